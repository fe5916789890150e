"""Quote pairing: the sampler's touch-up for quotation marks that pair with none.

A small diffusion LM places each `"` from what it sees around that position, so a sample can
open a quotation it never closes, or close one it never opened. After the reverse process, each
row's unpaired quotes (detok.unpaired_quotes: the same reading of opening and closing quotes the
printed text uses) are masked again and refilled by the same sampler, with quote marks excluded,
conditioned on everything else: the model chooses what stands there instead (a word, a comma, a
full stop). Up to `ROUNDS` rounds, since a refill changes its neighbours' reading. Only positions
the sampler filled are touched: a prompt's own quotes stay. This is a heuristic (like the repeat
block it reshapes the output), on by default (`SampleConfig.pair_quotes`), off with
`dbert sample --unpaired-quotes` (the model's own quotes). The touch-up is part of the run's
frames (`touch_up`): a viewer sees the stray quotes masked again and refilled.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator

import torch

from .detok import special_names, unpaired_quotes

ROUNDS = 3
QUOTE_PIECES = ('"', "`")


def quote_ids(tokenizer) -> list[int]:
    """The vocabulary ids of the double-quote pieces (those the tokenizer has)."""
    ids = [tokenizer.backend_tokenizer.token_to_id(p) for p in QUOTE_PIECES]
    return [int(i) for i in ids if i is not None]


def unpaired(db, ids: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """(B, L) bool: the eligible positions of each row of ids holding a quote that pairs with none."""
    names = special_names(db.tokenizer)
    out = torch.zeros_like(eligible)
    for r, row in enumerate(ids.tolist()):
        for i in unpaired_quotes(db.tokenizer.convert_ids_to_tokens(row), sep=names["sep"], drop=names["drop"],
                                 mask=names["mask"]):
            out[r, i] = eligible[r, i]
    return out


def touch_up(reverse, db, cfg, gen: torch.Generator, final, free: torch.Tensor, forbid=()) -> Iterator:
    """The frames that follow the reverse process's final frame: `final` itself, then for each
    round with unpaired quotes one frame masking them again (`remasked`) and the refill's frames
    (`reverse`: sample._reverse, handed in as the sampler imports this module), run on the rows
    concerned with quote marks excluded. Every frame but the last has touch_up=True, so
    `Frame.done` is True at the very end only; nfe, rows and flops keep counting."""
    quotes = quote_ids(db.tokenizer)
    S = final.steps
    base = {"nfe": final.nfe, "rows": final.rows, "flops": final.flops}
    current = final
    for _ in range(ROUNDS):
        bad = unpaired(db, current.ids, free) if quotes else torch.zeros_like(free)
        if not bad.any():
            break
        yield replace(current, touch_up=True)
        rows = bad.any(1).nonzero().squeeze(1)
        ids, masked = current.ids.clone(), current.masked.clone()
        ids[bad], masked[bad] = db.model.mask_id, True
        confidence = current.confidence.clone()
        confidence[bad] = float("nan")
        nothing = torch.zeros_like(bad)
        current = replace(current, ids=ids, masked=masked, revealed=nothing, remasked=bad, confidence=confidence,
                          row_steps=torch.full((len(ids),), S), touch_up=True)
        yield current
        sub = None
        for sub in reverse(db, replace(cfg, n=len(rows), prompt=None), gen, ids[rows].clone(), tuple(forbid) + tuple(quotes)):
            ids, masked, confidence = current.ids.clone(), current.masked.clone(), current.confidence.clone()
            revealed = torch.zeros_like(masked)
            ids[rows], masked[rows], revealed[rows] = sub.ids, sub.masked, sub.revealed
            confidence[rows] = torch.where(sub.revealed, sub.confidence, confidence[rows])
            current = replace(current, ids=ids, masked=masked, revealed=revealed, remasked=None, confidence=confidence,
                              nfe=base["nfe"] + sub.nfe, rows=base["rows"] + sub.rows, flops=base["flops"] + sub.flops,
                              touch_up=True)
            if not sub.done:
                yield current
        base = {"nfe": current.nfe, "rows": current.rows, "flops": current.flops}
    yield replace(current, touch_up=False)
