"""`dbert serve`: a local OpenAI-compatible completions server with native infill.

    GET  /health           {"status": "ok", "model", "queued", "busy"} (no key needed)
    GET  /v1/models        the store's checkpoints, the loaded one first
    POST /v1/completions   OpenAI's completions: model, prompt (a string or a list), suffix,
                           max_tokens, temperature, top_p, n, seed, stream, stream_options,
                           echo; dbert's own settings under "dbert": steps, top_k, sampler,
                           block_repeats, template, stream_steps, lowercase

The text of a choice is what the model wrote between prompt and suffix: the line
`dbert sample` would print for the template  prompt [MASK] x max_tokens suffix  (the same
SampleConfig, `generate()` and `DBert.decode`), less the decoded prompt in front and the
decoded suffix behind, so prompt + text + suffix reads as the whole sample. With echo, or
when the prompt holds [MASK] slots of its own (or a dbert.template is given), it is the
whole line. `max_tokens` is the exact length of the span in word pieces (dbert fills a span
of a known length); without it the span fills the checkpoint's training length.

With stream, the server sends OpenAI's text_completion chunks (server-sent events), one per
choice as its request finishes, then `data: [DONE]`. With dbert.stream_steps as well, a chunk
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
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import math
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from ..config import MAX_SEED, SAMPLERS, SampleConfig
from ..display import safe_text
from ..errors import DbertError
from ..sampling.blocks import is_story_model
from ..sampling.infill import has_range
from ..sampling.prompt import _MASK_RUN, expand_template, slots as _slots
from ..sampling.sample import default_length, resolve
from .serve_queue import Job, QueueFull, Scheduler, ShuttingDown

MASK = "[MASK]"
DBERT_FIELDS = ("steps", "top_k", "sampler", "block_repeats", "template", "stream_steps", "lowercase")
# SampleConfig's messages name CLI options; a request names JSON fields
_FIELD_OF_FLAG = {"--steps": "dbert.steps", "--top-k": "dbert.top_k", "--sampler": "dbert.sampler",
                  "--temperature": "temperature", "--top-p": "top_p", "--n": "n", "--seed": "seed",
                  "--length": "max_tokens"}


@dataclass
class Limits:
    """What one request may ask for; every field is a `dbert serve` flag."""

    max_n: int = 16              # choices per request (prompts x n)
    max_tokens: int = 256        # the span length max_tokens
    max_queue: int = 64          # jobs (prompts) waiting for the model; more: 429
    timeout: float = 120.0       # seconds per request, reading its body and queueing included; then 408/504
    max_body: int = 64 * 1024    # bytes of a request body; more: 413
    max_connections: int = 128   # connections with a request in progress; beyond, /health only (503)
    keep_alive: float = 5.0      # seconds a connection has to send a request's head, from its connect or
                                 # the end of its previous response, however it trickles; then closed


MAX_HEAD = 16 * 1024  # bytes of a request line and headers (h11's limit, set explicitly); more: 431
LOG_RATE = 5.0        # lines a second each server log (access, error) keeps on average ...
LOG_BURST = 100       # ... after a burst of this many; the lines dropped are counted instead
LOG_SUMMARY = 10.0    # seconds between two counts of dropped lines, at most one per log
LOG_VALUE = 120       # characters of one value a client chose (a path, a method) in a log line


class ApiError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 type_: str = "invalid_request_error", code: str | None = None, close: bool = False):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type_, code
        self.close = close  # the request's body was not read to its end: the connection is closed after

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers={"Connection": "close"} if self.close else None)


_STOPPED = {"timeout": (504, "timeout"), "shutdown": (503, "server_error"), "engine": (500, "server_error"),
            "cancelled": (499, "cancelled")}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# ---------------------------------------------------------------------------------- requests
@dataclass
class Prepared:
    """One prompt of a request, ready for the queue."""

    cfg: SampleConfig     # resolved; cfg.prompt is the template text, cfg.length its tokens
    head: int             # tokens of the prompt before the span
    tail: int             # tokens of the suffix after it
    whole: bool           # answer the whole line (echo, [MASK] slots of the caller's own, a template)


@dataclass
class Plan:
    prompts: list[Prepared]
    n: int
    stream: bool
    stream_steps: bool
    include_usage: bool
    cased: bool = True


def _type(name: str, value, kinds, what: str):
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):  # JSON true is no number
        raise ApiError(400, f"{name} must be {what} (got {json.dumps(value)[:60]})", param=name)
    return value


def _optional(body: dict, name: str, kinds, what: str, default=None):
    value = body.get(name)
    return default if value is None else _type(name, value, kinds, what)


def parse(body, db, model_name: str, limits: Limits, device: str = "auto", dtype: str = "auto") -> Plan:
    """A completions request body -> a Plan, or ApiError(400/404) naming the first bad field.
    Fields that OpenAI defines and dbert does not use (logprobs, stop, user, ...) are ignored."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != model_name:
        raise ApiError(404, f"the model {model!r} is not loaded here; this server serves {model_name!r}",
                       param="model", code="model_not_found")
    prompt = body.get("prompt", "")
    if prompt is None:
        prompt = ""
    if isinstance(prompt, str):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = prompt
    else:
        raise ApiError(400, "prompt must be a string or a non-empty list of strings (token ids are not accepted)",
                       param="prompt")
    suffix = _optional(body, "suffix", str, "a string", "")
    max_tokens = _optional(body, "max_tokens", int, "a whole number")
    if max_tokens is not None and not 1 <= max_tokens <= limits.max_tokens:
        raise ApiError(400, f"max_tokens must be in [1, {limits.max_tokens}] (got {max_tokens})", param="max_tokens")
    temperature = _optional(body, "temperature", (int, float), "a number", 1.0)
    top_p = _optional(body, "top_p", (int, float), "a number", 1.0)
    n = _optional(body, "n", int, "a whole number", 1)
    if n < 1:
        raise ApiError(400, f"n must be >= 1 (got {n})", param="n")
    if len(prompts) * n > limits.max_n:
        raise ApiError(400, f"this request asks for {len(prompts) * n} completions (prompts x n); "
                            f"the server allows {limits.max_n} (--max-n)", param="n")
    seed = _optional(body, "seed", int, "a whole number")
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise ApiError(400, f"seed must be in [0, {MAX_SEED}] (got {seed})", param="seed")
    stream = _optional(body, "stream", bool, "true or false", False)
    echo = _optional(body, "echo", bool, "true or false", False)
    options = _optional(body, "stream_options", dict, "an object", {})
    include_usage = _type("stream_options.include_usage", options.get("include_usage", False), bool, "true or false")
    extra = _optional(body, "dbert", dict, "an object", {})
    unknown = sorted(set(extra) - set(DBERT_FIELDS))
    if unknown:
        raise ApiError(400, f"unknown dbert field {unknown[0]!r}; known: {', '.join(DBERT_FIELDS)}", param="dbert")
    base = SampleConfig()
    steps = _optional(extra, "steps", int, "a whole number", base.steps)
    top_k = _optional(extra, "top_k", int, "a whole number", base.top_k)
    sampler = _optional(extra, "sampler", str, f"one of {', '.join(SAMPLERS)}")
    block_repeats = _optional(extra, "block_repeats", bool, "true or false", base.block_repeats)
    template = _optional(extra, "template", str, "a string")
    stream_steps = _optional(extra, "stream_steps", bool, "true or false", False)
    lowercase = _optional(extra, "lowercase", bool, "true or false", False)
    if stream_steps and not stream:
        raise ApiError(400, "dbert.stream_steps needs stream: true", param="dbert.stream_steps")
    if template is not None and (any(prompts) or suffix or len(prompts) > 1):
        raise ApiError(400, "dbert.template replaces prompt and suffix: leave those empty", param="dbert.template")

    if suffix and is_story_model(db):
        raise ApiError(400, "this checkpoint writes whole stories: it continues a prompt to the story's end and "
                            "takes no suffix", param="suffix")
    tok = db.tokenizer
    limit = db.model.max_length
    prompts = [_slots_of(p, "prompt", limit) for p in prompts]
    suffix = _slots_of(suffix, "suffix", limit)
    template = None if template is None else _slots_of(template, "dbert.template", limit)

    def tokens(text: str) -> list[int]:  # as sample.parse_prompt reads a template ([mask] in any case a slot)
        return tok.encode(_slots(tok, text), add_special_tokens=False) if text else []

    out = []
    for p in (prompts if template is None else [template]):
        head_ids, tail_ids = tokens(p), tokens(suffix)
        h, s = len(head_ids), len(tail_ids)
        if template is not None:  # as `dbert sample --prompt`: masks appended up to the length
            length = h + max_tokens if max_tokens is not None else max(default_length(db), h)
            text, h, s, whole = template, 0, 0, True
        else:
            span = max_tokens if max_tokens is not None else default_length(db) - h - s
            if span < 1:
                raise ApiError(400, f"the prompt and suffix take {h + s} of the {default_length(db)} tokens this "
                                    "checkpoint was trained on; give max_tokens", param="max_tokens")
            text = " ".join(t for t in (p, " ".join([MASK] * span), suffix) if t)
            length = len(tokens(text))
            whole = echo or tok.mask_token_id in head_ids or tok.mask_token_id in tail_ids
        if length > limit:
            raise ApiError(400, f"prompt + max_tokens + suffix is {length} tokens; this model takes at most {limit}",
                           param="max_tokens")
        cfg = SampleConfig(n=n, steps=steps, temperature=temperature, top_k=top_k, top_p=top_p, length=length,
                           sampler=sampler, seed=seed, device=device, prompt=text, block_repeats=block_repeats,
                           dtype=dtype)
        try:
            cfg = resolve(cfg, db)
        except DbertError as e:
            message = str(e)
            for flag, name in _FIELD_OF_FLAG.items():
                message = message.replace(flag + " ", name + " ")
            raise ApiError(400, message) from None
        out.append(Prepared(cfg, h, s, whole))
    return Plan(out, n, stream, stream_steps, include_usage, cased=not lowercase)


