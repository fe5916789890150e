"""File modes: the ones a fresh file or folder gets under the user's umask, given to everything
dbert puts in place (apply_umask: never an executable file, never a mode copied from an archive
or another user's folder) and to every file it writes whole (atomic.py)."""

from __future__ import annotations

import os
from pathlib import Path

from .tree import walk


def umask() -> int:
    """The process umask, read without changing it where the system allows."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore at once
    os.umask(mask)
    return mask


def apply_umask(root: Path) -> None:
    """Give root and everything in it the modes a fresh file or folder gets under the user's
    umask (0644/0755 under the usual 022, 0600/0700 under 077): never executable files, and
    never modes copied from an archive or another user's folder."""
    mask = umask()
    root = Path(root)
    for dirpath, _, others in walk(root):
        for name in others:
            f = os.path.join(dirpath, name)
            if not os.path.islink(f):
                os.chmod(f, 0o666 & ~mask)
        os.chmod(dirpath, 0o777 & ~mask)
