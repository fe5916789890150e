"""What dbert's downloads accept from the network: http(s) only, redirects that stay on the
host they started from, and an answer within a timeout (DBERT_FETCH_TIMEOUT seconds, default
TIMEOUT) both to connect and between any two reads, for archive URLs and the Hugging Face Hub.

An archive URL must also not trickle: its status line and headers (all redirects included)
must arrive within the timeout in total, and its body must bring at least DBERT_FETCH_MIN_BYTES
(MIN_BYTES) in every timeout-long window, so a server sending one byte every 29 seconds is one
line, not a fetch that never ends. And the whole fetch (every file of a hub repo, every
redirect) must end within DBERT_FETCH_DEADLINE seconds (DEADLINE), so a server that keeps just
above that pace ends too.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import math
import os
import socket
import time
import urllib.request
from urllib.parse import urljoin, urlparse

from ..errors import DbertError

TIMEOUT = 30.0
MIN_BYTES = 1024  # of an archive's body in every DBERT_FETCH_TIMEOUT seconds (DBERT_FETCH_MIN_BYTES overrides)
DEADLINE = 3600.0  # seconds for a whole fetch (DBERT_FETCH_DEADLINE overrides)
POLL = 0.25  # seconds between looks at a cancel request while a read waits
SCHEMES = ("http", "https")


def seconds(variable: str, default: float) -> float:
    """A positive, finite number of seconds from the environment variable, else default."""
    text = os.environ.get(variable)
    if text is None or not text.strip():
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise DbertError(f"{variable} must be a positive number of seconds, got {text[:40]!r}")
    return value


def timeout() -> float:
    """Seconds to wait for a connection or for the next bytes (DBERT_FETCH_TIMEOUT overrides)."""
    return seconds("DBERT_FETCH_TIMEOUT", TIMEOUT)


def min_bytes() -> int:
    """Bytes a download must bring in every DBERT_FETCH_TIMEOUT window (DBERT_FETCH_MIN_BYTES overrides)."""
    text = os.environ.get("DBERT_FETCH_MIN_BYTES")
    if text is None or not text.strip():
        return MIN_BYTES
    if not text.strip().isdigit() or int(text) < 1:
        raise DbertError(f"DBERT_FETCH_MIN_BYTES must be a whole number of bytes >= 1, got {text[:40]!r}")
    return int(text)


_deadline: tuple[float, float] | None = None  # (monotonic time, its seconds) the fetch under way must end by


@contextlib.contextmanager
def deadline():
    """A fetch under way: every download inside must end within DBERT_FETCH_DEADLINE seconds of its start."""
    global _deadline
    limit = seconds("DBERT_FETCH_DEADLINE", DEADLINE)
    min_bytes()  # a malformed setting is one line before anything is fetched
    _deadline = (time.monotonic() + limit, limit)
    try:
        yield
    finally:
        _deadline = None


def _check_deadline(url: str) -> float:
    """Seconds left of the fetch's deadline (inf when none is set); DbertError once it has passed."""
    if _deadline is None:
        return math.inf
    left = _deadline[0] - time.monotonic()
    if left <= 0:
        raise DbertError(f"cannot fetch {url}: the download did not finish within {_deadline[1]:g} s "
                         "(set DBERT_FETCH_DEADLINE to allow longer)")
    return left


def check_url(url: str) -> None:
    scheme = urlparse(url).scheme.lower()
    if scheme not in SCHEMES:
        raise DbertError(f"cannot fetch {url}: only http:// and https:// URLs are fetched"
                         + (f", not {scheme}://" if scheme else ""))


def check_redirect(url: str, new: str) -> None:
    """A redirect may change the path, or upgrade http to https; nothing else."""
    old_p, new_p = urlparse(url), urlparse(new)
    if new_p.scheme.lower() not in SCHEMES:
        raise DbertError(f"cannot fetch {url}: it redirects to {new_p.scheme or '?'}:// ({new[:120]}); "
                         "only http:// and https:// are fetched")
    same_host = (new_p.hostname or "").lower() == (old_p.hostname or "").lower()
    same_port = new_p.scheme != old_p.scheme or (new_p.port or _port(new_p.scheme)) == (old_p.port or _port(old_p.scheme))
    if not (same_host and same_port):
        raise DbertError(f"cannot fetch {url}: it redirects to another host ({new_p.hostname}); "
                         "fetch that URL directly if you trust it")
    if old_p.scheme == "https" and new_p.scheme == "http":
        raise DbertError(f"cannot fetch {url}: it redirects from https to plain http")


