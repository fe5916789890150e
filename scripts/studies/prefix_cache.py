"""Issue 39: what the prefix cache (`dbert sample --prefix-cache`) saves on long stories and how far it moves p.

A long story is written window after window (sampling/blocks.py): each continuation window holds the story's
last 128 tokens as given context and 128 new masks. The exact forward recomputes the context at every call;
the prefix cache (maths/prefix_cache.PrefixCache, Fast-dLLM's) keeps the context's keys and values from the window's
first call and computes only the new block. This study samples long stories from the exact p (the texts are
the defaults') and, at every call of a continuation window, also runs the cached forward on the same rows,
reporting KL(p_exact || p_cached) at the positions the sampler reads (mean, 99th percentile, max, in nats)
and how often the most likely token changes; then it times both end to end, one after the other, A B B A.

    python scripts/studies/prefix_cache.py --n 10 --length 900 --min-length 760 > runs/prefix-cache.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from dbert_core.config import SampleConfig
from dbert_core.hardware import cpu_name
from dbert_core.maths.model import DiffusionBert
from dbert_core.sampling.sample import generate, resolve
from dbert_core.storage import checkpoint, store


def kl_rows(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per row of two (M, V) logit arrays (-inf where a token is forbidden in both)."""
    lp, lq = torch.log_softmax(p_logits.double(), -1), torch.log_softmax(q_logits.double(), -1)
    p = lp.exp()
    return torch.where(p > 0, p * (lp - lq), torch.zeros_like(p)).sum(-1)


def measure(db, cfg) -> dict:
    """Sample with the exact p; at each cached call also compute the cached logits and compare."""
    kls, flips, calls = [], 0, 0
    orig = DiffusionBert.forward

    def forward(self, ids, attention, select, t=None, cache=None, rows=None):
        nonlocal flips, calls
        exact = orig(self, ids, attention, select, t)
        if cache is not None:
            used = cache.holds(ids)
            approx = orig(self, ids, attention, select, t, cache=cache, rows=rows)  # the first call fills the cache
            if used and exact.shape[0]:
                calls += 1
                kls.append(kl_rows(exact.float(), approx.float()))
                flips += int((exact.argmax(-1) != approx.argmax(-1)).sum())
        return exact

    DiffusionBert.forward = forward
    try:
        texts, stats = generate(db, cfg)
    finally:
        DiffusionBert.forward = orig
    kl = torch.cat(kls) if kls else torch.zeros(0)
    return {"texts": texts, "stats": stats, "cached_calls": calls, "positions": len(kl),
            "kl_mean": float(kl.mean()) if len(kl) else None,
            "kl_p99": float(kl.quantile(0.99)) if len(kl) else None, "kl_max": float(kl.max()) if len(kl) else None,
            "argmax_changed": flips / max(1, len(kl))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default=None, help="a checkpoint folder (default: the store's default)")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--length", type=int, default=900)
    ap.add_argument("--min-length", type=int, default=760)
    ap.add_argument("--out", default=None, help="write the stories of both runs here (FOLDER/exact.txt, cached.txt)")
    args = ap.parse_args()
    db = checkpoint.load(Path(args.checkpoint) if args.checkpoint else store.default_checkpoint())
    base = SampleConfig(n=args.n, seed=args.seed, length=args.length, min_length=args.min_length)
    cmp = measure(db, resolve(SampleConfig(**{**base.__dict__, "prefix_cache": True}), db))
    timing = {"exact": [], "cached": []}
    texts = {}
    for name in ("exact", "cached", "cached", "exact"):
        cfg = resolve(SampleConfig(**{**base.__dict__, "prefix_cache": name == "cached"}), db)
        t0 = time.perf_counter()
        texts[name], stats = generate(db, cfg)
        timing[name].append({"seconds": round(time.perf_counter() - t0, 2), "nfe": stats["nfe"], "gflop": stats["gflop"]})
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        for name, got in texts.items():
            (Path(args.out) / f"{name}.txt").write_text("\n".join(got) + "\n", encoding="utf-8")
    words = {name: sorted(len(t.split()) for t in got) for name, got in texts.items()}
    out = {"cpu": cpu_name(), "threads": torch.get_num_threads(), "checkpoint": str(db.path), "n": args.n,
           "seed": args.seed, "length": args.length, "min_length": args.min_length,
           **{k: v for k, v in cmp.items() if k not in ("texts", "stats")}, "timing": timing, "words": words}
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