def _slots_of(text: str, name: str, limit: int) -> str:
    """A prompt, suffix or template with its [MASK*N] runs written out, as `dbert sample` reads
    them (sample.expand_template): N slots. A [MASK*A-B] span (infill of unknown length, which
    `dbert sample` ranks by the model's bound) is not served: a 400, as are more slots than the
    model has positions (counted before they are written out: [MASK*99999] costs nothing)."""
    if has_range(text):
        raise ApiError(400, f"{name}: a [MASK*A-B] span (infill of unknown length: `dbert sample --candidates`) "
                            "is not served here; write [MASK*N] for N slots, or give max_tokens", param=name)
    slots = sum(int(m.group(1)) for m in _MASK_RUN.finditer(text))
    if slots > limit:
        raise ApiError(400, f"{name} asks for {slots} [MASK] slots; this model takes at most {limit} tokens", param=name)
    return expand_template(text)


def completion_text(db, job: Job, full: str, row, prep: Prepared) -> str:
    """The span's text: the CLI's line `full` less the decoded prompt and suffix at its ends
    (prompt + text + suffix reads as the line); the span decoded alone when they do not match
    there (the detokeniser joined across a boundary)."""
    if prep.whole:
        return full
    L = len(row)
    head = job.line(db, row, 0, prep.head) if prep.head else ""
    tail = job.line(db, row, L - prep.tail) if prep.tail else ""
    end = len(full) - len(tail)
    if full.startswith(head) and end >= len(head) and full[end:].lower() == tail.lower():
        return full[len(head):end]
    return job.line(db, row, prep.head, L - prep.tail)


