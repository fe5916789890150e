"""The uvicorn server of the app, and running it until a signal: SIGINT, SIGTERM and SIGHUP drain
(no new connections; what runs past --grace is cancelled) and end the run as a return, not by the
signal; a second Ctrl-C cancels at once. The
client-facing limits are uvicorn's settings (keep-alive, MAX_HEAD) and connections.protocol; the
logs go through logs.log_config."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading

from starlette.applications import Starlette

from .connections import protocol
from .logs import log_config
from .options import MAX_HEAD, Limits


def server(app: Starlette, host: str = "127.0.0.1", port: int = 8000, grace: float = 10.0, access_log: bool = True):
    """The uvicorn server of the app (its `run()` blocks; tests run it in a thread). On shutdown
    (SIGINT, SIGTERM, or SIGHUP: the terminal closed) the app itself cancels what runs past
    `grace` (each request then ends with a 503 or an error event) and a second later closes the
    connections still open (a body still arriving); a second SIGINT (Ctrl-C) does both at once.
    uvicorn's own cancelling of tasks, a few seconds later, is only a backstop.

    Client-facing limits come from the app's Limits: uvicorn's timeout_keep_alive and h11's head
    size (MAX_HEAD) as settings, the rest in connections.protocol. X-Forwarded-For is not read
    (no proxy is trusted): the access log names the peer of the socket."""
    import uvicorn

    limits: Limits = app.state.limits

    class Server(uvicorn.Server):
        _loop: asyncio.AbstractEventLoop | None = None
        _cutting = False

        async def startup(self, sockets=None):
            self._loop = asyncio.get_running_loop()
            await super().startup(sockets)

        async def shutdown(self, sockets=None):
            app.state.begin_shutdown(grace)
            asyncio.get_running_loop().call_later(grace + 1.0, self._close_connections)
            await super().shutdown(sockets)

        def _close_connections(self) -> None:
            for connection in list(self.server_state.connections):
                connection.transport.close()

        def _stop_now(self) -> None:
            """The second Ctrl-C: cancel every request now, close what is left a second later."""
            app.state.scheduler.stop_all("the server was stopped (a second Ctrl-C); the request was cancelled")
            loop = asyncio.get_running_loop()  # a callback on the server's loop (handle_exit)
            loop.call_later(1.0, self._close_connections)
            loop.call_later(3.0, setattr, self, "force_exit", True)

        def handle_exit(self, sig, frame) -> None:
            if self.should_exit and sig == signal.SIGINT and self._loop is not None:
                self._captured_signals.append(sig)
                if not self._cutting:
                    self._cutting = True
                    self._loop.call_soon_threadsafe(self._stop_now)
                return
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self):
            """uvicorn's SIGINT and SIGTERM, and SIGHUP too (unless ignored, as under nohup): each
            drains, and a drained server has ended as asked, so none is raised again afterwards
            (uvicorn would end the process by it: 129 for SIGHUP, 143 for SIGTERM); `dbert serve`
            then says it stopped and exits 0."""
            hup = getattr(signal, "SIGHUP", None)
            catch_hup = hup is not None and threading.current_thread() is threading.main_thread() \
                and signal.getsignal(hup) != signal.SIG_IGN
            old = signal.signal(hup, self.handle_exit) if catch_hup else None
            try:
                with super().capture_signals():
                    try:
                        yield
                    finally:
                        self._captured_signals.clear()  # drained: nothing to end the process by
            finally:
                if catch_hup:
                    signal.signal(hup, old)

    return Server(uvicorn.Config(app, host=host, port=port, log_config=log_config(), access_log=access_log,
                                 lifespan="on", http=protocol(limits), h11_max_incomplete_event_size=MAX_HEAD,
                                 proxy_headers=False, timeout_graceful_shutdown=grace + 5,  # type: ignore[arg-type]
                                 timeout_keep_alive=limits.keep_alive))  # type: ignore[arg-type]  # seconds: uvicorn annotates int, reads a float


def run(app: Starlette, host: str, port: int, grace: float = 10.0) -> None:
    """Serve until SIGINT/SIGTERM/SIGHUP: then take no new connections, let running requests finish
    for `grace` seconds, cancel what is left (the sampler stops at its next step), stop the worker.
    A second SIGINT cancels at once."""
    server(app, host, port, grace).run()
