"""How a command ends: Ctrl-C, SIGTERM and SIGHUP become Interrupted (so `finally` blocks clean
up), the handlers main() found are put back, and what ended a command becomes one line on
stderr and an exit status (exit_code).
"""

from __future__ import annotations

from ..errors import DbertError, Interrupted
from ..stopping import stop
from .streams import ReaderGone, say


def _on_signal(signum, frame) -> None:
    stop(signum, frame)  # Interrupted (after an import under way); nothing once main() has decided the ending


saved_handlers: dict = {}  # what main() found, put back by restore_signals


def restore_signals() -> None:
    """The signal handlers as main() found them (serve hands its signals to uvicorn)."""
    import signal

    for sig, handler in saved_handlers.items():
        signal.signal(sig, handler)


def stop_signals() -> dict:
    """Ctrl-C, SIGTERM and SIGHUP end a command through Interrupted: its `finally` blocks clean up
    (a fetch deletes its temp folder), then one line. `train` installs its own handlers while it
    runs (a stop saves a checkpoint); a SIGHUP ignored by the caller (nohup) stays ignored."""
    import signal

    old = {}
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is None or (name == "SIGHUP" and signal.getsignal(sig) == signal.SIG_IGN):
            continue
        try:
            old[sig] = signal.signal(sig, _on_signal)
        except (ValueError, OSError):  # not the main thread, or not allowed here
            pass
    return old


def is_the_process(names: tuple[str, ...] = ("dbert",), modules: tuple[str, ...] = ("dbert_core.cli", "dbert_core.cli.__main__")) -> bool:
    """Whether the running program is one of dbert's own commands (a script of one of `names`, or
    `python -m` one of `modules`), not another program (a test) calling main()."""
    import sys
    from pathlib import Path

    entry = sys.modules.get("__main__")
    spec = getattr(entry, "__spec__", None)
    return getattr(spec, "name", None) in modules or Path(getattr(entry, "__file__", "") or "").name in names


def quiet_exit() -> bool:
    """When main() is the process itself (`dbert`, `python -m dbert_core.cli`), a stop signal
    after the command has ended (a second fast Ctrl-C while the interpreter shuts down) is
    ignored: the status is decided, and Python's default handler would print a
    KeyboardInterrupt traceback and end with -2 instead. Inside another program main() leaves
    the handlers as it found them (restore_signals) and this returns False. Called before any
    handler is put back: restored first, Python's default handler was in place for a moment, and a
    burst of Ctrl-C landing in it ended in a traceback (a clean-clone CI run caught it once)."""
    import signal

    if not is_the_process():
        return False
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is not None:
            try:
                signal.signal(sig, signal.SIG_IGN)
            except (ValueError, OSError):
                pass
    return True


def exit_code(error: BaseException) -> int:
    """The exit status for what ended a command, after one line on stderr (none for a closed pipe)."""
    import errno

    if isinstance(error, Interrupted):
        say(f"dbert: interrupted ({error})" if str(error) not in ("", "SIGINT") else "dbert: interrupted")
        return 130
    if isinstance(error, ReaderGone):  # the reader stopped early (| head): nothing to say
        return 141
    if isinstance(error, DbertError):
        from ..settings import flag

        say(f"dbert: error: {error.said(flag)}")  # a setting named by its flag: --top-p
        return 2
    if isinstance(error, OSError):
        if error.errno == errno.EPIPE:  # the reader stopped early (| head): nothing to say
            return 141
        where = f" ({error.filename})" if error.filename else ""
        say(f"dbert: error: {error.strerror or error}{where}")
        return 2
    from ..hardware import is_out_of_memory

    if is_out_of_memory(error) and not isinstance(error, MemoryError):  # torch's allocators
        say("dbert: error: out of memory; lower --batch-size (or --n, --candidates, --length; bench: --batch)")
        return 2
    if isinstance(error, (RecursionError, MemoryError)):
        say(f"dbert: error: {'out of memory' if isinstance(error, MemoryError) else 'input nested too deeply'}")
        return 2
    say(f"dbert: internal error: {type(error).__name__}: {str(error).strip()[:300]} "
        "(please report it; DBERT_TRACEBACK=1 shows where)")
    return 1
