"""The Generate screen's keys: `CATALOGUE`, every key written once (keymap.KeySpec) in the order of
the key help (`?`), from which its BINDINGS, its key bar's KEYS and its palette commands are made;
and `KeyActions`, what each key does: the screen's actions (GenerateScreen mixes them in), each
asking the Session or the widget that owns what it changes and redrawing, through the screen's
public interface (`KeyHost`) only. Keys are the screen's because no part of it takes focus."""

from __future__ import annotations

from functools import partial
from typing import Protocol

from dbert_core.errors import DbertError

from ...controller import BRANCHES, Session
from ...runs import TOPK, Playback
from ...files import EXPORT_TITLE, default_name, export_run, save_texts, save_title, texts_of
from ...forms import PROMPT_TITLE, said
from ...keymap import KeySpec, bindings
from ...messages import PromptChosen, SettingsChosen
from ...widgets.keybar import bar_keys
from ...widgets.generate.canvas import Canvas
from ...widgets.generate.controls import Controls
from ...widgets.generate.editor import Editor
from ...widgets.generate.entropy import EntropyPanel
from ...widgets.generate.grid import SampleGrid
from ...widgets.generate.player import Player
from ..dialogs import FormDialog

CATALOGUE = (  # every key, in the order of the key help (`?`); the key bar shows those with a label, in `at` order
    # KeySpec(key, action, help, shown, bar, rank, at, palette, about): keymap.KeySpec says what each is
    KeySpec("space", "toggle_play", "Play / pause; a finished run: its frames again", "", "Play/Pause", 1, 1, "", ""),
    KeySpec("full_stop", "step", "One reverse step (pauses first)", ".", "Step", 3, 2, "", ""),
    KeySpec("left", "scrub(-1)", "Scrub back one step", "←", "Scrub", 3, 3, "", ""),
    KeySpec("right", "scrub(1)", "Scrub forward one step", "→", "Scrub", 3, 3, "", ""),
    KeySpec("g", "grid", "Grid of several samples, or back to one", "", "Grid", 2, 4, "Several samples", "A grid of samples of one run, or back to one"),
    KeySpec("c", "compare", "Compare two settings (separate draws, one seed), or end it", "", "Compare", 4, 6, "Compare two settings", "Two settings side by side: separate draws with one seed"),
    KeySpec("r", "restart", "Restart the run (same settings and seed)", "", "", 5, 0, "Restart sampling", "A new run with the same settings"),
    KeySpec("e", "edit", "Settings dialog: every sampling setting", "", "Settings", 1, 7, "Sampling settings", "Steps, temperature, top-k/p, length, seed, sampler"),
    KeySpec("p", "prompt", "Prompt / infill template", "", "Prompt", 5, 8, "Prompt / infill template", r"Text with \[MASK] slots"),
    KeySpec("s", "save", "Save the text(s) and settings; one sample shown: that one", "", "Save", 6, 9, "Save texts", "Write the generated text(s) to a file"),
    KeySpec("C", "copy", "Copy the selected sample to the clipboard (OSC 52)", "C", "", 5, 0, "Copy sample", "The selected sample's text to the clipboard"),
    KeySpec("x", "export", "Export the run: .json trajectory, .cast asciinema, .html text", "", "Export", 7, 10, "Export trajectory", "Every frame as JSON, or an asciinema .cast, or .html"),
    KeySpec("v", "toggle_colour", "Colour by reveal order / confidence", "", "Colour", 6, 11, "Toggle colouring", "Reveal order / confidence"),
    KeySpec("left_square_bracket", "steps(0.5)", "Halve the steps", "[", "", 5, 0, "", ""),
    KeySpec("right_square_bracket", "steps(2)", "Double the steps", "]", "", 5, 0, "", ""),
    KeySpec("minus", "temperature(-1)", "Temperature down", "-", "", 5, 0, "", ""),
    KeySpec("equals_sign,plus", "temperature(1)", "Temperature up", "+", "", 5, 0, "", ""),
    KeySpec("k", "top_k", "Next top-k", "", "", 5, 0, "", ""),
    KeySpec("o", "top_p", "Next top-p", "", "", 5, 0, "", ""),
    KeySpec("m", "cycle_sampler", "Next sampler", "", "", 5, 0, "", ""),
    KeySpec("n", "new_seed", "New seed", "", "", 5, 0, "New seed", "Restart with another seed"),
    KeySpec("tab", "switch_side", "Other side (compare)", "", "", 5, 0, "", ""),
    KeySpec("up", "select(-1)", "Previous sample", "↑", "", 5, 0, "", ""),
    KeySpec("down", "select(1)", "Next sample", "↓", "", 5, 0, "", ""),
    KeySpec("enter", "zoom", "Selected sample large", "", "", 5, 0, "", ""),
    KeySpec("escape", "unzoom", "All samples", "", "", 5, 0, "", ""),
    KeySpec("home", "scrub_to(0)", "First step (a long text from its top)", "", "", 5, 0, "", ""),
    KeySpec("end", "live", "Live; a long text follows the writing again", "", "", 5, 0, "", ""),
    KeySpec("pageup", "page(-1)", "Page up a long text (stops following; End follows)", "PgUp", "", 5, 0, "", ""),
    KeySpec("pagedown", "page(1)", "Page down a long text (or the grid)", "PgDn", "", 5, 0, "", ""),
    KeySpec("i", "inspect", "Inspect and edit tokens (a click on a token too); Esc leaves", "", "Inspect", 2, 5, "Inspect tokens", "The token under a cursor: reveal step, p', top candidates; edit"),
    KeySpec("shift+left", "extend(-1)", "Inspect: extend the selection left", "⇧←", "", 5, 0, "", ""),
    KeySpec("shift+right", "extend(1)", "Inspect: extend the selection right", "⇧→", "", 5, 0, "", ""),
    KeySpec("backspace", "remask", "Inspect: remask the selection (or the token under the cursor)", "⌫", "", 5, 0, "", ""),
    KeySpec("l", "lock", "Inspect: lock / unlock the selection (never remasked)", "", "", 5, 0, "", ""),
    KeySpec("a", "insert_slot", "Inspect: insert a masked slot at the cursor", "", "", 5, 0, "", ""),
    KeySpec("d", "delete_slot", "Inspect: delete the masked slot at the cursor", "", "", 5, 0, "", ""),
    KeySpec("f", "refill", "Refill the masked positions (a new version)", "", "", 5, 0, "Refill", "Fill the remasked tokens in: a new version"),
    KeySpec("b", "branch", f"Branch: {BRANCHES} refills at once, Enter picks one", "", "", 5, 0, "Branch", "Several refills at once; Enter picks one"),
    KeySpec("u", "undo", "Undo: the previous version", "", "", 5, 0, "Undo edit", "The previous version"),
    KeySpec("y", "redo", "Redo: the next version", "", "", 5, 0, "Redo edit", "The next version"),
    KeySpec("w", "toggle_stable", "Stable layout (words keep their lines) / free", "", "", 5, 0, "Stable layout", "Words keep the final text's lines while they fill in"),
    KeySpec("h", "toggle_entropy", f"Entropy panel: top-{TOPK} entropy of p' at each step's reveals", "", "", 5, 0,
            "Entropy panel", f"The mean entropy of p' at each step's reveals, its top-{TOPK} terms: a lower bound"),
)
BINDINGS = bindings(CATALOGUE)  # the screen's (the key help lists them)
KEYS = bar_keys(CATALOGUE, "screen")  # the key bar's; the control bar shows the setting keys beside their values


