"""Train a story model within a fixed wall-clock budget (a lent GPU's minutes), keeping the best held-out weights.

The step count is not known before the machine is seen, so it is measured: the run starts with a guess of
max_steps, times steps 10-30, then sets max_steps so that the cosine schedule ends inside --seconds (the
held-out evaluations' time counted in). The shipped weights are scored first (the baseline, same run); every
evaluation that beats the best so far writes the weights in float16 to OUT/best (a checkpoint `dbert` loads).

    python scripts/recipes/train_timed.py --init assets/dbert-minilm-stories --data a.txt --data b.txt \
        --val-data heldout.txt --out runs/gpu-story --seconds 330 --device cuda

Prints progress on stderr (dbert train's lines) and one JSON summary on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from dbert_core.cli.progress import TrainProgress
from dbert_core.config import TrainConfig
from dbert_core.storage import checkpoint as ckpt
from dbert_core.training.train import Callback, Trainer


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class TimeBudget(Callback):
    """Fits max_steps to the time left once steps are timed; stops the run at the hard deadline."""

    def __init__(self, seconds: float, first: int = 10, last: int = 30, margin: float = 15.0):
        self.deadline = time.perf_counter() + seconds  # from the script's start: data and model loading count
        self.first, self.last, self.margin = first, last, margin
        self.eval_s = 0.0
        self.summary: dict = {}

    def on_start(self, trainer):
        t0 = time.perf_counter()
        ev = trainer.evaluate()  # the starting weights, scored as every later evaluation is
        _sync(trainer.device)
        self.eval_s = time.perf_counter() - t0
        ev["step"] = 0
        trainer.history.append(ev)
        for cb in trainer.callbacks:
            if cb is not self:
                cb.on_eval(trainer, ev)
        self.summary.update(start_val_ppl=ev["val_ppl_token"], eval_seconds=round(self.eval_s, 2))

    def on_step(self, trainer, metrics):
        now = time.perf_counter()
        if metrics["step"] == self.first:
            _sync(trainer.device)
            self.t_first = time.perf_counter()
        elif metrics["step"] == self.last:
            _sync(trainer.device)
            now = time.perf_counter()
            step_s = (now - self.t_first) / (self.last - self.first)
            c = trainer.cfg
            left = self.deadline - now - self.margin
            per_step = step_s + (self.eval_s / c.eval_every if c.eval_every else 0.0)
            steps = self.last + max(0, int(left / per_step))
            c.max_steps = max(steps, c.warmup + 1)  # the loop and the schedule read this same config
            tokens = metrics["tokens_seen"] / metrics["step"]
            self.summary.update(step_seconds=round(step_s, 4), tokens_per_step=round(tokens),
                                tokens_per_s=round(tokens / step_s), max_steps=c.max_steps)
            print(f"time budget: {step_s * 1000:.1f} ms a step, {tokens / step_s:,.0f} tokens/s, "
                  f"evaluation {self.eval_s:.1f} s: max_steps set to {c.max_steps}", file=sys.stderr, flush=True)
        if now > self.deadline:
            trainer.stop()


class KeepBest(Callback):
    """Writes the weights in float16 to `folder` whenever the held-out bound is the best so far."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.best = float("inf")
        self.best_step = None
        self.last_eval = None

    def on_eval(self, trainer, metrics):
        self.last_eval = metrics["step"]
        if metrics["step"] > 0 and metrics["val_ppl_token"] < self.best:
            self.best, self.best_step = metrics["val_ppl_token"], metrics["step"]
            trainer.db.meta.update(step=trainer.step, tokens_seen=trainer.tokens_seen,
                                   val_ppl_token=round(float(self.best), 3), train_config=trainer.cfg.to_dict())
            ckpt.save(trainer.db, self.folder, dtype=torch.float16)
            print(f"best so far at step {trainer.step}: {self.best:.3f}, saved to {self.folder}", file=sys.stderr,
                  flush=True)

    def on_end(self, trainer, metrics):
        if self.last_eval != trainer.step:  # the final weights, unless just scored
            ev = trainer.evaluate()
            trainer.history.append(ev)
            print(f"eval step {ev['step']}: ppl {ev['val_ppl_token']:.2f} (final)", file=sys.stderr, flush=True)
            self.on_eval(trainer, ev)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--init", required=True)
    p.add_argument("--data", action="append", required=True)
    p.add_argument("--val-data", action="append", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--seconds", type=float, required=True, help="wall-clock budget from start to the last save")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--warmup", type=int, default=300)
    p.add_argument("--max-steps", type=int, default=100_000, help="a first guess; fitted to --seconds at step 30")
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--seed", type=int, default=8)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    a = p.parse_args(argv)
    budget = TimeBudget(a.seconds)
    out = Path(a.out).absolute()
    cfg = TrainConfig(data=[str(Path(f).absolute()) for f in a.data], val_data=[str(Path(f).absolute()) for f in a.val_data],
                      out=str(out / "last"), preset=None, init=a.init, unit="story", seq_len=a.seq_len,
                      batch_size=a.batch_size, lr=a.lr, warmup=a.warmup, max_steps=a.max_steps, schedule="spindle",
                      time="none", eval_every=a.eval_every, save_every=0, log_every=50, seed=a.seed, device=a.device,
                      dtype=a.dtype)
    keep = KeepBest(out / "best")
    trainer = Trainer(cfg, [budget, TrainProgress(cfg.log_every), keep])
    t0 = time.perf_counter()
    result = trainer.run()
    summary = {"device": str(trainer.device), "steps": trainer.step, "tokens_seen": trainer.tokens_seen,
               "seconds": round(time.perf_counter() - t0, 1), "best_val_ppl": keep.best, "best_step": keep.best_step,
               "stopped_at_deadline": bool(result.get("stopped")), **budget.summary,
               "evals": [h for h in trainer.history if "val_ppl_token" in h]}
    if trainer.device.type == "cuda":
        summary["gpu"] = torch.cuda.get_device_name(trainer.device)
        summary["max_memory_gb"] = round(torch.cuda.max_memory_allocated(trainer.device) / 2**30, 2)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
