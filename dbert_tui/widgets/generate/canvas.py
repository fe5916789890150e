"""The canvas: one sample drawn large, in a scrolling box, token by token.

It owns what it drew: the text (`text`), the token positions in it (`positions`, the cursor's
stops while inspecting), the double spacing of a tall terminal, and where the box is scrolled: a
text taller than the box follows the writing (`follow`, like toolong's follow mode: the lines
being filled in stay in view as later windows of a long story fill in) until PgUp, PgDn or the
mouse wheel scroll it by hand; End (live) follows again. While inspecting, the cursor's line
stays in view. The screen hands it a frame and how to paint it; the mouse over a token goes up
as a TokenPointed message.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from ...messages import TokenPointed
from ...render import render_row, render_tokens, row_spans

TALL = 36   # rows from which one sample is drawn double-spaced


class TokenScroll(VerticalScroll, can_focus=False):
    """Scrolls a long batch; never takes focus, so the arrow keys scrub instead of scrolling."""


class TokenView(Static):
    """The token text of one sample. Each token's style carries its position (render.render_row
    with marks), so the mouse says which token it is over: a hover, a press, a drag."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._down = False

    @staticmethod
    def _position(event) -> int | None:
        value = event.style.meta.get("token") if event.style else None
        return value if isinstance(value, int) else None

    def on_mouse_move(self, event) -> None:
        pos = self._position(event)
        if pos is not None:
            self.post_message(TokenPointed(pos, drag=self._down))

    def on_mouse_down(self, event) -> None:
        pos = self._position(event)
        self._down = pos is not None
        if pos is not None:
            self.post_message(TokenPointed(pos, press=True))

    def on_mouse_up(self, event) -> None:
        self._down = False


def final_of(run, stable: bool):
    """The run's final frame where it is known already (a replay, a finished run), for the
    stable layout; None when the layout is free or the end is not known yet."""
    from ...runs import Recorded

    if not stable:
        return None
    if run.source is not None:
        return Recorded(run.source[-1], run.source_order, 0.0)
    return run.frames[-1] if run.finished and run.frames else None


class Canvas(TokenScroll):
    """One sample large: the selected row of a frame, or the draft being inspected and edited."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.text = Text()                # the token text last drawn (plain: what tests and tmux read)
        self.positions: list[int] = []    # the token positions drawn while inspecting (cursor stops)
        self.follow = True                # keep the writing in view (False: scrolled by hand)

    def compose(self) -> ComposeResult:
        yield TokenView(Text("loading a checkpoint…", style="dim"), id="gen-tokens")

    def say(self, text: Text) -> None:
        """A line in place of the sample (loading, starting, ranking an infill)."""
        self.query_one(TokenView).update(text)

    def draw(self, db, rec, row: int | None, colour: str, edges, verbatim, final) -> None:
        """Row `row` of the frame (None: its only row), as the run paints it; followed, the box
        shows the part being written (from the first masked token to the last one written)."""
        self.text = render_tokens(db, rec, colour, None if row is None else [row], verbatim, edges,
                                  final=final, marks={})
        shown = self._spaced(self.text)
        self.say(shown)
        if self.follow and shown is self.text:
            spans = row_spans(db, rec, row or 0, verbatim=verbatim, final=final)
            written = [k for k, sp in enumerate(spans) if not sp.masked]
            masked = [k for k, sp in enumerate(spans) if sp.masked]
            if written:
                self._keep_in_view(spans, masked[0] if masked else written[-1], written[-1])

    def draw_draft(self, db, draft, colour: str, edges):
        """The draft being inspected, with its cursor, selection and locks; returns it as a frame.
        The cursor's line is kept in view."""
        rec, verbatim = draft.recorded(), draft.verbatim()
        marks = {"cursor": draft.cursor, "selected": draft.selected, "locked": draft.locked}
        self.text = render_row(db, rec, 0, colour, verbatim=verbatim, edges=edges, marks=marks)
        spans = row_spans(db, rec, 0, verbatim=verbatim)
        self.positions = [sp.index for sp in spans]
        shown = self._spaced(self.text)
        self.say(shown)
        at = next((k for k, sp in enumerate(spans) if sp.index == draft.cursor), None)
        if at is not None and shown is self.text:
            self._keep_in_view(spans, at, at, least=True)
        return rec

    # ------------------------------------------------------------------ scrolling
    def page(self, direction: int) -> None:
        """PgUp / PgDn: a page up or down; the box no longer follows the writing."""
        self.follow = False
        (self.scroll_page_down if direction > 0 else self.scroll_page_up)(animate=False)

    def follow_writing(self) -> None:
        """End (live): follow the writing again (shown at the next draw)."""
        self.follow = True

    def top(self) -> None:
        """A new run: the box at its top, following."""
        self.follow = True
        self.scroll_home(animate=False)

    def on_mouse_scroll_up(self, event) -> None:
        self.follow = False

    def on_mouse_scroll_down(self, event) -> None:
        self.follow = False

    def _line(self, spans, k: int) -> int:
        """The line of the drawn text (wrapped at the box's width) that span k starts on."""
        offset = sum(len(sp.gap) + len(sp.text) for sp in spans[:k]) + len(spans[k].gap)
        width = self.query_one(TokenView).content_size.width or self.size.width
        return max(0, len(self.text[:offset + 1].wrap(self.app.console, max(1, width))) - 1)

    def _keep_in_view(self, spans, first: int, last: int, least: bool = False) -> None:
        """Scroll so that spans first..last are in view, the last one two thirds down the box (the
        first one at the top if they do not all fit); `least`: only as far as needed."""
        height = self.scrollable_content_region.height
        if height <= 0 or not spans:
            return
        a, b = self._line(spans, first), self._line(spans, last)
        if least:
            y = round(self.scroll_y)
            if a >= y and b < y + height:
                return
            top = a if a < y else b - height + 1
        else:  # the last one two thirds down: the masks after it (later windows) are in view too
            top = min(a, max(0, b - (2 * height) // 3))
        self.call_after_refresh(self.scroll_to, y=top, animate=False)

    def _spaced(self, text: Text) -> Text:
        """On a tall terminal (TALL rows and up) one sample is drawn double-spaced: it fills the
        room instead of a few lines at the top, and a word is easier to follow as it fills in."""
        box = self.query_one(TokenView)
        width = box.content_size.width
        if self.screen.size.height < TALL or width < 20:
            return text
        lines = text.wrap(self.app.console, width)
        if 2 * len(lines) > self.content_size.height:
            return text
        return Text("\n\n").join(lines)
