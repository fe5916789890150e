"""Where `dbert sample --n 10` spends its time: torch.profiler over the sampling, at the defaults.

    python scripts/studies/profile_sample.py [--checkpoint DIR] [--threads 2] [--rows 16] [--repeats 3] [--steps S] [--cache-refresh K] [--cache-masked | --no-cache-masked] [--workers W] [--shapes]

Loads the checkpoint (default: the shipped one), resolves the CLI's defaults (SampleConfig, as
`dbert sample --n 10` does), runs a short untimed warm-up generation, then `--repeats` timed
generations without the profiler (the same seed: the same samples, the same calls) and one under
it. Prints the CPU (hardware.cpu_name), the load average, the sampling's seconds (each timed run
and the one under the profiler, whose own bookkeeping of some 60,000 small operations adds to
it), network calls and GFLOP (the frames' own count), the GFLOP/s of the best timed run and of
the profiled one as fractions of F.linear's rate at the model's shapes (evaluation.bench.shape_rates,
same process, same threads, same dtype, measured between them; with batches side by side the higher
of that and evaluation.bench.side_by_side_rate), and the profiler's table by self
CPU time.
"""

import argparse
import dataclasses
import os
import sys
from pathlib import Path

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", help="checkpoint directory (default: the shipped one)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=16, help="rows of the profiler's table")
    ap.add_argument("--shapes", action="store_true", help="the table by operation and input shapes")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs without the profiler (the best is reported)")
    ap.add_argument("--cache-refresh", type=int, default=None, help="the decided-position cache (default: the checkpoint's; 0: the exact forward)")
    ap.add_argument("--steps", type=int, default=None, help="reverse steps (default: the checkpoint's)")
    ap.add_argument("--workers", type=int, default=None, help="batches side by side (default: the CLI's, sampling/parallel.py)")
    ap.add_argument("--cache-masked", action=argparse.BooleanOptionalAction, default=None,
                    help="keep [MASK] positions' states too (default: the checkpoint's); --no-cache-masked: computed every call")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from dbert_core.heap import keep_freed_memory

    keep_freed_memory()  # as the dbert and dbert-tui programs do (dbert_core/heap.py)
    from dbert_core.config import SampleConfig
    from dbert_core.evaluation.bench import shape_rates, side_by_side_rate
    from dbert_core.hardware import cpu_name
    from dbert_core.sampling.sample import generate, resolve
    from dbert_core.storage import checkpoint, store

    path = Path(args.checkpoint) if args.checkpoint else store.default_checkpoint()
    db = checkpoint.load(path)
    cfg = resolve(SampleConfig(seed=0, steps=args.steps, cache_refresh=args.cache_refresh,
                                    cache_masked=args.cache_masked, workers=args.workers), db)
    generate(db, dataclasses.replace(cfg, n=1, length=16, min_length=0))  # warm-up: the kernels' first calls
    timed = [generate(db, cfg)[1] for _ in range(args.repeats)]
    dtype = torch.bfloat16 if cfg.dtype == "bf16" else torch.float32  # what the network computed in (bf16: autocast)
    B = min(cfg.n, cfg.batch_size)
    one = shape_rates(db.model.config, B, cfg.length + 2, B * cfg.length, dtype, torch.device("cpu"), reps=3)["model"]
    apart = side_by_side_rate(db.model.config, B, cfg.length + 2, B * cfg.length, dtype, torch.device("cpu"),
                              cfg.workers, reps=3) if cfg.workers > 1 and args.threads > 1 else 0.0
    rate = max(one, apart)  # the limit: the products as one batch on every thread, or as the batches side by side
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=args.shapes) as prof:
        _, st = generate(db, cfg)
    best = min(timed, key=lambda s: s["seconds"]) if timed else st
    print(f"CPU: {cpu_name()}, {args.threads} threads, torch {torch.__version__}, load average {os.getloadavg()[0]:.2f}")
    print(f"{path.name}: {cfg.sampler}, n {cfg.n}, length {cfg.length}, {str(dtype).removeprefix('torch.')}: "
          f"{st['nfe']} calls in {st['batches']} batches ({st['at_once']} side by side), {st['gflop']} GFLOP; "
          f"F.linear's rate at the model's shapes ({B} x {cfg.length + 2}) {one:.1f} GFLOP/s"
          + (f", as {cfg.workers} batches side by side {apart:.1f}" if apart else "") + f": the limit {rate:.1f}")
    for label, s in (("timed", best), ("profiled", st)):
        achieved = s["gflop"] / s["seconds"]
        runs = " / ".join(f"{t['seconds']:.2f}" for t in timed) if label == "timed" else f"{s['seconds']:.2f}"
        print(f"  {label:8s} {runs} s: {achieved:.1f} GFLOP/s = {100 * achieved / rate:.0f}% of the rate"
              + (" (the best run)" if label == "timed" and len(timed) > 1 else ""))
    print(prof.key_averages(group_by_input_shape=args.shapes).table(sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=40))
    return 0


if __name__ == "__main__":
    sys.exit(main())
