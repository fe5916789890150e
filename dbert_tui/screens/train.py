"""The Train screen: set up a run, watch loss / validation ELBO / tokens per second live, stop and
resume; the result lands in the store."""

from __future__ import annotations

import glob
import time
from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Button, Footer, Header, Input, Label, Select, Sparkline, Static
from textual.worker import get_current_worker

from dbert_core.config import DEVICES, PRESETS, SCHEDULES, TIME_MODES, TrainConfig

from ..messages import StoreChanged, TrainEval, TrainFinished, TrainPreview, TrainProgress
from ..workers import ReportWorkerErrors
from .dialogs import FileDialog

D = TrainConfig(data=[], out="")  # the form opens with `dbert train`'s defaults
WATCH_LOG_EVERY = 1  # the one setting the screen changes from `dbert train`: the chart keeps every step


def _mean(values) -> float:
    """Sparkline buckets show the mean (the default, max, exaggerates a noisy loss)."""
    return sum(values) / len(values)


def _fmt_time(seconds: float) -> str:
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class TuiCallback:
    """Training callback (runs on the worker thread): records metrics, posts messages, and
    turns the worker's cancellation into Trainer.stop() (which saves a checkpoint)."""

    def __init__(self, screen: "TrainScreen", worker, sample_every: int, sample_length: int):
        self.screen = screen
        self.worker = worker
        self.sample_every = sample_every
        self.sample_length = sample_length

    def on_start(self, trainer):
        self.start = time.perf_counter()
        self.first = trainer.step
        self.screen.post_message(TrainProgress({"step": trainer.step, "max_steps": trainer.cfg.max_steps,
                                                "starting": True}))

    def on_step(self, trainer, m):
        if self.worker.is_cancelled:
            trainer.stop()
        done = m["step"] - self.first
        eta = (time.perf_counter() - self.start) / max(1, done) * (m["max_steps"] - m["step"])
        self.screen.losses.append(m["loss_elbo"])
        self.screen.post_message(TrainProgress(dict(m, eta=eta)))
        if self.sample_every and m["step"] % self.sample_every == 0 and m["step"] < m["max_steps"]:
            self.preview(trainer, m["step"])

    def preview(self, trainer, step: int):
        from dbert_core.sample import generate

        model = trainer.db.model
        model.eval()
        try:
            steps = min(32, trainer.db.schedule.T)
            texts, _ = generate(trainer.db, n=1, seed=0, length=self.sample_length, steps=steps, top_k=30)
        finally:
            model.train()
        self.screen.post_message(TrainPreview(step, texts[0]))

    def on_eval(self, trainer, m):
        self.screen.vals.append(m["val_nats_per_token"])
        self.screen.post_message(TrainEval(m))

    def on_checkpoint(self, trainer, path):
        pass

    def on_end(self, trainer, m):
        pass


