"""The trajectory file: every frame of one sampling batch as JSON ("dbert-trajectory/1").

Written by `dbert sample --trajectory FILE` and by the TUI's export, read by anyone who wants
to replay or study how the text was filled in. One object:

    format, checkpoint, schedule, T, settings (the SampleConfig used), mask_id,
    strategy: {name, label ("exact" or "heuristic"), exact, params} (strategies.py),
    texts (the final texts), tokens (the final word pieces per row),
    reveal_step (B, L): the frame step at which each position was revealed (0: given),
    frames: [{step, steps, t, nfe, ids, masked, revealed, confidence}, ...]

confidence is p'(chosen token) when the position was revealed, null while masked. A strategy
that masks revealed tokens again (remdm, and the quote touch-up that follows the reverse process
by default: quotes.py) adds "remasked" to those frames, and a position's reveal_step is then its
last reveal; the touch-up's frames carry "touch_up": true.
"""

from __future__ import annotations

import math
from dataclasses import asdict, is_dataclass

import torch

FORMAT = "dbert-trajectory/1"


def reveal_order(frames) -> torch.Tensor:
    """(B, L) int32: the step of the frame that revealed each position (0: given or never)."""
    order = torch.zeros(frames[0].ids.shape, dtype=torch.int32) if frames else torch.zeros(0, 0, dtype=torch.int32)
    for f in frames:
        order[f.revealed] = f.step
    return order


def frame_record(f) -> dict:
    conf = [[None if math.isnan(c) else round(c, 6) for c in row] for row in f.confidence.tolist()]
    out = {"step": f.step, "steps": f.steps, "t": f.t, "nfe": f.nfe, "ids": f.ids.tolist(),
           "masked": f.masked.tolist(), "revealed": f.revealed.tolist(), "confidence": conf}
    if getattr(f, "remasked", None) is not None:
        out["remasked"] = f.remasked.tolist()
    if getattr(f, "touch_up", False):
        out["touch_up"] = True
    return out


def strategy_record(settings: dict) -> dict | None:
    """What the settings' sampler is: its name, label and parameters (None if no sampler is named)."""
    from .strategies import get

    name = settings.get("sampler")
    if name is None:
        return None
    s = get(name)
    return {"name": name, "label": s.label, "exact": s.exact, "params": s.resolve(settings.get("params"))}


def trajectory(db, settings, frames, order: torch.Tensor | None = None) -> dict:
    """The trajectory of one batch: `frames` in order (sample.Frame or compact copies of them),
    `settings` a SampleConfig (or a dict), `order` the reveal steps if already kept."""
    last = frames[-1] if frames else None
    if order is None:
        order = reveal_order(frames)
    settings = asdict(settings) if is_dataclass(settings) else dict(settings)
    return {
        "format": FORMAT,
        "checkpoint": str(db.path) if db.path else None,
        "schedule": db.schedule.name, "T": db.schedule.T,
        "settings": settings,
        "strategy": strategy_record(settings),
        "mask_id": db.model.mask_id,
        "texts": [db.decode(row) for row in last.ids] if last is not None else [],
        "tokens": [db.tokenizer.convert_ids_to_tokens([int(i) for i in row]) for row in last.ids] if last is not None else [],
        "reveal_step": order.tolist() if last is not None else [],
        "frames": [frame_record(f) for f in frames],
    }
