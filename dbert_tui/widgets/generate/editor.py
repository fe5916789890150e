"""Editing: remask, lock, insert and delete slots, refill, branch, undo and redo.

`Editor` owns the edit in progress and its history: the draft being inspected (editing.Draft),
the versions refills made (editing.Versions), the positions locked from one version to the
next, and the branch grid whose pick is pending. It draws nothing (the canvas draws the draft,
the inspector its token); the screen calls it from keys and the mouse and draws afterwards.
"""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from ...runs import Playback, Run
from ...editing import Draft, Version, Versions
from ...render import row_spans


class Editor(Widget):
    DEFAULT_CSS = """
    Editor { display: none; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.draft: Draft | None = None      # inspect mode: the sample being inspected / edited
        self.versions = Versions()           # the texts refills made (undo / redo)
        self.locked: set[int] = set()        # locked positions, kept from one version to the next
        self.branch_run: int | None = None   # the run id of a branch whose pick is pending

    def reset(self, keep_locks: bool = False) -> None:
        """A new run: no draft, no versions, no branch pending (and no locks, unless kept)."""
        self.draft, self.versions, self.branch_run = None, Versions(), None
        if not keep_locks:
            self.locked = set()

    # ------------------------------------------------------------------ inspect mode
    def enter(self, db, cursor: int | None = None, words: dict[int, str] | None = None) -> bool:
        """Inspect mode on: the shown sample of side A becomes the draft (the run pauses; a grid
        shows the sample large: the screen's part), the cursor at `cursor` or its first token; False if there is none.
        words: the prompt's own words by the shown frame's positions (the draft keeps them as typed)."""
        session = self.app.session
        if session.view_mode() == "compare" and session.playbacks:
            self.app.notify("inspect works on one run: end the comparison first (c)", severity="warning")
            return False
        if not session.playbacks or db is None:
            return False
        pb = session.playbacks[0]
        rec = pb.shown()
        if rec is None:
            return False
        if not pb.run.finished:
            pb.run.set_playing(False)
        row = session.selected if rec.frame.ids.shape[0] > 1 else 0
        if cursor is None:
            positions = [sp.index for sp in row_spans(db, rec, row)]
            cursor = positions[0] if positions else 0
        self.draft = Draft.of(rec, row, db.model.mask_id, self.locked, words)
        self.draft.cursor = cursor
        return True

    def end(self) -> None:
        """Inspect mode off; the draft's locks are kept for the next one."""
        if self.draft is not None:
            self.locked = set(self.draft.locked)
        self.draft = None

    def edit(self, name: str, *args):
        """Draft method `name` (nothing outside inspect mode)."""
        return None if self.draft is None else getattr(self.draft, name)(*args)

    def remask(self) -> None:
        if self.edit("remask") == 0:
            self.app.notify("nothing to remask there (locked, or masked already)", severity="warning")

    def insert_slot(self, max_length: int) -> None:
        if self.edit("insert", max_length) is False:
            self.app.notify("the text is at the model's maximum length", severity="warning")

    def delete_slot(self) -> None:
        if self.edit("delete") is False:
            self.app.notify("only a masked slot can be deleted (remask the token first: ⌫)", severity="warning")

    def point(self, pos: int, press: bool, drag: bool, positions: list[int]) -> None:
        """The mouse in inspect mode: a press puts the cursor there (and starts a selection), a
        drag selects from the press to here, a hover moves the cursor."""
        d = self.draft
        if d is None:  # not inspecting
            return
        if press:
            d.cursor, d.anchor, d.selected = pos, pos, set()
        elif drag and d.anchor is not None:
            d.select_range(d.anchor, pos, positions)
            d.cursor = pos
        else:
            d.cursor = pos

    # ------------------------------------------------------------------ refill and branch
    def can_refill(self, db) -> bool:
        if self.draft is None:
            self.app.notify("inspect first (i), then remask tokens (⌫) to refill", severity="warning")
            return False
        if getattr(db, "sampling", True) is False:
            self.app.notify("a replay has no model: refill needs the checkpoint (dbert-tui -c NAME)", severity="warning")
            return False
        if not self.draft.masked:
            self.app.notify("nothing is masked: remask tokens first (⌫)", severity="warning")
            return False
        return True

    def refill(self, db, run: Run, n: int, seed: int) -> tuple[object, int, dict | None] | None:
        """The draft ends for n refills of its masked positions (n > 1: a branch, picked later): the
        template, seed and kept prompt words (Draft.verbatim) of the refill's run (the screen asks the
        session for it, Session.edit_run), each refill its own seed from the session's `seed`; None
        when there is nothing to refill (it says why)."""
        if not self.can_refill(db):
            return None
        d = self.draft
        assert d is not None  # can_refill: there is one
        if not self.versions:  # the text edited is the first version
            self.versions.add(Version(run, d.row))
        self.locked = set(d.locked)
        self.draft = None
        return d.template(), seed * 7919 + 104729 * len(self.versions.items) + n, d.verbatim()

    def refill_started(self, run: Run, n: int) -> None:
        """The refill's run (controller.Session.edit_run): a branch (n > 1) waits for its pick."""
        self.branch_run = run.id if n > 1 else None

    def pick_branch(self, pb: Playback | None, row: int) -> Version | None:
        """In a finished branch grid, choosing a sample makes it the new version (returned; the
        screen shows it); None when no branch waits for its pick."""
        if pb is None or self.branch_run != pb.run.id or not pb.run.finished:
            return None
        self.branch_run = None
        version = Version(pb.run, row)
        self.versions.add(version)
        return version

    def run_finished(self, run: Run) -> None:
        """A run ended: a refill of one sample is a new version."""
        if run.template is not None and run.source is None and run.settings.n == 1:
            self.versions.add(Version(run, 0))

    # ------------------------------------------------------------------ versions
    def undo(self) -> Version | None:
        return self._say(self.versions.undo(), "undo")

    def redo(self) -> Version | None:
        return self._say(self.versions.redo(), "redo")

    def _say(self, version: Version | None, what: str) -> Version | None:
        if version is None:
            self.app.notify(f"nothing to {what}", severity="warning")
        return version

    def drop_draft(self) -> None:
        """Out of inspect mode without keeping the draft's locks (a version shown in its place)."""
        self.draft = None

    def replace_run(self, run: Run, again: Run) -> None:
        """`again` plays `run`'s recorded frames again (controller.Session.play_again): the versions
        that showed `run` show the copy."""
        for i, v in enumerate(self.versions.items):
            if v.run is run:
                self.versions.items[i] = Version(again, v.row)

    # ------------------------------------------------------------------ the status line's part
    def inspecting(self) -> Text | None:
        """The status while inspecting (None: not inspecting)."""
        if self.draft is None:
            return None
        d, text = self.draft, Text()
        text.append("inspect", style="bold magenta")
        text.append(f" · {d.masked} masked · {len(d.locked)} locked · ⌫ remask · f refill · b branch · Esc")
        if self.versions:
            text.append(f" · {self.versions.label()}", style="dim")
        return text

    def prefix(self, run: Run) -> Text:
        """Before a run's progress: its version, and whether a branch waits for its pick."""
        text = Text()
        if self.versions:
            text.append(f"{self.versions.label()} · ", style="bold magenta")
        if self.branch_run is not None and run.id == self.branch_run:
            text.append("branch: Enter picks · ", style="bold magenta")
        return text
