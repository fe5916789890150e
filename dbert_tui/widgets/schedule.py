"""The noise schedule: expected masked fraction over the reverse steps, and the run on it.

`SchedulePanel` plots it in a box (wide terminals); `ScheduleStrip` draws it as a one-line
sparkline (narrow ones). Both render from their reactives."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from ..render import schedule_chart_with_axes, schedule_strip


class _Schedule(Widget):
    curve: reactive[tuple] = reactive(tuple, layout=True)   # masked fraction after k steps, k = 0..S
    title = reactive("noise schedule")
    position: reactive[tuple | None] = reactive(None)        # (step, actual masked fraction)

    def set_curve(self, curve: list[float], title: str) -> None:
        self.curve, self.title, self.position = tuple(curve), title, None

    def set_position(self, step: int, actual: float) -> None:
        self.position = (step, actual)


class SchedulePanel(_Schedule):
    """Plots the curve sized to the widget."""

    DEFAULT_CSS = """
    SchedulePanel { height: auto; min-height: 6; }
    """

    def render(self) -> Text:
        text = Text(self.title + "\n", style="bold")
        if not self.curve:
            return text + Text("(no checkpoint)", style="dim")
        width = max(16, self.size.width)
        height = max(4, self.size.height - 3)
        step, actual = self.position or (None, None)
        text.append_text(schedule_chart_with_axes(list(self.curve), width, height, step, actual))
        steps = len(self.curve) - 1
        text.append("\n")
        if step is not None:
            exp = self.curve[min(step, steps)]
            text.append(f"masked {actual:4.0%} exp {exp:4.0%}", style="dim")
        else:
            text.append("• schedule · linear", style="dim")
        return text


class ScheduleStrip(_Schedule):
    """One line: the schedule's title, its curve as a sparkline with the current step marked,
    and the run's masked fraction against the expectation."""

    DEFAULT_CSS = """
    ScheduleStrip { height: 1; padding: 0 1; }
    """

    def render(self) -> Text:
        text = Text(self.title + " ", style="bold")
        if not self.curve:
            return text
        step, actual = self.position or (None, None)
        text.append_text(schedule_strip(list(self.curve), max(8, self.content_size.width - text.cell_len), step, actual))
        return text