def _port(scheme: str) -> int:
    return 443 if scheme.lower() == "https" else 80


class _Redirects(urllib.request.HTTPRedirectHandler):
    def http_error_302(self, req, fp, code, msg, headers):
        location = headers.get("Location") or headers.get("URI")
        if location:
            check_redirect(req.full_url, urljoin(req.full_url, location))
        return super().http_error_302(req, fp, code, msg, headers)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


class _Pace:
    """The clock of one download: headers due by a deadline, then MIN_BYTES per window."""

    def __init__(self, seconds: float, url: str, cancel=None):
        self.seconds, self.url, self.host, self.cancel = seconds, url, urlparse(url).netloc, cancel
        self.headers_by = time.monotonic() + seconds
        self.least = min_bytes()
        self.window: tuple[float, int] | None = None  # (start, bytes) once the body is being read

    def before(self) -> float:
        """Seconds the next read may wait (DbertError once the headers' deadline or the fetch's has passed)."""
        whole = _check_deadline(self.url)
        if self.window is None:
            left = self.headers_by - time.monotonic()
            if left <= 0:
                raise DbertError(f"cannot fetch {self.url}: no answer from {self.host} within {self.seconds:g} s "
                                 "(its headers never came whole; set DBERT_FETCH_TIMEOUT to wait longer)")
            return min(self.seconds, left, whole)
        return min(self.seconds, whole)

    def after(self, n: int) -> None:
        _check_deadline(self.url)
        if self.window is None:
            return
        start, got = self.window
        now = time.monotonic()
        if now - start >= self.seconds:
            if got + n < self.least:
                raise DbertError(f"cannot fetch {self.url}: {self.host} sends too slowly: {got + n} bytes in "
                                 f"{now - start:.0f} s (at least {self.least} are needed every {self.seconds:g} s; "
                                 "DBERT_FETCH_MIN_BYTES and DBERT_FETCH_TIMEOUT set them)")
            self.window = (now, 0)
        else:
            self.window = (start, got + n)


class _PacedSocket:
    """A connected socket whose reads follow a _Pace (everything else is the socket's own)."""

    def __init__(self, sock, pace: _Pace):
        self._sock, self._pace = sock, pace

    def __getattr__(self, name):
        return getattr(self._sock, name)

    def makefile(self, mode="r", *args, **kwargs):
        if mode == "rb":  # what http.client reads the response from
            self._sock._io_refs += 1  # as socket.makefile does: closing the connection waits for this file
            return io.BufferedReader(socket.SocketIO(self, "rb"))
        return self._sock.makefile(mode, *args, **kwargs)

    def recv_into(self, buffer, nbytes=0, flags=0):
        pace = self._pace
        limit, waited = pace.before(), 0.0
        while True:  # in slices of POLL seconds, so a cancel (the TUI's Esc or Ctrl-Q) is seen at once
            step = min(POLL, limit - waited) if pace.cancel is not None else limit
            self._sock.settimeout(max(step, 0.001))
            try:
                n = self._sock.recv_into(buffer, nbytes, flags)
                break
            except TimeoutError:
                waited += step
                if pace.cancel is not None and pace.cancel():
                    raise DbertError("download cancelled") from None
                if waited >= limit:
                    pace.before()  # past the headers' deadline: say so
                    raise
        pace.after(n)
        return n


def _paced(base, pace: _Pace):
    class Connection(base):
        def connect(self):
            super().connect()
            self.sock = _PacedSocket(self.sock, pace)

    return Connection


def open_url(url: str, cancel=None):
    """urlopen under the policy above; the response's reads time out and may not trickle.
    cancel: polled every POLL seconds while a read waits; True ends it ("download cancelled")."""
    check_url(url)
    pace = _Pace(timeout(), url, cancel)

    class Http(urllib.request.HTTPHandler):
        def http_open(self, req):
            return self.do_open(_paced(http.client.HTTPConnection, pace), req)

    class Https(urllib.request.HTTPSHandler):
        def https_open(self, req):
            return self.do_open(_paced(http.client.HTTPSConnection, pace), req, context=self._context)

    opener = urllib.request.build_opener(_Redirects, Http, Https)
    response = opener.open(url, timeout=pace.seconds)
    pace.window = (time.monotonic(), 0)  # the headers are in: from now on the body's pace counts
    return response


