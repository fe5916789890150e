"""The key help (`?`): what the current screen is for and every key it and the app take, with
full descriptions that wrap, in a box that scrolls when the terminal is small."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Label, Static

from ..keymap import APP_KEYS


def key_rows(app, screen: Screen) -> list[tuple[str, str]]:
    """(keys as shown, description) for every binding of `screen`, then the app's, once each."""
    rows, seen = [], set()
    for binding in [*type(screen).BINDINGS, *type(app).BINDINGS]:
        if not isinstance(binding, Binding) or not binding.description or binding.action in seen:
            continue
        seen.add(binding.action)
        keys = binding.key_display or " ".join(
            app.get_key_display(Binding(k.strip(), binding.action)) for k in binding.key.split(","))
        rows.append((keys, binding.description))
    rows.extend((s.label, s.help) for s in APP_KEYS if not s.bound)  # the keys Textual binds itself (ctrl+p)
    return rows


class HelpScreen(ModalScreen[None]):
    """Escape, q or ? closes it; the arrow keys and Page Up/Down scroll it."""

    BINDINGS = [Binding("escape,question_mark,q", "close", "Close")]

    def __init__(self, screen: Screen) -> None:
        super().__init__()
        self.for_screen = screen
        self.rows = key_rows(screen.app, screen)

    def compose(self) -> ComposeResult:
        about = (getattr(self.for_screen, "HELP", "") or "").strip()
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold", no_wrap=True)
        table.add_column(ratio=1)
        for keys, description in self.rows:
            table.add_row(keys, description)
        with Vertical(classes="dialog help-dialog"):
            yield Label(f"Keys · {self.for_screen.sub_title or 'dbert'}  (Esc closes; ↑ ↓ PgUp PgDn scroll)",
                        classes="dialog-title")
            with VerticalScroll(id="help-scroll"):
                if about:
                    yield Static(Text(about, style="italic"), id="help-about")
                yield Static(table, id="help-keys")

    def on_mount(self) -> None:
        self.query_one("#help-scroll").focus()

    def action_close(self) -> None:
        self.dismiss(None)
