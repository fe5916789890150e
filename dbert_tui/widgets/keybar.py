"""The key bar at the bottom of every screen: the screen's main keys, and always the keys that
switch screens, quit and open the key help, fitted to the width (never cut mid-word or
overdrawn); a click on a key runs it. `?` lists every key (screens.help.HelpScreen)."""

from __future__ import annotations

from dataclasses import dataclass

from textual.content import Content
from textual.markup import escape
from textual.reactive import reactive
from textual.widget import Widget

from ..keymap import APP_KEYS


@dataclass(frozen=True)
class Key:
    key: str          # as shown: "space", "f5", "←→"
    label: str
    action: str       # run on a click, e.g. "screen.toggle_play" or "app.mode('train')"
    rank: int = 5     # 0: always shown; higher ranks make room first when the bar is narrow


def bar_keys(specs, target: str) -> tuple[Key, ...]:
    """The bar's keys of a key catalogue (keymap.KeySpec): those with a bar label, in their bar order
    (`at`); keys that share a label are one key of the bar ("←→ Scrub"), running the first one's
    action on `target` ("screen" or "app") when clicked."""
    merged: dict[str, list] = {}
    for s in sorted((s for s in specs if s.bar), key=lambda s: s.at):
        merged.setdefault(s.bar, []).append(s)
    return tuple(Key("".join(s.label for s in same), label, f"{target}.{same[0].action}", same[0].rank)
                 for label, same in merged.items())


COMMON = bar_keys(APP_KEYS, "app")  # on every screen: the screen keys, help, quit (rank 0), and the palette when there is room
GAP = "  "


def fit(keys: list[Key], width: int) -> list[Key]:
    """The keys that fit in `width` cells, in their order: the highest ranks are left out first."""
    shown = list(keys)

    def length(ks):
        return sum(len(k.key) + 1 + len(k.label) for k in ks) + len(GAP) * max(0, len(ks) - 1)

    while length(shown) > width:
        droppable = [k for k in shown if k.rank > 0]
        if not droppable:
            break
        worst = max(droppable, key=lambda k: (k.rank, shown.index(k)))
        shown.remove(worst)
    return shown


class KeyBar(Widget):
    DEFAULT_CSS = """
    KeyBar { height: 1; dock: bottom; background: $footer-background; padding: 0 1; }
    """

    keys: reactive[tuple] = reactive(tuple, layout=False)

    def __init__(self, keys: list[Key] | tuple = (), **kwargs) -> None:
        super().__init__(**kwargs)
        self.set_reactive(KeyBar.keys, tuple(keys))  # the descriptor, as Textual documents

    def shown(self) -> list[Key]:
        width = self.content_size.width or (self.app.size.width - 2)
        return fit([*self.keys, *COMMON], width)

    def render(self) -> Content:
        parts = []
        for k in self.shown():
            parts.append(f'[@click="{k.action}"][bold $footer-key-foreground]{escape(k.key)}[/] {escape(k.label)}[/]')  # quoted: scrub(-1)
        return Content.from_markup(GAP.join(parts))

    def plain(self) -> str:
        """The bar as text at its width (tests read this)."""
        return self.render().plain