class KeyHost(Protocol):
    """What KeyActions asks of the screen it is mixed into (GenerateScreen), all of it public: the
    App's state as the screen reads it, the screen's parts, and four verbs."""

    app: object
    size: object
    session: Session        # the App's: the settings, runs and selection every key changes
    db: object              # the checkpoint being run (None: none yet)
    replay: object          # a trajectory being played instead of sampling, or None
    playbacks: list         # the session's playbacks
    draft: object           # the sample being inspected (the editor's), or None
    player: Player
    canvas: Canvas
    grid: SampleGrid
    editor: Editor
    controls: Controls
    entropy: EntropyPanel

    def view_mode(self) -> str: ...

    def notify(self, message: str, *, title: str = "", **options) -> None:
        """A toast (Textual's Widget.notify)."""

    def start_runs(self, playbacks: list[Playback]) -> None:
        """Play these runs: fresh cards and panels, a worker each."""

    def restart(self) -> None:
        """New runs of every side with the same seed, at once."""

    def restart_soon(self) -> None:
        """The same, once, after the changes already queued (a burst of control keys)."""

    def redraw(self, layout: bool = False, settings: bool = False) -> None:
        """Draw again: with `layout` the views shown first, with `settings` the schedule and the control bar."""

    def prompt_words(self) -> dict[int, str] | None:
        """The prompt's own words by position, as typed (an export shows them so)."""


