"""Training progress on stderr: a live bar on a terminal, plain periodic lines otherwise.

Progress is a courtesy: when its stream fails (a closed terminal after SIGHUP, a full disk,
stderr closed) the bar goes quiet and the run carries on training and saving.
"""

from __future__ import annotations

import functools
import sys
import time

from ..display import cache_line, duration, eta, step_label, tokenizing_line, window_step
from ..training.train import Callback


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


def _can_encode(stream, text: str) -> bool:
    try:
        text.encode(getattr(stream, "encoding", None) or "utf-8")
        return True
    except (UnicodeEncodeError, LookupError):
        return False


class CacheProgress:
    """The token cache's reports (token_cache.cached's `report`, story_data.entry's) on stderr: the
    tokenizing as a live line on a terminal, else a line every 5 s; then one line saying where the
    entry is. `dbert train` hears them through its callbacks (TrainProgress.on_prepare), `dbert eval`
    directly."""

    def __init__(self, stream=None, line=None):
        self.stream = stream or sys.stderr
        try:
            self.live = self.stream.isatty()
        except (OSError, ValueError):
            self.live = False
        self._print = line or (lambda text: print(text, file=self.stream, flush=True))
        self._shown = None  # when the last tokenizing line was written (None: none yet)
        self._open_line = False  # a live tokenizing line waits for its end

    def __call__(self, info: dict) -> None:
        if self.stream is None:
            return
        try:
            self._report(info)
        except (OSError, ValueError):  # a closed or broken progress stream never stops the work
            self.stream = None

    def _report(self, info: dict) -> None:
        if info.get("stage") == "tokenize":
            now = time.perf_counter()
            if self._shown is not None and now - self._shown < (0.25 if self.live else 5.0):
                return
            self._shown = now
            if self.live:
                self.stream.write("\r" + tokenizing_line(info) + "\x1b[K")
                self.stream.flush()
                self._open_line = True
            else:
                self._print(tokenizing_line(info))
            return
        if self._open_line:
            self.stream.write("\n")
            self._open_line = False
        self._print(cache_line(info))


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
        self.cache = CacheProgress(self.stream, self._line)

    def _line(self, text: str) -> None:
        if self.progress is not None:
            self.progress.console.print(text, highlight=False)
        else:
            print(text, file=self.stream, flush=True)

    @_quiet
    def on_prepare(self, trainer, info):
        """The corpus being tokenized into the token cache (CacheProgress)."""
        if trainer.is_main:
            self.cache(info)

    @_quiet
    def on_start(self, trainer):
        self.start = time.perf_counter()
        self.first_step = trainer.step
        db, cfg = trainer.db, trainer.cfg
        from ..maths.model import count_parameters

        if trainer.is_main:
            self._line(f"training {count_parameters(db.model) / 1e6:.2f}M parameters on {trainer.device} "
                       f"x{trainer.world}: {len(trainer.train_examples)} examples, schedule {cfg.schedule}, "
                       f"time {cfg.time}, vocabulary {db.model.config.vocab_size}, "
                       f"from step {trainer.step} to {cfg.max_steps}")
            for line in getattr(trainer.prepared, "documents", None) or ():
                self._line(line)
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
            left = eta(time.perf_counter() - self.start, max(1, done), m["max_steps"] - m["step"])
            self._line(f"step {m['step']}/{m['max_steps']} {info} eta {duration(left)}")

    @_quiet
    def on_eval(self, trainer, m):
        self._line(f"eval step {m['step']}: val ELBO {m['val_nats_per_token']:.4f} nats/token, "
                   f"ppl {m['val_ppl_token']:.2f} ({m['eval_steps']}-step bound)")

    @_quiet
    def on_notice(self, trainer, line):
        self._line(line)

    @_quiet
    def on_checkpoint(self, trainer, path):
        self._line(f"checkpoint step {trainer.step}: {path}")

    @_quiet
    def on_end(self, trainer, m):
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


