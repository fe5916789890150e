"""`dbert sample --n 10` at the defaults with 1 and with 2 threads, alternating, in one process.

    python scripts/studies/sample_threads.py [--threads 1,2] [--rounds 1]

Loads the shipped checkpoint, resolves the CLI's defaults, runs a short warm-up, then for each
round generates once per thread count (the order reversed every other round, so drift of a
shared machine hits both alike). One JSON line per run: threads, load average at its start,
seconds, GFLOP (the frames' count) and GFLOP/s, on the CPU named.
"""

import argparse
import dataclasses
import json
import os
import sys

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    from dbert_core.config import SampleConfig
    from dbert_core.hardware import cpu_name
    from dbert_core.sampling.sample import generate, resolve
    from dbert_core.storage import checkpoint, store

    db = checkpoint.load(store.default_checkpoint())
    cfg = resolve(SampleConfig(seed=0), db)
    generate(db, dataclasses.replace(cfg, n=1, length=16))  # warm-up
    counts = [int(x) for x in args.threads.split(",")]
    for r in range(args.rounds):
        for n in (counts if r % 2 == 0 else counts[::-1]):
            torch.set_num_threads(n)
            load = os.getloadavg()[0]
            _, st = generate(db, cfg)
            print(json.dumps({"cpu": cpu_name(), "threads": n, "load_average": round(load, 2), "seconds": st["seconds"],
                              "calls": st["nfe"], "gflop": st["gflop"],
                              "gflop_per_s": round(st["gflop"] / st["seconds"], 1)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
