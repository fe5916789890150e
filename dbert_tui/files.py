"""What the TUI writes: texts and trajectories (atomically), and its small state file
($DBERT_HOME/tui.json, the last checkpoint used). No Textual in here."""

from __future__ import annotations

import json
from pathlib import Path

from .controller import Recorded, Run


def texts_of(db, rec: Recorded) -> list[str]:
    return [db.decode(row) for row in rec.frame.ids]


def atomic_write(path, data: str) -> Path:
    """Write text whole or not at all (dbert_core.disk.layout.atomic_write_text)."""
    from dbert_core.disk.layout import atomic_write_text

    return atomic_write_text(path, data)


def trajectory(db, run: Run) -> dict:
    """Every recorded frame of a run, in the engine's trajectory format (dbert_core.sampling.trajectory)."""
    from dbert_core.sampling.trajectory import trajectory as as_json

    last = run.frames[-1] if run.frames else None
    return as_json(db, run.settings, [rec.frame for rec in run.frames], last.order if last else None)


def output_dir() -> Path:
    """Where saved texts and exported trajectories go by default: $DBERT_HOME/outputs (beside
    the store; docs/tui.md says so)."""
    from dbert_core.storage.store import home

    return home() / "outputs"


def output_path(typed: str) -> Path:
    """The file a typed name means: a bare file name lands in output_dir(), anything with a
    folder in it (or ~) is taken as given, relative to the launch directory."""
    p = Path(typed).expanduser()
    return output_dir() / p if p.parent == Path(".") and not typed.startswith(".") else p


def default_output(stem: str, ext: str) -> Path:
    """output_dir()/stem.ext, or stem-2.ext, stem-3.ext ... when that file exists already."""
    folder = output_dir()
    path, k = folder / f"{stem}.{ext}", 2
    while path.exists():
        path, k = folder / f"{stem}-{k}.{ext}", k + 1
    return path


def state_file() -> Path:
    from dbert_core.disk.layout import TUI_STATE
    from dbert_core.storage.store import home

    return home() / TUI_STATE


def read_state() -> dict:
    """tui.json, or {} when it is missing or unusable: a FIFO, /dev/zero, a huge or deeply
    nested file is never read through (dbert_core.disk.jsonfile), it is simply a fresh start."""
    from dbert_core.errors import DbertError
    from dbert_core.disk.jsonfile import read_json

    try:
        data = read_json(state_file(), max_bytes=1 << 20)
        return data if isinstance(data, dict) else {}
    except (OSError, DbertError):
        return {}


def remember(**values) -> None:
    """Merge values into the app's small state file (last checkpoint used), atomically."""
    data = read_state()
    data.update(values)
    from dbert_core.errors import DbertError

    try:
        atomic_write(state_file(), json.dumps(data, indent=2) + "\n")
    except (OSError, DbertError):
        pass  # remembering is a convenience; never fail the app for it