class TrainScreen(ReportWorkerErrors, Screen):
    BINDINGS = [
        Binding("f5", "start", "Start"),
        Binding("f6", "stop", "Stop"),
        Binding("f7", "resume", "Resume"),
        Binding("ctrl+o", "browse", "Add file"),
    ]

    def __init__(self, data: list[str] | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.default_data = data or []
        self.browse_root = str(Path(self.default_data[0]).parent) if self.default_data else "."
        self.losses: list[float] = []
        self.vals: list[float] = []
        self.trainer = None
        self.out: Path | None = None
        self._latest: dict | None = None
        self._drawn_at = 0.0
        self._redraw_pending = False

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="tr-main"):
            with VerticalScroll(id="tr-form"):
                yield Label("data: files or globs, comma-sep.")
                yield Input(", ".join(self.default_data), placeholder="corpus.txt, more/*.txt", id="tr-data")
                yield Label("output: store name")
                yield Input("my-dbert", id="tr-out")
                yield Label("preset (random init)")
                yield Select([(p, p) for p in PRESETS], value=D.preset, allow_blank=False, id="tr-preset")
                yield Label("or init: a BERT dir or hub id")
                yield Input("", placeholder="(optional)", id="tr-init")
                yield Label("steps · batch · seq len · T")
                with Horizontal(classes="tr-row"):
                    yield Input(str(D.max_steps), id="tr-steps", type="integer")
                    yield Input(str(D.batch_size), id="tr-batch", type="integer")
                    yield Input(str(D.seq_len), id="tr-seq", type="integer")
                    yield Input(str(D.T), id="tr-T", type="integer")
                yield Label("schedule · time · device")
                yield Select([(s, s) for s in SCHEDULES], value=D.schedule, allow_blank=False, id="tr-schedule")
                yield Select([(t, t) for t in TIME_MODES], value=D.time, allow_blank=False, id="tr-time")
                yield Select([(d, d) for d in DEVICES], value=D.device, allow_blank=False, id="tr-device")
                yield Label("eval every · preview every")
                with Horizontal(classes="tr-row"):
                    yield Input(str(D.eval_every), id="tr-eval", type="integer")
                    yield Input("100", id="tr-sample", type="integer")
                with Horizontal(classes="tr-row"):
                    yield Button("Start F5", id="tr-start", variant="primary")
                    yield Button("Stop F6", id="tr-stop", variant="error", disabled=True)
                    yield Button("Resume F7", id="tr-resume")
            with Vertical(id="tr-live"):
                yield Static(Text("not training", style="dim"), id="tr-stats")
                yield Label("loss (ELBO nats/token)", classes="tr-chart-label")
                yield Sparkline([], id="tr-loss", summary_function=_mean)
                yield Label("validation ELBO", classes="tr-chart-label")
                yield Sparkline([], id="tr-val", summary_function=_mean)
                yield Static("", id="tr-valtext")
                yield Label("sample preview", classes="tr-chart-label")
                yield Static(Text("—", style="dim"), id="tr-preview")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = "Train"
        for inp in self.query(Input):
            inp.cursor_blink = not self.app.deterministic

    # ------------------------------------------------------------------ config from the form
    def _int(self, wid: str, label: str) -> int:
        from dbert_core.errors import DbertError

        text = self.query_one(f"#{wid}", Input).value.strip()
        try:
            return int(text)
        except ValueError:
            raise DbertError(f"{label} must be a whole number, got {text!r}") from None

    def config(self, resume: bool):
        """The run's TrainConfig: dbert train's defaults and the form's values; on resume the
        checkpoint's own settings, with the few a resumed run may change taken from the form."""
        from dbert_core.errors import DbertError
        from dbert_core.store import is_name, out_path
        from dbert_core.train import resume_config

        if resume:
            name = self.query_one("#tr-out", Input).value.strip()
            if not is_name(name):
                raise DbertError(f"the output must be a plain store name, got {name!r}")
            cfg = resume_config(out_path(name), max_steps=self._int("tr-steps", "steps"),
                                eval_every=self._int("tr-eval", "eval every"),
                                device=self.query_one("#tr-device", Select).value, log_every=WATCH_LOG_EVERY)
            return cfg, self._int("tr-sample", "sample every")
        raw = [p.strip() for p in self.query_one("#tr-data", Input).value.split(",") if p.strip()]
        data = []
        for p in raw:
            hits = sorted(glob.glob(str(Path(p).expanduser())))
            if not hits:
                raise DbertError(f"no such data file: {p}")
            data.extend(hits)
        if not data:
            raise DbertError("choose at least one training text file")
        name = self.query_one("#tr-out", Input).value.strip()
        if not is_name(name):
            raise DbertError(f"the output must be a plain store name, got {name!r}")
        init = self.query_one("#tr-init", Input).value.strip() or None
        steps = self._int("tr-steps", "steps")
        cfg = TrainConfig(
            data=data, out=str(out_path(name)), preset=None if init else self.query_one("#tr-preset", Select).value,
            init=init, max_steps=steps, batch_size=self._int("tr-batch", "batch"),
            seq_len=self._int("tr-seq", "seq len"), T=self._int("tr-T", "T"),
            schedule=self.query_one("#tr-schedule", Select).value, time=self.query_one("#tr-time", Select).value,
            device=self.query_one("#tr-device", Select).value, eval_every=self._int("tr-eval", "eval every"),
            log_every=WATCH_LOG_EVERY,
        ).validate()
        return cfg, self._int("tr-sample", "sample every")

    # ------------------------------------------------------------------ actions
    def action_start(self, resume: bool = False) -> None:
        from dbert_core.errors import DbertError

        if self.trainer is not None:
            self.app.notify("a training run is already going (F6 stops it)", severity="warning")
            return
        try:
            cfg, sample_every = self.config(resume)
        except DbertError as e:
            self.app.notify(str(e), title="train", severity="error")
            return
        if not resume:
            self.losses.clear()
            self.vals.clear()
        self.out = Path(cfg.out)
        self._set_running(True)
        self.query_one("#tr-stats", Static).update(Text(f"preparing {self.out.name} …", style="cyan"))
        self.train(cfg, sample_every)

    def action_browse(self) -> None:
        """Pick a data file from a tree; it is appended to the data field."""
        self.app.push_screen(FileDialog("Add a training text file (Enter picks, Esc cancels)", self.browse_root),
                             self._add_file)

    def _add_file(self, path: str | None) -> None:
        if not path:
            return
        field = self.query_one("#tr-data", Input)
        parts = [p.strip() for p in field.value.split(",") if p.strip()]
        if path not in parts:
            field.value = ", ".join([*parts, path])

    def action_resume(self) -> None:
        self.action_start(resume=True)

    def action_stop(self) -> None:
        if self.trainer is not None:
            self.trainer.stop()
            self.query_one("#tr-stats", Static).update(Text("stopping: saving a checkpoint …", style="yellow"))

    @on(Button.Pressed, "#tr-start")
    def _start_pressed(self) -> None:
        self.action_start()

    @on(Button.Pressed, "#tr-stop")
    def _stop_pressed(self) -> None:
        self.action_stop()

    @on(Button.Pressed, "#tr-resume")
    def _resume_pressed(self) -> None:
        self.action_resume()

    def _set_running(self, on_: bool) -> None:
        self.query_one("#tr-start", Button).disabled = on_
        self.query_one("#tr-resume", Button).disabled = on_
        self.query_one("#tr-stop", Button).disabled = not on_

    # ------------------------------------------------------------------ the worker
    @work(thread=True, exclusive=True, exit_on_error=False, group="train", name="training")
    def train(self, cfg, sample_every: int) -> None:
        from dbert_core.train import Trainer

        worker = get_current_worker()
        trainer = Trainer(cfg, [TuiCallback(self, worker, sample_every, min(cfg.seq_len, 32))])
        self.trainer = trainer
        try:
            metrics = trainer.run()
        finally:
            self.trainer = None
            self.app.call_from_thread(self._set_running, False)
        self.post_message(TrainFinished(Path(cfg.out), trainer.step, bool(metrics.get("stopped"))))

    @on(TrainProgress)
    def _progress(self, message: TrainProgress) -> None:
        """Redraw at most ~10 times a second: tiny models step far faster than anyone reads."""
        self._latest = message.metrics
        now = time.monotonic()
        if now - self._drawn_at >= 0.1:
            self._draw_progress()
        elif not self._redraw_pending:
            self._redraw_pending = True
            self.set_timer(0.1, self._draw_progress)

    def _draw_progress(self) -> None:
        self._redraw_pending = False
        self._drawn_at = time.monotonic()
        m = self._latest
        if m is None:
            return
        text = Text()
        text.append(f"step {m['step']}/{m['max_steps']}", style="bold")
        if "loss_elbo" in m:
            text.append(f" · loss {m['loss_elbo']:.3f} · ce {m['loss_ce']:.3f} · lr {m['lr']:.1e}")
            if not self.app.deterministic:
                text.append(f"\n{m['tokens_per_s']:.0f} tok/s · {int(m['tokens_seen']):,} tokens · "
                            f"elapsed {_fmt_time(m['elapsed'])} · ETA {_fmt_time(m['eta'])}")
        else:
            text.append(" · starting", style="dim")
        self.query_one("#tr-stats", Static).update(text)
        self.query_one("#tr-loss", Sparkline).data = list(self.losses[-400:])

    @on(TrainEval)
    def _eval(self, message: TrainEval) -> None:
        m = message.metrics
        self.query_one("#tr-val", Sparkline).data = list(self.vals)
        self.query_one("#tr-valtext", Static).update(
            Text(f"step {m['step']}: {m['val_nats_per_token']:.3f} nats/tok, ppl ≤ {m['val_ppl_token']:.0f}",
                 style="green"))

    @on(TrainPreview)
    def _preview(self, message: TrainPreview) -> None:
        self.query_one("#tr-preview", Static).update(Text(f"[step {message.step}] {message.text}"))

    @on(TrainFinished)
    def _finished(self, message: TrainFinished) -> None:
        self._draw_progress()
        self._latest = None  # a pending redraw must not cover the final line
        verb = "stopped at" if message.stopped else "finished at"
        self.query_one("#tr-stats", Static).update(
            Text(f"{verb} step {message.step}; saved as {message.path.name} in the store"
                 + (" (F7 resumes)" if message.stopped else ""), style="bold green"))
        self.app.notify(f"training {verb} step {message.step}: {message.path.name}")
        self.app.post_message(StoreChanged(message.path, "trained"))