def timed_out(error: BaseException) -> bool:
    """Whether an exception (or one it was raised from) is a timeout."""
    seen = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, TimeoutError) or "Timeout" in type(current).__name__ or \
                "timed out" in str(getattr(current, "reason", "")):
            return True
        current = current.__cause__ or current.__context__
    return False


def no_answer(where: str, host: str) -> DbertError:
    return DbertError(f"cannot fetch {where}: no answer from {host} within {timeout():g} s "
                      "(set DBERT_FETCH_TIMEOUT to wait longer)")


_configured: float | None = None


def _paced_stream(response, pace: _Pace):
    """The response's stream read under a _Pace: MIN_BYTES in every window or DbertError. The
    hub's client is httpx or a fork of it (httpx2): the stream class is taken from its package."""
    import importlib

    base = importlib.import_module(type(response).__module__.split(".")[0]).SyncByteStream
    inner = response.stream

    class PacedStream(base):  # type: ignore[valid-type,misc]  # the client's own class, found at run time
        def __iter__(self):
            for chunk in inner:
                pace.after(len(chunk))
                yield chunk

        def close(self) -> None:
            inner.close()

    return PacedStream()


class SlowAnswer(DbertError):
    """A hub connection's answer came too slowly (the caller names what was being fetched)."""


class _PacedStream:
    """One of the hub client's connections read under the pace rule from each request on: the
    answer's first byte within the timeout (the per-read timeout), then MIN_BYTES in every window,
    headers included, so a server that trickles its *headers* ends too (the response hook only
    sees the body). Writing a request starts the clock again (keep-alive: idle time between
    requests does not count)."""

    def __init__(self, inner, seconds: float, host: str):
        self._inner, self._seconds, self._host = inner, seconds, host
        self._pace = _Pace(seconds, f"https://{host}/")

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        data = self._inner.read(max_bytes, timeout)
        if self._pace.window is None:
            self._pace.window = (time.monotonic(), 0)  # the answer has begun
        try:
            self._pace.after(len(data))
        except DbertError as e:  # "cannot fetch <host>: <host> sends too slowly ...": the caller says what
            raise SlowAnswer(str(e).split(": ", 1)[-1]) from None
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._pace.window = None  # a new request: its answer's clock starts at its first byte
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None):
        return _PacedStream(self._inner.start_tls(ssl_context, server_hostname, timeout), self._seconds, self._host)

    def get_extra_info(self, info: str):
        return self._inner.get_extra_info(info)


class _PacedBackend:
    """The hub client's network backend with every TCP connection a _PacedStream."""

    def __init__(self, inner, seconds: float):
        self._inner, self._seconds = inner, seconds

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        stream = self._inner.connect_tcp(host, port, timeout=timeout, local_address=local_address,
                                         socket_options=socket_options)
        return _PacedStream(stream, self._seconds, f"{host}:{port}")

    def __getattr__(self, name):  # connect_unix_socket, sleep: as they were
        return getattr(self._inner, name)


def _pace_connections(client, seconds: float) -> None:
    """Put the pace rule on the client's own connections (httpx's transport -> httpcore's pool ->
    its network backend; private names, so a client built otherwise keeps only the body's pace)."""
    pool = getattr(getattr(client, "_transport", None), "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    if pool is not None and backend is not None and not isinstance(backend, _PacedBackend):
        pool._network_backend = _PacedBackend(backend, seconds)


def configure_hub() -> None:
    """Give huggingface_hub's HTTP client our timeouts: it passes none for some requests (repo
    info, file listings), which then wait forever on a host that never answers; and read every
    response body under the https downloads' pace rule, so one that trickles in ends too."""
    global _configured
    seconds = timeout()
    if _configured == seconds:
        return
    try:
        import huggingface_hub
        from huggingface_hub.utils import _http

        default = _http.default_client_factory
    except (ImportError, AttributeError):  # an older huggingface_hub: it sets its own timeouts
        return

    def cap(request) -> None:
        given = request.extensions.get("timeout") or {}
        request.extensions["timeout"] = {k: seconds if given.get(k) is None else min(given[k], seconds)
                                         for k in ("connect", "read", "write", "pool")}

    def pace(response) -> None:  # a body that trickles in ends as an https download's does (_Pace)
        clock = _Pace(seconds, str(response.request.url))
        clock.window = (time.monotonic(), 0)
        response.stream = _paced_stream(response, clock)

    def factory():
        client = default()
        client.event_hooks["request"].append(cap)
        client.event_hooks["response"].append(pace)
        _pace_connections(client, seconds)
        return client

    huggingface_hub.set_client_factory(factory)
    _configured = seconds
