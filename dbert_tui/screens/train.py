"""The Train screen: set up a run, watch loss / validation ELBO / tokens per second live, stop and
resume; the result lands in the store."""

from __future__ import annotations

import glob
import time
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Button, Checkbox, Header, Input, Label, Select, Static
from textual.worker import get_current_worker

from dbert_core.config import DEVICES, DTYPES, LOSSES, PRESETS, SCHEDULES, TIME_MODES, TRAIN_SETTINGS, UNITS, TrainConfig
from dbert_core.display import cache_line, duration, eta, tokenizing_line
from dbert_core.settings import TRAIN, label

from ..keymap import KeySpec, bindings
from ..messages import StoreChanged, TrainEval, TrainFailed, TrainFinished, TrainPrepare, TrainPreview, TrainProgress
from ..widgets.chart import Chart
from ..widgets.keybar import KeyBar, bar_keys
from ..workers import ReportWorkerErrors, one_line
from .dialogs import FileDialog

D_VALUES = {name: s.default for name, s in TRAIN_SETTINGS.items()}  # the form opens with `dbert train`'s defaults
# the form's field of each setting it shows (its labels: dbert_core/settings.py TRAIN)
WIDGET = {"max_steps": "tr-steps", "batch_size": "tr-batch", "seq_len": "tr-seq", "lr": "tr-lr",
          "warmup": "tr-warmup", "vocab_size": "tr-vocab", "seed": "tr-seed", "lam": "tr-lam", "T": "tr-T",
          "eval_every": "tr-eval", "save_every": "tr-save", "unit": "tr-unit", "dtype": "tr-dtype",
          "device": "tr-device", "schedule": "tr-schedule", "time": "tr-time", "loss": "tr-objective"}
WATCH_LOG_EVERY = 1  # the one setting the screen changes from `dbert train`: the chart keeps every step
LOSS_SMOOTHING = 0.6  # EMA weight of the loss line (the raw latest value is shown beside it)
MAX_POINTS = 2000     # a long run's loss is thinned to this many points for drawing



def said(error) -> str:
    """A training error as the Train screen says it: its settings by the form's labels (settings.TRAIN)."""
    return error.said(lambda name: label(name, TRAIN))


