"""An output place, checked and made before any work: a path a user names for a file or a folder
(check_output: one DbertError naming the option), and a training run's output folder, made
(make_folders; remove_empty takes them back) and tried with a test file (check_writable)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..errors import DbertError
from .atomic import refuse_file_link, written_through


def check_output(path, option: str, folder: bool = False) -> Path:
    """Refuse, before any work, an output path that cannot be written: a folder where a file is
    wanted (or a file where a folder is), a path under a regular file, a block device (a disk:
    never written, see atomic_write_text), or a place this user cannot write (permissions, a
    read-only file system), a symbolic link to a file (atomic.refuse_file_link). What is written
    into, not replaced (a character device such as /dev/null, a FIFO, a socket, /dev/stdout), needs
    only to be writable itself: its folder (/dev) is never written. One DbertError naming the option."""
    path = Path(path).expanduser()
    if not str(path).strip() or (not folder and str(path) == "."):  # Path("") is "."
        raise DbertError(f"{option} must name a {'folder' if folder else 'file'} (an empty name is the current folder)")
    if path.exists() and path.is_dir() != folder:
        raise DbertError(f"{option} {path} is {'a file, not a folder' if folder else 'a folder; give a file name'}")
    if not folder and path.is_block_device():
        raise DbertError(f"{option} {path} is a block device (a disk); dbert writes files, never disks")
    if not folder and written_through(path):
        if not os.access(path, os.W_OK):
            raise DbertError(f"{option} {path} is not writable")
        return path
    if not folder:
        refuse_file_link(path, f"{option} {path}")
    parent = path if folder and path.exists() else path.parent
    while not parent.exists() and parent != parent.parent:
        if os.path.lexists(parent):  # a dangling link
            break
        parent = parent.parent
    if not parent.is_dir():
        raise DbertError(f"{option} {path}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise DbertError(f"{option} {path}: {parent} is not writable")
    if not os.path.lexists(path) or folder:  # a file is made there: try one (root passes os.access, /sys does not)
        try:
            with tempfile.TemporaryFile(dir=parent, prefix=".dbert-write-test-"):
                pass
        except OSError as e:
            raise DbertError(f"{option} {path}: {parent} is not writable ({e.strerror or e})") from None
    return path


def make_folders(folder: Path) -> list[Path]:
    """mkdir -p folder; the folders it made, outermost first (remove_empty takes them back)."""
    folder = Path(folder)
    missing = []
    while not os.path.lexists(folder) and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    made = []
    try:
        for f in reversed(missing):
            f.mkdir()
            made.append(f)
    except OSError as e:
        remove_empty(made)
        raise DbertError(f"cannot write checkpoints to {missing[0]}: {e.strerror or e}") from None
    return made


def remove_empty(made: list[Path]) -> None:
    """Remove the folders make_folders made, innermost first, as long as they are empty."""
    for f in reversed(made):
        try:
            f.rmdir()
        except OSError:
            return


def check_writable(folder: Path) -> None:
    """Create folder if need be and write a test file in it: a training run fails before step 1,
    not at the first save after an hour of training."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder, prefix=".dbert-write-test-"):
            pass
    except OSError as e:
        raise DbertError(f"cannot write checkpoints to {folder}: {e.strerror or e}") from None
