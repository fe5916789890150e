"""The noise-schedule panel: expected masked fraction over the reverse steps, and the run on it."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from ..render import schedule_chart


class SchedulePanel(Widget):
    """Plots a curve (masked fraction after k steps, k = 0..S) sized to the widget."""

    DEFAULT_CSS = """
    SchedulePanel { height: auto; min-height: 6; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.curve: list[float] = []
        self.title = "noise schedule"
        self.step: int | None = None
        self.actual: float | None = None

    def set_curve(self, curve: list[float], title: str) -> None:
        self.curve, self.title = curve, title
        self.step = self.actual = None
        self.refresh(layout=True)

    def set_position(self, step: int, actual: float) -> None:
        self.step, self.actual = step, actual
        self.refresh()

    def render(self) -> Text:
        text = Text(self.title + "\n", style="bold")
        if not self.curve:
            return text + Text("(no checkpoint)", style="dim")
        width = max(8, self.size.width)
        height = max(3, self.size.height - 3)
        text.append_text(schedule_chart(self.curve, width, height, self.step, self.actual))
        steps = len(self.curve) - 1
        text.append("\n")
        if self.step is not None and self.actual is not None:
            exp = self.curve[min(self.step, steps)]
            text.append(f"masked {self.actual:4.0%} exp {exp:4.0%}", style="dim")
        else:
            text.append("• schedule · linear", style="dim")
        return text
