"""Writing a text file whole or not at all (atomic_write_text), and never replacing what is not a
regular file: a regular file or a new path is replaced (a temp file beside it, fsync,
os.replace); a device, a FIFO, a socket or another process's open file is written through;
a block device is refused, and so is a symbolic link to a file (refuse_file_link): a link
planted at an output's name never redirects the write to the file it names."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
import tempfile
import threading
from pathlib import Path

from ..errors import DbertError
from .modes import umask


def atomic_write_text(path, text: str) -> Path:
    """Write a text file whole or not at all, and never replace what is not a regular file.

    A new path or a regular file is replaced atomically: a temp file beside it, fsync,
    os.replace, with the umask's mode (mkstemp alone would leave it 0600). A symbolic link to a
    regular file, to a folder or to nothing is refused (refuse_file_link): neither the link nor
    the file it names is changed. Anything else is written through,
    never renamed over: a character device (/dev/null, /dev/full, a terminal), a FIFO (refused
    at once when no process reads it: never a hang), a socket (connected to), a link to one of
    these, and /dev/stdout, /dev/fd/N or /proc/self/fd/N (written to that descriptor, whatever
    it is open on). A block device (a disk) is refused. A failure (a full disk, /dev/full, a
    read-only folder) is one DbertError; a replaced file is then as it was."""
    path = Path(path).expanduser()
    data = text.encode("utf-8")
    try:
        fd = _own_fd(path)
        if fd is not None:
            _flush_std(fd)
            _write_all(fd, data)
            return path
        try:
            st = os.stat(path)  # through links
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise DbertError(f"cannot write {path}: it is a folder")
        if st is not None and stat.S_ISBLK(st.st_mode):
            raise DbertError(f"cannot write {path}: it is a block device (a disk); dbert writes files, never disks")
        if st is not None and (not stat.S_ISREG(st.st_mode) or _in_proc(path)):
            _write_through(path, st, data)
        else:
            refuse_file_link(path, f"cannot write {path}")
            _replace(path, data)  # os.replace renames over the name itself, never through a link
    except OSError as e:
        raise DbertError(f"cannot write {path}: {e.strerror or e}") from None
    return path


def written_through(path) -> bool:
    """Whether path is (or links to) something dbert writes into rather than replaces: a
    character device, a FIFO, a socket, or a process's open file (/dev/stdout, /proc/PID/fd/N)."""
    path = Path(path).expanduser()
    try:
        st = os.stat(path)
    except OSError:
        return False
    return not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or stat.S_ISBLK(st.st_mode)) \
        or (stat.S_ISREG(st.st_mode) and _in_proc(path))


def refuse_file_link(path, what: str) -> None:
    """A symbolic link at an output's name that leads to a regular file, a folder or nowhere is
    refused: writing through it would replace a file the user never named (a link planted at
    `-o samples.jsonl` pointing at ~/.bashrc), and replacing the link would undo one they made.
    Links to what is written through (written_through: /dev/stdout, a link to /dev/null) pass."""
    path = Path(path).expanduser()
    if not os.path.islink(path) or written_through(path):
        return
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    raise DbertError(f"{what}: it is a symbolic link (to {target}); dbert never writes a file through a link, "
                     "so name the file itself or remove the link")


def _links(path: Path):
    """path, then each path its chain of symbolic links leads to (at most 40), made absolute."""
    p = os.path.abspath(path)
    for _ in range(40):
        yield p
        if not os.path.islink(p):
            return
        p = os.path.abspath(os.path.join(os.path.dirname(p), os.readlink(p)))


def _in_proc(path: Path) -> bool:
    """path leads into /proc (/dev/stdout -> /proc/self/fd/1): a process's open file, not a name."""
    return any(os.path.realpath(os.path.dirname(p)).startswith("/proc/") for p in _links(path))


def _own_fd(path: Path) -> int | None:
    """N when path is, or links to, this process's own descriptor N (/dev/stdout, /dev/fd/N,
    /proc/self/fd/N): written to directly, so it shares the stream's position with stdout."""
    own = {f"/proc/{os.getpid()}/fd", f"/proc/{os.getpid()}/task/{threading.get_native_id()}/fd"}
    for p in _links(path):
        folder, name = os.path.split(p)
        if name.isdigit() and os.path.realpath(folder) in own:
            try:
                os.fstat(int(name))
            except OSError:
                return None  # not open: opening the name gives the error
            return int(name)
    return None


def _flush_std(fd: int) -> None:
    """What Python holds for the stream on fd goes first (stdout, stderr)."""
    import sys

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            if stream.fileno() == fd:
                stream.flush()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _write_through(path: Path, st: os.stat_result, data: bytes) -> None:
    """Write data into what path is (a device, a FIFO, a socket, another process's open file)
    without renaming or truncating anything."""
    if stat.S_ISSOCK(st.st_mode):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(path))
            s.sendall(data)
        return
    fifo = stat.S_ISFIFO(st.st_mode)
    flags = os.O_WRONLY | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    flags |= os.O_APPEND if stat.S_ISREG(st.st_mode) else 0  # another process's file: added to, never cut
    try:
        fd = os.open(path, flags | (os.O_NONBLOCK if fifo else 0))
    except OSError as e:
        if fifo and e.errno == errno.ENXIO:
            raise DbertError(f"cannot write {path}: it is a FIFO and no process is reading it") from None
        raise
    try:
        now = os.fstat(fd)
        if stat.S_IFMT(now.st_mode) != stat.S_IFMT(st.st_mode):
            raise DbertError(f"cannot write {path}: it changed while being opened")
        if fifo:
            os.set_blocking(fd, True)
        _write_all(fd, data)
    finally:
        os.close(fd)


def _replace(path: Path, data: bytes) -> None:
    """A regular file or a new path, replaced whole: a temp file beside it, fsync, os.replace."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)
        tmp = None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
