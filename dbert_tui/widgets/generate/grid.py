"""The grid: several samples of one run, a card each, filling in together.

It owns its cards (as many as the run has rows), which one is marked selected, how many go to
a row, and which lie below the visible part. A click on a card goes up as SampleChosen.
"""

from __future__ import annotations

from rich.text import Text
from textual.containers import VerticalScroll
from textual.reactive import reactive
from textual.widgets import Static

from ...messages import SampleChosen
from ...render import render_row, window_step


def progress_bar(done: float, width: int = 10) -> str:
    """A bar of `width` cells, `done` (0..1) of it filled."""
    filled = max(0, min(width, round(done * width)))
    return "▰" * filled + "▱" * (width - filled)


class SampleCard(Static, can_focus=False):
    """One sample: its text (set by the grid), its number in the title and its progress
    (revealed tokens, and the reverse step this row has reached) below."""

    DEFAULT_CSS = """
    SampleCard { height: auto; min-height: 3; border: round $primary 40%; padding: 0 1; }
    SampleCard.-selected { border: round $accent; }
    """

    selected = reactive(False)

    def __init__(self, index: int, **kwargs) -> None:
        super().__init__(Text("starting…", style="dim"), **kwargs)
        self.index = index
        self.text = Text()
        self.border_title = f"#{index + 1}"

    def watch_selected(self, selected: bool) -> None:
        self.set_class(selected, "-selected")

    def show(self, text: Text, revealed: int, total: int, step: int, steps: int, per_window: int = 0) -> None:
        """The sample's text, and its progress: `revealed` of `total` tokens, reverse step `step` of
        `steps` (a story's counted on across its windows of `per_window` steps: shown per window)."""
        self.text = text
        self.update(text)
        window, windows, within = window_step(step, steps, per_window)
        where = f"window {window}/{windows} · " if windows > 1 else ""
        if not total:
            self.border_subtitle = ""
        elif revealed == total:  # a row is complete at its own step, often before the run's last one
            self.border_subtitle = f"{total}/{total} done · {where}step {within}"
        else:
            bar = "" if windows > 1 else progress_bar(revealed / total) + " "  # a story's window instead: it fits a card
            self.border_subtitle = f"{bar}{revealed}/{total} · {where}step {within}/{per_window if windows > 1 else steps}"

    def on_click(self) -> None:
        self.post_message(SampleChosen(self.index))


class SampleGrid(VerticalScroll, can_focus=False):
    """The cards, one to three to a row by the terminal's width (`fit`)."""

    DEFAULT_CSS = """
    SampleGrid { layout: grid; grid-size: 2; grid-rows: auto; grid-gutter: 0 1; height: 1fr; }
    """

    def cards(self) -> list[SampleCard]:
        return list(self.query(SampleCard))

    def fit(self, width: int, wide: int) -> None:
        """Three cards to a row from `wide` columns, two from 60, else one."""
        self.styles.grid_size_columns = 3 if width >= wide else 2 if width >= 60 else 1

    def make_cards(self, n: int, selected: int) -> None:
        """n cards (kept across runs; extra ones removed, missing ones added)."""
        cards = self.cards()
        for card in cards[n:]:
            card.remove()
        if len(cards) < n:
            self.mount_all([SampleCard(i) for i in range(len(cards), n)])
        for card in cards[:n]:
            card.show(Text("starting…", style="dim"), 0, 0, 0, 0)
        self.call_after_refresh(lambda: self.mark(self.app.session.selected))

    def mark(self, selected: int) -> None:
        for card in self.cards():
            card.selected = card.index == selected

    def reveal(self, index: int) -> None:
        """Scroll card `index` into view."""
        self.scroll_to_widget(self.cards()[index])

    def draw(self, db, rec, colour: str, edges, verbatim, final, per_window: int = 0) -> None:
        """Every row of the frame on its card, with its own progress (per window: `per_window` steps each)."""
        f = rec.frame
        L = f.ids.shape[1]
        for card in self.cards():
            b = card.index
            if b >= f.ids.shape[0]:
                continue
            row_step = int(f.row_steps[b]) if f.row_steps is not None else f.step
            card.show(render_row(db, rec, b, colour, verbatim=verbatim, edges=edges, final=final),
                      L - int(f.masked[b].sum()), L, row_step, f.steps, per_window)

    def cards_below(self) -> list[int]:
        """The cards mostly below the visible part (the status hints at them): less than half of the
        card, or of the view where the card is taller, on screen. A tall card whose start fills the
        view is on screen (at 80x24 a story grid said #1-#6 below with #1 and #2 in view)."""
        view = self.scrollable_content_region.height
        top, bottom = self.scroll_y, self.scroll_y + view

        def below(r) -> bool:
            shown = max(0, min(bottom, r.bottom) - max(top, r.y))
            return r.bottom > bottom and 2 * shown < min(r.height, view)

        return [card.index for card in self.cards() if card.display and below(card.virtual_region)]

    def text(self) -> str:
        """Every card's text, as drawn."""
        return "\n\n".join(card.text.plain for card in self.cards())
