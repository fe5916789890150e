"""How cheap can infill's ranking be and keep its choice? (docs/usage.md, "Infill's ranking")

For each prompt the shipped model draws the candidates of `dbert sample PROMPT --seed 1`
(every length of the [MASK*A-B] span, --candidates 4), once; they are then ranked by the
S-step bound per token with D corruptions (infill.bound), for several (S, D, precision), and
each ranking's top 3 is compared with the reference's: the 32-step bound over 8 corruptions in
float32 with the seed's draws (the ranking before this study). "another draw" is the reference
itself with other corruptions (seed 2): how much of the reference's top 3 is its own noise.

    python scripts/studies/infill_ranking.py                 # every prompt, every ranking
    python scripts/studies/infill_ranking.py 2 3 --quick     # prompts 2 and 3: the reference and the cheap ones
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

from dbert_core import config
from dbert_core.sampling import infill
from dbert_core.sampling.sample import resolve
from dbert_core.storage import checkpoint, store

PROMPTS = ["Tom had a [MASK*1-6] dog.",
           "Once upon a time, there was a [MASK*1-6] who lived in a small house.",
           "Lily went to the [MASK*1-6] to play with her friends.",
           "The cat [MASK*1-6] and fell asleep under the tree."]
VARIANTS = [("reference", "fp32", 32, 8, 1), ("another draw", "fp32", 32, 8, 2), ("bf16", "bf16", 32, 8, 1),
            ("bf16", "bf16", 16, 8, 1), ("bf16", "bf16", 32, 4, 1), ("bf16", "bf16", 16, 4, 1),
            ("bf16", "bf16", 8, 8, 1), ("bf16", "bf16", 8, 4, 1), ("bf16", "bf16", 16, 2, 1),
            ("bf16", "bf16", 8, 2, 1)]


def top(texts, nats, tokens, k=3):
    order = sorted(range(len(texts)), key=lambda i: nats[i] / tokens[i])
    return [texts[i] for i in order[:k]]


QUICK = [VARIANTS[0], ("bf16", "bf16", 16, 4, 1), ("bf16", "bf16", 32, 4, 1)]


def main() -> None:
    args = sys.argv[1:]
    variants = QUICK if "--quick" in args else VARIANTS
    picked = [PROMPTS[int(a) - 1] for a in args if a.isdigit()] or PROMPTS
    db = checkpoint.load(store.resolve("default"))
    results = {v: [] for v in variants}  # (top-3 overlap, same top 1, seconds) per prompt
    for prompt in picked:
        cfg = resolve(replace(config.SampleConfig(n=3, seed=1), prompt=prompt), db)
        drawn = infill.infill(db, cfg, per_length=4, score_steps=1, draws=1)  # the candidates; scores unused
        texts, rows = [c.text for c in drawn], [c.ids for c in drawn]
        tokens = [len(r) for r in rows]
        ref = None
        for v in variants:
            name, dtype, S, D, seed = v
            start = time.perf_counter()
            nats = infill.bound(db, rows, S, seed, D, dtype)
            sec = time.perf_counter() - start
            best = top(texts, nats, tokens)
            ref = best if ref is None else ref
            results[v].append((len(set(best) & set(ref)) / 3, best[0] == ref[0], sec))
            print(f"{prompt[:30]!r:34} {name:13} S={S:2} D={D} {sec:6.1f}s top3 {best}", file=sys.stderr, flush=True)
    print(f"| ranking | steps S | draws D | top-3 agreement | same best | seconds (first prompt) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for v, r in results.items():
        name, dtype, S, D, seed = v
        agree = sum(x[0] for x in r) / len(r)
        same = sum(x[1] for x in r)
        print(f"| {name} | {S} | {D} | {agree:.0%} | {same}/{len(r)} | {r[0][2]:.1f} |")


if __name__ == "__main__":
    main()
