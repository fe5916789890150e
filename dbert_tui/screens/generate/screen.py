"""The Generate screen: watch the reverse process fill in [MASK]s, step by step, and drive it.

Three views of the same machinery:
- one sample, large, with the noise schedule (a panel where the terminal is wide, a one-line
  strip where it is not);
- a grid of n samples of one run filling in together (`g`), each card with its own progress;
  Enter (or a click) shows the selected one large, Esc goes back;
- a comparison (`c`): two settings side by side with one seed (separate draws); Tab chooses the side the
  keys change, and any change restarts both.

The state is the App's controller.Session (settings of both sides, runs, playback, selection);
each part of the screen is a widget that owns the rest of its state (widgets/generate/): the
player (workers, frames, playback, the status line), the canvas (one sample large), the grid,
the comparison, the token inspector, the editor (remask, refill, branch, undo) and the controls
(the legend and the control bar: settings, colouring, layout). This screen composes them, turns
keys into calls on them (keys.py; what the keys need of it is its public KeyHost interface),
routes their messages (a frame recorded, an infill ranked, a card clicked, a token pointed at)
to the Session and the parts, and draws them all at most once per burst of frames.
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from pathlib import Path

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Header

from dbert_core.errors import DbertError

from ...controller import Session
from ...forms import said
from ...runs import TOPK, Playback, Recorded, Run
from ...messages import InfillChosen, RunAdvanced, RunFailed, SampleChosen, TokenPointed
from ...render import prompt_words_of, window_step
from ...widgets.generate.canvas import Canvas, final_of
from ...widgets.generate.compare import CompareView
from ...widgets.generate.controls import Controls
from ...widgets.generate.editor import Editor
from ...widgets.generate.entropy import EntropyPanel
from ...widgets.generate.grid import SampleGrid
from ...widgets.generate.inspector import InspectorLine, TokenInspector
from ...widgets.generate.player import Player
from ...widgets.keybar import KeyBar
from ...widgets.schedule import SchedulePanel, ScheduleStrip
from ...workers import ReportWorkerErrors
from .keys import BINDINGS, CATALOGUE, KEYS, KeyActions

WIDE = 120  # columns from which the schedule gets its panel (below: the one-line strip)


class GenerateScreen(KeyActions, ReportWorkerErrors, Screen):
    """Live reverse diffusion. Changing a control restarts the run with the new settings."""

    HELP = ("Watch the reverse process fill in the [MASK]s, step by step. The control bar shows each "
            "sampling setting beside its key; a change restarts the run at once with the same seed (a new "
            "draw all the same: once one token differs, the rest of the story can differ). "
            "A text taller than the screen follows the writing as later windows fill in; PgUp and PgDn "
            "(or the mouse wheel) scroll it, End follows the writing again. "
            f"h shows the entropy panel: for the frame drawn, the mean entropy in nats of p' (the law each token "
            f"was drawn from) over the positions its step revealed, plotted over the steps so far. It sums the "
            f"top-{TOPK} candidates' terms -p log p, not renormalised: a lower bound of the entropy of p' (each id "
            f"left out adds a term >= 0), exact where the {TOPK} hold all of p'; renormalised, it would be the "
            f"entropy of another law, never above log {TOPK}.")

    CATALOGUE, BINDINGS, KEYS = CATALOGUE, BINDINGS, KEYS  # screens/generate/keys.py: every key, written once

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._restart_pending = False
        self._draw_pending = False
        self._ready = False
        self.drawn: Recorded | None = None  # the frame of side A last drawn
        self.frames_drawn = 0    # draws (bursts of frames coalesce into one)
        # the parts (widgets/generate/), each the owner of its own state
        self.player = Player(id="gen-status")          # the status line; workers, frames, playback
        self.canvas = Canvas(id="gen-tokens-box")      # one sample large
        self.grid = SampleGrid(id="gen-grid")          # several samples, a card each
        self.compare = CompareView(id="gen-compare")   # two settings side by side
        self.inspector = TokenInspector(id="gen-inspect")  # the token under the cursor
        self.editor = Editor()                         # the draft, versions, refill and branch
        self.controls = Controls(id="gen-bar")         # the legend and the control bar
        self.entropy = EntropyPanel(id="gen-entropy")  # side A's reveal entropy over the steps (`h`)

    # ------------------------------------------------------------------ the App's state
    @property
    def session(self) -> Session:
        """The generation session (settings, runs, selection): the App's (DbertApp.session)."""
        return self.app.session

    @property
    def replay(self):
        """The dbert_core.sampling.replay.Replay being played instead of sampling (no model), or None: the App's."""
        return getattr(self.app, "replay", None)

    @property
    def db(self):
        """The checkpoint being run: the App's (DbertApp.db); the screen keeps no copy."""
        return getattr(self.app, "db", None)

    # ------------------------------------------------------------------ what is shown
    @property
    def playbacks(self) -> list[Playback]:
        return self.session.playbacks

    @property
    def run(self) -> Run | None:
        """Side A's run (the only one unless comparing)."""
        return self.session.run

    @property
    def view(self) -> int | None:
        """Side A's shown frame index (None: live)."""
        return self.playbacks[0].view if self.playbacks else None

    @property
    def draft(self):
        """The sample being inspected and edited (the editor's), or None."""
        return self.editor.draft

    def shown(self):
        return self.playbacks[0].shown() if self.playbacks else None

    def view_mode(self) -> str:
        return self.session.view_mode()

    def shown_text(self, side: int = 0) -> str:
        """The plain text of a side's token view, as drawn (tests and the tmux check read this)."""
        if self.view_mode() == "compare":
            return self.compare.panes()[side].text.plain
        if self.view_mode() == "grid":
            return self.grid.text()
        return self.canvas.text.plain

    def inspected(self) -> dict | None:
        """dbert_core.sampling.inspector.token_info of the token under the inspector's cursor."""
        return self.inspector.inspect(self.db, self.draft)

    # ------------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        yield Header()
        yield self.player
        with Horizontal(id="gen-main"):
            yield self.canvas
            yield self.grid
            yield self.compare
            yield SchedulePanel(id="gen-schedule")
            yield self.inspector
        yield self.entropy
        yield ScheduleStrip(id="gen-strip")
        yield InspectorLine(id="gen-inspect-line")
        yield self.controls
        yield KeyBar(KEYS, id="gen-keys")
        yield self.editor

    def on_mount(self) -> None:
        self.sub_title = "Generate"
        self._ready = True
        self._arrange()
        self._show_controls()
        self.watch(self.app, "db", self.use_db)  # the App's checkpoint, now and whenever it changes

    def on_resize(self) -> None:
        self._arrange()
        self.call_after_refresh(self._draw)  # laid out again at the new size (a tall screen's double spacing, too)

    def _arrange(self) -> None:
        """Show the widgets of the current view; the schedule as a panel only where it is wide."""
        if not self._ready:
            return
        mode, wide = self.view_mode(), self.size.width >= WIDE
        self.canvas.display = mode == "single"
        self.grid.display = mode == "grid"
        self.compare.display = mode == "compare"
        inspecting = self.draft is not None and mode == "single"
        self.query_one(SchedulePanel).display = mode == "single" and wide and not inspecting
        self.query_one(ScheduleStrip).display = not (mode == "single" and wide) and not inspecting
        self.inspector.display = inspecting and wide
        self.query_one(InspectorLine).display = inspecting and not wide
        self.grid.fit(self.size.width, WIDE)
        self.call_after_refresh(self._toasts_above_the_bar)

    def _toasts_above_the_bar(self) -> None:
        """Notifications stand above the schedule strip, the control bar and the key bar, never on
        them (at 80x24 they covered the settings a key had just changed)."""
        bottom = [w for w in (self.query_one(ScheduleStrip), self.query_one(InspectorLine), self.controls,
                              self.query_one("#gen-keys")) if w.display and w.region.height]
        top = min((w.region.y for w in bottom), default=self.size.height)
        for rack in self.query("#textual-toastrack"):  # none where notifications are off
            rack.styles.margin = (0, 0, self.size.height - top + 1, 0)  # the rack's last row is its margin's first

    def use_db(self, db) -> None:
        """The App's checkpoint changed (its settings are already fitted to it): start a run."""
        if db is not None:
            self.restart()

    # ------------------------------------------------------------------ runs
    def restart_soon(self) -> None:
        """Coalesce several control changes into one restart."""
        if self.db is None or self._restart_pending:
            return
        self._restart_pending = True
        self.call_later(self.restart)

    def restart(self) -> None:
        """New runs of every side, with the same seed; previous workers are cancelled."""
        self._restart_pending = False
        if self.db is None or not self._ready:
            return
        from dbert_core.sampling.infill import has_range

        if self.replay is None and has_range(self.session.settings.prompt):
            self._start_infill()
            return
        self.player.infilling = 0  # an infill being ranked is dropped
        try:
            playbacks = self.session.replay_runs(self.replay) if self.replay is not None else self.session.new_runs(self.db)
        except DbertError as e:
            self.app.notify(said(e), title="settings", severity="error")
            return
        self.editor.reset()
        self.start_runs(playbacks)

    def _start_infill(self) -> None:
        """A prompt with [MASK*A-B]: the player draws and ranks every length; the winner's batch
        is then played back (InfillChosen), the winner shown large."""
        from dbert_core.sampling.sample import resolve

        try:
            cfg = resolve(dataclasses.replace(self.session.settings, n=1), self.db)
        except DbertError as e:
            self.app.notify(said(e), title="settings", severity="error")
            return
        self.player.cancel()
        self.editor.reset(keep_locks=True)
        self.session.drop_runs()
        self.canvas.say(Text("infill: drawing every length and ranking them by the model's ELBO per token…",
                             style="dim"))
        self._arrange()
        self.player.start_infill(cfg, self.db)
        self._status()

    @on(InfillChosen)
    def _infill_chosen(self, message: InfillChosen) -> None:
        self.start_runs(self.session.play_infill(message.frames, message.order, message.template, message.row))

    def start_runs(self, playbacks: list[Playback]) -> None:
        """Play these runs: fresh cards and panels, then a worker each (the player's)."""
        self.frames_drawn = 0
        self.drawn = None
        self.grid.make_cards(playbacks[0].run.settings.n, self.session.selected)
        self._arrange()
        from dbert_core.display import safe_text

        name = safe_text(Path(self.db.path).name, 60) if self.db.path else "model"
        self.sub_title = f"{'Replay' if self.replay is not None else 'Generate'} · {name}"
        self._show_curve()
        self._show_controls()
        self.canvas.say(Text("starting…", style="dim"))
        self.canvas.top()
        self.player.start(playbacks, self.db)
        self._status()

    @on(RunAdvanced)
    def _run_advanced(self, message: RunAdvanced) -> None:
        if message.finished:
            pb = self.session.playback_of(message.run_id)
            if pb is not None:
                self.editor.run_finished(pb.run)  # a refill: a new version
        self._draw_soon()

    @on(RunFailed)
    def _run_failed(self, message: RunFailed) -> None:
        """A sampling worker raised (the app has notified): the screen goes back to a usable
        state. A failed infill says so in place of the sample; a failed refill brings back the
        version it started from; any other run ends as it stands, Space or r runs it again."""
        if message.run_id == 0:
            if self.player.infilling:
                self.player.infilling = 0
                self.canvas.say(Text(f"the infill failed: {message.text} · p: change the prompt", style="red"))
                self._status()
            return
        pb = self.session.playback_of(message.run_id)
        if pb is None:  # a run already replaced
            return
        run = pb.run
        run.failed, run.finished = message.text, True
        run.set_playing(False)
        version = self.editor.versions.current()
        if run.template is not None and version is not None and version.run is not run:
            self.editor.branch_run = None
            self.show_version(version)  # the text before the refill, as it was
            return
        self._arrange()
        self._draw()
        if not run.frames:
            self.canvas.say(Text(f"the run failed: {message.text} · Space or r: again", style="red"))
        self._status()

    # ------------------------------------------------------------------ drawing
    def _draw_soon(self) -> None:
        """One draw after the frames already queued (a burst of frames is drawn once)."""
        if not self._draw_pending:
            self._draw_pending = True
            self.call_later(self._draw)

    def redraw(self, layout: bool = False, settings: bool = False) -> None:
        """Draw again after a key (KeyHost): with `layout` the views shown first, with `settings`
        the schedule's curve and the control bar."""
        if layout:
            self._arrange()
        if settings:
            self._show_curve()
            self._show_controls()
        self._draw()

    def _draw(self) -> None:
        self._draw_pending = False
        if not self.playbacks or self.db is None:
            return
        mode, controls = self.view_mode(), self.controls
        if controls.colour == "confidence":
            controls.fit_edges(self.playbacks)
        colour, edges = controls.colour, controls.edges
        pb = self.playbacks[0]
        rec = pb.shown()
        if mode == "compare":
            self.compare.draw(self.db, self.playbacks, self.session.side, self.session.selected, colour, edges,
                              self.prompt_words, not self.app.deterministic)
        elif rec is not None and mode == "grid":
            self.grid.draw(self.db, rec, colour, edges, self.prompt_words(), final_of(pb.run, controls.stable),
                           pb.run.per_window)
        elif rec is not None and self.draft is not None:
            shown = self.canvas.draw_draft(self.db, self.draft, colour, edges)
            per_window = pb.run.per_window  # a story's reveal step within its window
            info = self.inspector.show(self.db, self.draft, shown.frame.steps, per_window)
            self.query_one(InspectorLine).show(info, shown.frame.steps, self.db.schedule.T, per_window)
        elif rec is not None:
            row = self.session.selected if rec.frame.ids.shape[0] > 1 else None
            self.canvas.draw(self.db, rec, row, colour, edges, self.prompt_words(), final_of(pb.run, controls.stable))
        if rec is not None and rec is not self.drawn:
            self.drawn = rec
            self.frames_drawn += 1
        if self.entropy.display:
            self.entropy.show(pb.frames, None if rec is None else len(pb.frames) - 1 if pb.view is None else pb.view)
        active_pb = self.session.active_playback()
        active = active_pb.shown() if active_pb is not None else None
        if active_pb is not None and active is not None:  # the schedule is one window's: its step within the window
            f = active.frame
            within = window_step(f.step, f.steps, active_pb.run.per_window)[2]
            for widget in (self.query_one(SchedulePanel), self.query_one(ScheduleStrip)):
                widget.set_position(within, float(f.masked.double().mean()))
        self._status()

    def prompt_words(self, prompt: str | None = None) -> dict[int, str] | None:
        """The prompt's own words by position (shown as typed), for the session's prompt or this one."""
        return prompt_words_of(self.db, self.run, self.session.settings.prompt if prompt is None else prompt,
                               given=prompt is not None)

    def _status(self) -> None:
        mode, run = self.view_mode(), self.run
        self.player.show_status(self.db, mode, self.grid.cards_below() if mode == "grid" else [],
                                self.editor.inspecting(), self.editor.prefix(run) if run is not None else Text())
        self._show_keys()

    def _show_keys(self) -> None:
        """The key bar's space key says what it does now: Pause, Play or Replay."""
        label = self.player.space_label()
        bar = self.query_one(KeyBar)
        keys = tuple(replace(k, label=label) if k.key == "space" else k for k in KEYS)
        if keys != bar.keys:
            bar.keys = keys

    def _show_curve(self) -> None:
        """The schedule's expected masked fraction after each shown step (the engine's curve:
        sample.masked_curve), or the one a replayed file carries."""
        curve = getattr(self.db, "curve", None)
        if not curve:
            from dbert_core.sampling.sample import masked_curve

            steps = self.session.shown_settings().steps
            assert steps is not None  # a run's settings, or the session's fitted to the checkpoint
            curve = [float(v) for v in masked_curve(self.db, steps)]
        title = f"{self.db.schedule.name} T={self.db.schedule.T}"
        for widget in (self.query_one(SchedulePanel), self.query_one(ScheduleStrip)):
            widget.set_curve(curve, title)

    def _show_controls(self) -> None:
        """The control bar: the values in force and which the checkpoint chose (a replay's are its file's)."""
        if self.db is None:
            origins = None
        else:
            origins = self.session.origins(self.db) if self.replay is None else {}
        self.controls.show(self.playbacks, origins)

    # ------------------------------------------------------------------ messages from the parts
    @on(SampleChosen)
    def _sample_chosen(self, message: SampleChosen) -> None:
        if self.pick_branch(message.index):
            return
        if self.session.zoom(message.index):
            self.grid.mark(self.session.selected)
            self._arrange()
            self._draw()

    @on(TokenPointed)
    def _token_pointed(self, message: TokenPointed) -> None:
        """The mouse: a press on a token inspects it (inspect mode on), a drag selects from the
        press to here, a hover moves the cursor while inspecting."""
        pos = message.position
        if self.draft is None:
            if message.press and self.enter_inspect(pos):
                self.draft.anchor = pos
            return
        self.editor.point(pos, message.press, message.drag, self.canvas.positions)
        self._draw()
