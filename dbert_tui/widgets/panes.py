"""Token views: a scrolling text box, and one side of a comparison (its settings, status and text)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.reactive import reactive
from textual.widgets import Static

from .controls import CONTROLS, _value


class TokenScroll(VerticalScroll, can_focus=False):
    """Scrolls a long batch; never takes focus, so the arrow keys scrub instead of scrolling."""


def settings_line(settings, differs: set[str]) -> Text:
    """steps · temp · top-k · top-p · sampler, the fields in `differs` highlighted."""
    out = Text()
    for i, (_keys, name, field) in enumerate(CONTROLS):
        if field == "seed":
            continue
        if i:
            out.append(" · ", style="dim")
        value = (name + " " if name else "") + _value(settings, field)
        out.append(value, style="bold reverse" if field in differs else "")
    return out


class ComparePane(Vertical):
    """One side of a comparison: the border names the side ("A", "B") and says when the keys
    change it; the head shows its settings (what differs from the other side highlighted)."""

    DEFAULT_CSS = """
    ComparePane { width: 1fr; height: 1fr; border: round $primary 40%; padding: 0 1; }
    ComparePane.-active { border: round $accent; }
    ComparePane > .pane-head { height: auto; }
    ComparePane > .pane-status { height: auto; color: $text-muted; }
    ComparePane > TokenScroll { height: 1fr; }
    """

    active = reactive(False)

    def __init__(self, side: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.side = side
        self.text = Text()

    def compose(self) -> ComposeResult:
        yield Static(classes="pane-head")
        yield Static(classes="pane-status")
        with TokenScroll():
            yield Static(Text("starting…", style="dim"), classes="pane-tokens")

    def watch_active(self, active: bool) -> None:
        self.set_class(active, "-active")
        self.border_title = f"{self.side} · the keys change this side" if active else self.side

    def show(self, head: Text, status: Text, tokens: Text) -> None:
        self.text = tokens
        self.query_one(".pane-head", Static).update(head)
        self.query_one(".pane-status", Static).update(status)
        self.query_one(".pane-tokens", Static).update(tokens)


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
        from ..messages import TokenPointed

        pos = self._position(event)
        if pos is not None:
            self.post_message(TokenPointed(pos, drag=self._down))

    def on_mouse_down(self, event) -> None:
        from ..messages import TokenPointed

        pos = self._position(event)
        self._down = pos is not None
        if pos is not None:
            self.post_message(TokenPointed(pos, press=True))

    def on_mouse_up(self, event) -> None:
        self._down = False
