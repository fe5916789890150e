"""`dbert serve`: a local OpenAI-compatible completions server with native infill.

    GET  /health           {"status": "ok", "model", "queued", "busy"} (no key needed)
    GET  /v1/models        the store's checkpoints, the loaded one first
    POST /v1/completions   OpenAI's completions: model, prompt (a string or a list), suffix,
                           max_tokens, temperature, top_p, n, seed, stream, stream_options,
                           echo; dbert's own settings under "dbert": steps, top_k, sampler,
                           block_repeats, template, stream_steps, lowercase
    POST /v1/chat/completions  OpenAI's chat: the last user message's text is the story's opening
                           (request.chat_body), the story's continuation the assistant's message

The text of a choice is what the model wrote between prompt and suffix: the line
`dbert sample` would print for the template  prompt [MASK] x max_tokens suffix  (the same
SampleConfig, `generate()` and `DBert.decode`), less the decoded prompt in front and the
decoded suffix behind, so prompt + text + suffix reads as the whole sample. With echo, or
when the prompt holds [MASK] slots of its own (or a dbert.template is given), it is the
whole line. `max_tokens` is the exact length of the span in word pieces (dbert fills a span
of a known length); without it the span fills the checkpoint's training length.

With stream, the server sends OpenAI's chunks (server-sent events): a long story's text as each
of its windows is finished (a window's tokens never change after it: response.settled_text holds
back the last word, which the next window may still join), the rest when the choice is done, then
`data: [DONE]`. With dbert.stream_steps as well, a chunk
follows every reverse step with empty text (OpenAI clients ignore it) and, on each choice,
"dbert": {"step", "steps", "text"}: the whole line so far, [MASK] where still masked.

Starlette on uvicorn: Starlette is the small, well-kept ASGI toolkit FastAPI itself is built
on (routing, streaming responses, lifespan) without pydantic models, which would repeat the
checks SampleConfig already makes; uvicorn is the reference ASGI server and handles SIGINT and
SIGTERM with a graceful shutdown. Both are imported only when the server starts.
The model runs in one worker thread (serve_queue.Scheduler): the event loop only parses,
queues and streams. Nothing a request sends is used as a path: it names no file.

Against bad clients (docs/security.md, "The server", has the numbers): connections are capped
(Limits.max_connections; idle ones make room, past it only /health), a request's head has
Limits.keep_alive seconds and its body the request's --timeout, every malformed request is a
4xx in the API's error shape, and the logs escape what clients send and keep LOG_RATE lines a
second (LogGuard). SIGHUP drains like SIGTERM; a second Ctrl-C cancels at once.

This module is the app: its routes, the API key and the head check. A request is read and
checked in request.py, answered in response.py; the server that runs the app is server.py, its
connections connections.py, its logs logs.py, its limits and start-up checks options.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
import uuid
from datetime import datetime

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from ..errors import DbertError
from .api_error import ApiError
from .options import MAX_HEAD, Limits
from .request import chat_body, decode_body, parse, read_body
from .response import completion_body, disconnected, event_stream, events
from .serve_queue import Job, QueueFull, Scheduler, ShuttingDown


def create_app(db, model_name: str, *, api_key: str | None = None, limits: Limits | None = None,
               batching: bool = True, max_rows: int = 32, device: str = "auto", dtype: str = "auto",
               models: list[dict] | None = None, threads: int | None = None) -> Starlette:
    """The ASGI app serving the loaded checkpoint `db` as `model_name`. models: the /v1/models
    list (default: the store's checkpoints, read once now)."""
    limits = limits or Limits()
    scheduler = Scheduler(db, max_queue=limits.max_queue, batching=batching, max_rows=max_rows, threads=threads)
    routes = _Routes(db, model_name, scheduler, limits, models if models is not None else list_models(model_name),
                     api_key.encode() if api_key else None, device, dtype)

    def begin_shutdown(grace: float) -> None:
        """SIGINT/SIGTERM: no new work now; after `grace` seconds, what still runs is cancelled."""
        scheduler.refuse()
        asyncio.get_running_loop().call_later(grace, scheduler.stop_all,
                                              "the server is shutting down; the request was cancelled")

    @contextlib.asynccontextmanager
    async def lifespan(app):
        scheduler.start()
        try:
            yield
        finally:
            scheduler.close()

    app = Starlette(routes=[Route("/health", routes.health), Route("/v1/models", routes.list_models_route),
                            Route("/v1/completions", routes.completions, methods=["POST"]),
                            Route("/v1/chat/completions", routes.chat_completions, methods=["POST"])],
                    exception_handlers={ApiError: _api_error, HTTPException: _http_error},  # type: ignore[dict-item]  # each called with its own class
                    lifespan=lifespan,
                    middleware=[Middleware(_HeadCheck)])
    app.state.scheduler = scheduler
    app.state.begin_shutdown = begin_shutdown
    app.state.limits = limits
    return app


async def _api_error(request: Request, exc: ApiError):
    return exc.response()


async def _http_error(request: Request, exc: HTTPException):
    return ApiError(exc.status_code, exc.detail or "error").response()


class _Routes:
    """The app's routes over one loaded checkpoint: the API key (None: none asked), the scheduler
    its model runs on, and what a request may ask (limits, device, dtype)."""

    def __init__(self, db, model_name: str, scheduler: Scheduler, limits: Limits, model_list: list[dict],
                 key: bytes | None, device: str, dtype: str):
        self.db, self.model_name, self.scheduler, self.limits = db, model_name, scheduler, limits
        self.model_list, self.key, self.device, self.dtype = model_list, key, device, dtype

    def authorize(self, request: Request) -> None:
        if self.key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if not (scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.key)):
            raise ApiError(401, "a valid API key is needed: send Authorization: Bearer KEY", code="invalid_api_key")

    async def health(self, request: Request):
        scheduler = self.scheduler
        return JSONResponse({"status": "ok", "model": self.model_name, "queued": scheduler.queued,
                             "busy": scheduler.busy})

    async def list_models_route(self, request: Request):
        self.authorize(request)
        return JSONResponse({"object": "list", "data": self.model_list})

    async def completions(self, request: Request):
        return await self.answer(request, chat=False)

    async def chat_completions(self, request: Request):
        return await self.answer(request, chat=True)

    async def answer(self, request: Request, chat: bool):
        """A completion or chat request: read, checked, queued, then streamed or answered whole."""
        db, limits = self.db, self.limits
        deadline = time.monotonic() + limits.timeout  # reading the body, queueing and sampling, all together
        self.authorize(request)
        data = decode_body(await read_body(request, limits.max_body, deadline, limits.timeout))
        plan = parse(chat_body(data) if chat else data, db, self.model_name, limits, device=self.device,
                     dtype=self.dtype)
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue = asyncio.Queue()
        jobs = [Job(p.cfg, notify=lambda ev, i=i: loop.call_soon_threadsafe(inbox.put_nowait, (i, ev)),  # type: ignore[misc]  # i=i: each its own
                    deadline=deadline, want_steps=plan.stream_steps, want_settled=plan.stream, cased=plan.cased)
                for i, p in enumerate(plan.prompts)]
        try:
            self.scheduler.submit(jobs)
        except QueueFull as e:
            raise ApiError(429, str(e), type_="rate_limit_error", code="queue_full") from None
        except ShuttingDown as e:
            raise ApiError(503, str(e), type_="server_error") from None
        kind = ("chatcmpl", "chat.completion.chunk" if plan.stream else "chat.completion") if chat else \
            ("cmpl", "text_completion")
        meta = {"id": f"{kind[0]}-{uuid.uuid4().hex}", "object": kind[1], "created": int(time.time()),
                "model": self.model_name}
        if plan.stream:
            return StreamingResponse(event_stream(db, plan, jobs, inbox, deadline, meta, chat=chat),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        watcher = asyncio.ensure_future(disconnected(request))
        try:
            results = {}
            async for i, ev in events(inbox, len(jobs), deadline, watcher):
                if ev[0] == "done":
                    results[i] = ev
            return JSONResponse(completion_body(db, plan, jobs, results, meta, chat=chat))
        finally:
            watcher.cancel()
            for job in jobs:
                job.cancel()  # a no-op for finished jobs; stops the others at their next step


class _HeadCheck:
    """A request head over MAX_HEAD bytes is a 431 (h11 bounds only a head that arrives in pieces,
    not one that arrives in one read); one with both Content-Length and Transfer-Encoding is a
    400: which of the two frames the body is the request-smuggling ambiguity (RFC 9112, 6.3),
    refused rather than guessed."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            size = len(scope["raw_path"]) + len(scope["query_string"]) + sum(len(k) + len(v) + 4
                                                                             for k, v in scope["headers"])
            names = {name for name, _ in scope["headers"]}
            error = None
            if size > MAX_HEAD:
                error = ApiError(431, f"the request's headers are over {MAX_HEAD} bytes", close=True)
            elif b"content-length" in names and b"transfer-encoding" in names:
                error = ApiError(400, "the request has both Content-Length and Transfer-Encoding: send one",
                                 close=True)
            if error is not None:
                return await error.response()(scope, receive, send)
        await self.app(scope, receive, send)


def list_models(model_name: str) -> list[dict]:
    """OpenAI's model objects: the loaded checkpoint first, then the store's usable ones."""
    from ..storage.store import entries

    def created(text: str) -> int:
        try:
            return int(datetime.fromisoformat(text).timestamp())
        except (TypeError, ValueError):
            return 0

    rows = [{"id": model_name, "object": "model", "created": int(time.time()), "owned_by": "dbert", "loaded": True}]
    try:
        listed = entries()
    except (OSError, DbertError):
        listed = []
    for e in listed:
        if not e.broken and e.name != model_name:
            rows.append({"id": e.name, "object": "model", "created": created(e.created), "owned_by": "dbert",
                         "loaded": False})
    return rows