def thinned(points: list, most: int = MAX_POINTS) -> tuple:
    """At most about `most` of the points, evenly spaced, the last one always kept."""
    k = max(1, -(-len(points) // most))
    out = points[::k]
    if points and out[-1] is not points[-1]:
        out.append(points[-1])
    return tuple(out)


class TuiCallback:
    """Training callback (runs on the worker thread): posts the metrics in messages (the screen
    records them on the UI thread; nothing here touches the screen's state or widgets), and
    turns the worker's cancellation into Trainer.stop() (which saves a checkpoint)."""

    def __init__(self, screen: "TrainScreen", worker, sample_every: int, sample_length: int,
                 keep_history: bool = False):
        self.screen = screen
        self.worker = worker
        self.sample_every = sample_every
        self.sample_length = sample_length
        self.keep_history = keep_history
        self.last_eval = None

    def on_prepare(self, trainer, info):
        """The corpus tokenized into the token cache before the run starts (`dbert train`'s stderr line)."""
        if trainer.is_main:
            self.screen.post_message(TrainPrepare(dict(info)))

    def on_start(self, trainer):
        self.start = time.perf_counter()
        self.first = trainer.step
        # the run really starts: unless it resumes, the charts are its own from now on (`fresh`)
        self.screen.post_message(TrainProgress({"step": trainer.step, "max_steps": trainer.cfg.max_steps,
                                                "starting": True}, fresh=not self.keep_history))

    def on_step(self, trainer, m):
        if self.worker.is_cancelled:
            trainer.stop()
        done = m["step"] - self.first
        left = eta(time.perf_counter() - self.start, max(1, done), m["max_steps"] - m["step"])  # as dbert train's line
        self.screen.post_message(TrainProgress(dict(m, eta=left), losses=[(m["step"], m["loss_elbo"])]))
        if self.sample_every and m["step"] % self.sample_every == 0 and m["step"] < m["max_steps"]:
            self.preview(trainer, m["step"])

    def preview(self, trainer, step: int):
        from dbert_core.sampling.sample import generate

        model = trainer.db.model
        model.eval()
        try:
            steps = min(32, trainer.db.schedule.T)
            texts, _ = generate(trainer.db, n=1, seed=0, length=self.sample_length, steps=steps, top_k=30)
        finally:
            model.train()
        self.screen.post_message(TrainPreview(step, texts[0]))

    def on_eval(self, trainer, m):
        self.last_eval = m["step"]
        self.screen.post_message(TrainEval(m))

    def on_checkpoint(self, trainer, path):
        pass

    def on_end(self, trainer, m):
        """A run that reached its last step is evaluated there too, when evaluation is on and the
        last step is not a multiple of eval every (a 300-step run, eval every 200, ends with a
        step-300 value, not step 200's)."""
        if (trainer.cfg.eval_every and not m.get("stopped") and trainer.step > self.first
                and self.last_eval != trainer.step and not self.worker.is_cancelled):
            self.on_eval(trainer, trainer.evaluate())


class TrainScreen(ReportWorkerErrors, Screen):
    AUTO_FOCUS = "#tr-data"  # arriving here, typing goes to the data field
    CATALOGUE = (  # keymap.KeySpec: the key help's order; the bar shows those with a label; the palette those with a title
        # KeySpec(key, action, help, shown, bar, rank, at, palette, about)
        KeySpec("f5", "start", "Start training with the form's settings", "", "Start", 1, 1, "Start training", "A new run with the form's settings"),
        KeySpec("f6", "stop", "Stop (saves a checkpoint that F7 resumes)", "", "Stop", 1, 2, "Stop training", "Saves a checkpoint that F7 resumes"),
        KeySpec("f7", "resume", "Resume the run saved under the output name", "", "Resume", 1, 3, "Resume training", "The run saved under the output name"),
        KeySpec("ctrl+o", "browse", "Add a data file from a folder tree", "^o", "Add file", 2, 4, "Add a data file", "Picked from a folder tree"),
        KeySpec("escape", "leave_field", "Leave the text field (then 1/2/3 and ? work as keys)", "", "", 5, 0, "", ""),
    )
    BINDINGS = bindings(CATALOGUE)
    KEYS = bar_keys(CATALOGUE, "screen")
    HELP = ("Train a model on your text files: the form holds dbert train's options; the result lands in "
            "the store under the output name. Tab moves between fields.")

    def __init__(self, data: list[str] | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.default_data = data or []
        self.browse_root = str(Path(self.default_data[0]).parent) if self.default_data else "."
        self.losses: list[tuple] = []  # (step, loss_elbo) of every step, appended on the UI thread (TrainProgress)
        self.vals: list[tuple] = []    # (step, validation nats/token) of every evaluation (TrainEval)
        self.trainer = None            # the running Trainer (set and cleared on the UI thread), for F6
        self.out: Path | None = None
        self._latest: dict | None = None
        self._drawn_at = 0.0
        self._redraw_pending = False
        self._starting = False  # between F5 and the worker's end (TrainFinished / TrainFailed)

    def compose(self) -> ComposeResult:
        def field(*pairs) -> Horizontal:
            """One form line: each widget after its own label (one or two to a line)."""
            parts = []
            for text, widget in pairs:
                parts += [Label(text), widget]
            return Horizontal(*parts, classes="tr-field")

        def num(wid: str, value, placeholder: str = "") -> Input:
            return Input(str(value), id=wid, placeholder=placeholder, compact=True)

        def choice(wid: str, options, value) -> Select:
            return Select([(o, o) for o in options], value=value, allow_blank=False, id=wid, compact=True)

        def entry(name: str, value=None, placeholder: str = "") -> tuple:
            """A setting's label and its field, opening with `dbert train`'s default."""
            default = D_VALUES[name] if value is None else value
            return label(name, TRAIN), num(WIDGET[name], f"{default:g}" if isinstance(default, float) else default,
                                           placeholder)

        def pick(name: str, options) -> tuple:
            return label(name, TRAIN), choice(WIDGET[name], options, D_VALUES[name])

        yield Header()
        with Horizontal(id="tr-main"):
            with VerticalScroll(id="tr-form"):
                yield Label("data: files or globs (^o adds one)", classes="tr-wide")
                yield Input(", ".join(self.default_data), placeholder="corpus.txt, more/*.txt", id="tr-data",
                            compact=True)
                yield field((label("out", TRAIN), Input("my-dbert", id="tr-out", placeholder="a store name", compact=True)))
                yield Label("model", classes="tr-head")
                yield field((label("preset", TRAIN), choice("tr-preset", PRESETS, D_VALUES["preset"])))
                yield field(("or " + label("init", TRAIN), Input("", placeholder="BERT dir or hub id (optional)", id="tr-init",
                                              compact=True)))
                yield Horizontal(Label("init +"), Checkbox(label("trim_vocab", TRAIN), id="tr-trim", compact=True),
                                 Checkbox(label("from_scratch", TRAIN), id="tr-scratch", compact=True), classes="tr-field")
                yield field(entry("vocab_size", "", "learnt"), entry("seed"))
                yield Label("data and run", classes="tr-head")
                yield field((label("val_data", TRAIN), Input("", placeholder="held-out files (optional)", id="tr-val-data",
                                               compact=True)))
                yield field(pick("unit", UNITS), (label("pack", TRAIN), Checkbox("", bool(D_VALUES["pack"]), id="tr-pack",
                                                                                 compact=True)))
                yield field(entry("max_steps"), entry("batch_size"))
                yield field(entry("seq_len"), pick("dtype", DTYPES))
                yield field(entry("lr"), entry("warmup"))
                yield field(pick("device", DEVICES))
                yield Label("diffusion", classes="tr-head")
                yield field(pick("schedule", SCHEDULES), entry("lam"))
                yield field(entry("T"), pick("time", TIME_MODES))
                yield field(pick("loss", LOSSES))
                yield Label("every N steps (0: never)", classes="tr-head")
                yield field(entry("eval_every"), entry("save_every"))
                yield field(("preview", num("tr-sample", 100)))
                with Horizontal(classes="tr-row"):
                    yield Button("Start F5", id="tr-start", variant="primary")
                    yield Button("Stop F6", id="tr-stop", variant="error", disabled=True)
                    yield Button("Resume F7", id="tr-resume")
            with Vertical(id="tr-live"):
                yield Static(Text("not training", style="dim"), id="tr-stats")
                yield Chart("loss (nats/token)", smooth=LOSS_SMOOTHING, id="tr-loss")
                yield Chart("validation ELBO (nats/token)", style="green", id="tr-val")
                yield Label("sample preview", classes="tr-chart-label")
                yield Static(Text("—", style="dim"), id="tr-preview")
        yield KeyBar(self.KEYS)

    def on_mount(self) -> None:
        self.sub_title = "Train"
        for inp in self.query(Input):
            inp.cursor_blink = not self.app.deterministic

    def on_screen_resume(self) -> None:
        """Arriving with the data field focused (AUTO_FOCUS), the form shows its top, label included."""
        if self.focused is None or self.focused.id == "tr-data":
            self.call_after_refresh(self.query_one("#tr-form").scroll_home, animate=False)

    # ------------------------------------------------------------------ config from the form
    def _value(self, wid: str) -> str:
        return self.query_one(f"#{wid}", Input).value.strip()

    def _read(self, name: str):
        """The form's value of setting `name`: its choice, or its text as the schema's number type."""
        from dbert_core.errors import DbertError

        widget = self.query_one(f"#{WIDGET[name]}")
        if isinstance(widget, Select):
            return widget.value
        text, kind = widget.value.strip(), TRAIN_SETTINGS[name].kind
        try:
            return kind(text)
        except ValueError:
            whole = "a whole number" if kind is int else "a number"
            raise DbertError(f"must be {whole}, got {text!r}", name, text) from None

    def _preview_every(self) -> int:
        from dbert_core.errors import DbertError

        text = self._value("tr-sample")
        try:
            return int(text)
        except ValueError:
            raise DbertError(f"preview every must be a whole number, got {text!r}") from None

    def _out_name(self) -> str:
        from dbert_core.errors import DbertError
        from dbert_core.storage.store import is_name

        name = self._value("tr-out")
        if not is_name(name):
            raise DbertError(f"must be a plain store name, got {name!r}", "out", name)
        return name

    def config(self, resume: bool):
        """The run's TrainConfig: dbert train's defaults and the form's values; on resume the
        checkpoint's own settings, with the few a resumed run may change (TrainConfig.RESUMABLE)
        taken from the form."""
        from dbert_core.errors import DbertError
        from dbert_core.storage.store import out_path
        from dbert_core.training.prepare import resume_config

        sample_every = self._preview_every()
        if resume:
            changes = {name: self._read(name) for name in ("max_steps", "eval_every", "save_every", "device", "dtype")}
            return resume_config(out_path(self._out_name()), **changes, log_every=WATCH_LOG_EVERY), sample_every
        def files(wid: str) -> list[str]:
            out: list[str] = []
            for p in (p.strip() for p in self._value(wid).split(",") if p.strip()):
                hits = sorted(glob.glob(str(Path(p).expanduser())))
                if not hits:
                    raise DbertError(f"no such data file: {p}")
                out.extend(str(Path(h).resolve()) for h in hits)  # absolute: the store is global
            return out

        data = files("tr-data")
        if not data:
            raise DbertError("choose at least one training text file")
        val_data = files("tr-val-data") or None
        name = self._out_name()
        init = self._value("tr-init") or None
        values = {n: self._read(n) for n in WIDGET if n != "vocab_size"}
        preset: Any = self.query_one("#tr-preset", Select).value  # a choice: this Select has no blank
        cfg = TrainConfig(
            data=data, val_data=val_data, out=str(out_path(name)),
            preset=None if init else preset,
            init=init, trim_vocab=self.query_one("#tr-trim", Checkbox).value,
            from_scratch=self.query_one("#tr-scratch", Checkbox).value,
            vocab_size=self._read("vocab_size") if self._value("tr-vocab") else None,
            pack=self.query_one("#tr-pack", Checkbox).value, log_every=WATCH_LOG_EVERY, **values,
        ).validate()
        return cfg, sample_every

    # ------------------------------------------------------------------ actions
    def action_start(self, resume: bool = False) -> None:
        from dbert_core.errors import DbertError

        if self.trainer is not None or self._starting:
            self.app.notify("a training run is already going (F6 stops it)", severity="warning")
            return
        try:
            cfg, sample_every = self.config(resume)
            out = Path(cfg.out)
            if not resume and out.exists() and any(out.iterdir()):
                raise DbertError(f"{out.name} already exists: F7 resumes it, or change the output name")
        except DbertError as e:
            self.app.notify(said(e), title="train", severity="error")
            return
        self.out = Path(cfg.out)
        self._starting = True
        self._set_running(True)
        self.query_one("#tr-stats", Static).update(Text(f"preparing {self.out.name} …", style="cyan"))
        if not resume:  # a new run: the last one's sample (a failed run's too) is not this one's
            self.query_one("#tr-preview", Static).update(Text("—", style="dim"))
        self.train(cfg, sample_every, resume)

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

    def action_leave_field(self) -> None:
        self.set_focus(None)

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
    def train(self, cfg, sample_every: int, resume: bool = False) -> None:
        """(worker thread) Prepare and run the trainer. A failure before or during the run resets
        the panel (TrainFailed); expected ones (DbertError) are said there in the form's words,
        anything else also reaches the app's worker report."""
        from dbert_core.errors import DbertError
        from dbert_core.training.train import Trainer

        worker = get_current_worker()
        callback = TuiCallback(self, worker, sample_every, min(cfg.seq_len, 32), keep_history=resume)
        try:
            trainer = Trainer(cfg, [callback])
            self.app.call_from_thread(self._set_trainer, trainer)
            metrics = trainer.run()
        except DbertError as e:
            self.post_message(TrainFailed(said(e)))
            return
        except Exception as e:
            self.post_message(TrainFailed(one_line(e), notify=False))
            raise
        finally:
            self.app.call_from_thread(self._set_trainer, None)
        self.post_message(TrainFinished(Path(cfg.out), trainer.step, bool(metrics.get("stopped"))))

    def _set_trainer(self, trainer) -> None:
        """(UI thread) The worker's trainer, until it ends (None): F6 stops it."""
        self.trainer = trainer
        if trainer is None:
            self._set_running(False)

    @on(TrainProgress)
    def _progress(self, message: TrainProgress) -> None:
        """Record the steps' losses; redraw at most ~10 times a second: tiny models step far faster
        than anyone reads."""
        if message.fresh:
            self.losses.clear()
            self.vals.clear()
        self.losses.extend(message.losses)
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
                            f"elapsed {duration(m['elapsed'])} · ETA {duration(m['eta'])}")
        else:
            text.append(" · starting", style="dim")
        self.query_one("#tr-stats", Static).update(text)
        self.query_one("#tr-loss", Chart).points = thinned(self.losses)

    @on(TrainPrepare)
    def _prepare(self, message: TrainPrepare) -> None:
        """The tokenizing of a corpus not cached yet (MB read, MB/s, tokens, ETA), then where its entry
        is, as `dbert train` says them on stderr; the run's first step line replaces them."""
        info = message.info
        text = tokenizing_line(info) if info.get("stage") == "tokenize" else cache_line(info)
        self.query_one("#tr-stats", Static).update(Text.assemble(("preparing", "bold"), " · ", text))

    @on(TrainEval)
    def _eval(self, message: TrainEval) -> None:
        m = message.metrics
        self.vals.append((m["step"], m["val_nats_per_token"]))
        chart = self.query_one("#tr-val", Chart)
        chart.points = tuple(self.vals)
        chart.title = f"validation ELBO · step {m['step']}: ppl ≤ {m['val_ppl_token']:.0f}"
        chart.refresh()

    @on(TrainPreview)
    def _preview(self, message: TrainPreview) -> None:
        self.query_one("#tr-preview", Static).update(Text(f"[step {message.step}] {message.text}"))

    @on(TrainFailed)
    def _failed(self, message: TrainFailed) -> None:
        """A start that failed: the panel says so (the charts keep the last run's history)."""
        self._starting = False
        self._latest = None  # a pending redraw must not cover it
        self.query_one("#tr-stats", Static).update(
            Text.assemble(("not training", "bold"), " · the last start failed: ", (message.text, "red")))
        if message.notify:
            self.app.notify(message.text, title="train", severity="error", timeout=10)

    @on(TrainFinished)
    def _finished(self, message: TrainFinished) -> None:
        self._starting = False
        self._draw_progress()
        self._latest = None  # a pending redraw must not cover the final line
        verb = "stopped at" if message.stopped else "finished at"
        self.query_one("#tr-stats", Static).update(
            Text(f"{verb} step {message.step}; saved as {message.path.name} in the store"
                 + (" (F7 resumes)" if message.stopped else ""), style="bold green"))
        self.app.notify(f"training {verb} step {message.step}: {message.path.name}")
        self.app.post_message(StoreChanged(message.path, "trained"))
