"""Training tokens/s and model FLOP utilisation (MFU) at a story model's shapes, on this machine.

    python scripts/studies/train_mfu.py [--checkpoint DIR] [--batch 16] [--seq-len 256]
        [--steps 3] [--threads 1,2] [--dtype fp32,bf16] [--malloc cli|default] [--out DIR]

For each dtype x thread count: the trainer's own optimizer steps (dropout, loss, fused AdamW,
autocast as `dbert train` runs them; random token ids, so no data set is needed) on a copy of the
checkpoint (default: the shipped one), and F.linear's rate at the same shapes (batch x seq_len
tokens, half the positions projected to the vocabulary) measured in the same process with the
same threads; glibc's malloc set as the `dbert` program sets it (--malloc default: its own). MFU = model FLOPs per second (3x the forwards' FLOPs, counted from the forwards the
steps run) / that rate. Cases alternate rate and step measurements within a case, so a busy
machine moves both alike; the load average is printed next to each line. JSON lines on stdout.
"""

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", help="checkpoint directory (default: the shipped one)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--dtype", default="fp32", help="comma list of fp32, bf16")
    ap.add_argument("--out", help="directory for bench.json / bench.md of the last case (default: a temporary one)")
    ap.add_argument("--malloc", choices=("cli", "default"), default="cli",
                    help="cli: glibc keeps freed arrays for reuse, as the dbert program asks (heap.py); default: glibc's own")
    args = ap.parse_args()
    if args.malloc == "cli":
        from dbert_core.heap import keep_freed_memory

        keep_freed_memory()  # as `dbert train` runs (cli.main)
    from dbert_core.evaluation.bench import Bench
    from dbert_core.hardware import cpu_name
    from dbert_core.storage import checkpoint, store

    path = Path(args.checkpoint) if args.checkpoint else store.default_checkpoint()
    db = checkpoint.load(path)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp())
    for dtype in args.dtype.split(","):
        for n in (int(x) for x in args.threads.split(",")):
            torch.set_num_threads(n)
            bench = Bench(db, out, args.seq_len, quick=True, reps=3)
            bench.train(batch=args.batch, seq_len=args.seq_len, steps=args.steps, dtype=dtype)
            t = bench.result["train"]
            print(json.dumps({"cpu": cpu_name(), "load_average": [round(x, 2) for x in os.getloadavg()],
                              "checkpoint": path.name, "malloc": args.malloc, **t}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
