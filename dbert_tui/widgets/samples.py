"""Several samples of one run: a card per sample in a scrolling grid, each with its own progress."""

from __future__ import annotations

from rich.text import Text
from textual.containers import VerticalScroll
from textual.reactive import reactive
from textual.widgets import Static

from ..messages import SampleChosen


def progress_bar(done: float, width: int = 10) -> str:
    """A bar of `width` cells, `done` (0..1) of it filled."""
    filled = max(0, min(width, round(done * width)))
    return "▰" * filled + "▱" * (width - filled)


class SampleCard(Static, can_focus=False):
    """One sample: its text (set by the screen), its number in the title and its progress
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

    def show(self, text: Text, revealed: int, total: int, step: int, steps: int) -> None:
        """The sample's text, and its progress: `revealed` of `total` tokens, reverse step `step` of `steps`."""
        self.text = text
        self.update(text)
        if not total:
            self.border_subtitle = ""
        elif revealed == total:  # a row is complete at its own step, often before the run's last one
            self.border_subtitle = f"{total}/{total} done · step {step}"
        else:
            self.border_subtitle = f"{progress_bar(revealed / total)} {revealed}/{total} · step {step}/{steps}"

    def on_click(self) -> None:
        self.post_message(SampleChosen(self.index))


class SampleGrid(VerticalScroll, can_focus=False):
    """The cards, two or three to a row (set by the screen from the terminal's width)."""

    DEFAULT_CSS = """
    SampleGrid { layout: grid; grid-size: 2; grid-rows: auto; grid-gutter: 0 1; height: 1fr; }
    """

    def cards(self) -> list[SampleCard]:
        return list(self.query(SampleCard))
