"""How a stop signal (SIGINT, SIGTERM, SIGHUP) becomes errors.Interrupted, safely.

The CLI's handlers (cli/ending.py) and a training run's (training/train.py) call stop(): it raises
Interrupted unless a stop is already under way, puts off a signal that lands inside an import or
a put_off_stops() block (taking an output folder's lock into a variable), and takes no lock,
since a handler can run again inside itself when a second signal comes.
"""

from __future__ import annotations

import contextlib
from typing import Any

from .errors import Interrupted

_under_way = False  # a stop is under way (stop_under_way): stop signals change nothing
_holding = 0  # put_off_stops() blocks open: a stop signal waits until the last one ends


def stop(signum: int, frame=None) -> None:
    """The body of a stop signal's handler (frame: the handler's): raise Interrupted, unless a stop
    is already under way (stop_under_way: a run saving before it stops, a command whose exit
    status is decided), where a fast second Ctrl-C used to break into the ending and surface as a
    traceback. A signal that lands inside an import is put off until the import is over: some
    libraries' imports swallow any exception (numpy's docstrings), which left numpy half-built
    and the run going on as if nothing had been pressed. Nothing here takes a lock: a handler can
    run again inside itself (a second signal), and a lock it already holds would wait forever."""
    import signal

    if _under_way:
        return
    if (_holding or _importing(frame)) and hasattr(signal, "setitimer"):
        _put_off(signum)
        return
    raise Interrupted(signal.Signals(signum).name)


_pending: int | None = None  # a stop signal put off until the import it landed in is over
_NONE = object()
_alarm_before: Any = _NONE  # SIGALRM's handler before a put-off put _again there


def _put_off(signum: int) -> None:
    """Deliver signum again in 50 ms (SIGALRM; no thread, no lock), to the handler then in place."""
    import signal

    global _pending, _alarm_before
    _pending = signum
    current = signal.getsignal(signal.SIGALRM)
    if current is not _again:
        _alarm_before = current
        signal.signal(signal.SIGALRM, _again)
    signal.setitimer(signal.ITIMER_REAL, 0.05)


def _again(_alarm: int, frame) -> None:
    """SIGALRM: the put-off stop signal, once no import is under way (else 50 ms more)."""
    import os
    import signal

    signum = _pending
    if signum is None:
        return
    if _holding or _importing(frame):
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        return
    _no_put_off()
    handler = signal.getsignal(signum)
    if callable(handler):
        handler(signum, frame)
    elif handler != signal.SIG_IGN:
        os.kill(os.getpid(), signum)  # the default action


def _no_put_off() -> None:
    """No stop signal pending: the timer off and SIGALRM's handler as it was, so no timer outlives
    the command (at exit Python puts SIGALRM back to its default, which kills the process)."""
    import signal

    global _pending, _alarm_before
    if _alarm_before is _NONE:
        return
    _pending = None
    try:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, _alarm_before if _alarm_before is not None else signal.SIG_DFL)
    except (ValueError, OSError):  # not the main thread: the handler there stays (it ignores no pending)
        return
    _alarm_before = _NONE


def _importing(frame) -> bool:
    """Whether the frame is inside a module's import (its code runs under importlib)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def put_off_stops():
    """A block a stop signal must not break into: one landing inside it is delivered once it
    ends (within 50 ms). For a step whose result must reach a variable before anything can fail,
    so that the caller's clean-up sees it: `with put_off_stops(): lock = OutLock(out)` (an
    Interrupted raised between the lock file's creation and the assignment left the file behind)."""
    global _holding
    _holding += 1
    try:
        yield
    finally:
        _holding -= 1


def stop_under_way() -> None:
    """A stop is under way (a run saving before it stops; a command whose status is decided):
    stop signals from here on change nothing, and a put-off one is dropped."""
    global _under_way
    _under_way = True
    _no_put_off()


def stop_reset() -> None:
    """A command starts: stop signals interrupt it."""
    global _under_way
    _under_way = False
