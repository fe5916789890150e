"""The `dbert` command. stdout carries data only; progress and messages go to stderr.

Heavy imports (torch, transformers) happen inside the commands, so `dbert --help` is instant.
An expected failure (bad file, bad option, bad checkpoint) prints one line and exits 2.

This module builds the Typer app, registers the commands in the order `dbert --help` lists
them, and holds main(), the entry point (`dbert`, `python -m dbert_core.cli`). The rest:

    commands/    one module per command: train, sample, eval, checkpoints (list, fetch, import,
                 remove), tui, bench, serve
    options      the option types and defaults the commands share; what an option turns into
    streams      stdout for data, stderr for messages (say); file descriptors 0-2 made safe
    ending       signals become Interrupted; what ended a command becomes one line and a status
    progress     progress on stderr: rich bars on a terminal, plain lines otherwise
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from ..errors import DbertError, Interrupted
from ..heap import keep_freed_memory
from ..stopping import stop_reset, stop_under_way
from .commands.bench import bench
from .commands.checkpoints import checkpoints_app
from .commands.eval import evaluate
from .commands.sample import COMMON as SAMPLE_COMMON, sample
from .commands.serve import serve
from .commands.train import train
from .commands.tui import tui
from .ending import exit_code, is_the_process, quiet_exit, restore_signals, saved_handlers, stop_signals
from .options import (SAMPLER, Decay, Device, DocSep, Dtype, EvalUnit, Loss, Preset, Schedule, Time, Unit,
                      flags_without_type)
from .short_help import short_help
from .streams import DataStream, ReaderGone, std_streams

__all__ = ["app", "main", "flags_without_type", "sample", "Decay", "Device", "DocSep", "Dtype", "EvalUnit", "Loss",
           "Preset", "SAMPLER", "Schedule", "Time", "Unit"]  # what scripts and tests import from dbert_core.cli

flags_without_type()
app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="DiffusionBERT: train, sample and evaluate text diffusion models.")
app.add_typer(checkpoints_app, name="checkpoints")


def _version(value: bool):
    if value:
        from .. import __version__

        print(f"dbert {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                 help="Print the version and exit.")] = False):
    pass


app.command()(train)
app.command(cls=short_help(SAMPLE_COMMON))(sample)
app.command("eval")(evaluate)
app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, add_help_option=False)(tui)
app.command()(bench)
app.command()(serve)


def main() -> None:
    """Entry point: run the app; every failure becomes one line on stderr and a non-zero exit
    (2: an expected failure, 130: interrupted, 141: stdout closed early, 1: a bug), never a
    traceback, and stdout carries only data."""
    import os

    given = sys.stdout
    if is_the_process():  # the process's own malloc settings: arrays of the sampler's calls reuse pages (heap.py)
        keep_freed_memory()
    std_streams()
    stop_reset()
    saved_handlers.update(stop_signals())
    code: int | str | None = 0  # SystemExit.code: a status, a message or None
    try:  # typer itself prints usage errors and help, and exits (SystemExit) for them
        app()
        stop_under_way()
    except SystemExit as e:
        stop_under_way()
        code = e.code
    except BaseException as e:  # noqa: BLE001 - the one place every failure ends
        stop_under_way()  # the status is decided here: a late stop signal cannot break into the line below
        if os.environ.get("DBERT_TRACEBACK") == "1" and not isinstance(e, (DbertError, Interrupted)):
            raise
        code = exit_code(e)
    try:
        sys.stdout.flush()
    except (OSError, ValueError, ReaderGone) as e:
        code = exit_code(e) if isinstance(e, (OSError, ReaderGone)) else 2
    if code:  # nothing more may reach a broken stdout: the interpreter's own flush at exit stays quiet
        try:
            if sys.stdout.fileno() == 1:
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, 1)
                os.close(null)
        except (OSError, ValueError, AttributeError):
            pass
    if not quiet_exit():  # the process itself: late stop signals ignored, never a default handler in between
        restore_signals()  # inside another program (tests): the handlers as they were
    saved_handlers.clear()
    if isinstance(sys.stdout, DataStream) and not isinstance(given, DataStream):
        sys.stdout = given
    sys.exit(code if isinstance(code, int) else 0 if code is None else 1)
