"""A training chart with a scale: its title, the latest value (and its smoothed one), the y range
and a step axis (render.line_chart), sized to the widget."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from ..render import ema, line_chart


class Chart(Widget):
    """`points` is a tuple of (step, value); `smooth` the EMA weight of the line (the latest raw
    value is always shown beside the smoothed one)."""

    DEFAULT_CSS = """
    Chart { height: 6; }
    """

    points: reactive[tuple] = reactive(tuple, layout=False)

    def __init__(self, title: str, smooth: float = 0.0, style: str = "cyan", **kwargs) -> None:
        super().__init__(**kwargs)
        self.title = title
        self.smooth = smooth
        self.style = style

    def headline(self) -> Text:
        """'title · now V (EMA S) · min A · max B' (tests read this; it wraps in a narrow panel)."""
        text = Text(self.title, style="bold")
        if self.points:
            values = [v for _, v in self.points]
            text.append(f" · now {values[-1]:.3f}")
            if self.smooth and len(values) > 1:
                text.append(f" (EMA {ema(values, self.smooth)[-1]:.3f})", style="dim")
            text.append(f" · min {min(values):.3f} · max {max(values):.3f}", style="dim")
        return text

    def render(self) -> Text:
        width = max(12, self.content_size.width)
        head = self.headline()
        rows = len(head.wrap(self.app.console, width))
        text = Text("\n").join(head.wrap(self.app.console, width))
        text.append("\n")
        plot = max(1, self.content_size.height - rows - 1)  # the rest, less the step axis
        text.append_text(line_chart(list(self.points), width, plot, self.smooth, self.style))
        return text
