"""Refill: the [MASK]s of a given canvas filled in, conditioned on every other token (the TUI's
`f` and `b`), in windows the model's positions hold.

A canvas that fits the model (at most `max_length` columns) is one call of the sampler with the
canvas as its template, exactly as `--prompt` is (tests/test_refill.py checks its law). A longer
one (a story written block by block past one window) cannot be handed to the network whole: its
masked columns are grouped into runs, and each run is filled in a window of the story's length
(blocks.window) centred on it, the canvas around it as it stands then given as context (later
windows see what earlier ones wrote), as block continuation fills a long story window by window.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import torch

from .base import Frame, last_frame
from .blocks import end_fill, is_story_model, window
from .sample import frames


def refill_stream(db, cfg, generator: torch.Generator, template: torch.Tensor, topk: int = 0) -> Iterator[Frame]:
    """Frames of cfg.n refills of `template` ((L,) or (n, L) token ids, [MASK] where to fill), each
    of the canvas's shape: one sampler call when the canvas fits the model, else window by window
    (refill_frames)."""
    if template.shape[-1] <= db.model.max_length:
        return frames(db, cfg, generator=generator, template=template, topk=topk)
    width = window(db) if is_story_model(db) else db.model.max_length
    return refill_frames(db, cfg, generator, template, width, topk)


def windows(masked_columns: list[int], length: int, width: int) -> list[int]:
    """The canvas columns at which a long refill's windows start, left to right: each window,
    `width` columns wide, holds a run of the masked columns at most width // 2 long, centred in it
    (a quarter window of context at least on each side, where the canvas has it), inside the
    canvas of `length` columns."""
    span = max(1, width // 2)
    starts, i = [], 0
    while i < len(masked_columns):
        first, j = masked_columns[i], i
        while j + 1 < len(masked_columns) and masked_columns[j + 1] - first < span:
            j += 1
        run = masked_columns[j] - first + 1
        starts.append(max(0, min(length - width, first - (width - run) // 2)))
        i = j + 1
    return starts


def refill_frames(db, cfg, generator: torch.Generator, template: torch.Tensor, width: int,
                  topk: int = 0) -> Iterator[Frame]:
    """A refill of a canvas wider than the model, window after window (windows()). Frames of the
    whole canvas as blocks.story_frames makes them: `step` counts on across windows (steps = the
    step budget times the windows), only the very last frame is `done`. A story's end rule holds
    across windows: once a filled column is [SEP], the row's masked columns after it are end padding."""
    end, mask = db.tokenizer.sep_token_id, db.model.mask_id
    canvas = (template.unsqueeze(0).repeat(cfg.n, 1) if template.dim() == 1 else template).clone()
    n, L = canvas.shape
    free = canvas == mask
    confidence = torch.full((n, L), float("nan"), dtype=torch.float64)
    top: tuple[torch.Tensor, torch.Tensor] | None = None  # the canvas's candidates (ids, probs), once a frame has them
    starts = windows(free.any(0).nonzero().flatten().tolist(), L, width)
    S, most = cfg.steps, max(1, len(starts))
    nfe = calls = 0
    flops = 0.0
    last = None
    for block, a in enumerate(starts):
        b = a + width
        rows = [r for r in range(n) if bool((canvas[r, a:b] == mask).any())]  # an ended story has none left
        if not rows:
            continue
        mine = free[rows, a:b]
        for f in frames(db, replace(cfg, n=len(rows), prompt=None), generator=generator,
                        template=canvas[rows, a:b].clone(), topk=topk, offset=a):
            last = f
            ids = canvas.clone()
            ids[rows, a:b] = f.ids
            revealed = torch.zeros(n, L, dtype=torch.bool)
            revealed[rows, a:b] = f.revealed
            conf = confidence.clone()
            conf[rows, a:b] = torch.where(mine, f.confidence, conf[rows, a:b])
            t_ids = t_probs = None
            if f.top_ids is not None and f.top_probs is not None:  # frames(topk > 0): every frame has both
                if top is None:
                    top = (torch.full((n, L, f.top_ids.shape[-1]), -1, dtype=f.top_ids.dtype),
                           torch.full((n, L, f.top_ids.shape[-1]), float("nan"), dtype=f.top_probs.dtype))
                t_ids, t_probs = top[0].clone(), top[1].clone()
                t_ids[rows, a:b] = f.top_ids
                t_probs[rows, a:b] = f.top_probs
            remasked = None
            if f.remasked is not None:
                remasked = torch.zeros(n, L, dtype=torch.bool)
                remasked[rows, a:b] = f.remasked
            row_steps = torch.full((n,), block * S, dtype=torch.long)
            if f.row_steps is not None:
                row_steps[rows] = block * S + f.row_steps
            yield replace(f, ids=ids, masked=ids == mask, revealed=revealed, confidence=conf, top_ids=t_ids,
                          top_probs=t_probs, remasked=remasked, row_steps=row_steps, steps=S * most,
                          step=block * S + f.step, nfe=nfe + f.nfe, rows=calls + f.rows, flops=flops + f.flops,
                          touch_up=True)  # more follows: the canvas's last frame, below, is the one done
        last = last_frame(last)
        canvas[rows, a:b] = last.ids
        confidence[rows, a:b] = torch.where(mine, last.confidence, confidence[rows, a:b])
        if last.top_ids is not None and last.top_probs is not None and top is not None:
            top[0][rows, a:b] = last.top_ids
            top[1][rows, a:b] = last.top_probs
        nfe, calls, flops = nfe + last.nfe, calls + last.rows, flops + last.flops
        if is_story_model(db):  # a story that ended in this window: its masks after the end are end padding
            end_fill(canvas, canvas == mask, free, end)
    yield Frame(ids=canvas.clone(), masked=canvas == mask, revealed=torch.zeros(n, L, dtype=torch.bool),
                confidence=confidence.clone(), step=S * most, steps=S * most, t=0, nfe=nfe, rows=calls,
                row_steps=torch.full((n,), S * most, dtype=torch.long), flops=flops,
                top_ids=None if top is None else top[0].clone(), top_probs=None if top is None else top[1].clone())
