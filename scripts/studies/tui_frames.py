"""Issue 39: how many frames a second the TUI's worker makes for one story (the Generate screen's defaults).

Runs the TUI's own worker loop (dbert_tui.runs.produce) on the shipped checkpoint with the
Generate screen's settings (one story, seed 0, the CLI's sampler and length) and no pacing
(pace_ms 0: as fast as the model goes), and reports the frames it hands to the screen, their rate,
and the time between frames (median and 90th percentile). Drawing a frame happens on the UI thread
while the worker computes the next one, so this is the rate the screen can show.

    python scripts/studies/tui_frames.py --threads 2 [--seeds 0,1,2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default=None, help="a checkpoint folder (default: the store's default)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seeds", default="0,1,2")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from dbert_core.heap import keep_freed_memory

    keep_freed_memory()  # as the dbert and dbert-tui programs do (dbert_core/heap.py)
    from pathlib import Path

    from dbert_core.hardware import cpu_name
    from dbert_core.sampling.sample import resolve
    from dbert_core.storage import checkpoint, store
    from dbert_tui.controller import Settings
    from dbert_tui.runs import Run, produce

    db = checkpoint.load(Path(args.checkpoint) if args.checkpoint else store.default_checkpoint())
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        settings = resolve(Settings(seed=seed, pace_ms=0), db)
        stamps: list[float] = []
        start = time.perf_counter()
        produce(Run(0, settings), db, lambda: False, lambda rec: stamps.append(time.perf_counter()))
        gaps = [b - a for a, b in zip([start, *stamps], stamps)]
        total = stamps[-1] - start
        rows.append({"seed": seed, "frames": len(stamps), "seconds": round(total, 2),
                     "frames_per_s": round(len(stamps) / total, 1),
                     "gap_median_ms": round(1000 * statistics.median(gaps), 1),
                     "gap_p90_ms": round(1000 * statistics.quantiles(gaps, n=10)[-1], 1)})
    print(json.dumps({"cpu": cpu_name(), "threads": args.threads, "load": round(os.getloadavg()[0], 2),
                      "length": settings.length, "steps": settings.steps, "sampler": settings.sampler,
                      "runs": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