# ---------------------------------------------------------------------------------- the app
def create_app(db, model_name: str, *, api_key: str | None = None, limits: Limits | None = None,
               batching: bool = True, max_rows: int = 32, device: str = "auto", dtype: str = "auto",
               models: list[dict] | None = None, threads: int | None = None) -> Starlette:
    """The ASGI app serving the loaded checkpoint `db` as `model_name`. models: the /v1/models
    list (default: the store's checkpoints, read once now)."""
    limits = limits or Limits()
    scheduler = Scheduler(db, max_queue=limits.max_queue, batching=batching, max_rows=max_rows, threads=threads)
    model_list = models if models is not None else list_models(model_name)
    key = api_key.encode() if api_key else None

    def authorize(request: Request) -> None:
        if key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if not (scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key)):
            raise ApiError(401, "a valid API key is needed: send Authorization: Bearer KEY", code="invalid_api_key")

    async def health(request: Request):
        return JSONResponse({"status": "ok", "model": model_name, "queued": scheduler.queued, "busy": scheduler.busy})

    async def list_models_route(request: Request):
        authorize(request)
        return JSONResponse({"object": "list", "data": model_list})

    async def completions(request: Request):
        deadline = time.monotonic() + limits.timeout  # reading the body, queueing and sampling, all together
        authorize(request)
        data = _decode(await _read_body(request, limits.max_body, deadline, limits.timeout))
        plan = parse(data, db, model_name, limits, device=device, dtype=dtype)
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue = asyncio.Queue()
        jobs = [Job(p.cfg, notify=lambda ev, i=i: loop.call_soon_threadsafe(inbox.put_nowait, (i, ev)),
                    deadline=deadline, want_steps=plan.stream_steps, cased=plan.cased)
                for i, p in enumerate(plan.prompts)]
        try:
            scheduler.submit(jobs)
        except QueueFull as e:
            raise ApiError(429, str(e), type_="rate_limit_error", code="queue_full") from None
        except ShuttingDown as e:
            raise ApiError(503, str(e), type_="server_error") from None
        meta = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": model_name}
        if plan.stream:
            return StreamingResponse(_stream(db, plan, jobs, inbox, deadline, meta), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        watcher = asyncio.ensure_future(_disconnected(request))
        try:
            results = {}
            async for i, ev in _events(inbox, len(jobs), deadline, watcher):
                if ev[0] == "done":
                    results[i] = ev
            return JSONResponse(_response(db, plan, jobs, results, meta))
        finally:
            watcher.cancel()
            for job in jobs:
                job.cancel()  # a no-op for finished jobs; stops the others at their next step

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

    async def api_error(request: Request, exc: ApiError):
        return exc.response()

    async def http_error(request: Request, exc: HTTPException):
        return ApiError(exc.status_code, exc.detail or "error").response()

    app = Starlette(routes=[Route("/health", health), Route("/v1/models", list_models_route),
                            Route("/v1/completions", completions, methods=["POST"])],
                    exception_handlers={ApiError: api_error, HTTPException: http_error}, lifespan=lifespan,
                    middleware=[Middleware(_HeadCheck)])
    app.state.scheduler = scheduler
    app.state.begin_shutdown = begin_shutdown
    app.state.limits = limits
    return app


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


async def _read_body(request: Request, limit: int, deadline: float, timeout: float) -> bytes:
    """The body, read by the request's deadline (a half-sent body is a 408, not a held connection),
    at most `limit` bytes (413); a body that ends early (the client left) is a 400. Each of these
    closes the connection: what is left of the body is never read."""
    size = request.headers.get("content-length", "")
    if size.isdigit() and int(size) > limit:
        raise ApiError(413, f"the request body is over {limit} bytes (--max-body)", close=True)
    chunks, total = [], 0
    try:
        async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
            async for chunk in request.stream():
                total += len(chunk)
                if total > limit:
                    raise ApiError(413, f"the request body is over {limit} bytes (--max-body)", close=True)
                chunks.append(chunk)
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {timeout:g} s (--timeout)", type_="timeout",
                       close=True) from None
    except ClientDisconnect:
        raise ApiError(400, f"the request body ended early, after {total} bytes: the client closed the connection",
                       close=True) from None
    return b"".join(chunks)


