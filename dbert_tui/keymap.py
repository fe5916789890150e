"""The key catalogue: each key of a screen (or of the app) written once, as a `KeySpec`, and what
is made of it: the screen's Textual BINDINGS (`bindings`), so the key help (`?`, screens.help)
and the footer read from them; the key bar's keys (widgets.keybar.bar_keys); the command
palette's commands (`commands`). `APP_KEYS` are the keys every screen shares.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Iterable

from textual.actions import parse
from textual.app import SystemCommand
from textual.binding import Binding, BindingType


@dataclass(frozen=True)
class KeySpec:
    key: str           # Textual's key names, comma-separated ("equals_sign,plus")
    action: str        # the action it runs, with its arguments ("steps(2)")
    help: str          # its line in the key help (`?`)
    shown: str = ""    # how the key reads ("." for full_stop, "←→" in the bar); "": Textual's own name
    bar: str = ""      # its label in the key bar; "": not in the bar
    rank: int = 5      # the bar's: 0 always shown, higher ranks make room first when it is narrow
    at: int = 0        # its place in the bar, from the left (the key help keeps the catalogue's order)
    palette: str = ""  # its title in the command palette (ctrl+p), with `about` under it; "": not there
    about: str = ""
    bound: bool = True  # False: Textual binds it (ctrl+p); the catalogue only describes it

    @property
    def label(self) -> str:
        """The key as the bar and the palette name it: `shown`, else the shortest of its key names."""
        return self.shown or min(self.key.split(","), key=len)


def bindings(specs: Iterable[KeySpec], priority: Iterable[str] = ()) -> list[BindingType]:
    """The Textual bindings of the catalogue's bound keys, in its order (the key help's); the
    actions in `priority` run before a focused widget's own bindings."""
    urgent = set(priority)
    return [Binding(s.key, s.action, s.help, key_display=s.shown or None, priority=s.action in urgent)
            for s in specs if s.bound]


def commands(specs: Iterable[KeySpec], host) -> list[SystemCommand]:
    """The palette's commands of the catalogue's keys that have a title: each runs the key's
    action on `host` (the screen or the app), and its line names the key."""
    out = []
    for s in specs:
        if not s.palette:
            continue
        _, name, args = parse(s.action)
        method = getattr(host, f"action_{name}")
        out.append(SystemCommand(s.palette, f"{s.about} ({s.label})", partial(method, *args) if args else method))
    return out


APP_KEYS = (  # every screen's: the help lists them after the screen's own; the bar always shows them
    # KeySpec(key, action, help, shown, bar, rank, at, palette, about)
    KeySpec("ctrl+q", "quit", "Quit", "^q", "Quit", 0, 5, "", ""),
    KeySpec("f1,1", "mode('generate')", "Generate", "", "Gen", 0, 1, "Generate screen", "Watch reverse diffusion"),
    KeySpec("f2,2", "mode('checkpoints')", "Checkpoints", "", "Ckpts", 0, 2, "Checkpoints screen", "List, choose, fetch, import, delete"),
    KeySpec("f3,3", "mode('train')", "Train", "", "Train", 0, 3, "Train screen", "Train a model on your text files"),
    KeySpec("question_mark", "toggle_keys", "Keys", "?", "Keys", 0, 4, "Keys", "Every key of this screen, described in full"),
    KeySpec("ctrl+p", "command_palette", "Command palette: every action and screen by name", "^p", "Palette", 9, 6, "", "", bound=False),
)
