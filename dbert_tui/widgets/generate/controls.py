"""The control bar: the sampling settings of the run on screen, each beside the key that changes
it, and the legend of the colours above it.

`Controls` owns how the run is asked for and painted: the settings and prompt dialogs' fields
and checks (the dialogs post what was chosen to the App, which sets the App's controller.Session
and has the screen restart the run), `v` the colouring (reveal order, or confidence in bands at
the run's quintiles: the `edges`), `w` the layout (stable: words keep the final text's lines). `ControlBar` draws the
settings; the legend line the colours.
"""

from __future__ import annotations

import dataclasses

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Static

from ...controller import Settings, differences
from ...forms import SIDES, FieldError, settings_fields, settings_form
from ...render import FIXED_EDGES, confidence_edges, legend

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
        from dbert_core.errors import DbertError
        from dbert_core.strategies import get

        try:
            strategy = get(value)
        except DbertError:  # a name no strategy has (a replay's, written by another dbert)
            strategy = None
        shown = strategy.short(getattr(settings, "params", None)) if strategy is not None else str(value)
        refresh = getattr(settings, "cache_refresh", None)
        reads = strategy is not None and strategy.cache_masked  # a family that reads the kept [MASK] states
        masks = "+masks" if refresh and getattr(settings, "cache_masked", None) and reads else ""
        return shown + (f" cache {refresh}{masks}" if refresh else "")  # the decided-position cache: an approximation
    if value is None:  # a replayed file that does not record it (a run's settings are resolved before it starts)
        return "?"
    if name == "top_k" and value == 0:
        return "off"
    if name == "top_p" and value >= 1.0:
        return "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


class ControlBar(Widget):
    """One line (two where the terminal is narrow) that always shows steps, temperature, top-k,
    top-p, sampler (and the decided-position cache's refresh, when on) and seed with their keys. In a comparison it shows the side the keys
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

    settings: reactive[Settings | None] = reactive(None, layout=True)
    from_checkpoint: reactive[frozenset] = reactive(frozenset(), layout=True)  # fields the checkpoint recommended
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
            if field in self.from_checkpoint:  # the value in force is the checkpoint's, as `dbert sample` resolves it
                t.append(" (checkpoint)", style=label)
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


class Controls(Vertical):
    """The legend and the control bar; the settings they show and the painting they describe."""

    DEFAULT_CSS = """
    Controls { height: auto; }
    """

    colour = reactive("order")   # "order" (reveal order) or "confidence" (p')

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.edges: tuple[float, ...] = FIXED_EDGES  # the confidence bands (render.confidence_edges)
        self.stable = True         # lay a known text out on its final line breaks

    def compose(self) -> ComposeResult:
        yield Static(legend("order"), id="gen-legend")
        yield ControlBar(id="gen-controls")

    # ------------------------------------------------------------------ what is shown
    def show(self, playbacks, origins: dict[str, str] | None) -> None:
        """The shown side's settings (in a comparison: which side, and where the two differ), where
        each comes from (`origins`: controller.Session.origins; None: no checkpoint yet) and the legend."""
        bar, session = self.query_one(ControlBar), self.app.session
        bar.settings = None if origins is None else dataclasses.replace(session.shown_settings())
        bar.from_checkpoint = frozenset(f for f, origin in (origins or {}).items() if origin == "checkpoint")
        bar.side = SIDES[session.side] if session.partner is not None else ""
        runs = [pb.run.settings for pb in playbacks]
        fields = {f for _, _, f in CONTROLS}
        bar.differs = frozenset(differences(runs[0], runs[-1]) & fields) if len(runs) > 1 else frozenset()
        self._show_legend()

    def _show_legend(self) -> None:
        text = legend(self.colour, self.edges)
        prompt = self.app.session.settings.prompt
        if prompt:
            text.append(f"  · prompt {prompt[:40]!r}", style="dim")
        self.query_one("#gen-legend", Static).update(text)

    def watch_colour(self) -> None:
        if self.is_mounted:
            self._show_legend()

    def fit_edges(self, playbacks) -> None:
        """The confidence bands: quintiles over the newest frame of every side (so a scrubbed
        frame keeps the colours of the run, and both sides of a comparison share one scale)."""
        import torch

        newest = [pb.frames[-1].frame.confidence.flatten() for pb in playbacks if pb.frames]
        edges = confidence_edges(torch.cat(newest)) if newest else FIXED_EDGES
        if edges != self.edges:
            self.edges = edges
            self._show_legend()

    # ------------------------------------------------------------------ painting keys
    def toggle_colour(self) -> None:
        self.colour = "confidence" if self.colour == "order" else "order"

    def toggle_stable(self) -> None:
        self.stable = not self.stable
        self.app.notify("stable layout: words keep the final text's lines" if self.stable
                        else "free layout: each frame wrapped as it reads", timeout=3)

    # ------------------------------------------------------------------ settings
    def settings_form(self) -> tuple[str, list]:
        """The settings dialog's title and fields: the side the keys change."""
        session = self.app.session
        return settings_form(session.active, session.side if session.partner is not None else None)

    def check_settings(self, values: dict, db):
        """(field, message) of the dialog's first bad field, or None."""
        try:
            settings_fields(values, self.app.session.active, db)
        except FieldError as e:
            return e.key, e.message
        return None

    def prompt_form(self) -> list:
        return [("prompt", "template", self.app.session.settings.prompt, "the cat [MASK] on the [MASK]")]
