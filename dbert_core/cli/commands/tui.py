"""`dbert tui`: hands over to the terminal app through its `dbert-tui` entry point (the engine
never imports the front end), with every option it takes."""

from __future__ import annotations

import typer

from ...errors import DbertError


def tui(ctx: typer.Context):
    """Open the interactive terminal app: `dbert-tui` with every option it takes (dbert tui --help).

    Example: dbert tui --checkpoint dbert-minilm-wiki --steps 64
    """
    from importlib.metadata import entry_points

    found = [e for e in entry_points(group="console_scripts") if e.name == "dbert-tui"]
    if not found:  # the engine reaches the front end through its entry point, never by import
        raise DbertError("the terminal app is not installed (no dbert-tui entry point): pip install dbert")
    found[0].load()(list(ctx.args), prog_name="dbert tui")
