"""The control bar: the sampling settings of the run on screen, each beside the key that changes it."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

# (keys, label, field): the order is the order of importance; steps and temperature first
CONTROLS = (
    ("[ ]", "steps", "steps"),
    ("- +", "temp", "temperature"),
    ("k", "top-k", "top_k"),
    ("o", "top-p", "top_p"),
    ("m", "", "sampler"),
    ("n", "seed", "seed"),
)


def _value(settings, name: str) -> str:
    value = getattr(settings, name)
    if name == "sampler" and value is not None:  # a heuristic strategy says so, with its parameters
        from dbert_core.strategies import STRATEGIES

        strategy = STRATEGIES.get(value)
        return strategy.short(getattr(settings, "params", None)) if strategy is not None else str(value)
    if name == "top_k" and value == 0:
        return "off"
    if name == "top_p" and value >= 1.0:
        return "off"
    if isinstance(value, float):
        return f"{value:g}"
    return "auto" if value is None else str(value)


class ControlBar(Widget):
    """One line (two where the terminal is narrow) that always shows steps, temperature, top-k,
    top-p, sampler and seed with their keys. In a comparison it shows the side the keys
    change (`side`), with the fields where the two sides differ highlighted (`differs`)."""

    DEFAULT_CSS = """
    ControlBar { height: auto; padding: 0 1; background: $boost; }
    ControlBar > .controlbar--key { color: $accent; text-style: bold; }
    ControlBar > .controlbar--label { color: $text-muted; }
    ControlBar > .controlbar--value { text-style: bold; }
    ControlBar > .controlbar--differs { color: $warning; text-style: bold reverse; }
    ControlBar > .controlbar--side { color: $text; background: $accent 40%; text-style: bold; }
    """
    COMPONENT_CLASSES = {"controlbar--key", "controlbar--label", "controlbar--value", "controlbar--differs",
                         "controlbar--side"}

    settings = reactive(None, layout=True)
    side = reactive("", layout=True)
    differs: reactive[frozenset] = reactive(frozenset())

    def groups(self) -> list[Text]:
        """One Text per control: its key(s), label and current value."""
        s = self.settings
        if s is None:
            return [Text("no checkpoint yet", style="dim")]
        key, label = self.get_component_rich_style("controlbar--key"), self.get_component_rich_style("controlbar--label")
        out = []
        if self.side:
            out.append(Text.assemble((f" {self.side} ", self.get_component_rich_style("controlbar--side")),
                                     (" tab", key)))
        for keys, name, field in CONTROLS:
            value_style = self.get_component_rich_style(
                "controlbar--differs" if field in self.differs else "controlbar--value")
            t = Text.assemble((keys, key), " ")
            if name:
                t.append(name + " ", style=label)
            t.append(_value(s, field), style=value_style)
            out.append(t)
        return out

    def lines(self, width: int) -> list[Text]:
        """The groups packed into as few lines of `width` cells as they fit in (a group is never split)."""
        lines: list[Text] = []
        current = Text()
        for g in self.groups():
            if current.cell_len and current.cell_len + 2 + g.cell_len > width:
                lines.append(current)
                current = Text()
            if current.cell_len:
                current.append("  ")
            current.append_text(g)
        lines.append(current)
        return lines

    def get_content_height(self, container, viewport, width: int) -> int:
        return len(self.lines(width))

    def render(self) -> Text:
        return Text("\n").join(self.lines(max(1, self.content_size.width)))

    def plain(self) -> str:
        """The bar as text at its current width (tests and the tmux check read this)."""
        return self.render().plain
