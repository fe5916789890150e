"""What leaving a story's decided end out of the forward saves (`dbert train --hide-end-padding`).

    python scripts/studies/end_padding.py CHECKPOINT [--n 10] [--rounds 2] [--threads 2] > end_padding.json

1. The cost of one more forward call, in tokens (what `maths.end_padding.OVERHEAD` stands for): the
   model's forward (bf16 autocast where native) timed at rows x tokens shapes a sampler's groups
   take, fitted as seconds = a + b * rows * tokens; a / b is the call's price in tokens.
2. `dbert sample --n N --seed 0` at the checkpoint's defaults, in this process, A B A B: rows cropped
   to their own length in groups (the sampler's way), and not cropped at all (the same model
   reading its whole window, the hidden padding masked): seconds, calls, GFLOP, and whether the
   texts are the same. The checkpoint must have been trained with --hide-end-padding.
One JSON object on stdout; the CPU is named in it.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import torch


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def call_price(db, bf16: bool, reps: int = 5) -> dict:
    """Forward seconds at rows x tokens shapes; the fit a + b * rows * tokens."""
    shapes = [(1, 130), (1, 258), (2, 130), (2, 258), (4, 200), (6, 258), (10, 258)]
    V = db.model.config.vocab_size
    out = []
    for rows, tokens in shapes:
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(1000, V, (rows, tokens), generator=g)
        att = torch.ones_like(ids, dtype=torch.bool)
        sel = torch.zeros_like(att)
        sel[:, 1::4] = True  # a quarter of the positions projected, as in a sampler's early calls
        best = float("inf")
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            db.model(ids, att, sel)
            for _ in range(reps):
                t0 = time.perf_counter()
                db.model(ids, att, sel)
                best = min(best, time.perf_counter() - t0)
        out.append({"rows": rows, "tokens": tokens, "seconds": round(best, 5)})
    x = torch.tensor([[1.0, r["rows"] * r["tokens"]] for r in out], dtype=torch.float64)
    y = torch.tensor([r["seconds"] for r in out], dtype=torch.float64)
    a, b = torch.linalg.lstsq(x, y.unsqueeze(1)).solution.squeeze(1).tolist()
    return {"shapes": out, "a_seconds": round(a, 5), "b_seconds_per_token": b, "call_in_tokens": round(a / b, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from dbert_core.config import SampleConfig
    from dbert_core.hardware import compute_dtype
    from dbert_core.sampling import base
    from dbert_core.sampling.sample import generate, resolve
    from dbert_core.storage import checkpoint

    db = checkpoint.load(a.checkpoint)
    if not db.model.hide_end_padding:
        print(f"end_padding: {a.checkpoint} was not trained with --hide-end-padding", file=sys.stderr)
        return 1
    cfg = resolve(SampleConfig(n=a.n, seed=0, dtype="auto"), db)
    bf16 = compute_dtype("auto", db.device) == "bf16"
    report = {"cpu": cpu_name(), "threads": a.threads, "checkpoint": a.checkpoint, "bf16": bf16,
              "steps": cfg.steps, "top_k": cfg.top_k, "top_p": cfg.top_p, "n": a.n,
              "price": call_price(db, bf16)}
    whole = base.needed_lengths
    runs = []
    for r in range(a.rounds):
        for crop in (True, False):
            base.needed_lengths = whole if crop else (lambda hidden, select: torch.full((len(hidden),), hidden.shape[1]))
            t0 = time.perf_counter()
            texts, stats = generate(db, cfg)
            runs.append({"crop": crop, "round": r, "seconds": round(time.perf_counter() - t0, 2), "nfe": stats["nfe"],
                         "rows": stats["rows"], "gflop": stats["gflop"], "texts": texts})
    base.needed_lengths = whole
    same = all(x["texts"] == runs[0]["texts"] for x in runs if x["crop"]) and \
        all(x["texts"] == runs[1]["texts"] for x in runs if not x["crop"])
    report["same_texts_cropped_and_not"] = runs[0]["texts"] == runs[1]["texts"]
    report["repeatable"] = same
    report["runs"] = [{k: v for k, v in x.items() if k != "texts"} for x in runs]
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