class KeyActions:
    """The actions of BINDINGS, mixed into GenerateScreen: each uses the host's public interface
    (KeyHost) and the members here, nothing else of the screen (tests/test_tui_keys.py checks it)."""

    # ------------------------------------------------------------------ playback
    def action_toggle_play(self) -> None:
        if not self.playbacks:
            return
        if self.draft is not None:
            self._leave_inspect()
        if self.player.finished():
            if self.editor.versions:  # an edited text: play its recorded frames again (the versions stay)
                run = self.playbacks[0].run
                again = self.session.play_again([run])
                self.editor.replace_run(run, again[0].run)  # the version it showed is now the copy
                self.start_runs(again)
                return
            self._replay_recorded()
            return
        self.player.toggle()
        self.redraw()

    def _replay_recorded(self) -> None:
        """Space on a finished run: its recorded frames played again from the start through the
        gate, every side (nothing is sampled; the final text is known, so the stable layout holds
        from the first frame unless `w` chose free). A failed run has nothing whole to play: it runs again."""
        if any(pb.run.failed or not pb.frames for pb in self.playbacks):
            self.restart()
            return
        self.start_runs(self.session.play_again([pb.run for pb in self.playbacks]))

    def action_step(self) -> None:
        """One reverse step (pauses first); while scrubbing, one recorded step forward."""
        self.player.step()
        self.redraw()

    def action_scrub(self, delta: int) -> None:
        if self.draft is not None:  # inspect mode: the arrows move the cursor
            self.draft.move(delta, self.canvas.positions)
        else:
            self.player.scrub(delta)
        self.redraw()

    def action_scrub_to(self, index: int) -> None:
        self.player.scrub_to(index)
        self.canvas.follow_writing()  # Home: the first step, where it writes (a long text's top)
        self.redraw()

    def action_live(self) -> None:
        self.player.live()
        self.canvas.follow_writing()
        self.redraw()

    def action_page(self, direction: int) -> None:
        """PgUp / PgDn: the long text (or the grid) a page up or down."""
        if self.view_mode() == "grid":
            (self.grid.scroll_page_down if direction > 0 else self.grid.scroll_page_up)(animate=False)
        elif self.view_mode() == "single":
            self.canvas.page(direction)

    def action_restart(self) -> None:
        self.restart()

    # ------------------------------------------------------------------ controls
    def _change(self, method, *args) -> None:
        """A Session change (a control key), then a restart at once with the same seed. A value the
        checkpoint cannot take is a notification and the run goes on."""
        if self.db is None:
            return
        if self.replay is not None:
            self.app.notify("a replay plays the file's frames: its settings cannot change", severity="warning")
            return
        try:
            method(*args)
        except DbertError as e:
            self.app.notify(said(e), title="settings", severity="error")
            return
        self.restart_soon()

    def action_steps(self, factor: float) -> None:
        self._change(self.session.steps, self.db, factor)

    def action_temperature(self, direction: int) -> None:
        self._change(self.session.temperature, self.db, direction)

    def action_top_k(self) -> None:
        self._change(self.session.top_k, self.db)

    def action_top_p(self) -> None:
        self._change(self.session.top_p, self.db)

    def action_cycle_sampler(self) -> None:
        from dbert_core import strategies

        self._change(self.session.next_sampler, self.db)
        name = self.session.active.sampler
        strategy = strategies.get(name) if name in strategies.names() else None
        if strategy is not None and not strategy.exact:  # the bar's `name~`: what the ~ means
            self.notify(f"{strategy.name}~ is a heuristic (~): {strategy.law}, not the model's own law "
                        "(docs/decoding.md)", title="sampler")

    def action_new_seed(self) -> None:
        self._change(self.session.new_seed)

    def action_toggle_colour(self) -> None:
        self.controls.toggle_colour()
        self.redraw(settings=True)

    def action_toggle_stable(self) -> None:
        self.controls.toggle_stable()
        self.redraw()

    def action_toggle_entropy(self) -> None:
        """The entropy panel shown (drawn at once from the frame on screen) or hidden."""
        self.entropy.toggle()
        self.redraw()

    def action_edit(self) -> None:
        """The settings dialog; applied, it posts SettingsChosen to the App, which sets them (DbertApp)."""
        title, fields = self.controls.settings_form()
        self.app.push_screen(FormDialog(title, fields, "Apply", check=lambda values: self.controls.check_settings(values, self.db),
                                        post=SettingsChosen))

    def action_prompt(self) -> None:
        """The prompt dialog; applied, it posts PromptChosen to the App, which sets it (DbertApp)."""
        self.app.push_screen(FormDialog(PROMPT_TITLE, self.controls.prompt_form(), "Use",
                                        post=lambda values: PromptChosen(values["prompt"])))

    # ------------------------------------------------------------------ samples and comparison
    def action_grid(self) -> None:
        """One sample <-> a grid of several (the last number used, 6 at first), same seed."""
        self._change(self.session.toggle_grid)

    def action_select(self, delta: int) -> None:
        if not self.session.select(delta):
            return
        self.grid.mark(self.session.selected)
        if self.view_mode() == "grid":
            self.grid.reveal(self.session.selected)
        self.redraw()

    def action_zoom(self) -> None:
        if self.draft is not None:  # inspect mode: Enter selects / unselects the token under the cursor
            self.draft.toggle_select()
            self.redraw()
            return
        if self.pick_branch(self.session.selected):
            return
        if self.session.zoom():
            self.redraw(layout=True)

    def pick_branch(self, row: int) -> bool:
        """In a finished branch grid, choosing a sample makes it the new version (shown large)."""
        version = self.editor.pick_branch(self.playbacks[0] if self.playbacks else None, row)
        if version is None:
            return False
        self.session.show_version(version.run, version.row)
        self.grid.mark(self.session.selected)
        self.redraw(layout=True)
        return True

    def action_unzoom(self) -> None:
        if self.draft is not None:
            self._leave_inspect()
            return
        if self.session.unzoom():
            self.redraw(layout=True)

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
        self.player.cancel(1)
        self.redraw(layout=True, settings=True)

    def action_switch_side(self) -> None:
        if self.session.switch_side():
            self.redraw(settings=True)

    # ------------------------------------------------------------------ inspect and edit
    def action_inspect(self) -> None:
        """Inspect mode on (the run pauses; the cursor on the first token) or off."""
        if self.draft is not None:
            self._leave_inspect()
            return
        self.enter_inspect()

    def enter_inspect(self, cursor: int | None = None) -> bool:
        """Inspect mode on (a grid shows its selected sample large); False when there is nothing to inspect."""
        if not self.editor.enter(self.db, cursor, self.prompt_words()):
            return False
        self.session.zoom()
        self.redraw(layout=True)
        return True

    def _leave_inspect(self) -> None:
        self.editor.end()
        self.redraw(layout=True)

    def action_extend(self, delta: int) -> None:
        self.editor.edit("move", delta, self.canvas.positions, True)
        self.redraw()

    def action_remask(self) -> None:
        self.editor.remask()
        self.redraw()

    def action_lock(self) -> None:
        self.editor.edit("toggle_lock")
        self.redraw()

    def action_insert_slot(self) -> None:
        if self.db is not None:
            self.editor.insert_slot(self.db.model.max_length)
            self.redraw()

    def action_delete_slot(self) -> None:
        self.editor.delete_slot()
        self.redraw()

    def action_refill(self) -> None:
        """Fill the draft's masked positions in (a normal run, shown filling in): a new version."""
        self._refill(1)

    def action_branch(self) -> None:
        """BRANCHES refills of the same draft at once, in the grid; Enter (or a click) picks one."""
        self._refill(BRANCHES)

    def _refill(self, n: int) -> None:
        edit = self.editor.refill(self.db, self.playbacks[0].run if self.playbacks else None, n, self.session.settings.seed)
        if edit is not None:
            template, seed, words = edit
            pb = self.session.edit_run(template, n, seed, words)
            self.editor.refill_started(pb.run, n)
            self.start_runs([pb])

    def action_undo(self) -> None:
        self.show_version(self.editor.undo())

    def action_redo(self) -> None:
        self.show_version(self.editor.redo())

    def show_version(self, version) -> None:
        """Show a version (undo, redo, a failed refill's) large, out of inspect mode."""
        if version is None:
            return
        self.player.cancel(0)
        self.session.show_version(version.run, version.row)
        self.editor.drop_draft()
        self.redraw(layout=True)

    # ------------------------------------------------------------------ files
    def action_save(self) -> None:
        pb = self.session.active_playback()  # save and export write the side the keys change
        if pb is None or not pb.frames:
            self.app.notify("nothing to save yet", severity="warning")
            return
        rows = self._shown_rows(pb)
        name = default_name(self.db, self.session.active.seed, "txt", rows[0] + 1 if rows else None)
        self.app.push_screen(FormDialog(save_title(pb.frames[-1].frame, rows), [("path", "file", name, "")], "Save"),
                             partial(self._save, pb))

    def _save(self, pb: Playback, values: dict | None) -> None:
        if values and values["path"] and pb.frames:
            self._report(*save_texts(values["path"], self.db, pb.frames[-1], pb.run.settings, self._shown_rows(pb)))

    def _shown_rows(self, pb: Playback) -> list[int] | None:
        """The one sample on screen when a run of several shows one (large, or a side of a
        comparison): [selected]; None in the grid or for a run of one (all of them)."""
        several = pb.frames and pb.frames[-1].frame.ids.shape[0] > 1
        return [self.session.selected] if several and self.view_mode() != "grid" else None

    def action_copy(self) -> None:
        """The selected sample's text (as saved) to the clipboard: Textual's OSC 52."""
        pb = self.session.active_playback()
        if pb is None or not pb.frames:
            self.app.notify("nothing to copy yet", severity="warning")
            return
        rec = pb.frames[-1]
        row = min(self.session.selected, rec.frame.ids.shape[0] - 1)
        text = texts_of(self.db, rec)[row]
        self.app.copy_to_clipboard(text)
        which = f"sample {row + 1} of {rec.frame.ids.shape[0]}" if rec.frame.ids.shape[0] > 1 else "the sample"
        left = int(rec.frame.masked[row].sum())
        self.app.notify(f"copied {which} to the clipboard ({len(text)} characters{f', {left} [MASK] left' if left else ''});"
                        " the terminal must allow OSC 52", timeout=5)

    def action_export(self) -> None:
        pb = self.session.active_playback()
        if pb is None or not pb.frames:
            self.app.notify("nothing to export yet", severity="warning")
            return
        self.app.push_screen(FormDialog(EXPORT_TITLE, [("path", "file", self._default_name("json"), "")], "Export"),
                             partial(self._export, pb))

    def _export(self, pb: Playback, values: dict | None) -> None:
        if not values or not values["path"]:
            return
        rows = [self.session.selected] if pb.run.frames[-1].frame.ids.shape[0] > 1 and self.view_mode() == "single" else None
        self._report(*export_run(values["path"], self.db, pb.run, rows, self.size.width, self.prompt_words(), self.replay))

    def _default_name(self, ext: str) -> str:
        return default_name(self.db, self.session.active.seed, ext)

    def _report(self, ok: bool, message: str) -> None:
        if ok:
            self.app.notify(message, timeout=8)
        else:
            self.app.notify(message, severity="error")
