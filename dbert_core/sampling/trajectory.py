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

What a replay (`dbert-tui --replay FILE`, replay.py) needs without the checkpoint, added to the
same format (readers of the fields above are unaffected):

    pieces {id: word piece} of every id in the frames and in top,
    special {sep, cls, pad, unk, mask}: the tokenizer's special pieces,
    truecase {uncased word: written form} of the final texts' words (null: none),
    masking_time {id: E[tau]}: when the forward process masks each token (inspector.py),
    expected_masked (S+1,): the schedule's expected masked fraction after each step,
    top {k, ids (B, L, k), probs (B, L, k)}: the k most likely candidates of p' and their p' at
        each position's (last) reveal, -1 / null where none (only when the run recorded them).
"""

from __future__ import annotations

import math
from dataclasses import asdict, is_dataclass
from typing import Any

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
    from ..strategies import get

    name = settings.get("sampler")
    if name is None:
        return None
    s = get(name)
    return {"name": name, "label": s.label, "exact": s.exact, "params": s.resolve(settings.get("params"))}


def replay_fields(db, frames, steps: int) -> dict:
    """The fields a replay needs besides the frames (see the module docstring)."""
    import re

    from .inspector import masking_time

    tok = db.tokenizer
    seen = {int(i) for f in frames for i in f.ids.flatten().tolist()}
    top = getattr(frames[-1], "top_ids", None) if frames else None
    if top is not None:
        seen |= {int(i) for i in top.flatten().tolist() if i >= 0}
    ids = sorted(seen)
    out: dict[str, Any] = {"pieces": dict(zip(map(str, ids), tok.convert_ids_to_tokens(ids))),
           "special": {"sep": tok.sep_token, "cls": tok.cls_token, "pad": tok.pad_token, "unk": tok.unk_token,
                       "mask": tok.mask_token},
           "masking_time": {str(i): round(float(t), 3) for i, t in zip(ids, masking_time(db.schedule, torch.tensor(ids)))},
           "truecase": None}
    table = getattr(db, "truecase", None)
    if table and frames:
        words = {w for row in frames[-1].ids for w in re.findall(r"[\w']+", db.decode(row, cased=False).lower())}
        out["truecase"] = {w: table[w] for w in sorted(words) if w in table}
    try:
        from .base import masked_curve

        out["expected_masked"] = [round(float(v), 6) for v in masked_curve(db, steps)]
    except (ValueError, AttributeError):
        out["expected_masked"] = None
    if top is not None:
        probs = frames[-1].top_probs
        out["top"] = {"k": int(top.shape[-1]), "ids": top.tolist(),
                      "probs": [[[None if math.isnan(p) else round(p, 6) for p in cell] for cell in row]
                                for row in probs.tolist()]}
    return out


def trajectory(db, settings, frames, order: torch.Tensor | None = None) -> dict:
    """The trajectory of one batch: `frames` in order (sample.Frame or compact copies of them),
    `settings` a SampleConfig (or a dict), `order` the reveal steps if already kept."""
    last = frames[-1] if frames else None
    if order is None:
        order = reveal_order(frames)
    settings = asdict(settings) if is_dataclass(settings) and not isinstance(settings, type) else dict(settings)
    extra = replay_fields(db, frames, last.steps) if last is not None else {}
    return {**extra, 
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