def _decode(body: bytes):
    """The JSON of a request body, or a 400: not JSON, nested too deeply for the parser, or a
    string holding a lone surrogate (a \\ud800 escape without its pair: no Unicode text, so no
    tokenizer, log or client could take it)."""
    try:
        data = json.loads(body)
    except RecursionError:
        raise ApiError(400, "the request body is nested too deeply") from None
    except ValueError:
        raise ApiError(400, "the request body is not valid JSON") from None
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        where = None
        if isinstance(data, dict):
            where = next((k for k, v in data.items() if not _is_unicode(k) or not _is_unicode(v)), None)
            where = where if where is None or _is_unicode(where) else None
        raise ApiError(400, f"{where or 'the request body'} holds a lone surrogate (a \\ud800-\\udfff escape "
                            "without its pair): not Unicode text", param=where) from None
    except (RecursionError, ValueError):
        raise ApiError(400, "the request body is nested too deeply") from None
    return data


def _is_unicode(value) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


async def _disconnected(request: Request) -> None:
    """Returns when the client goes away (the body is read: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _events(inbox: asyncio.Queue, jobs: int, deadline: float, watcher: asyncio.Future | None = None):
    """The jobs' events until each is done; ApiError for a job's error or the time limit."""
    left = jobs
    while left:
        get = asyncio.ensure_future(inbox.get())
        waiting = {get} if watcher is None else {get, watcher}
        done, _ = await asyncio.wait(waiting, timeout=max(0.0, deadline - time.monotonic()),
                                     return_when=asyncio.FIRST_COMPLETED)
        if get not in done:
            get.cancel()
            if watcher is not None and watcher in done:
                raise ApiError(499, "the client went away", type_="cancelled")
            raise ApiError(504, "the request ran past the server's time limit (--timeout)", type_="timeout")
        i, ev = get.result()
        if ev[0] == "error":
            status, kind = _STOPPED.get(ev[1], (500, "server_error"))
            raise ApiError(status, ev[2], type_=kind)
        if ev[0] == "done":
            left -= 1
        yield i, ev


def _choices(db, plan: Plan, jobs: list[Job], i: int, ev: tuple) -> list[dict]:
    _, texts, rows, _ = ev
    prep = plan.prompts[i]
    return [{"index": i * plan.n + j, "text": completion_text(db, jobs[i], texts[j], rows[j], prep), "logprobs": None,
             "finish_reason": _finish(db, rows[j])} for j in range(len(texts))]


def _finish(db, row) -> str:
    """"stop" for a story that reached its end (a story model's [SEP]), else "length"."""
    return "stop" if is_story_model(db) and db.tokenizer.sep_token_id in row.tolist() else "length"


def _usage(plan: Plan) -> dict:
    prompt = sum(p.head + p.tail for p in plan.prompts)
    completion = sum((p.cfg.length - p.head - p.tail) * p.cfg.n for p in plan.prompts)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _response(db, plan: Plan, jobs: list[Job], results: dict, meta: dict) -> dict:
    choices = [c for i in sorted(results) for c in _choices(db, plan, jobs, i, results[i])]
    stats = [results[i][3] for i in sorted(results)]
    cfg = plan.prompts[0].cfg
    return {**meta, "choices": choices, "usage": _usage(plan),
            "dbert": {"steps": cfg.steps, "sampler": cfg.sampler, "length": [p.cfg.length for p in plan.prompts],
                      "nfe": sum(s["nfe"] for s in stats), "seconds": max(s["seconds"] for s in stats)}}


def _sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


async def _stream(db, plan: Plan, jobs: list[Job], inbox: asyncio.Queue, deadline: float, meta: dict):
    """Server-sent events: OpenAI's chunks; a disconnect cancels this generator, and so the jobs."""
    try:
        async for i, ev in _events(inbox, len(jobs), deadline):
            if ev[0] == "step":
                _, step, steps, texts = ev
                yield _sse({**meta, "choices": [{"index": i * plan.n + j, "text": "", "logprobs": None,
                                                 "finish_reason": None,
                                                 "dbert": {"step": step, "steps": steps, "text": t}}
                                                for j, t in enumerate(texts)]})
            elif ev[0] == "done":
                for choice in _choices(db, plan, jobs, i, ev):
                    yield _sse({**meta, "choices": [choice]})
        if plan.include_usage:
            yield _sse({**meta, "choices": [], "usage": _usage(plan)})
        yield _sse("[DONE]")
    except ApiError as e:
        yield _sse(e.body())
    finally:
        for job in jobs:
            job.cancel()


# ---------------------------------------------------------------------------------- running
def check_options(*, api_key: str | None, port: int, timeout: float, grace: float, **at_least_one: int) -> None:
    """The `dbert serve` options, checked before the model loads: one DbertError line naming the
    first bad one. An empty key (--api-key '' or DBERT_API_KEY=, which Click reads as no key at
    all) is refused: it would otherwise switch authentication off without a word."""
    if api_key is None and os.environ.get("DBERT_API_KEY") == "":
        raise DbertError("DBERT_API_KEY is set but empty: set it to a key, or unset it to serve without one")
    if api_key is not None:
        if not api_key.strip():
            raise DbertError("--api-key is empty: give a key, or leave the option out to serve without one")
        if api_key != api_key.strip() or not all(" " <= c <= "~" for c in api_key):
            raise DbertError("--api-key must be printable ASCII without spaces at its ends (it travels in an "
                             "HTTP header: Authorization: Bearer KEY)")
    for name, value in at_least_one.items():
        if value < 1:
            raise DbertError(f"--{name.replace('_', '-')} must be >= 1")
    if not 0 < port < 65536:
        raise DbertError(f"--port must be in [1, 65535], got {port}")
    if not (math.isfinite(timeout) and timeout > 0):
        raise DbertError(f"--timeout must be a number of seconds > 0, got {timeout}")
    if not (math.isfinite(grace) and grace >= 0):
        raise DbertError(f"--grace must be a number of seconds >= 0, got {grace}")


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


def _protocol(limits: Limits):
    """uvicorn's h11 protocol with the limits uvicorn has no setting for (docs/security.md, "The server"):

    - a request's head (line and headers) must arrive within limits.keep_alive seconds of the
      connect or of the previous response, however slowly it trickles: uvicorn's keep-alive timer
      starts only after a first response and restarts on every byte;
    - past limits.max_connections open connections, the oldest idle one (no request in progress)
      is closed to make room; when none is idle, the new connection may only ask /health (a 503
      for anything else): uvicorn's limit_concurrency would count idle connections too and answer
      /health with a 503 while they last;
    - a request h11 cannot parse gets its 4xx in the API's JSON error shape, not plain text."""
    import h11
    from uvicorn.protocols.http.h11_impl import STATUS_PHRASES, H11Protocol

    class Protocol(H11Protocol):
        def __init__(self, *args, **kwargs):
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
            if len(live) > limits.max_connections:
                idle = [c for c in live if c is not self and getattr(c, "idle", False)]
                if idle:
                    min(idle, key=lambda c: c._born).close()
                else:
                    self.app = _overflow(self.app, limits.max_connections)

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
            self._head_timer = self.loop.call_later(limits.keep_alive, self.close)

        def _stop_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def close(self) -> None:
            if not self.transport.is_closing():
                with contextlib.suppress(h11.LocalProtocolError):
                    self.conn.send(h11.ConnectionClosed())
                self.transport.close()

        def send_400_response(self, msg: str) -> None:
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

    return Protocol


def server(app: Starlette, host: str = "127.0.0.1", port: int = 8000, grace: float = 10.0, access_log: bool = True):
    """The uvicorn server of the app (its `run()` blocks; tests run it in a thread). On shutdown
    (SIGINT, SIGTERM, or SIGHUP: the terminal closed) the app itself cancels what runs past
    `grace` (each request then ends with a 503 or an error event) and a second later closes the
    connections still open (a body still arriving); a second SIGINT (Ctrl-C) does both at once.
    uvicorn's own cancelling of tasks, a few seconds later, is only a backstop.

    Client-facing limits come from the app's Limits: uvicorn's timeout_keep_alive and h11's head
    size (MAX_HEAD) as settings, the rest in _protocol. X-Forwarded-For is not read (no proxy
    is trusted): the access log names the peer of the socket."""
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
            self._loop.call_later(grace + 1.0, self._close_connections)
            await super().shutdown(sockets)

        def _close_connections(self) -> None:
            for connection in list(self.server_state.connections):
                connection.transport.close()

        def _stop_now(self) -> None:
            """The second Ctrl-C: cancel every request now, close what is left a second later."""
            app.state.scheduler.stop_all("the server was stopped (a second Ctrl-C); the request was cancelled")
            self._loop.call_later(1.0, self._close_connections)
            self._loop.call_later(3.0, setattr, self, "force_exit", True)

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
            """uvicorn's SIGINT and SIGTERM, and SIGHUP too (unless ignored, as under nohup): it
            drains like SIGTERM, then ends the process by the signal as the others do."""
            hup = getattr(signal, "SIGHUP", None)
            if hup is None or threading.current_thread() is not threading.main_thread() \
                    or signal.getsignal(hup) == signal.SIG_IGN:
                with super().capture_signals():
                    yield
                return
            old = signal.signal(hup, self.handle_exit)
            hung_up = False
            try:
                with super().capture_signals():
                    try:
                        yield
                    finally:
                        hung_up = hup in self._captured_signals
                        self._captured_signals[:] = [s for s in self._captured_signals if s != hup]
            finally:
                signal.signal(hup, old)
            if hung_up:
                signal.raise_signal(hup)

    return Server(uvicorn.Config(app, host=host, port=port, log_config=log_config(), access_log=access_log,
                                 timeout_graceful_shutdown=grace + 5, lifespan="on", http=_protocol(limits),
                                 timeout_keep_alive=limits.keep_alive, h11_max_incomplete_event_size=MAX_HEAD,
                                 proxy_headers=False))


def run(app: Starlette, host: str, port: int, grace: float = 10.0) -> None:
    """Serve until SIGINT/SIGTERM/SIGHUP: then take no new connections, let running requests finish
    for `grace` seconds, cancel what is left (the sampler stops at its next step), stop the worker.
    A second SIGINT cancels at once."""
    server(app, host, port, grace).run()
