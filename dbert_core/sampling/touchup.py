"""The touch-up: after the reverse process, what a reader sees wrong at once is masked again and refilled.

Three checks, each a heuristic on by default and off by its own flag:
- quotes (quotes.py, `SampleConfig.pair_quotes`, `--unpaired-quotes`): a double quote that pairs
  with none; refilled with quote marks excluded;
- contractions (contractions.py, `SampleConfig.fix_contractions`, `--raw-contractions`): a word,
  apostrophe and suffix English does not join ("you't", "friends's"), so the model writes the
  words another way ("you can", "friends");
- made-up words (lexicon.py, `SampleConfig.known_words`, `--made-up-words`): pieces side by side that
  spell a word the checkpoint's training text never writes ("littlewirled"); refilled with nothing
  excluded (a checkpoint without its word list, dbert_words.json, is not checked).
Both refills exclude the apostrophes and the suffix pieces too (contractions.join_ids): denied a
double quote, the model wrote a single one in its place ("'The little girl"), and a lone suffix
piece is no word.

Each round finds what the checks flag, masks those positions again and refills them with the same
sampler, conditioned on everything else, excluding what the checks that flagged something exclude.
Up to ROUNDS rounds, since a refill changes its neighbours' reading. Only positions the sampler filled
are touched: a prompt's own text stays. The rounds are frames of the run (`Frame.touch_up`), so a
viewer sees the stray pieces masked again and refilled, and nfe, rows and flops keep counting.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterator

import torch

from ..text import contractions, lexicon, quotes

ROUNDS = 3


@dataclass(frozen=True)
class Check:
    find: Callable  # (db, ids (B, L), eligible (B, L) bool) -> (B, L) bool: the positions to refill
    exclude: tuple[int, ...]  # ids the refill of what it found never draws


def checks(db, cfg) -> list[Check]:
    """The checks cfg turns on that the vocabulary can fail (a tokenizer without quote marks has
    no unpaired quotes)."""
    out, joins = [], tuple(contractions.join_ids(db.tokenizer))
    if cfg.pair_quotes and (q := quotes.quote_ids(db.tokenizer)):
        out.append(Check(quotes.unpaired, tuple(q) + joins))
    if cfg.fix_contractions and contractions.apostrophe_ids(db.tokenizer):
        out.append(Check(contractions.broken_positions, joins))
    if cfg.known_words and getattr(db, "words", None) is not None:
        out.append(Check(lexicon.made_up_positions, ()))
    return out


def touch_up(reverse, db, cfg, gen: torch.Generator, final, free: torch.Tensor, forbid=(), top=None) -> Iterator:
    """The frames that follow the reverse process's final frame: `final` itself, then for each
    round with something flagged one frame masking it again (`remasked`) and the refill's frames
    (`reverse`: sample._reverse, handed in as sample.py imports this module), run on the rows
    concerned. Every frame but the last has touch_up=True, so `Frame.done` is True at the very end
    only. top: the run's inspector.TopK recorder, given the refills' candidates too."""
    from .inspector import TopK

    on = checks(db, cfg)
    S = final.steps
    base = {"nfe": final.nfe, "rows": final.rows, "flops": final.flops}
    current = final
    for _ in range(ROUNDS):
        bad, exclude = torch.zeros_like(free), tuple(forbid)
        for check in on:
            found = check.find(db, current.ids, free)
            if found.any():
                bad |= found
                exclude += check.exclude
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
        sub_top = TopK((len(rows), ids.shape[1]), top.k) if top is not None else None
        for sub in reverse(db, replace(cfg, n=len(rows), prompt=None), gen, ids[rows].clone(), exclude, sub_top):
            if sub_top is not None:  # (top is) the refilled positions' candidates replace those of their first reveal
                fresh = (sub_top.ids[..., 0] >= 0).unsqueeze(-1)
                top.ids[rows] = torch.where(fresh, sub_top.ids, top.ids[rows])
                top.probs[rows] = torch.where(fresh, sub_top.probs, top.probs[rows])
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