class SampleProgress:
    """`dbert sample` / `dbert eval` progress on stderr, fed every frame of the run (on_frame):
    on a terminal one live line (samples done, the batch's step, network calls, elapsed, ETA),
    elsewhere a plain line per finished batch, and within a batch one at each window of a long
    story, or after 2 s and then every 10 s of silence. A long story's step is its window and the
    step within it (`window 1/2 · step 40/48`: per_window, the steps of one window, as the TUI's
    status says it). Nothing ever goes to stdout."""

    def __init__(self, total: int, batch_size: int, label: str = "sampling", stream=None, per_window: int = 0):
        self.total, self.batch_size, self.label, self.per_window = total, max(1, batch_size), label, per_window
        self.stream = stream or sys.stderr
        try:
            self.live = self.stream.isatty()
        except (AttributeError, ValueError):
            self.live = False
        self.done = self.nfe = 0
        self.start = time.perf_counter()
        self._shown = 0.0
        self._plain = self.start  # when the last plain line was written (the run's start: none yet)
        self._window: int | None = None  # the window of the batch's last plain line

    def _write(self, text: str) -> None:
        try:
            if not _can_encode(self.stream, "·"):  # an ASCII stream (the C locale): a plain separator
                text = text.replace("·", "-")
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken progress stream never stops the work
            self.live = False
            self.stream = None

    def _eta(self, fraction: float) -> str:
        left = eta(time.perf_counter() - self.start, fraction, 1 - fraction)
        return "?" if left is None else duration(left)

    def __call__(self, frame) -> None:
        if self.stream is None:
            return
        rows = int(frame.ids.shape[0])
        finished = frame.done  # the batch's last frame (the quote touch-up's frames come after the last step)
        batch_nfe = int(frame.nfe)
        if finished:
            self.done = min(self.total, self.done + rows)
            self.nfe += batch_nfe
        now = time.perf_counter()
        elapsed = now - self.start
        fraction = (self.done + (0 if finished else rows * frame.step / max(1, frame.steps))) / self.total
        calls = self.nfe + (0 if finished else batch_nfe)
        where = step_label(frame.step, frame.steps, self.per_window)
        if self.live:
            if finished or now - self._shown > 0.1:
                self._shown = now
                self._write(f"\r{self.label} {self.done}/{self.total} · {where} · {calls} calls · "
                            f"{duration(elapsed)} · eta {self._eta(fraction)}\x1b[K")
        elif finished:
            self._plain, self._window = now, None
            self._write(f"{self.label} {self.done}/{self.total} · {self.nfe} calls · {duration(elapsed)} · "
                        f"eta {self._eta(fraction)}\n")
        else:
            window, windows, _ = window_step(frame.step, frame.steps, self.per_window)
            quiet = now - self._plain >= (2.0 if self._plain == self.start else 10.0)
            if (windows > 1 and window != self._window) or quiet:
                self._plain, self._window = now, window
                self._write(f"{self.label} {self.done}/{self.total} · {where} · {calls} calls · "
                            f"{duration(elapsed)} · eta {self._eta(fraction)}\n")

    def close(self) -> None:
        if self.live and self.stream is not None:
            self._write("\r\x1b[K")


class CountProgress(SampleProgress):
    """Progress of a loop over N items (`dbert eval`'s scoring): update(done) after each batch."""

    def update(self, done: int, fraction: float | None = None) -> None:
        """done of total items; fraction: how much of the work is done, where items finish together
        (infill's ranking scores its texts side by side: done jumps, fraction moves every forward)."""
        if self.stream is None:
            return
        elapsed = time.perf_counter() - self.start
        fraction = done / max(1, self.total) if fraction is None else fraction
        now = time.perf_counter()
        text = f"{self.label} {done}/{self.total} · {duration(elapsed)} · eta {self._eta(fraction)}"
        if self.live:
            if done >= self.total or now - self._shown > 0.1:
                self._shown = now
                self._write(f"\r{text}\x1b[K")
        elif done >= self.total or now - self._shown > 10:  # plain lines: every 10 s and at the end
            self._shown = now
            self._write(text + "\n")
