"""Quote pairing: the sampler's touch-up for quotation marks that pair with none.

A small diffusion LM places each `"` from what it sees around that position, so a sample can
open a quotation it never closes, or close one it never opened. After the reverse process, each
row's unpaired quotes (detok.unpaired_quotes: the same reading of opening and closing quotes the
printed text uses) are masked again and refilled by the same sampler, with quote marks excluded,
conditioned on everything else: the model chooses what stands there instead (a word, a comma, a
full stop). Up to `touchup.ROUNDS` rounds, since a refill changes its neighbours' reading. Only positions
the sampler filled are touched: a prompt's own quotes stay. This is a heuristic (like the repeat
block it reshapes the output), on by default (`SampleConfig.pair_quotes`), off with
`dbert sample --unpaired-quotes` (the model's own quotes). The touch-up's loop, shared with the
contraction touch-up, is touchup.py: a viewer sees the stray quotes masked again and refilled.
"""

from __future__ import annotations

import torch

from .detok import special_names, unpaired_quotes

QUOTE_PIECES = ('"', "`", "\u201c", "\u201d")  # the curly ones print as '"' (detok), so they pair as one


def quote_ids(tokenizer) -> list[int]:
    """The vocabulary ids of the double-quote pieces (those the tokenizer has)."""
    return tokenizer.ids_of(QUOTE_PIECES)


def unpaired(db, ids: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """(B, L) bool: the eligible positions of each row of ids holding a quote that pairs with none."""
    names = special_names(db.tokenizer)
    out = torch.zeros_like(eligible)
    for r, row in enumerate(ids.tolist()):
        for i in unpaired_quotes(db.tokenizer.convert_ids_to_tokens(row), sep=names["sep"], drop=names["drop"],
                                 mask=names["mask"]):
            out[r, i] = eligible[r, i]
    return out
