"""What the TUI writes: texts and trajectories (atomically), and its small state file
($DBERT_HOME/tui.json, the last checkpoint used). No Textual in here."""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import asdict
from pathlib import Path

from .controller import Recorded, Run
from .render import token_pieces


def texts_of(db, rec: Recorded) -> list[str]:
    return [db.decode(row) for row in rec.frame.ids]


def atomic_write(path, data: str) -> Path:
    """Write text to path via a temp file in the same directory and os.replace."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def trajectory(db, run: Run) -> dict:
    """Every recorded frame of a run as plain JSON-able data."""
    frames = []
    for rec in run.frames:
        f = rec.frame
        conf = [[None if math.isnan(c) else round(c, 6) for c in row] for row in f.confidence.tolist()]
        frames.append({"step": f.step, "steps": f.steps, "t": f.t, "nfe": f.nfe,
                       "ids": f.ids.tolist(), "masked": f.masked.tolist(), "revealed": f.revealed.tolist(),
                       "confidence": conf})
    last = run.frames[-1] if run.frames else None
    return {
        "format": "dbert-trajectory/1",
        "checkpoint": str(db.path) if db.path else None,
        "schedule": db.schedule.name, "T": db.schedule.T,
        "settings": asdict(run.settings),
        "mask_id": db.model.mask_id,
        "texts": texts_of(db, last) if last else [],
        "tokens": [token_pieces(db.tokenizer, row) for row in last.frame.ids] if last else [],
        "reveal_step": last.order.tolist() if last else [],
        "frames": frames,
    }


def state_file() -> Path:
    from dbert_core.store import home

    return home() / "tui.json"


def read_state() -> dict:
    try:
        data = json.loads(state_file().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def remember(**values) -> None:
    """Merge values into the app's small state file (last checkpoint used), atomically."""
    data = read_state()
    data.update(values)
    try:
        atomic_write(state_file(), json.dumps(data, indent=2) + "\n")
    except OSError:
        pass  # remembering is a convenience; never fail the app for it
