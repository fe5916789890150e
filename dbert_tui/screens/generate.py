"""The Generate screen: watch the reverse process fill in [MASK]s, step by step, and drive it."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Header, Static
from textual.worker import get_current_worker

from ..messages import FrameReady, RunFinished
from ..render import (Recorded, Run, compact, Settings, atomic_write, expected_masked, legend, render_tokens, texts_of,
                      trajectory)
from ..widgets.schedule import SchedulePanel
from ..workers import ReportWorkerErrors
from .dialogs import FormDialog

TEMPERATURES = (0.1, 0.25, 0.5, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0)


class TokenScroll(VerticalScroll, can_focus=False):
    """Scrolls a long batch; never takes focus, so the arrow keys scrub instead of scrolling."""


class GenerateScreen(ReportWorkerErrors, Screen):
    """Live reverse diffusion. Changing a control restarts the run with the new settings."""

    BINDINGS = [  # footer order: the most used first (the rest: ctrl+p, or `dbert-tui` docs)
        Binding("space", "toggle_play", "Play/Pause"),
        Binding("full_stop", "step", "Step", key_display="."),
        Binding("left", "scrub(-1)", "Back", key_display="←"),
        Binding("right", "scrub(1)", "Fwd", key_display="→"),
        Binding("e", "edit", "Settings"),
        Binding("r", "restart", "Restart"),
        Binding("s", "save", "Save"),
        Binding("x", "export", "Export"),
        Binding("v", "toggle_colour", "Colour"),
        Binding("p", "prompt", "Prompt"),
        Binding("n", "new_seed", "Seed"),
        Binding("home", "scrub_to(0)", "First", show=False),
        Binding("end", "live", "Live", show=False),
        Binding("left_square_bracket", "steps(0.5)", "Steps-", key_display="[", show=False),
        Binding("right_square_bracket", "steps(2)", "Steps+", key_display="]", show=False),
        Binding("minus", "temperature(-1)", "Temp-", key_display="-", show=False),
        Binding("equals_sign,plus", "temperature(1)", "Temp+", key_display="+", show=False),
        Binding("m", "cycle_sampler", "Sampler", show=False),
    ]

    steps = reactive(64)
    temperature = reactive(1.0)
    colour = reactive("order")

    def __init__(self, settings: Settings | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.settings = settings or Settings()
        self._auto_length = self.settings.length is None  # follow each checkpoint's seq_len
        self.set_reactive(GenerateScreen.steps, self.settings.steps)
        self.set_reactive(GenerateScreen.temperature, self.settings.temperature)
        self.db = None
        self.run: Run | None = None
        self._run_ids = 0
        self.view: int | None = None  # index of the frame shown; None follows the live run
        self._restart_pending = False
        self._ready = False
        self._tokens_text = Text()
        self.frames_drawn = 0

    # ------------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="gen-status")
        with Horizontal(id="gen-main"):
            with TokenScroll(id="gen-tokens-box"):
                yield Static(Text("loading a checkpoint…", style="dim"), id="gen-tokens")
            yield SchedulePanel(id="gen-schedule")
        yield Static(legend("order"), id="gen-legend")
        yield Static("", id="gen-settings")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = "Generate"
        self._ready = True
        self._show_settings()
        if self.db is not None:
            self.restart()
        elif self.app.db is not None:
            self.use_db(self.app.db)

    def on_resize(self) -> None:
        """Larger terminals get a wider schedule panel."""
        self.query_one(SchedulePanel).styles.width = 40 if self.size.width >= 120 else 28

    def on_screen_resume(self) -> None:
        if self.app.db is not None and self.app.db is not self.db:
            self.use_db(self.app.db)

    # ------------------------------------------------------------------ the model
    def use_db(self, db) -> None:
        """A (new) checkpoint: clamp the settings to it, redraw the schedule and start a run."""
        self.db = db
        T, max_len = db.schedule.T, db.model.max_length
        from dbert_core.errors import DbertError
        from dbert_core.sample import default_length, default_sampler

        s = self.settings
        s.steps = max(1, min(T, s.steps))
        if self._auto_length or s.length is None:
            s.length = default_length(db)
        s.length = max(1, min(max_len, s.length))
        try:
            s.resolved(db)
        except DbertError as e:  # e.g. `cached` on a time-conditioned model: say so, use the default
            s.sampler = default_sampler(db)
            self.app.notify(f"{e}; using {s.sampler}", title="sampler", severity="warning")
        self.set_reactive(GenerateScreen.steps, s.steps)
        if self._ready:  # otherwise on_mount starts the run
            self.restart()

    # ------------------------------------------------------------------ reactives
    def validate_steps(self, value: int) -> int:
        T = self.db.schedule.T if self.db is not None else 1_000_000
        return max(1, min(T, int(value)))

    def validate_temperature(self, value: float) -> float:
        return round(max(0.05, min(5.0, float(value))), 3)

    def watch_steps(self, value: int) -> None:
        self.settings.steps = value
        self._restart_soon()

    def watch_temperature(self, value: float) -> None:
        self.settings.temperature = value
        self._restart_soon()

    def watch_colour(self, value: str) -> None:
        self.query_one("#gen-legend", Static).update(legend(value))
        self._draw()

    def _restart_soon(self) -> None:
        """Coalesce several control changes into one restart."""
        if self.db is None or self._restart_pending:
            return
        self._restart_pending = True
        self.call_later(self.restart)

    # ------------------------------------------------------------------ runs
    def restart(self) -> None:
        self._restart_pending = False
        if self.db is None or not self._ready:
            return
        from dbert_core.errors import DbertError

        try:
            s = self.settings.resolved(self.db)
        except DbertError as e:
            self.app.notify(str(e), title="settings", severity="error")
            return
        self._run_ids += 1
        self.frames_drawn = 0
        playing = self.run.playing if self.run is not None else True
        self.run = Run(self._run_ids, s, playing=playing)
        self.view = None
        name = Path(self.db.path).name if self.db.path else "model"
        curve = expected_masked(self.db, s.steps)
        self.query_one(SchedulePanel).set_curve(curve, f"{self.db.schedule.name} T={self.db.schedule.T}")
        self.query_one("#gen-tokens", Static).update(Text("starting…", style="dim"))
        self.sub_title = f"Generate · {name}"
        self._show_settings()
        self._status()
        self.sample(self.run, self.db)

    @work(thread=True, exclusive=True, exit_on_error=False, group="sample", name="sampling")
    def sample(self, run: Run, db) -> None:
        """Produce frames; record each in the run and tell the UI (coalesced)."""
        import torch

        from dbert_core.sample import frames

        worker = get_current_worker()
        s = run.settings
        gen = torch.Generator().manual_seed(s.seed)
        order = torch.zeros((s.n, s.length), dtype=torch.int32)
        stream = frames(db, s, generator=gen)
        spent = 0.0
        while True:
            if worker.is_cancelled:
                return
            t0 = time.perf_counter()
            frame = next(stream, None)
            spent += time.perf_counter() - t0
            if frame is None:
                break
            order[frame.revealed] = frame.step
            run.frames.append(Recorded(compact(frame), order, spent))
            self.post_message(FrameReady(run.id, len(run.frames) - 1))
            if frame.done:
                break
            if not run.wait_turn(lambda: worker.is_cancelled, s.pace_ms / 1000):
                return
        run.finished = True
        self.post_message(RunFinished(run.id))

    @on(FrameReady)
    def _frame_ready(self, message: FrameReady) -> None:
        if self.run is not None and message.run_id == self.run.id:
            self.frames_drawn += 1
            self._draw()

    @on(RunFinished)
    def _run_finished(self, message: RunFinished) -> None:
        if self.run is not None and message.run_id == self.run.id:
            self._draw()

    # ------------------------------------------------------------------ drawing
    def shown(self) -> Recorded | None:
        """The frame on screen: the scrubbed one, or the newest."""
        if self.run is None or not self.run.frames:
            return None
        if self.view is None:
            return self.run.frames[-1]
        return self.run.frames[min(self.view, len(self.run.frames) - 1)]

    def shown_text(self) -> str:
        """The plain text of the token view (tests and the tmux check read this)."""
        return self._tokens_text.plain

    def _draw(self) -> None:
        rec = self.shown()
        if rec is None or self.db is None:
            return
        self._tokens_text = render_tokens(self.db, rec, self.colour)
        self.drawn = rec
        self.query_one("#gen-tokens", Static).update(self._tokens_text)
        f = rec.frame
        masked = float(f.masked.double().mean())
        self.query_one(SchedulePanel).set_position(f.step, masked)
        self._status()

    def _status(self) -> None:
        run = self.run
        text = Text()
        if run is None or self.db is None:
            text.append("no run", style="dim")
        elif not run.frames:
            text.append(f"step 0/{run.settings.steps} · starting", style="dim")
        else:
            rec = self.shown()
            f = rec.frame
            n_masked, total = int(f.masked.sum()), f.masked.numel()
            text.append(f"step {f.step}/{f.steps}", style="bold")
            text.append(f" · masked {n_masked}/{total} · nfe {f.nfe}")
            if not self.app.deterministic:
                text.append(f" · {rec.seconds:.2f}s")
            if self.view is not None and self.view < len(run.frames) - 1:
                state = f"scrub {self.view + 1}/{len(run.frames)} (End: live)"
            elif run.finished:
                state = "done"
            else:
                state = "playing" if run.playing else "paused"
            text.append(f" · {state}", style="bold cyan" if state != "done" else "bold green")
        self.query_one("#gen-status", Static).update(text)

    def _show_settings(self) -> None:
        s = self.run.settings if self.run is not None else self.settings
        line = (f"{s.sampler} · steps {s.steps} · temp {s.temperature:g} · top-k {s.top_k} · top-p {s.top_p:g}"
                f" · len {s.length if s.length is not None else 'auto'} · n {s.n} · seed {s.seed}")
        if s.prompt:
            line += f" · prompt {s.prompt[:40]!r}"
        self.query_one("#gen-settings", Static).update(Text(line, style="dim"))

    # ------------------------------------------------------------------ actions
    def action_toggle_play(self) -> None:
        if self.run is None:
            return
        if self.run.finished:
            self.restart()
            return
        with self.run.lock:
            self.run.playing = not self.run.playing
        self.view = None
        self._status()

    def action_step(self) -> None:
        """One reverse step (pauses the run first)."""
        if self.run is None:
            return
        if self.view is not None and self.view < len(self.run.frames) - 1:
            self.action_scrub(1)
            return
        with self.run.lock:
            self.run.playing = False
            if not self.run.finished:
                self.run.step_budget += 1
        self.view = None
        self._status()

    def action_scrub(self, delta: int) -> None:
        if self.run is None or not self.run.frames:
            return
        last = len(self.run.frames) - 1
        current = last if self.view is None else self.view
        target = max(0, min(last, current + delta))
        self.view = None if target == last else target
        self._draw()

    def action_scrub_to(self, index: int) -> None:
        if self.run is not None and self.run.frames:
            self.view = max(0, min(index, len(self.run.frames) - 1))
            self._draw()

    def action_live(self) -> None:
        self.view = None
        self._draw()

    def action_restart(self) -> None:
        self.restart()

    def action_new_seed(self) -> None:
        self.settings.seed = (self.settings.seed * 1_103_515_245 + 12_345) % 2**31
        self.restart()

    def action_steps(self, factor: float) -> None:
        self.steps = max(1, round(self.steps * factor))

    def action_temperature(self, direction: int) -> None:
        values = TEMPERATURES
        if direction > 0:
            self.temperature = next((v for v in values if v > self.temperature + 1e-9), self.temperature * 1.25)
        else:
            self.temperature = next((v for v in reversed(values) if v < self.temperature - 1e-9), self.temperature * 0.8)

    def action_cycle_sampler(self) -> None:
        from dbert_core.config import SAMPLERS

        usable = SAMPLERS
        if self.db is not None:
            usable = [s for s in SAMPLERS if self._allows(s)]
        current = self.run.settings.sampler if self.run is not None else self.settings.sampler
        i = usable.index(current) if current in usable else -1
        self.settings.sampler = usable[(i + 1) % len(usable)]
        self.restart()

    def _allows(self, sampler: str) -> bool:
        from dataclasses import replace

        from dbert_core.errors import DbertError

        try:
            replace(self.settings, sampler=sampler).resolved(self.db)
            return True
        except DbertError:
            return False

    def action_toggle_colour(self) -> None:
        self.colour = "confidence" if self.colour == "order" else "order"

    def action_edit(self) -> None:
        from dbert_core.config import SAMPLERS

        s = self.settings
        fields = [
            ("steps", "steps (1..T)", str(s.steps), ""),
            ("temperature", "temperature (> 0)", f"{s.temperature:g}", ""),
            ("top_k", "top-k (0: off)", str(s.top_k), ""),
            ("top_p", "top-p (0..1]", f"{s.top_p:g}", ""),
            ("length", "length (tokens)", "" if s.length is None else str(s.length), "the checkpoint's"),
            ("n", "samples", str(s.n), ""),
            ("seed", "seed", str(s.seed), ""),
            ("sampler", "sampler", s.sampler or "", "auto: " + " | ".join(SAMPLERS)),
            ("pace_ms", "ms per step (0: fastest)", str(s.pace_ms), ""),
        ]
        self.app.push_screen(FormDialog("Sampling settings (Enter applies and restarts)", fields, "Apply"),
                             self._apply_settings)

    def _apply_settings(self, values: dict | None) -> None:
        if not values:
            return
        s = dataclasses.replace(self.settings)
        try:
            s.steps, s.top_k = int(values["steps"]), int(values["top_k"])
            s.length = int(values["length"]) if values["length"] else self.settings.length
            s.n, s.seed, s.pace_ms = int(values["n"]), int(values["seed"]), int(values["pace_ms"])
            s.temperature, s.top_p = float(values["temperature"]), float(values["top_p"])
        except ValueError as e:
            self.app.notify(f"not a number: {str(e).split(': ')[-1]}", title="settings", severity="error")
            return
        s.sampler = values["sampler"].strip() or None
        if s.n > 16 or s.pace_ms < 0:
            self.app.notify("samples must be 1..16 and the pace >= 0 ms", title="settings", severity="error")
            return
        if s.length != self.settings.length:
            self._auto_length = False
        self.settings = s
        self.set_reactive(GenerateScreen.steps, s.steps)
        self.set_reactive(GenerateScreen.temperature, s.temperature)
        self.restart()

    def action_prompt(self) -> None:
        self.app.push_screen(FormDialog("Prompt / infill template: text with [MASK] slots; masks are appended "
                                        "up to the length (empty: unconditional)",
                                        [("prompt", "template", self.settings.prompt, "the cat [MASK] on the [MASK]")],
                                        "Use"), self._apply_prompt)

    def _apply_prompt(self, values: dict | None) -> None:
        if values is None:
            return
        from dbert_core.errors import DbertError
        from dbert_core.sample import parse_prompt

        if values["prompt"] and self.db is not None:
            try:
                parse_prompt(self.db, values["prompt"], self.settings.length)
            except DbertError as e:
                self.app.notify(str(e), title="prompt", severity="error")
                return
        self.settings.prompt = values["prompt"]
        self.restart()

    def _default_name(self, ext: str) -> str:
        name = Path(self.db.path).name if self.db is not None and self.db.path else "dbert"
        return f"dbert-{name}-seed{self.settings.seed}.{ext}"

    def action_save(self) -> None:
        rec = self.run.frames[-1] if self.run and self.run.frames else None
        if rec is None:
            self.app.notify("nothing to save yet", severity="warning")
            return
        if not self.run.finished:
            self.app.notify("the run is not finished; saving the text so far (masks kept)", severity="warning")
        self.app.push_screen(FormDialog("Save the text(s), one per line", [("path", "file", self._default_name("txt"), "")],
                                        "Save"), self._save)

    def _save(self, values: dict | None) -> None:
        if not values or not values["path"] or self.run is None or not self.run.frames:
            return
        texts = texts_of(self.db, self.run.frames[-1])
        try:
            path = atomic_write(values["path"], "".join(t.replace("\n", " ") + "\n" for t in texts))
        except OSError as e:
            self.app.notify(f"cannot write {values['path']}: {e.strerror or e}", severity="error")
            return
        self.app.notify(f"saved {len(texts)} text(s) to {path}")

    def action_export(self) -> None:
        if self.run is None or not self.run.frames:
            self.app.notify("nothing to export yet", severity="warning")
            return
        self.app.push_screen(FormDialog("Export the trajectory (every frame) as JSON",
                                        [("path", "file", self._default_name("json"), "")], "Export"), self._export)

    def _export(self, values: dict | None) -> None:
        if not values or not values["path"] or self.run is None:
            return
        import json

        try:
            path = atomic_write(values["path"], json.dumps(trajectory(self.db, self.run)) + "\n")
        except OSError as e:
            self.app.notify(f"cannot write {values['path']}: {e.strerror or e}", severity="error")
            return
        self.app.notify(f"exported {len(self.run.frames)} frames to {path}")
