"""A connection to `dbert serve`: uvicorn's h11 protocol with the limits uvicorn has no setting
for (protocol): a deadline on a request's head, a cap on the connections with a request in
progress (idle ones make room; past it, /health only: _overflow), and a request h11 cannot parse
answered in the API's error shape."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import TYPE_CHECKING

from ..display import safe_text
from .api_error import ApiError
from .options import Limits

if TYPE_CHECKING:  # uvicorn is imported when the server starts (protocol()), not with this module
    from uvicorn.protocols.http.h11_impl import H11Protocol as _Base
else:
    _Base = object


def _overflow(app, limit: int):
    """What a connection past `limit` busy ones may do: GET /health (then it is closed); anything
    else is a 503 in the API's error shape."""
    body = json.dumps(ApiError(503, f"the server has {limit} connections with a request in progress "
                                    "(--max-connections); retry later", type_="server_error",
                               code="too_many_connections").body()).encode()

    async def overflow(scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/health" and scope["method"] in ("GET", "HEAD"):
            async def closing(message):
                if message["type"] == "http.response.start":
                    message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
                await send(message)

            return await app(scope, receive, closing)
        await send({"type": "http.response.start", "status": 503,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close"), (b"retry-after", b"1")]})
        await send({"type": "http.response.body", "body": body})

    return overflow


def protocol(limits: Limits):
    """uvicorn's h11 protocol with the limits uvicorn has no setting for (_Limited says which)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    return type("Protocol", (_Limited, H11Protocol), {"limits": limits})


class _Limited(_Base):
    """What protocol() adds to uvicorn's H11Protocol (docs/security.md, "The server"):

    - a request's head (line and headers) must arrive within limits.keep_alive seconds of the
      connect or of the previous response, however slowly it trickles: uvicorn's keep-alive timer
      starts only after a first response and restarts on every byte;
    - past limits.max_connections open connections, the oldest idle one (no request in progress)
      is closed to make room; when none is idle, the new connection may only ask /health (a 503
      for anything else): uvicorn's limit_concurrency would count idle connections too and answer
      /health with a 503 while they last;
    - a request h11 cannot parse gets its 4xx in the API's JSON error shape, not plain text."""

    limits: Limits  # the server's, set by protocol()

    def __init__(self, *args, **kwargs):
        import h11

        super().__init__(*args, **kwargs)
        self._born = self.loop.time()
        self._head_timer: asyncio.TimerHandle | None = None
        self._timed = None  # the request cycle that was current when the head timer started
        self._bad: h11.RemoteProtocolError | None = None
        parse_next = self.conn.next_event

        def next_event():  # remember why h11 refused a request (uvicorn keeps only "invalid")
            try:
                return parse_next()
            except h11.RemoteProtocolError as e:
                self._bad = e
                raise

        self.conn.next_event = next_event

    @property
    def idle(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._start_head_timer()
        live = [c for c in self.connections if c.transport is not None and not c.transport.is_closing()]
        if len(live) > self.limits.max_connections:
            idle = [c for c in live if c is not self and getattr(c, "idle", False)]
            if idle:
                min(idle, key=lambda c: c._born).close()  # type: ignore[union-attr]  # ours: _born set above
            else:
                self.app = _overflow(self.app, self.limits.max_connections)

    def connection_lost(self, exc) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.cycle is not self._timed:  # a new request's head arrived
            self._stop_head_timer()

    def on_response_complete(self) -> None:
        self._start_head_timer()
        super().on_response_complete()
        if self.cycle is not self._timed:  # a pipelined request was already waiting
            self._stop_head_timer()

    def _start_head_timer(self) -> None:
        self._stop_head_timer()
        self._timed = self.cycle
        self._head_timer = self.loop.call_later(self.limits.keep_alive, self.close)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def close(self) -> None:
        import h11

        if not self.transport.is_closing():
            with contextlib.suppress(h11.LocalProtocolError):
                self.conn.send(h11.ConnectionClosed())
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        import h11
        from uvicorn.protocols.http.h11_impl import STATUS_PHRASES

        hint = getattr(self._bad, "error_status_hint", 400)
        status = hint if 400 <= hint < 500 else 400
        why = safe_text(str(self._bad), 200) if self._bad is not None and str(self._bad) else "malformed"
        body = json.dumps(ApiError(status, f"invalid HTTP request: {why}").body()).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        try:
            for event in (h11.Response(status_code=status, headers=headers, reason=STATUS_PHRASES[status]),
                          h11.Data(data=body), h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
        except h11.LocalProtocolError:  # a response of ours was under way (pipelining): only close
            pass
        self.transport.close()
