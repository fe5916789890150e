"""The checkpoint store: named checkpoints in a per-user data directory, plus the shipped default.

    $DBERT_HOME (default: platformdirs' user data dir for "dbert")/checkpoints/<name>/

`resolve` turns what a user typed (a store name, "default", or a path) into a directory.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from .errors import DbertError

DEFAULT_NAME = "default"
DEFAULT_DIR = "dbert-minilm-wiki"  # the shipped model's folder inside assets/


def home() -> Path:
    env = os.environ.get("DBERT_HOME")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("dbert", appauthor=False))


def store_dir() -> Path:
    return home() / "checkpoints"


def assets_dir() -> Path:
    """The shipped assets: inside the installed package, or the repository's assets/ folder."""
    from importlib.resources import files

    packaged = Path(str(files("dbert_core") / "assets"))
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "assets"


def default_checkpoint() -> Path | None:
    path = assets_dir() / DEFAULT_DIR
    return path if (path / "dbert.json").is_file() else None


def is_name(text: str) -> bool:
    """A store name: no path separators, not '.' or '..', not hidden."""
    return bool(text) and "/" not in text and os.sep not in text and not text.startswith(".")


def out_path(out: str) -> Path:
    """Where `dbert train --out X` writes: a store entry for a bare name, else the path."""
    if is_name(out) and not Path(out).exists():
        return store_dir() / out
    return Path(out)


def resolve(name_or_path: str | None) -> Path:
    """The checkpoint directory for a store name, 'default', a path, or None (the default)."""
    if name_or_path is None or name_or_path == DEFAULT_NAME:
        path = default_checkpoint()
        if path is None:
            raise DbertError("no default checkpoint is installed; pass --checkpoint NAME_OR_DIR "
                             "(see `dbert checkpoints list`)")
        return path
    p = Path(name_or_path).expanduser()
    if p.exists():
        return p
    if is_name(name_or_path):
        entry = store_dir() / name_or_path
        if entry.exists() or entry.with_name(entry.name + ".old").exists():
            return entry
        raise DbertError(f"no checkpoint named {name_or_path!r} in {store_dir()} and no such directory "
                         "(see `dbert checkpoints list`)")
    raise DbertError(f"checkpoint directory not found: {name_or_path}")


def human_size(n: float) -> str:
    """1536 -> '1.5 KB' (sizes in the checkpoint listings of the CLI and the TUI)."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


@dataclass
class Entry:
    name: str
    path: Path
    size: int
    parameters: int | None
    schedule: str
    time: str
    created: str


def _entry(name: str, path: Path) -> Entry | None:
    try:
        meta = json.loads((path / "dbert.json").read_text())
    except (OSError, ValueError):
        return None
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and "trainer_state" not in f.parts)
    schedule = meta.get("schedule", "?")
    if schedule == "spindle":
        schedule = f"spindle({meta.get('lambda', 0.3):g})"
    return Entry(name, path, size, meta.get("parameters"), schedule, meta.get("time", "none"),
                 meta.get("created", "?"))


def entries() -> list[Entry]:
    """The default checkpoint first, then the store's entries by name."""
    out = []
    default = default_checkpoint()
    if default is not None:
        e = _entry(DEFAULT_NAME, default)
        if e:
            out.append(e)
    root = store_dir()
    if root.is_dir():
        for p in sorted(root.iterdir()):
            if p.is_dir() and is_name(p.name) and not p.name.endswith(".old"):
                e = _entry(p.name, p)
                if e:
                    out.append(e)
    return out
