"""The temporary folders dbert writes in beside their destination, and what a crash left in them.

Everything dbert writes is built in a hidden temporary folder beside its destination and
renamed into place:

    .NAME.dbert-KIND-PID-XXXXXXXX/     KIND: swap (a save), fetch, import, remove or cache (a token cache entry)
        .dbert-temp                    marker: {"pid", "host", "created", "kind"}

A folder is dbert's own only when its name has that shape AND it holds the marker (or, killed
before the marker was written, it is empty). Recovery and cleaning touch nothing else: a user's
`NAME.old`, `.NAME.old` or any look-alike is never renamed or deleted.

A save moves the previous checkpoint into its swap folder (`swap/old`) and renames the new one
into place, so a crash leaves either NAME or `swap/old`. Readers use `readable` (no writes);
writers call `recover`, which puts `swap/old` back if NAME is missing and deletes the swap
folder, once its owner is gone (its pid has exited, or it is older than STALE_SECONDS).
`clean` does that for every temp folder of a directory, and removes the output locks no
process holds (lock.stale_lock): the store runs it on each operation.

Torch-free: listing the store and the TUI's start-up use it without loading any model.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import tempfile
import time
from pathlib import Path

from ..errors import DbertError
from .layout import MARK, META
from .lock import stale_lock

KINDS = ("swap", "fetch", "import", "remove", "cache")
STALE_SECONDS = 24 * 3600  # an owner alive for longer is taken for a reused pid
_NAME = re.compile(r"^\.(?P<name>.+)\.dbert-(?P<kind>" + "|".join(KINDS) + r")-(?P<pid>\d+)-[A-Za-z0-9_]+$")


def temp_dir(target: Path, kind: str) -> Path:
    """A new marked temp folder beside target, for an operation of this kind."""
    if kind not in KINDS:
        raise ValueError(f"unknown temp folder kind {kind!r}")
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f".{target.name}.dbert-{kind}-{os.getpid()}-", dir=target.parent))
    part = folder / (MARK + ".part")
    try:
        part.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "created": time.time(),
                                    "kind": kind}))
        os.replace(part, folder / MARK)  # the marker appears whole or not at all
    except OSError:  # a full disk: nothing left behind
        part.unlink(missing_ok=True)
        folder.rmdir()
        raise
    return folder


def discard(folder: Path) -> None:
    """Delete a temp folder, its marker last: killed halfway, it is still recognisably ours."""
    folder = Path(folder)
    try:
        children = list(folder.iterdir())
    except OSError:
        return
    for child in children:
        if child.name == MARK:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
    try:
        (folder / MARK).unlink(missing_ok=True)
        folder.rmdir()
    except OSError:
        pass


def _parse(folder: Path) -> tuple[str, str, int] | None:
    m = _NAME.match(folder.name)
    return (m["name"], m["kind"], int(m["pid"])) if m else None


def _marker(folder: Path) -> dict | None:
    from .jsonfile import read_json

    try:
        data = read_json(folder / MARK, max_bytes=1 << 16)
    except (OSError, DbertError):
        return None
    return data if isinstance(data, dict) else None


def is_ours(folder: Path) -> bool:
    """A temp folder dbert made: the name's shape and dbert's marker inside."""
    folder = Path(folder)
    return folder.is_dir() and not folder.is_symlink() and _parse(folder) is not None and _marker(folder) is not None


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    try:  # a killed child its parent has not reaped yet is a zombie: gone for our purpose
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _gone(folder: Path, pid: int, marker: dict | None) -> bool:
    """Whether the process that made folder can no longer be using it."""
    created = marker.get("created") if marker else None
    try:
        age = time.time() - (float(created) if created is not None else folder.stat().st_mtime)
    except (TypeError, ValueError, OSError):
        age = 0.0
    if age > STALE_SECONDS:
        return True
    if marker and marker.get("host") not in (None, socket.gethostname()):
        return False  # another machine's process (a shared disk): only age tells
    return not _alive(pid)


def _half_made(folder: Path) -> bool:
    """Killed between mkdtemp and writing the marker: nothing in it but, at most, the marker's draft."""
    try:
        return {p.name for p in folder.iterdir()} <= {MARK + ".part"}
    except OSError:
        return False


def _ours_and_stale(folder: Path) -> tuple[str, str] | None:
    """(name, kind) of a temp folder dbert made whose owner is gone, else None."""
    parsed = _parse(folder)
    if parsed is None or folder.is_symlink() or not folder.is_dir():
        return None
    name, kind, pid = parsed
    marker = _marker(folder)
    if marker is None and not _half_made(folder):
        return None  # our name's shape but not our marker: not provably ours, so not touched
    return (name, kind) if _gone(folder, pid, marker) else None


def _finish(folder: Path, name: str, kind: str) -> None:
    """Finish what a dead owner left: put a swapped-out checkpoint back, then delete the folder."""
    target = folder.parent / name
    if kind == "swap" and (folder / "old").is_dir() and not target.exists():
        os.rename(folder / "old", target)
    discard(folder)


def clean(parent: Path, name: str | None = None) -> None:
    """Recover and remove the stale temp folders in parent (only those of `name` if given)."""
    parent = Path(parent)
    try:
        children = list(parent.iterdir())
    except OSError:
        return
    for folder in children:
        if stale_lock(folder, name):
            with contextlib.suppress(OSError):
                folder.unlink()  # OutLock's inode check makes a run that opened it just now retry
            continue
        found = _ours_and_stale(folder)
        if found is not None and (name is None or found[0] == name):
            try:
                _finish(folder, *found)
            except OSError:
                pass  # e.g. a read-only store: left for a later operation, never fatal


def recover(path: Path) -> None:
    """Finish a save a crash interrupted (writers only: save, training)."""
    path = Path(path)
    clean(path.parent, path.name)


def _swapped_out(path: Path) -> Path | None:
    """The previous checkpoint a save of path has moved aside, if any (newest first)."""
    try:
        found = [f / "old" for f in path.parent.glob(f".{glob_escape(path.name)}.dbert-swap-*")
                 if is_ours(f) and (f / "old" / META).is_file()]
    except OSError:
        return None
    return max(found, key=lambda p: p.stat().st_mtime, default=None)


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def readable(path: Path) -> Path:
    """Where a checkpoint can be read now without writing: path itself or, between a save's two
    renames (or after a crash there), the previous checkpoint in its swap folder."""
    path = Path(path)
    if path.exists():
        return path
    return _swapped_out(path) or path


def exists(path: Path) -> bool:
    """A checkpoint is at path, or mid-swap there."""
    path = Path(path)
    return path.exists() or _swapped_out(path) is not None
