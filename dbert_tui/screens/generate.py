"""The Generate screen: watch the reverse process fill in [MASK]s, step by step, and drive it.

Three views of the same machinery:
- one sample, large, with the noise schedule (a panel where the terminal is wide, a one-line
  strip where it is not);
- a grid of n samples of one run filling in together (`g`), each card with its own progress;
  Enter (or a click) shows the selected one large, Esc goes back;
- a comparison (`c`): the same seed under two settings, side by side; Tab chooses the side the
  keys change, and any change restarts both.

The control bar under the text always shows steps, temperature, top-k, top-p, sampler and seed
with their keys; a change restarts the run at once with the same seed. The state is a
controller.Session (settings of both sides, runs, playback, selection); this screen composes
the widgets, turns keys into Session calls, starts one worker per side and draws.
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace
import itertools
from functools import partial
from pathlib import Path

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Header, Static
from textual.worker import get_current_worker

from dbert_core.errors import DbertError

from ..controller import BRANCHES, MAX_N, Playback, Run, Session, differences, produce
from ..editing import Draft, Version, Versions
from ..messages import FrameReady, InfillReady, RunFinished, SampleChosen, TokenPointed
from ..files import atomic_write, default_output, output_path, texts_of, trajectory
from ..render import FIXED_EDGES, confidence_edges, inspector_lines, legend, progress_line, row_spans
from ..widgets.controls import CONTROLS, ControlBar
from ..widgets.keybar import Key, KeyBar
from ..widgets.generate.canvas import Canvas, final_of
from ..widgets.generate.compare import CompareView
from ..widgets.generate.grid import SampleGrid
from ..widgets.schedule import SchedulePanel, ScheduleStrip
from ..workers import ReportWorkerErrors
from .dialogs import FormDialog

class FieldError(Exception):
    """A bad value in the settings dialog: `key` names its field (None: no one field)."""

    def __init__(self, key: str | None, message: str) -> None:
        super().__init__(message)
        self.key, self.message = key, message


# the settings dialog's field for an option named in an engine error (--top-k ...)
OPTION_FIELDS = {"--n": "n", "--steps": "steps", "--temperature": "temperature", "--top-k": "top_k",
                 "--top-p": "top_p", "--length": "length", "--sampler": "sampler", "--param": "params",
                 "--seed": "seed"}


def field_of(message: str) -> str | None:
    import re

    for option in re.findall(r"--[a-z-]+", message):
        if option in OPTION_FIELDS:
            return OPTION_FIELDS[option]
    return next((key for key in ("steps", "length", "sampler") if key in message), None)


WIDE = 120  # columns from which the schedule gets its panel (below: the one-line strip)
SIDES = "AB"
KEYS = [  # the key bar (widgets.keybar): rank 1 stays longest, `?` lists every key
    Key("space", "Play/Pause", "screen.toggle_play", 1),
    Key(".", "Step", "screen.step", 3),
    Key("←→", "Scrub", "screen.scrub_back", 3),
    Key("g", "Grid", "screen.grid", 2),
    Key("i", "Inspect", "screen.inspect", 2),
    Key("c", "Compare", "screen.compare", 4),
    Key("e", "Settings", "screen.edit", 1),
    Key("p", "Prompt", "screen.prompt", 5),
    Key("s", "Save", "screen.save", 6),
    Key("x", "Export", "screen.export", 7),
    Key("v", "Colour", "screen.toggle_colour", 6),
]


class GenerateScreen(ReportWorkerErrors, Screen):
    """Live reverse diffusion. Changing a control restarts the run with the new settings."""

    HELP = ("Watch the reverse process fill in the [MASK]s, step by step. The control bar shows each "
            "sampling setting beside its key; a change restarts the run at once with the same seed.")

    BINDINGS = [  # the order of the key help (`?`); the key bar shows KEYS, the control bar the setting keys
        Binding("space", "toggle_play", "Play / pause; replay a finished run"),
        Binding("full_stop", "step", "One reverse step (pauses first)", key_display="."),
        Binding("left", "scrub(-1)", "Scrub back one step", key_display="←"),
        Binding("right", "scrub(1)", "Scrub forward one step", key_display="→"),
        Binding("g", "grid", "Grid of several samples, or back to one"),
        Binding("c", "compare", "Compare two settings side by side, or end it"),
        Binding("r", "restart", "Restart the run (same settings and seed)"),
        Binding("e", "edit", "Settings dialog: every sampling setting"),
        Binding("p", "prompt", "Prompt / infill template"),
        Binding("s", "save", "Save the text(s) to a file"),
        Binding("x", "export", "Export the run: .json trajectory, .cast asciinema, .html text"),
        Binding("v", "toggle_colour", "Colour by reveal order / confidence"),
        Binding("left_square_bracket", "steps(0.5)", "Halve the steps", key_display="["),
        Binding("right_square_bracket", "steps(2)", "Double the steps", key_display="]"),
        Binding("minus", "temperature(-1)", "Temperature down", key_display="-"),
        Binding("equals_sign,plus", "temperature(1)", "Temperature up", key_display="+"),
        Binding("k", "top_k", "Next top-k"),
        Binding("o", "top_p", "Next top-p"),
        Binding("m", "cycle_sampler", "Next sampler"),
        Binding("n", "new_seed", "New seed"),
        Binding("tab", "switch_side", "Other side (compare)"),
        Binding("up", "select(-1)", "Previous sample", key_display="↑"),
        Binding("down", "select(1)", "Next sample", key_display="↓"),
        Binding("enter", "zoom", "Selected sample large"),
        Binding("escape", "unzoom", "All samples"),
        Binding("home", "scrub_to(0)", "First step"),
        Binding("end", "live", "Live"),
        Binding("i", "inspect", "Inspect and edit tokens (a click on a token too); Esc leaves"),
        Binding("shift+left", "extend(-1)", "Inspect: extend the selection left", key_display="⇧←"),
        Binding("shift+right", "extend(1)", "Inspect: extend the selection right", key_display="⇧→"),
        Binding("backspace", "remask", "Inspect: remask the selection (or the token under the cursor)", key_display="⌫"),
        Binding("l", "lock", "Inspect: lock / unlock the selection (never remasked)"),
        Binding("a", "insert_slot", "Inspect: insert a masked slot at the cursor"),
        Binding("d", "delete_slot", "Inspect: delete the masked slot at the cursor"),
        Binding("f", "refill", "Refill the masked positions (a new version)"),
        Binding("b", "branch", f"Branch: {BRANCHES} refills at once, Enter picks one"),
        Binding("u", "undo", "Undo: the previous version"),
        Binding("y", "redo", "Redo: the next version"),
        Binding("w", "toggle_stable", "Stable layout (words keep their lines) / free"),
    ]

    colour = reactive("order")

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._restart_pending = False
        self._draw_pending = False
        self._ready = False
        self.drawn = None                           # the frame of side A last drawn
        self.edges = FIXED_EDGES                    # the confidence bands (render.confidence_edges)
        self.frames_drawn = 0                       # draws (bursts of frames coalesce into one)
        self.draft: Draft | None = None             # inspect mode: the sample being inspected / edited
        self.versions = Versions()                  # the texts refills made (undo / redo)
        self.stable = True                          # lay a known text out on its final line breaks
        self._locked: set[int] = set()              # locked positions, kept from one version to the next
        self._branch_run: int | None = None         # the run id of a branch whose pick is pending
        self._masking = None                        # (V,) masking time per token id (spindle)
        self._infilling = 0                         # the token of the infill being computed (0: none)
        self._infill_tokens = itertools.count(1)
        self.ranking: list = []                     # the last infill's candidates, best first

    # ------------------------------------------------------------------ the App's state
    @property
    def session(self) -> Session:
        """The generation session (settings, runs, selection): the App's (DbertApp.session)."""
        return self.app.session

    @property
    def replay(self):
        """The dbert_core.replay.Replay being played instead of sampling (no model), or None: the App's."""
        return getattr(self.app, "replay", None)

    # ------------------------------------------------------------------ what is shown
    @property
    def canvas(self) -> Canvas:
        return self.query_one(Canvas)

    @property
    def grid(self) -> SampleGrid:
        return self.query_one(SampleGrid)

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

    def shown(self):
        return self.playbacks[0].shown() if self.playbacks else None

    def view_mode(self) -> str:
        return self.session.view_mode()

    def shown_text(self, side: int = 0) -> str:
        """The plain text of a side's token view, as drawn (tests and the tmux check read this)."""
        if self.view_mode() == "compare":
            return self.query_one(CompareView).panes()[side].text.plain
        if self.view_mode() == "grid":
            return self.grid.text()
        return self.canvas.text.plain

    # ------------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="gen-status")
        with Horizontal(id="gen-main"):
            yield Canvas(id="gen-tokens-box")
            yield SampleGrid(id="gen-grid")
            yield CompareView(id="gen-compare")
            yield SchedulePanel(id="gen-schedule")
            yield Static(id="gen-inspect")
        yield ScheduleStrip(id="gen-strip")
        yield Static(id="gen-inspect-line")
        yield Static(legend("order"), id="gen-legend")
        yield ControlBar(id="gen-controls")
        yield KeyBar(KEYS, id="gen-keys")

    def on_mount(self) -> None:
        self.sub_title = "Generate"
        self._ready = True
        self._arrange()
        self._show_controls()
        self.watch(self.app, "db", self.use_db)  # the App's checkpoint, now and whenever it changes

    def on_resize(self) -> None:
        self._arrange()

    def _arrange(self) -> None:
        """Show the widgets of the current view; the schedule as a panel only where it is wide."""
        if not self._ready:
            return
        mode, wide = self.view_mode(), self.size.width >= WIDE
        self.canvas.display = mode == "single"
        self.grid.display = mode == "grid"
        self.query_one(CompareView).display = mode == "compare"
        inspecting = self.draft is not None and mode == "single"
        self.query_one(SchedulePanel).display = mode == "single" and wide and not inspecting
        self.query_one(ScheduleStrip).display = not (mode == "single" and wide) and not inspecting
        self.query_one("#gen-inspect").display = inspecting and wide
        self.query_one("#gen-inspect-line").display = inspecting and not wide
        self.grid.fit(self.size.width, WIDE)

    # ------------------------------------------------------------------ the model
    @property
    def db(self):
        """The checkpoint being run: the App's (DbertApp.db); the screen keeps no copy."""
        return getattr(self.app, "db", None)

    def use_db(self, db) -> None:
        """The App's checkpoint changed (its settings are already fitted to it): start a run."""
        if db is not None:
            self.restart()

    # ------------------------------------------------------------------ runs
    def _restart_soon(self) -> None:
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
        from dbert_core.errors import DbertError
        from dbert_core.infill import has_range

        if self.replay is None and has_range(self.session.settings.prompt):
            self._start_infill()
            return
        self._infilling = 0
        try:
            playbacks = self.session.replay_runs(self.replay) if self.replay is not None else self.session.new_runs(self.db)
        except DbertError as e:
            self.app.notify(str(e), title="settings", severity="error")
            return
        self.draft = None
        self.versions = Versions()
        self._locked = set()
        self._branch_run = None
        self._start(playbacks)

    # ------------------------------------------------------------------ infill of unknown length
    def _start_infill(self) -> None:
        """A prompt with [MASK*A-B]: every length drawn and ranked (dbert_core.infill) in a
        worker; the winner's batch is then played back, the winner shown large."""
        from dbert_core.errors import DbertError
        from dbert_core.sample import resolve

        try:
            cfg = resolve(dataclasses.replace(self.session.settings, n=1), self.db)
        except DbertError as e:
            self.app.notify(str(e), title="settings", severity="error")
            return
        self.workers.cancel_group(self, "sample-0")
        self.workers.cancel_group(self, "sample-1")
        self.draft = None
        self.versions = Versions()
        self._branch_run = None
        self.session.partner, self.session.side = None, 0
        self.session.playbacks = []
        token = self._infilling = next(self._infill_tokens)
        self.canvas.say(Text("infill: drawing every length and ranking them by "
                               "the model's ELBO per token…", style="dim"))
        self._arrange()
        self._status()
        self.run_worker(partial(self._infill, token, cfg, self.db), name="infill", group="sample-0", exclusive=True,
                        thread=True, exit_on_error=False)

    def _infill(self, token: int, cfg, db) -> None:
        """(worker thread) The infill's candidates, posted when all are ranked."""
        from dbert_core.infill import infill

        from ..controller import TOPK

        worker = get_current_worker()

        class Cancelled(Exception):
            pass

        def check(_frame) -> None:
            if worker.is_cancelled:
                raise Cancelled

        keep: dict = {}
        try:
            got = infill(db, cfg, on_frame=check, keep=keep, topk=TOPK)
        except Cancelled:
            return
        self.post_message(InfillReady(token, got, keep))

    @on(InfillReady)
    def _infill_ready(self, message: InfillReady) -> None:
        if message.token != self._infilling or not message.candidates:
            return
        from dbert_core.infill import variants
        from dbert_core.trajectory import reveal_order

        from ..controller import compact

        self._infilling = 0
        self.ranking = message.candidates
        best = message.candidates[0]
        frames = [compact(f) for f in message.keep[best.lengths]]
        s = dataclasses.replace(self.session.settings, n=frames[-1].ids.shape[0], length=frames[-1].ids.shape[1])
        template = dict(variants(self.session.settings.prompt))[best.lengths]
        run = Run(next(self.session._ids), s, playing=True, source=frames, source_order=reveal_order(frames),
                  source_prompt=template)
        self.session.playbacks = [Playback(run)]
        self.session.selected, self.session.zoomed = best.row, s.n > 1
        lines = [f"#{i + 1} {c.score:.3f} nats/token, {'+'.join(map(str, c.lengths))} token(s)"
                 for i, c in enumerate(message.candidates[:3])]
        self.app.notify(f"infill: {len(message.candidates)} candidates ranked by ELBO per token; shown: the best\n"
                        + "\n".join(lines), title="infill", timeout=10)
        self._start(self.session.playbacks)

    def _start(self, playbacks: list[Playback]) -> None:
        """Start a worker per playback (a sampler, or a replay's recorded frames)."""
        if len(playbacks) == 1:
            self.workers.cancel_group(self, "sample-1")
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
        for i, pb in enumerate(playbacks):
            self.run_worker(partial(self._sample, pb.run, self.db), name="sampling", group=f"sample-{i}",
                            exclusive=True, thread=True, exit_on_error=False)
        self._status()

    def _sample(self, run: Run, db) -> None:
        """(worker thread) Compute the run's frames and post each one; then say it finished."""
        worker = get_current_worker()
        index = itertools.count()
        if produce(run, db, lambda: worker.is_cancelled,
                   lambda rec: self.post_message(FrameReady(run.id, next(index), rec))):
            self.post_message(RunFinished(run.id))

    @on(FrameReady)
    def _frame_ready(self, message: FrameReady) -> None:
        pb = self.session.playback_of(message.run_id)
        if pb is not None:
            pb.run.record(message.rec)
            self._draw_soon()

    @on(RunFinished)
    def _run_finished(self, message: RunFinished) -> None:
        pb = self.session.playback_of(message.run_id)
        if pb is not None:
            pb.run.finished = True
            if pb.run.template is not None and pb.run.source is None and pb.run.settings.n == 1:  # a refill: a new version
                self.versions.add(Version(pb.run, 0))
            self._draw_soon()

    # ------------------------------------------------------------------ drawing
    def _draw_soon(self) -> None:
        """One draw after the frames already queued (a burst of frames is drawn once)."""
        if not self._draw_pending:
            self._draw_pending = True
            self.call_later(self._draw)

    def _mark_selected(self) -> None:
        self.grid.mark(self.session.selected)

    def _draw(self) -> None:
        self._draw_pending = False
        if not self.playbacks or self.db is None:
            return
        mode = self.view_mode()
        if self.colour == "confidence":
            edges = self._confidence_edges()
            if edges != self.edges:
                self.edges = edges
                self._show_controls()
        if mode == "compare":
            self._draw_compare()
        elif mode == "grid":
            self._draw_grid()
        else:
            self._draw_single()
        rec = self.playbacks[0].shown()
        if rec is not None and rec is not self.drawn:
            self.drawn = rec
            self.frames_drawn += 1
        active = self.session.active_playback().shown()
        if active is not None:
            f = active.frame
            for widget in (self.query_one(SchedulePanel), self.query_one(ScheduleStrip)):
                widget.set_position(f.step, float(f.masked.double().mean()))
        self._status()

    def _confidence_edges(self) -> tuple[float, ...]:
        """The confidence bands: quintiles over the newest frame of every side (so a scrubbed
        frame keeps the colours of the run, and both sides of a comparison share one scale)."""
        import torch

        newest = [pb.frames[-1].frame.confidence.flatten() for pb in self.playbacks if pb.frames]
        return confidence_edges(torch.cat(newest)) if newest else FIXED_EDGES

    def _prompt_words(self, prompt: str | None = None) -> dict[int, str] | None:
        """The prompt's own words by position (shown as typed), for the session's prompt or this one."""
        from dbert_core.sample import prompt_words

        if prompt is None and self.run is not None and self.run.source_prompt is not None:
            prompt = self.run.source_prompt  # an infill: the winner's length
        elif prompt is None and self.run is not None and self.run.template is not None:
            return None  # a refill: the positions are the draft's, not the prompt's
        prompt = self.session.settings.prompt if prompt is None else prompt
        return prompt_words(self.db, prompt) if prompt and self.db is not None else None

    def _draw_single(self) -> None:
        pb = self.playbacks[0]
        rec = pb.shown()
        if rec is None:
            return
        row = self.session.selected if rec.frame.ids.shape[0] > 1 else 0
        if self.draft is not None:
            self._show_inspector(self.canvas.draw_draft(self.db, self.draft, self.colour, self.edges))
        else:
            self.canvas.draw(self.db, rec, row if rec.frame.ids.shape[0] > 1 else None, self.colour, self.edges,
                             self._prompt_words(), final_of(pb.run, self.stable))

    # ------------------------------------------------------------------ the token inspector
    def _masking_of(self):
        """masking(id) -> the token's mean masking time, for the spindle schedule (else None)."""
        db = self.db
        if db is None or db.schedule.name != "spindle":
            return None
        if hasattr(db, "masking_time"):  # a replay: the file's
            return db.masking_time
        if self._masking is None or self._masking[0] is not db:
            import torch

            from dbert_core.inspector import masking_time

            self._masking = (db, masking_time(db.schedule, torch.arange(len(db.schedule.centered))))
        table = self._masking[1]
        return lambda i: float(table[i]) if 0 <= i < len(table) else None

    def inspected(self) -> dict | None:
        """dbert_core.inspector.token_info of the token under the inspector's cursor."""
        from dbert_core.inspector import token_info

        d = self.draft
        if d is None or not d.ids:
            return None
        rec = d.recorded()
        tok = self.db.tokenizer
        info = token_info(rec.frame, rec.order, 0, min(d.cursor, len(d.ids) - 1),
                          lambda i: tok.convert_ids_to_tokens([int(i)])[0], self._masking_of())
        if info.get("masking_time") is None:
            info.pop("masking_time", None)
        return info

    def _show_inspector(self, rec) -> None:
        info = self.inspected()
        steps, T = rec.frame.steps, self.db.schedule.T
        self.query_one("#gen-inspect", Static).update(inspector_lines(info, steps, T, compact=False))
        self.query_one("#gen-inspect-line", Static).update(inspector_lines(info, steps, T, compact=True))

    def action_inspect(self) -> None:
        """Inspect mode on (the run pauses; the cursor on the first token) or off."""
        if self.draft is not None:
            self._leave_inspect()
            return
        self._enter_inspect()

    def _enter_inspect(self, cursor: int | None = None) -> bool:
        if self.view_mode() == "compare" and self.playbacks:
            self.app.notify("inspect works on one run: end the comparison first (c)", severity="warning")
            return False
        if not self.playbacks or self.db is None:
            return False
        pb = self.playbacks[0]
        rec = pb.shown()
        if rec is None:
            return False
        if not pb.run.finished:
            pb.run.set_playing(False)
        if self.view_mode() == "grid":
            self.session.zoomed = True
        row = self.session.selected if rec.frame.ids.shape[0] > 1 else 0
        self.draft = Draft.of(rec, row, self.db.model.mask_id, self._locked)
        positions = self.canvas.positions = [sp.index for sp in row_spans(self.db, rec, row)]
        self.draft.cursor = cursor if cursor is not None else (positions[0] if positions else 0)
        self._arrange()
        self._draw()
        return True

    def _leave_inspect(self) -> None:
        if self.draft is not None:
            self._locked = set(self.draft.locked)
        self.draft = None
        self._arrange()
        self._draw()

    def _edit(self, name: str, *args):
        """Draft method `name` from a key (nothing outside inspect mode), then a redraw."""
        if self.draft is None:
            return None
        result = getattr(self.draft, name)(*args)
        self._draw()
        return result

    def action_extend(self, delta: int) -> None:
        self._edit("move", delta, self.canvas.positions, True)

    def action_remask(self) -> None:
        if self._edit("remask") == 0:
            self.app.notify("nothing to remask there (locked, or masked already)", severity="warning")

    def action_lock(self) -> None:
        self._edit("toggle_lock")

    def action_insert_slot(self) -> None:
        if self.db is not None and self._edit("insert", self.db.model.max_length) is False:
            self.app.notify("the text is at the model's maximum length", severity="warning")

    def action_delete_slot(self) -> None:
        if self._edit("delete") is False:
            self.app.notify("only a masked slot can be deleted (remask the token first: ⌫)", severity="warning")

    def _can_refill(self) -> bool:
        if self.draft is None:
            self.app.notify("inspect first (i), then remask tokens (⌫) to refill", severity="warning")
            return False
        if getattr(self.db, "sampling", True) is False:
            self.app.notify("a replay has no model: refill needs the checkpoint (dbert-tui -c NAME)", severity="warning")
            return False
        if not self.draft.masked:
            self.app.notify("nothing is masked: remask tokens first (⌫)", severity="warning")
            return False
        return True

    def action_refill(self) -> None:
        """Fill the draft's masked positions in (a normal run, shown filling in): a new version."""
        self._refill(1)

    def action_branch(self) -> None:
        """BRANCHES refills of the same draft at once, in the grid; Enter (or a click) picks one."""
        self._refill(BRANCHES)

    def _refill(self, n: int) -> None:
        if not self._can_refill():
            return
        d = self.draft
        if not self.versions:  # the text edited is the first version
            self.versions.add(Version(self.playbacks[0].run, d.row))
        self._locked = set(d.locked)
        template = d.template()
        self.draft = None
        pb = self.session.edit_run(template, n, seed=self.session.settings.seed * 7919 + 104729 * len(self.versions.items)
                                   + n)
        self._branch_run = pb.run.id if n > 1 else None
        self.frames_drawn = 0
        self.drawn = None
        self.grid.make_cards(n, self.session.selected)
        self._arrange()
        self._show_controls()
        self._start([pb])

    def _play_again(self, run: Run) -> None:
        """A finished run's recorded frames played again through the gate (nothing is sampled)."""
        frames = [rec.frame for rec in run.frames]
        again = Run(next(self.session._ids), run.settings, playing=True, template=run.template, source=frames,
                    source_order=run.frames[-1].order)
        self.session.playbacks = [Playback(again)]
        for i, v in enumerate(self.versions.items):  # the version now shown is the new copy
            if v.run is run:
                self.versions.items[i] = Version(again, v.row)
        self._start(self.session.playbacks)

    def _show_version(self, version: Version | None, what: str) -> None:
        if version is None:
            self.app.notify(f"nothing to {what}", severity="warning")
            return
        self.workers.cancel_group(self, "sample-0")
        self.session.show_version(version.run, version.row)
        self.draft = None
        self._arrange()
        self._draw()

    def action_undo(self) -> None:
        self._show_version(self.versions.undo(), "undo")

    def action_redo(self) -> None:
        self._show_version(self.versions.redo(), "redo")

    def action_toggle_stable(self) -> None:
        self.stable = not self.stable
        self.app.notify("stable layout: words keep the final text's lines" if self.stable
                        else "free layout: each frame wrapped as it reads", timeout=3)
        self._draw()

    @on(TokenPointed)
    def _token_pointed(self, message: TokenPointed) -> None:
        """The mouse: a press on a token inspects it (inspect mode on), a drag selects from the
        press to here, a hover moves the cursor while inspecting."""
        pos = message.position
        if self.draft is None:
            if message.press:
                self._enter_inspect(pos)
                if self.draft is not None:
                    self.draft.anchor = pos
            return
        d = self.draft
        if message.press:
            d.cursor, d.anchor, d.selected = pos, pos, set()
        elif message.drag and d.anchor is not None:
            d.select_range(d.anchor, pos, self.canvas.positions)
            d.cursor = pos
        else:
            d.cursor = pos
        self._draw()

    def _draw_grid(self) -> None:
        rec = self.playbacks[0].shown()
        if rec is not None:
            self.grid.draw(self.db, rec, self.colour, self.edges, self._prompt_words(),
                           final_of(self.playbacks[0].run, self.stable))

    def _draw_compare(self) -> None:
        self.query_one(CompareView).draw(self.db, self.playbacks, self.session.side, self.session.selected, self.colour,
                                         self.edges, self._prompt_words, not self.app.deterministic)

    def _status(self) -> None:
        text = Text()
        mode = self.view_mode()
        if self._infilling:
            text.append("infill", style="bold magenta")
            text.append(" · drawing every length of the [MASK*A-B] span, ranking by ELBO per token…", style="dim")
        elif self.run is None or self.db is None:
            text.append("no run", style="dim")
        elif mode == "compare":
            seeds = {pb.run.settings.seed for pb in self.playbacks}
            text.append("compare A | B", style="bold")
            text.append(f" · seed {'/'.join(map(str, sorted(seeds)))} · keys change {SIDES[self.session.side]}"
                        " (Tab: switch) · c: end")
        else:
            pb = self.playbacks[0]
            rec = pb.shown()
            n, selected = pb.run.settings.n, self.session.selected
            if n > 1:
                text.append(f"sample {selected + 1}/{n} · " if mode == "single" else f"{n} samples · ", style="bold")
            below = self.grid.cards_below() if mode == "grid" else []
            if below:  # early in the line: it must not be cut off on a narrow terminal
                text.append(f"#{below[0] + 1}{'' if len(below) == 1 else f'-#{below[-1] + 1}'} below (↓) · ",
                            style="bold yellow")
            if self.draft is not None:
                d = self.draft
                text.append("inspect", style="bold magenta")
                text.append(f" · {d.masked} masked · {len(d.locked)} locked · ⌫ remask · f refill · b branch · Esc")
                if self.versions:
                    text.append(f" · {self.versions.label()}", style="dim")
            elif rec is None:
                text.append(f"step 0/{pb.run.settings.steps} · starting", style="dim")
            else:
                if self.versions:
                    text.append(f"{self.versions.label()} · ", style="bold magenta")
                if self._branch_run is not None and pb.run.id == self._branch_run:
                    text.append("branch: Enter picks · ", style="bold magenta")
                text.append_text(progress_line(pb, rec, selected if mode == "single" and n > 1 else None,
                                               not self.app.deterministic))
        self.query_one("#gen-status", Static).update(text)
        self._show_keys()

    def _show_keys(self) -> None:
        """The key bar's space key says what it does now: Pause, Play or Replay."""
        label = "Play/Pause"
        if self.playbacks:
            if all(pb.run.finished for pb in self.playbacks):
                label = "Replay"
            else:
                label = "Pause" if self.playbacks[0].run.playing else "Play"
        bar = self.query_one(KeyBar)
        keys = tuple(replace(k, label=label) if k.key == "space" else k for k in KEYS)
        if keys != bar.keys:
            bar.keys = keys

    def _show_curve(self) -> None:
        """The schedule's expected masked fraction after each shown step (the engine's curve:
        sample.masked_curve), or the one a replayed file carries."""
        curve = getattr(self.db, "curve", None)
        if not curve:
            from dbert_core.sample import masked_curve

            curve = [float(v) for v in masked_curve(self.db, self.session.shown_settings().steps)]
        title = f"{self.db.schedule.name} T={self.db.schedule.T}"
        for widget in (self.query_one(SchedulePanel), self.query_one(ScheduleStrip)):
            widget.set_curve(curve, title)

    def _show_controls(self) -> None:
        bar = self.query_one(ControlBar)
        session = self.session
        bar.settings = dataclasses.replace(session.shown_settings())
        bar.side = SIDES[session.side] if session.partner is not None else ""
        runs = [pb.run.settings for pb in self.playbacks]
        fields = {f for _, _, f in CONTROLS}
        bar.differs = frozenset(differences(runs[0], runs[-1]) & fields) if len(runs) > 1 else frozenset()
        legend_text = legend(self.colour, self.edges)
        if session.settings.prompt:
            legend_text.append(f"  · prompt {session.settings.prompt[:40]!r}", style="dim")
        self.query_one("#gen-legend", Static).update(legend_text)

    def watch_colour(self, value: str) -> None:
        if self._ready:
            self._show_controls()
            self._draw()

    # ------------------------------------------------------------------ playback
    def action_toggle_play(self) -> None:
        if not self.playbacks:
            return
        if self.draft is not None:
            self._leave_inspect()
        if all(pb.run.finished for pb in self.playbacks):
            if self.versions:  # an edited text: play its recorded frames again (the versions stay)
                self._play_again(self.playbacks[0].run)
                return
            self.restart()  # replay from the start
            return
        playing = not self.playbacks[0].run.playing
        for pb in self.playbacks:
            pb.run.set_playing(playing)
            pb.live()
        self._draw()

    def action_step(self) -> None:
        """One reverse step (pauses first); while scrubbing, one recorded step forward."""
        for pb in self.playbacks:
            pb.step()
        self._draw()

    def action_scrub(self, delta: int) -> None:
        if self.draft is not None:  # inspect mode: the arrows move the cursor
            self.draft.move(delta, self.canvas.positions)
            self._draw()
            return
        for pb in self.playbacks:
            pb.scrub(delta)
        self._draw()

    def action_scrub_back(self) -> None:
        """A click on the key bar's ←→: one step back."""
        self.action_scrub(-1)

    def action_scrub_to(self, index: int) -> None:
        for pb in self.playbacks:
            pb.scrub_to(index)
        self._draw()

    def action_live(self) -> None:
        for pb in self.playbacks:
            pb.live()
        self._draw()

    def action_restart(self) -> None:
        self.restart()

    # ------------------------------------------------------------------ controls
    def _change(self, method, *args) -> None:
        """A Session change (a control key), then a restart at once with the same seed; a value
        the checkpoint cannot take is a notification and the run goes on."""
        from dbert_core.errors import DbertError

        if self.db is None:
            return
        if self.replay is not None:
            self.app.notify("a replay plays the file's frames: its settings cannot change", severity="warning")
            return
        try:
            method(*args)
        except DbertError as e:
            self.app.notify(str(e), title="settings", severity="error")
            return
        self._restart_soon()

    def action_steps(self, factor: float) -> None:
        self._change(self.session.steps, self.db, factor)

    def action_temperature(self, direction: int) -> None:
        self._change(self.session.temperature, self.db, direction)

    def action_top_k(self) -> None:
        self._change(self.session.top_k, self.db)

    def action_top_p(self) -> None:
        self._change(self.session.top_p, self.db)

    def action_cycle_sampler(self) -> None:
        self._change(self.session.next_sampler, self.db)

    def action_new_seed(self) -> None:
        self._change(self.session.new_seed)

    def action_toggle_colour(self) -> None:
        self.colour = "confidence" if self.colour == "order" else "order"

    # ------------------------------------------------------------------ samples and comparison
    def action_grid(self) -> None:
        """One sample <-> a grid of several (the last number used, 6 at first), same seed."""
        self._change(self.session.toggle_grid)

    def action_select(self, delta: int) -> None:
        if not self.session.select(delta):
            return
        self._mark_selected()
        if self.view_mode() == "grid":
            self.grid.reveal(self.session.selected)
        self._draw()

    def action_zoom(self) -> None:
        if self.draft is not None:  # inspect mode: Enter selects / unselects the token under the cursor
            self.draft.toggle_select()
            self._draw()
            return
        if self._pick_branch(self.session.selected):
            return
        if self.session.zoom():
            self._arrange()
            self._draw()

    def _pick_branch(self, row: int) -> bool:
        """In a finished branch grid, choosing a sample makes it the new version."""
        pb = self.playbacks[0] if self.playbacks else None
        if pb is None or self._branch_run != pb.run.id or not pb.run.finished:
            return False
        self._branch_run = None
        self.versions.add(Version(pb.run, row))
        self.session.show_version(pb.run, row)
        self._mark_selected()
        self._arrange()
        self._draw()
        return True

    def action_unzoom(self) -> None:
        if self.draft is not None:
            self._leave_inspect()
            return
        if self.session.unzoom():
            self._arrange()
            self._draw()

    @on(SampleChosen)
    def _sample_chosen(self, message: SampleChosen) -> None:
        if self._pick_branch(message.index):
            return
        if self.session.zoom(message.index):
            self._mark_selected()
            self._arrange()
            self._draw()

    def action_compare(self) -> None:
        """Start a comparison (side B: side A with an eighth, or 8x, of the steps; the keys
        change B) or end one (side A goes on alone)."""
        if self.db is None:
            return
        if self.session.partner is None:
            self.session.start_compare(self.db.schedule.T)
            self.restart()
            return
        self.session.end_compare()
        self.workers.cancel_group(self, "sample-1")
        self._arrange()
        self._show_curve()
        self._show_controls()
        self._draw()

    def action_switch_side(self) -> None:
        if self.session.switch_side():
            self._show_curve()
            self._show_controls()
            self._draw()

    # ------------------------------------------------------------------ dialogs
    def action_edit(self) -> None:
        from dbert_core.config import STRATEGIES

        s = self.session.active
        fields = [
            ("steps", "steps (1..T)", str(s.steps), ""),
            ("temperature", "temperature (0: greedy)", f"{s.temperature:g}", ""),
            ("top_k", "top-k (0: off)", str(s.top_k), ""),
            ("top_p", "top-p (0..1]", f"{s.top_p:g}", ""),
            ("length", "length (tokens)", "" if s.length is None else str(s.length), "the checkpoint's"),
            ("n", "samples", str(s.n), ""),
            ("seed", "seed", str(s.seed), ""),
            ("sampler", "sampler", s.sampler or "", "auto: " + " | ".join(STRATEGIES)),
            ("params", "sampler parameters", " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                                                      for k, v in (s.params or {}).items()), "NAME=VALUE ...: defaults"),
            ("pace_ms", "ms per step (0: fastest)", str(s.pace_ms), ""),
        ]
        title = "Sampling settings (Enter applies and restarts)"
        if self.session.partner is not None:
            title = f"Side {SIDES[self.session.side]}: " + title
        self.app.push_screen(FormDialog(title, fields, "Apply", check=self._check_settings), self._apply_settings)

    def _settings_fields(self, values: dict) -> dict:
        """The dialog's text as settings of the active side, checked against the checkpoint;
        raises FieldError naming the first bad field."""
        from dbert_core.errors import DbertError

        old = self.session.active
        fields: dict = {}
        for key, kind in (("steps", int), ("temperature", float), ("top_k", int), ("top_p", float), ("n", int),
                          ("seed", int), ("pace_ms", int), ("length", int)):
            text = values[key]
            if key == "length" and not text:
                fields[key] = old.length
                continue
            try:
                fields[key] = kind(text)
            except ValueError:
                whole = "a whole number" if kind is int else "a number"
                name = {"n": "samples", "pace_ms": "ms per step"}.get(key, key.replace("_", "-"))
                raise FieldError(key, f"{name} must be {whole}, got {text!r}") from None
        if not 1 <= fields["n"] <= MAX_N:
            raise FieldError("n", f"samples must be 1..{MAX_N}")
        if fields["pace_ms"] < 0:
            raise FieldError("pace_ms", "the pace must be >= 0 ms")
        fields["sampler"] = values["sampler"].strip() or None
        fields["params"] = None
        try:
            if values.get("params", "").strip():
                if fields["sampler"] is None:
                    raise FieldError("params", "sampler parameters need a sampler named")
                from dbert_core.strategies import parse_params

                fields["params"] = parse_params(fields["sampler"], values["params"].split())
        except DbertError as e:
            raise FieldError("params", str(e)) from None
        try:
            new = dataclasses.replace(old, **fields)
            if self.db is not None:
                from dbert_core.sample import resolve

                resolve(new, self.db)
            else:
                new.validate()
        except DbertError as e:
            raise FieldError(field_of(str(e)), str(e).replace("--", "")) from None
        return fields

    def _check_settings(self, values: dict):
        try:
            self._settings_fields(values)
        except FieldError as e:
            return e.key, e.message
        return None

    def _apply_settings(self, values: dict | None) -> None:
        if not values:
            return
        from dbert_core.errors import DbertError

        old = self.session.active
        try:
            fields = self._settings_fields(values)
            self.session.change(self.db, **fields)
        except (FieldError, DbertError) as e:  # the dialog checked them; the checkpoint may have changed since
            self.app.notify(str(e), title="settings", severity="error")
            return
        if fields["length"] != old.length:
            self.session.auto_length = False
        self.restart()

    def action_prompt(self) -> None:
        self.app.push_screen(FormDialog("Prompt / infill template: text with \\[MASK] slots (\\[MASK*N]: N of them, "
                                        "\\[MASK*A-B]: A to B tokens, ranked by the model's ELBO per token); masks are "
                                        "appended up to the length (empty: unconditional)",
                                        [("prompt", "template", self.session.settings.prompt,
                                          "the cat [MASK] on the [MASK]")], "Use"), self._apply_prompt)

    def _apply_prompt(self, values: dict | None) -> None:
        if values is None:
            return
        from dbert_core.errors import DbertError
        from dbert_core.infill import has_range, variants
        from dbert_core.sample import parse_prompt

        if values["prompt"] and self.db is not None:
            try:
                if has_range(values["prompt"]):
                    variants(values["prompt"])  # the spans are checked; each length is the template's own
                else:
                    parse_prompt(self.db, values["prompt"], self.session.settings.length)
            except DbertError as e:
                self.app.notify(str(e), title="prompt", severity="error")
                return
        self.session.set_all(prompt=values["prompt"])
        self.restart()

    # ------------------------------------------------------------------ files
    def _default_name(self, ext: str) -> str:
        """output_dir()/<checkpoint>-seed<seed>.<ext> (one dbert- prefix at most: the shipped
        checkpoints' names carry one already), made unique."""
        name = Path(self.db.path).name if self.db is not None and self.db.path else "dbert"
        stem = f"{name if name.startswith('dbert') else 'dbert-' + name}-seed{self.session.active.seed}"
        return str(default_output(stem, ext))

    def action_save(self) -> None:
        pb = self.session.active_playback()  # save and export write the side the keys change
        if pb is None or not pb.frames:
            self.app.notify("nothing to save yet", severity="warning")
            return
        f = pb.frames[-1].frame
        title = "Save the text(s), one per line"
        left = int(f.masked.sum())
        if left:  # say what a half-filled run writes
            title = (f"The run is at step {f.step}/{f.steps}: {left} of {f.masked.numel()} tokens are still masked "
                     f"and are written as \\[MASK]. Save the text so far, one per line?")
        self.app.push_screen(FormDialog(title, [("path", "file", self._default_name("txt"), "")], "Save"),
                             partial(self._save, pb))

    def _save(self, pb: Playback, values: dict | None) -> None:
        if not values or not values["path"] or not pb.frames:
            return
        rec = pb.frames[-1]
        texts = texts_of(self.db, rec)
        target = output_path(values["path"])
        try:
            path = atomic_write(target, "".join(t + "\n" for t in texts))
        except (OSError, DbertError) as e:  # layout.atomic_write_text: DbertError "cannot write ..."
            self.app.notify(str(e) if isinstance(e, DbertError) else f"cannot write {target}: "
                            f"{e.strerror or e}", severity="error")
            return
        left = int(rec.frame.masked.sum())
        what = f" (step {rec.frame.step}/{rec.frame.steps}, {left} [MASK] left)" if left else ""
        self.app.notify(f"saved {len(texts)} text(s){what} to {Path(path).resolve()}", timeout=8)

    def _export_text(self, pb: Playback, suffix: str) -> str:
        """The run as a file of type suffix: .cast, .html, else the JSON trajectory."""
        import json

        from dbert_core import share

        run = pb.run
        frames = [rec.frame for rec in run.frames]
        order = run.frames[-1].order
        name = Path(self.db.path).name if self.db.path else "dbert"
        rows = [self.session.selected] if frames[-1].ids.shape[0] > 1 and self.view_mode() == "single" else None
        if suffix == ".cast":
            return share.cast(self.db, frames, order, width=max(40, min(120, self.size.width)), title=f"dbert · {name}",
                              rows=rows, verbatim=self._prompt_words())
        if suffix in (".html", ".htm"):
            return share.html(self.db, frames, order, title=f"dbert · {name}", verbatim=self._prompt_words())
        if self.replay is not None and run.source is not None:  # the file as it was read
            return json.dumps(self.replay.data) + "\n"
        return json.dumps(trajectory(self.db, run)) + "\n"

    def action_export(self) -> None:
        pb = self.session.active_playback()
        if pb is None or not pb.frames:
            self.app.notify("nothing to export yet", severity="warning")
            return
        self.app.push_screen(FormDialog("Export the run: .json the trajectory (every frame; dbert-tui --replay "
                                        "plays it), .cast an asciinema recording, .html the text coloured by reveal order",
                                        [("path", "file", self._default_name("json"), "")], "Export"),
                             partial(self._export, pb))

    def _export(self, pb: Playback, values: dict | None) -> None:
        if not values or not values["path"]:
            return
        target = output_path(values["path"])
        try:
            path = atomic_write(target, self._export_text(pb, target.suffix.lower()))
        except (OSError, DbertError) as e:  # layout.atomic_write_text: DbertError "cannot write ..."
            self.app.notify(str(e) if isinstance(e, DbertError) else f"cannot write {target}: "
                            f"{e.strerror or e}", severity="error")
            return
        self.app.notify(f"exported {len(pb.frames)} frames to {Path(path).resolve()}", timeout=8)
