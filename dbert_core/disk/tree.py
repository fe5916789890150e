"""Walking a folder tree as dbert does (walk): top down, never following a link, without
recursion, and within limits (MAX_TREE_DEPTH folders deep, MAX_TREE_ENTRIES entries): a
checkpoint holds a dozen files, and a link to / or 990 nested folders must not turn a listing
into a walk of the disk. A data folder's files (folder_files), for --data, in sorted order."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import DbertError

MAX_TREE_DEPTH = 16  # folders within folders in a checkpoint (dbert's own use one: trainer_state/)
MAX_TREE_ENTRIES = 10_000  # files and folders in a checkpoint (as archive.MAX_MEMBERS)


def walk(root, max_depth: int = MAX_TREE_DEPTH, max_entries: int = MAX_TREE_ENTRIES, strict: bool = True):
    """(folder, dirs, others) for root and every folder under it, top down, like os.walk but
    never following a link (a link is listed among `others`, whatever it points to) and without
    recursion. A tree deeper than max_depth or with more than max_entries entries is refused
    (DbertError) when strict, else walked only that far: a checkpoint holds a dozen files, and a
    link to / or 990 nested folders must not turn a listing into a walk of the disk."""
    root = Path(root)
    stack, seen = [(root, 0)], 0
    while stack:
        folder, level = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        seen += len(entries)
        if seen > max_entries:
            if strict:
                raise DbertError(f"{root} holds more than {max_entries} files and folders; refusing it")
            return
        dirs: list[str] = []
        others: list[str] = []
        for e in entries:
            try:
                (dirs if e.is_dir(follow_symlinks=False) else others).append(e.name)
            except OSError:
                others.append(e.name)
        yield folder, dirs, others
        if dirs and level + 1 > max_depth:
            if strict:
                raise DbertError(f"{root} nests folders more than {max_depth} deep; refusing it")
            continue
        stack.extend((folder / d, level + 1) for d in reversed(dirs))


def folder_files(folder: str) -> list[str]:
    """A data folder's files, every level down, in sorted order (hidden names skipped)."""
    found: list[str] = []
    for top, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found.extend(os.path.join(top, f) for f in sorted(files) if not f.startswith("."))
    if not found:
        raise DbertError(f"data folder holds no files: {folder}")
    return found
