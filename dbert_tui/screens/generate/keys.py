"""The Generate screen's keys: every binding in the order of the key help (`?`), the ones the
key bar shows (widgets.keybar: rank 1 stays longest), and `KeyActions`, what each key does:
the screen's actions (GenerateScreen mixes them in), each handing the key to the widget that
owns what it changes and redrawing. Keys are the screen's because no part of it takes focus."""

from __future__ import annotations

from functools import partial

from textual.binding import Binding

from ...controller import BRANCHES, Playback, Run
from ...files import EXPORT_TITLE, default_name, export_run, save_texts, save_title, texts_of
from ...forms import PROMPT_TITLE
from ...widgets.keybar import Key
from ..dialogs import FormDialog

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


BINDINGS = [  # the order of the key help (`?`); the key bar shows KEYS, the control bar the setting keys
    Binding("space", "toggle_play", "Play / pause; a finished run: its frames again"),
    Binding("full_stop", "step", "One reverse step (pauses first)", key_display="."),
    Binding("left", "scrub(-1)", "Scrub back one step", key_display="←"),
    Binding("right", "scrub(1)", "Scrub forward one step", key_display="→"),
    Binding("g", "grid", "Grid of several samples, or back to one"),
    Binding("c", "compare", "Compare two settings (separate draws, one seed), or end it"),
    Binding("r", "restart", "Restart the run (same settings and seed)"),
    Binding("e", "edit", "Settings dialog: every sampling setting"),
    Binding("p", "prompt", "Prompt / infill template"),
    Binding("s", "save", "Save the text(s) and settings; one sample shown: that one"),
    Binding("C", "copy", "Copy the selected sample to the clipboard (OSC 52)", key_display="C"),
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
    Binding("home", "scrub_to(0)", "First step (a long text from its top)"),
    Binding("end", "live", "Live; a long text follows the writing again"),
    Binding("pageup", "page(-1)", "Page up a long text (stops following; End follows)", key_display="PgUp"),
    Binding("pagedown", "page(1)", "Page down a long text (or the grid)", key_display="PgDn"),
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


class KeyActions:
    """The actions of BINDINGS, mixed into GenerateScreen (its parts: self.player, self.canvas, ...)."""

    # ------------------------------------------------------------------ playback
    def action_toggle_play(self) -> None:
        if not self.playbacks:
            return
        if self.draft is not None:
            self._leave_inspect()
        if self.player.finished():
            if self.editor.versions:  # an edited text: play its recorded frames again (the versions stay)
                self._start(self.editor.play_again(self.playbacks[0].run))
                return
            self._replay_recorded()
            return
        self.player.toggle()
        self._draw()

    def _replay_recorded(self) -> None:
        """Space on a finished run: its recorded frames played again from the start through the
        gate, every side (nothing is sampled; the final text is known, so the stable layout holds
        from the first frame unless `w` chose free). A failed run has nothing whole to play: it runs again."""
        if any(pb.run.failed or not pb.frames for pb in self.playbacks):
            self.restart()
            return
        again = [Playback(Run(next(self.session._ids), pb.run.settings, playing=True, template=pb.run.template,
                              source=[rec.frame for rec in pb.frames], source_order=pb.frames[-1].order,
                              source_prompt=pb.run.source_prompt)) for pb in self.playbacks]
        self.session.playbacks = again
        self._start(again)

    def action_step(self) -> None:
        """One reverse step (pauses first); while scrubbing, one recorded step forward."""
        self.player.step()
        self._draw()

    def action_scrub(self, delta: int) -> None:
        if self.draft is not None:  # inspect mode: the arrows move the cursor
            self.draft.move(delta, self.canvas.positions)
        else:
            self.player.scrub(delta)
        self._draw()

    def action_scrub_back(self) -> None:
        """A click on the key bar's ←→: one step back."""
        self.action_scrub(-1)

    def action_scrub_to(self, index: int) -> None:
        self.player.scrub_to(index)
        self.canvas.follow_writing()  # Home: the first step, where it writes (a long text's top)
        self._draw()

    def action_live(self) -> None:
        self.player.live()
        self.canvas.follow_writing()
        self._draw()

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
        """A Session change (a control key), then a restart at once with the same seed."""
        if self.controls.change(self.db, self.replay, method, *args):
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
        from dbert_core.strategies import STRATEGIES

        self._change(self.session.next_sampler, self.db)
        strategy = STRATEGIES.get(self.session.active.sampler or "")
        if strategy is not None and not strategy.exact:  # the bar's `name~`: what the ~ means
            self.notify(f"{strategy.name}~ is a heuristic (~): {strategy.law}, not the model's own law "
                        "(docs/decoding.md)", title="sampler")

    def action_new_seed(self) -> None:
        self._change(self.session.new_seed)

    def action_toggle_colour(self) -> None:
        self.controls.toggle_colour()
        self._show_controls()
        self._draw()

    def action_toggle_stable(self) -> None:
        self.controls.toggle_stable()
        self._draw()

    def action_edit(self) -> None:
        title, fields = self.controls.settings_form()
        self.app.push_screen(FormDialog(title, fields, "Apply", check=lambda values: self.controls.check_settings(values, self.db)),
                             self._apply_settings)

    def _apply_settings(self, values: dict | None) -> None:
        if self.controls.apply_settings(values, self.db):
            self.restart()

    def action_prompt(self) -> None:
        self.app.push_screen(FormDialog(PROMPT_TITLE, self.controls.prompt_form(), "Use"), self._apply_prompt)

    def _apply_prompt(self, values: dict | None) -> None:
        if self.controls.apply_prompt(values, self.db):
            self.restart()

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
        if not self.editor.pick_branch(self.playbacks[0] if self.playbacks else None, row):
            return False
        self.grid.mark(self.session.selected)
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
        self._arrange()
        self._show_curve()
        self._show_controls()
        self._draw()

    def action_switch_side(self) -> None:
        if self.session.switch_side():
            self._show_curve()
            self._show_controls()
            self._draw()

    # ------------------------------------------------------------------ inspect and edit
    def action_inspect(self) -> None:
        """Inspect mode on (the run pauses; the cursor on the first token) or off."""
        if self.draft is not None:
            self._leave_inspect()
            return
        self._enter_inspect()

    def _enter_inspect(self, cursor: int | None = None) -> bool:
        if not self.editor.enter(self.db, cursor):
            return False
        self._arrange()
        self._draw()
        return True

    def _leave_inspect(self) -> None:
        self.editor.end()
        self._arrange()
        self._draw()

    def action_extend(self, delta: int) -> None:
        self.editor.edit("move", delta, self.canvas.positions, True)
        self._draw()

    def action_remask(self) -> None:
        self.editor.remask()
        self._draw()

    def action_lock(self) -> None:
        self.editor.edit("toggle_lock")
        self._draw()

    def action_insert_slot(self) -> None:
        if self.db is not None:
            self.editor.insert_slot(self.db.model.max_length)
            self._draw()

    def action_delete_slot(self) -> None:
        self.editor.delete_slot()
        self._draw()

    def action_refill(self) -> None:
        """Fill the draft's masked positions in (a normal run, shown filling in): a new version."""
        self._refill(1)

    def action_branch(self) -> None:
        """BRANCHES refills of the same draft at once, in the grid; Enter (or a click) picks one."""
        self._refill(BRANCHES)

    def _refill(self, n: int) -> None:
        pb = self.editor.refill(self.db, self.playbacks[0].run if self.playbacks else None, n)
        if pb is not None:
            self._start([pb])

    def action_undo(self) -> None:
        self._show_version(self.editor.undo())

    def action_redo(self) -> None:
        self._show_version(self.editor.redo())

    def _show_version(self, version) -> None:
        if version is None:
            return
        self.player.cancel(0)
        self.editor.show(version)
        self._arrange()
        self._draw()

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
        self._report(*export_run(values["path"], self.db, pb.run, rows, self.size.width, self._prompt_words(), self.replay))

    def _default_name(self, ext: str) -> str:
        return default_name(self.db, self.session.active.seed, ext)

    def _report(self, ok: bool, message: str) -> None:
        if ok:
            self.app.notify(message, timeout=8)
        else:
            self.app.notify(message, severity="error")
