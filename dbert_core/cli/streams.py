"""stdout for data, stderr for messages: say() writes a message safely to stderr, and
std_streams() makes file descriptors 0-2 and sys.stdout / sys.stderr safe before a command runs
(a closed pipe on stdout becomes ReaderGone, a closed stdout fails the first write of data).
"""

from __future__ import annotations

import sys


def say(message: str) -> None:
    """A message for the user: stderr, never stdout; made safe to show (display.safe_text: no
    escape codes from a checkpoint or URL reach the terminal). A closed or failing stderr loses
    the message but never fails the command."""
    from ..display import safe_text

    try:
        print(safe_text(message, MAX_LINE), file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


MAX_LINE = 2000  # characters of one message line; a longer one keeps its start and end


def std_streams() -> None:
    """File descriptors 0-2 open, so a file dbert opens never takes the place of a closed stdout
    or stderr (and receives what was meant for them), and sys.stderr never None (print would
    then write messages to stdout). A closed stdout fails the first write of data with EBADF,
    one line; a closed stderr silences messages. Unencodable characters are escaped, not fatal
    (PYTHONIOENCODING=ascii, the C locale)."""
    import os

    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if sys.stdout is None:
        sys.stdout = _Closed()
    elif not isinstance(sys.stdout, DataStream):
        sys.stdout = DataStream(sys.stdout)
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")
    if sys.stdin is None:  # fd 0 was closed: reading it is reading nothing, isatty() is False
        sys.stdin = open(os.devnull)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]  # not every stream: caught below
        except (AttributeError, ValueError, OSError):
            pass
    sys.argv[1:] = [_argument_text(a) for a in sys.argv[1:]]


def _argument_text(arg: str) -> str:
    """An argument as the user typed it. Under the C locale without UTF-8 coercion Python decodes
    argv as ASCII, so "Café" arrives holding surrogate escapes that no tokenizer or file name
    check accepts; its bytes are read again as UTF-8 (what terminals send), undecodable bytes
    as U+FFFD."""
    if not any("\udc80" <= ch <= "\udcff" for ch in arg):
        return arg
    import os

    return os.fsencode(arg).decode("utf-8", errors="replace")


class ReaderGone(Exception):
    """stdout's reader stopped early (`| head -1`): the command ends, status 141, nothing said."""


class DataStream:
    """sys.stdout, with a closed pipe raised as ReaderGone: Click turns a BrokenPipeError inside a
    command into a silent exit 0, which tells a script the data was all delivered."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError as e:
            raise ReaderGone() from e

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError as e:
            raise ReaderGone() from e

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


class _Closed:
    """What sys.stdout is when fd 1 was closed at start: writing data fails, as it would."""

    encoding = "utf-8"
    errors = "strict"

    def write(self, text: str) -> int:
        import errno

        raise OSError(errno.EBADF, "stdout is closed")

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        raise OSError(9, "stdout is closed")
