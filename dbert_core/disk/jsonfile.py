"""The one way dbert reads a small JSON file it did not write in this process.

`read_json` refuses, with one DbertError line naming the file, whatever could hang, exhaust
memory or crash a recursive reader further on:

- anything but a regular file: a FIFO or a device (`/dev/zero`) is refused without reading,
  and the file is opened non-blocking, so even opening a FIFO cannot wait for a writer;
- a file over `max_bytes` (it is never read past that);
- bytes that are not UTF-8, text that is not JSON;
- nesting deeper than `max_depth` (MAX_DEPTH): `[[[[…]]]]` 200,000 deep is one line, not a
  RecursionError.

Torch-free.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from ..errors import DbertError

MAX_DEPTH = 64  # checkpoint configs nest 3 or 4 deep
MAX_BYTES = 4 << 20  # 4 MiB: dbert.json, config.json, tokenizer_config.json


def read_bytes(path, max_bytes: int, what: str | None = None) -> bytes:
    """A regular file's bytes, at most max_bytes of them (DbertError otherwise)."""
    path = Path(path)
    what = what or str(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise DbertError(f"{what} cannot be read: {e.strerror or e}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise DbertError(f"{what} is not a regular file (a FIFO, a device or a folder); refusing to read it")
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise DbertError(f"{what} cannot be read: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if size > max_bytes:
        raise DbertError(f"{what} is larger than {_size(max_bytes)}; refusing to read it")
    return b"".join(chunks)


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB" if n >= 1 << 10 else f"{n} bytes"


def depth(value) -> int:
    """How deep lists and objects nest in a parsed JSON value (a scalar: 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def read_json(path, what: str | None = None, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH):
    """A small JSON file, parsed; DbertError for anything but a regular file of at most
    max_bytes holding UTF-8 JSON nested at most max_depth deep. FileNotFoundError passes."""
    what = what or str(path)
    data = read_bytes(path, max_bytes, what)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DbertError(f"{what} is not UTF-8 text (byte {e.start})") from None
    return loads(text, what, max_depth)


def loads(text: str, what: str, max_depth: int = MAX_DEPTH):
    """json.loads with the nesting limit of read_json."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise DbertError(f"{what} nests deeper than {max_depth} levels; refusing it") from None
    except ValueError as e:
        raise DbertError(f"{what} is not valid JSON ({str(e)[:80]})") from None
    if depth(value) > max_depth:
        raise DbertError(f"{what} nests deeper than {max_depth} levels; refusing it")
    return value
