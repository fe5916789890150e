"""Training progress on stderr: a live bar on a terminal, plain periodic lines otherwise.

Progress is a courtesy: when its stream fails (a closed terminal after SIGHUP, a full disk,
stderr closed) the bar goes quiet and the run carries on training and saving.
"""

from __future__ import annotations

import functools
import sys
import time

from .train import Callback


def _quiet(method):
    """A hook that stops reporting, instead of stopping the run, when the stream fails."""

    @functools.wraps(method)
    def hook(self, *args):
        if self.failed:
            return None
        try:
            return method(self, *args)
        except (OSError, ValueError):  # EIO, EPIPE, ENOSPC; ValueError: the stream was closed
            self.failed = True
            progress, self.progress = self.progress, None
            if progress is not None:
                try:
                    progress.live.stop()
                except Exception:  # noqa: BLE001 - its last refresh fails the same way
                    pass
            return None

    return hook


def _fmt_time(seconds: float) -> str:
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class TrainProgress(Callback):
    def __init__(self, every: int = 10, stream=None):
        self.every = max(1, every)
        self.stream = stream or sys.stderr
        try:
            self.live = self.stream.isatty()
        except (OSError, ValueError):
            self.live = False
        self.progress = None
        self.failed = False

    def _line(self, text: str) -> None:
        if self.progress is not None:
            self.progress.console.print(text, highlight=False)
        else:
            print(text, file=self.stream, flush=True)

    @_quiet
    def on_start(self, trainer):
        self.start = time.perf_counter()
        self.first_step = trainer.step
        db, cfg = trainer.db, trainer.cfg
        from .model import count_parameters

        if trainer.is_main:
            self._line(f"training {count_parameters(db.model) / 1e6:.1f}M parameters on {trainer.device} "
                       f"x{trainer.world}: {len(trainer.train_examples)} examples, schedule {cfg.schedule}, "
                       f"time {cfg.time}, vocabulary {db.model.config.vocab_size}, "
                       f"from step {trainer.step} to {cfg.max_steps}")
            if db.model.bert.fresh_head:  # expected for a BertModel --init (a sentence encoder)
                self._line(f"--init {cfg.init} has no MLM head (a BertModel): the head starts at random")
        if self.live and trainer.is_main:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.progress = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                                     TimeRemainingColumn(), console=Console(file=self.stream), redirect_stdout=False,
                                     redirect_stderr=False, transient=False)
            self.progress.start()
            self.task = self.progress.add_task("train", total=cfg.max_steps, completed=trainer.step, info="")

    @_quiet
    def on_step(self, trainer, m):
        if not trainer.is_main:
            return
        info = f"loss {m['loss_elbo']:.3f} ce {m['loss_ce']:.3f} lr {m['lr']:.2e} {m['tokens_per_s']:.0f} tok/s"
        if self.progress is not None:
            self.progress.update(self.task, completed=m["step"], info=info)
        elif m["step"] % self.every == 0 or m["step"] == m["max_steps"]:
            done = m["step"] - self.first_step
            eta = (time.perf_counter() - self.start) / max(1, done) * (m["max_steps"] - m["step"])
            self._line(f"step {m['step']}/{m['max_steps']} {info} eta {_fmt_time(eta)}")

    @_quiet
    def on_eval(self, trainer, m):
        self._line(f"eval step {m['step']}: val ELBO {m['val_nats_per_token']:.4f} nats/token, "
                   f"ppl {m['val_ppl_token']:.2f} ({m['eval_steps']}-step bound)")

    @_quiet
    def on_checkpoint(self, trainer, path):
        self._line(f"checkpoint step {trainer.step}: {path}")

    @_quiet
    def on_end(self, trainer, m):
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
