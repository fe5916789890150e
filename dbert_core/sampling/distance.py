"""How far a decoding strategy's law is from the model's own: total-variation distance between
distributions over whole sequences, estimated from draws, with its noise floor.

On a model small enough (a few tokens, a few candidates per position: top-k), the distribution
of whole sequences can be estimated from enough draws. TV(P, Q) = 1/2 sum_x |P(x) - Q(x)|; its
plug-in estimate from N draws of each is biased upwards by the draws' noise, so it is reported
beside the same estimate for two independent runs of the exact sampler with the same N (the
noise floor): a strategy whose TV stays within the floor's spread cannot be told apart from the
model's law at this N; one well above it samples another law.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import replace

import torch

from ..config import SampleConfig


def sequence_counts(db, cfg: SampleConfig, draws: int, seed: int, batch_size: int = 4096) -> Counter:
    """How often each whole sequence (a tuple of ids) came out of `draws` samples under cfg."""
    from .base import last_frame
    from .sample import frames

    gen = torch.Generator().manual_seed(seed)
    counts: Counter = Counter()
    done = 0
    while done < draws:
        n = min(batch_size, draws - done)
        last = None
        for last in frames(db, replace(cfg, n=n), generator=gen):
            pass
        counts.update(map(tuple, last_frame(last).ids.tolist()))
        done += n
    return counts


def tv(a: Counter, b: Counter) -> float:
    """The plug-in total-variation distance between two empirical distributions."""
    na, nb = sum(a.values()), sum(b.values())
    return 0.5 * sum(abs(a.get(x, 0) / na - b.get(x, 0) / nb) for x in set(a) | set(b))


def tv_table(db, strategies: list[tuple[str, dict | None]], draws: int, length: int = 3, steps: int = 16,
             top_k: int = 3, reference: str = "ancestral", floor_pairs: int = 5, seed: int = 0,
             batch_size: int = 4096, block_repeats: bool = True) -> dict:
    """TV of each (strategy, params) against `reference` (an exact sampler), `draws` each.

    The floor: TV between `floor_pairs` pairs of independent reference runs of `draws` each
    (mean and standard deviation). A row is `outside` when its TV exceeds the floor's mean by
    more than 4 standard deviations and by more than a fifth of the mean (a spread estimated
    from a few pairs can be small by chance)."""
    from .sample import resolve

    base = resolve(SampleConfig(n=1, steps=steps, length=length, top_k=top_k, sampler=reference,
                                block_repeats=block_repeats, pair_quotes=False,
                                fix_contractions=False, known_words=False), db)  # the samplers' own laws
    ref = sequence_counts(db, base, draws, seed, batch_size)
    floors = [tv(sequence_counts(db, base, draws, seed + 1000 + 2 * i, batch_size),
                 sequence_counts(db, base, draws, seed + 1001 + 2 * i, batch_size)) for i in range(floor_pairs)]
    mean = statistics.fmean(floors)
    sd = statistics.stdev(floors) if len(floors) > 1 else 0.0
    limit = mean + max(4 * sd, 0.2 * mean)
    rows = []
    for i, (name, params) in enumerate(strategies):
        cfg = resolve(replace(base, sampler=name, params=params), db)
        from ..strategies import get

        counts = sequence_counts(db, cfg, draws, seed + 1 + i, batch_size)
        d = tv(ref, counts)
        rows.append({"sampler": name, "label": get(name).label, "params": cfg.params, "tv": round(d, 4),
                     "outside": d > limit, "support": len(counts)})
    return {"reference": reference, "draws": draws, "length": length, "steps": steps, "top_k": top_k,
            "block_repeats": block_repeats, "support_reference": len(ref),
            "floor": {"mean": round(mean, 4), "sd": round(sd, 4), "pairs": [round(f, 4) for f in floors],
                      "limit": round(limit, 4)},
            "rows": rows, "sqrt_support_over_draws": round(math.sqrt(len(ref) / draws), 4)}
