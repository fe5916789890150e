"""The server's logs: uvicorn's access and error logs, every line on stderr, each handler behind
one LogGuard, so that nothing a client sent reaches them raw (control characters escaped, a
value cut to LOG_VALUE characters) and no client can make them grow fast (LOG_RATE lines a second
after a burst of LOG_BURST; the lines past that are dropped and counted)."""

from __future__ import annotations

import logging
import threading
import time

from ..display import safe_text

LOG_RATE = 5.0        # lines a second each server log (access, error) keeps on average ...
LOG_BURST = 100       # ... after a burst of this many; the lines dropped are counted instead
LOG_SUMMARY = 10.0    # seconds between two counts of dropped lines, at most one per log
LOG_VALUE = 120       # characters of one value a client chose (a path, a method) in a log line


class LogGuard(logging.Filter):
    """On each handler of the server's logs: nothing a client sent reaches them raw, and no client
    can make them grow fast.

    - every argument and exception text goes through display.safe_text: control characters
      (ESC, BEL, the C1 controls a header's Latin-1 bytes decode to) are written as escapes, a
      value is at most LOG_VALUE characters;
    - each logger (uvicorn.access, uvicorn.error) keeps `rate` lines a second on average, after a
      burst of `burst`; the lines past that are dropped and counted, and the count is written
      (one warning line) when lines pass again, and every `every` seconds while they do not."""

    def __init__(self, rate: float = LOG_RATE, burst: int = LOG_BURST, every: float = LOG_SUMMARY,
                 clock=time.monotonic):
        super().__init__()
        self.rate, self.burst, self.every, self.clock = rate, burst, every, clock
        self._buckets: dict[str, list[float]] = {}  # logger -> [tokens, at, dropped, counted since]
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "dbert_count", False):  # the count of dropped lines itself
            return True
        now = self.clock()
        with self._lock:
            b = self._buckets.setdefault(record.name, [float(self.burst), now, 0, now])
            b[0], b[1] = min(float(self.burst), b[0] + (now - b[1]) * self.rate), now
            keep = b[0] >= 1
            if keep:
                b[0] -= 1
            else:
                b[2] += 1
            count = b[2] if b[2] and (keep or now - b[3] >= self.every) else 0
            if count:
                since, b[2], b[3] = now - b[3], 0, now
        if count:
            logging.getLogger("uvicorn.error").warning(
                "%d lines of the %s log dropped in the last %.0f s (it keeps %g a second)", count, record.name,
                since, self.rate, extra={"dbert_count": True})
        if keep:
            _escape(record)
        return keep


def _escape(record: logging.LogRecord) -> None:
    if isinstance(record.msg, str):
        record.msg = safe_text(record.msg, None)
    if isinstance(record.args, tuple):
        record.args = tuple(safe_text(a, LOG_VALUE) if isinstance(a, str) else a for a in record.args)
    if record.exc_info and not record.exc_text:
        text = logging.Formatter().formatException(record.exc_info)
        record.exc_text = "\n".join(safe_text(line, None) for line in text.split("\n"))


def log_config() -> dict:
    """uvicorn's logging with every line on stderr (its access log goes to stdout by default),
    each handler behind one LogGuard."""
    import copy

    from uvicorn.config import LOGGING_CONFIG

    cfg = copy.deepcopy(LOGGING_CONFIG)
    cfg["filters"] = {"dbert_guard": {"()": LogGuard}}
    for handler in cfg["handlers"].values():
        handler["stream"] = "ext://sys.stderr"
        handler["filters"] = ["dbert_guard"]
    return cfg
