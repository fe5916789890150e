"""A command whose --help lists its common options and --help-all every one. `dbert sample` has
over thirty; rich's help squeezed them into 400 lines at 80 columns and cut the longest names
("--end-at-senten…"). --help keeps rich's layout for the common few (short names: nothing is
cut); --help-all lists every option as plain wrapped text: each name whole on its own line, its
help below it, at the terminal's width."""

from __future__ import annotations

import shutil
import textwrap
from typing import Any

import typer
from typer.core import TyperCommand


def short_help(common: tuple[str, ...]) -> type[TyperCommand]:
    """A TyperCommand class whose --help lists only the parameters named in `common` (their
    Python names); the others stay usable, and --help-all (show_all) lists them."""

    class ShortHelp(TyperCommand):
        def format_help(self, ctx, formatter) -> None:
            rest = [p for p in self.params if p.name not in common and not getattr(p, "hidden", False)]
            for p in rest:
                p.hidden = True  # type: ignore[attr-defined]  # typer's options and arguments have it
            try:
                return super().format_help(ctx, formatter)
            finally:
                for p in rest:
                    p.hidden = False  # type: ignore[attr-defined]  # (as above)

    return ShortHelp


def show_all(ctx: typer.Context, value: bool) -> None:
    """The --help-all callback: every option of the command, names whole, help wrapped; then exit."""
    if not value or ctx.resilient_parsing:
        return
    width = max(40, min(100, shutil.get_terminal_size((80, 24)).columns)) - 1
    lines = [f"Usage: {ctx.command_path} [OPTIONS] [PROMPT]", "", "Every option (--help lists the common ones):"]
    p: Any  # typer's own parameter classes (not click's): hidden, help, show_default
    for p in ctx.command.params:
        if p.param_type_name != "option" or p.hidden:
            continue
        lines.append("")
        lines.append("  " + ", ".join([*p.opts, *p.secondary_opts]))
        about = (p.help or "").strip()
        default = p.default if p.show_default is not False and not callable(p.default) else None
        if default not in (None, False, "", ()) and not isinstance(default, bool):
            about += f" [default: {getattr(default, 'value', default)}]"
        lines += textwrap.wrap(about, width=width, initial_indent="      ", subsequent_indent="      ")
    typer.echo("\n".join(lines))
    raise typer.Exit()
