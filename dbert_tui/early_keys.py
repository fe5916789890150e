"""Keys pressed before the app has the terminal: a Ctrl-Q typed while dbert-tui still imports and
loads (a blank screen for a second or more) must quit it. In the terminal's usual cooked mode the
line discipline takes Ctrl-Q for itself (IXON: "resume output") and the app never sees it, so it
ran on. At the very start of the program, before the heavy imports, this turns flow control,
line editing and echo off (the keys then wait, unseen, for the app, which reads them once it
starts), and puts the terminal back as it was when the program ends, after the app's own restore.
Only in the dbert-tui process itself, with a terminal on stdin; nothing else is changed."""

from __future__ import annotations

import atexit
import os
import sys
from typing import Any


def _is_dbert_tui() -> bool:
    argv = list(getattr(sys, "orig_argv", sys.argv))
    return os.path.basename(sys.argv[0] or "") == "dbert-tui" or "dbert_tui.app" in argv[1:4]


def hold() -> None:
    """Let keys typed from now on reach the app (see the module's docstring); a no-op elsewhere."""
    try:
        import termios

        if not (_is_dbert_tui() and os.isatty(0)):
            return
        before = termios.tcgetattr(0)
        held: list[Any] = [list(x) if isinstance(x, list) else x for x in before]  # flags (int), then cc (a list)
        held[0] &= ~(termios.IXON | termios.IXOFF)  # iflag: Ctrl-Q and Ctrl-S are keys, not flow control
        held[3] &= ~(termios.ICANON | termios.ECHO)  # lflag: each key at once, not echoed onto the screen
        termios.tcsetattr(0, termios.TCSANOW, held)
    except (ImportError, OSError, ValueError, Exception):  # noqa: BLE001 - never fail a start for this
        return

    def restore() -> None:
        try:
            termios.tcsetattr(0, termios.TCSANOW, before)
        except Exception:  # noqa: BLE001 - the terminal has gone: nothing to restore
            pass

    atexit.register(restore)
