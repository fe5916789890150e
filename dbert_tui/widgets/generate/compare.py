"""Compare: two settings side by side with the same seed, separate draws (`c`).

It owns its two panes: each names its side, says whether the keys change it, shows its
settings (what differs from the other side highlighted), its progress and its text.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.widgets import Static

from ...controller import differences
from ...render import progress_line, render_tokens
from .controls import CONTROLS, _value
from .canvas import TokenScroll


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


class CompareView(Horizontal):
    """Side A and side B."""

    DEFAULT_CSS = """
    CompareView { width: 1fr; height: 1fr; }
    """

    def compose(self) -> ComposeResult:
        yield ComparePane("A", id="gen-side-a")
        yield ComparePane("B", id="gen-side-b")

    def panes(self) -> list[ComparePane]:
        return list(self.query(ComparePane))

    def draw(self, db, playbacks, side: int, selected: int, colour: str, edges, verbatim_of, timed: bool) -> None:
        """Each side's shown frame (one sample per side: the selected one); `side` is the one the
        keys change; verbatim_of(prompt) the prompt's own words."""
        differs = differences(playbacks[0].run.settings, playbacks[-1].run.settings)
        for i, (pb, pane) in enumerate(zip(playbacks, self.panes())):
            pane.active = i == side
            rec = pb.shown()
            head = settings_line(pb.run.settings, differs)
            if rec is None:
                pane.show(head, Text(f"step 0/{pb.run.settings.steps} · starting", style="dim"),
                          Text("starting…", style="dim"))
                continue
            row = selected if rec.frame.ids.shape[0] > 1 else None
            status = progress_line(pb, rec, row, timed)
            if row is not None:
                status = Text(f"sample {row + 1}/{rec.frame.ids.shape[0]} · ").append_text(status)
            pane.show(head, status, render_tokens(db, rec, colour, None if row is None else [row],
                                                  verbatim_of(pb.run.settings.prompt), edges))
