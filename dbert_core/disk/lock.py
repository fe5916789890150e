"""The lock on an output folder, so two runs never write one checkpoint (OutLock; Busy when
another run holds it), who holds it (holder), and the lock file a run killed with -9 left, which
no process holds (stale_lock: temp_folders.clean removes it)."""

from __future__ import annotations

import contextlib
import os
import re
import stat
from pathlib import Path

from ..errors import DbertError
from .layout import LOCK


class Busy(DbertError):
    """An output folder another dbert run holds (OutLock); `holder` names it ("pid N")."""

    def __init__(self, message: str, holder: str):
        super().__init__(message)
        self.holder = holder


def holder(out: Path) -> str | None:
    """Who holds out's OutLock ("pid N" of a run training into it), or None when nobody does.
    Only looks: the lock file is opened read-only (no link followed, a FIFO never waited on)
    and locked shared for an instant, never created or changed."""
    try:
        import fcntl
    except ImportError:
        return None
    path = Path(out).with_name(LOCK.format(name=Path(out).name))
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None  # no lock file (or not one dbert could have made): nobody is training into out
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, OutLock.RECORD + 1, 0).decode("ascii", "replace").strip()
            return text if re.fullmatch(r"pid \d+", text) else "another process"
        return None
    finally:
        os.close(fd)  # drops the shared lock too


class OutLock:
    """An exclusive lock on an output folder, so two runs never write one checkpoint.

    The lock is a hidden file beside the folder, locked with flock: the kernel drops it when its
    holder exits, even by kill -9, so a stale lock cannot exist. The holder removes the file
    when done; a process that opened it just before is told to retry by the inode check.

    The file is opened with O_NOFOLLOW and never truncated: a link planted at its name (to a
    user's file) is refused, and so is anything but a small file of dbert's own "pid N" text,
    so taking the lock can never change a file that is not dbert's.
    """

    RECORD = 32  # bytes of the "pid N" record, padded: rewriting it in place needs no truncation

    def __init__(self, out: Path):
        self.path = Path(out).with_name(LOCK.format(name=Path(out).name))
        self.file = None
        try:
            import fcntl  # noqa: F401 - only whether it exists: flock below goes through it
        except ImportError:  # Windows: no flock; runs are not protected from each other there
            return
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | \
            getattr(os, "O_NONBLOCK", 0)  # non-blocking: a FIFO planted there cannot hang the open
        for _ in range(100):
            try:
                fd = os.open(self.path, flags, 0o666)
            except OSError as e:
                what = "a symbolic link" if os.path.islink(self.path) else (e.strerror or str(e))
                raise DbertError(f"cannot lock {out}: {self.path}: {what}; dbert will not open it "
                                 "(remove it if it is not yours)") from None
            f = os.fdopen(fd, "r+b", buffering=0)
            try:
                if self._take(f, out):
                    self.file = f
                    return
            except BaseException:  # refused, busy, or interrupted (Ctrl-C) part way: no file left behind
                self._drop(f)
                raise
            f.close()  # the previous holder removed the file after we opened it: try again
        raise DbertError(f"cannot lock {out}")

    def _take(self, f, out: Path) -> bool:
        """Lock the open file f and record this process in it; False when its name no longer
        leads to it (the holder before removed it: open again). Busy when another run holds it."""
        import fcntl

        holder = self._check(f)
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Busy(f"{out} is being written by another dbert run ({holder or 'another process'}); "
                       "wait for it or choose another output", holder or "another process") from None
        if not self._named(f):
            return False
        try:
            os.pwrite(f.fileno(), f"pid {os.getpid()}".ljust(self.RECORD - 1).encode() + b"\n", 0)
        except OSError as e:  # a full disk: one line naming the lock, not a bare "No space left on device"
            raise DbertError(f"cannot lock {out}: writing {self.path} failed: {e.strerror or e}") from None
        return True

    def _named(self, f) -> bool:
        """Whether the lock file's name still leads to the open file f."""
        try:
            return os.fstat(f.fileno()).st_ino == os.stat(self.path, follow_symlinks=False).st_ino
        except FileNotFoundError:
            return False

    def _drop(self, f) -> None:
        """Close f after a failed _take, removing the lock file if no process holds it and it is
        dbert's (the one this process may have just made): as release() would, had it finished."""
        import fcntl

        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # already ours, or nobody's: ours now
            self._check(f)
            if self._named(f):
                self.path.unlink()
        except (OSError, DbertError):
            pass  # another run holds it, or it is not a dbert lock file: left as it is
        finally:
            f.close()

    def _check(self, f) -> str:
        """The holder recorded in an open lock file ("" when empty); DbertError unless it is a
        regular file with one name, of this user, holding only dbert's record."""
        st = os.fstat(f.fileno())
        text = os.pread(f.fileno(), self.RECORD + 1, 0) if stat.S_ISREG(st.st_mode) else b""
        ours = (stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_uid == os.geteuid()
                and st.st_size <= self.RECORD and re.fullmatch(rb"(pid \d+ *\n?)?", text) is not None)
        if not ours:
            raise DbertError(f"cannot lock the output folder: {self.path} exists and is not a dbert lock file; "
                             "dbert will not change it (remove it if it is not yours)")
        return text.decode().strip()

    def release(self) -> None:
        if self.file is not None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            self.file.close()
            self.file = None


_LOCK_NAME = re.compile(r"^\.(?P<name>.+)\.dbert-lock$")


def stale_lock(file: Path, name: str | None) -> bool:
    """An OutLock file (of `name` if given) that no process holds, made by dbert (a regular
    file of its "pid N" record): what a run killed with -9 leaves; a store operation removes it."""
    m = _LOCK_NAME.match(file.name)
    if m is None or (name is not None and m["name"] != name):
        return False
    try:
        fd = os.open(file, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not (stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_size <= OutLock.RECORD):
            return False
        if re.fullmatch(rb"(pid \d+ *\n?)?", os.pread(fd, OutLock.RECORD + 1, 0)) is None:
            return False
    except OSError:
        return False
    finally:
        os.close(fd)
    return holder(file.with_name(m["name"])) is None
