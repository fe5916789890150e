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
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import time
import uuid
from dataclasses import dataclass
from datetime import datetime

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from ..config import MAX_SEED, SAMPLERS, SampleConfig
from ..errors import DbertError
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
    timeout: float = 120.0       # seconds per request, its time in the queue included; then 504
    max_body: int = 64 * 1024    # bytes of a request body; more: 413


class ApiError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 type_: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type_, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


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

    tok = db.tokenizer
    limit = db.model.max_length

    def tokens(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False) if text else []

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
        authorize(request)
        body = await _read_body(request, limits.max_body)
        try:
            data = json.loads(body)
        except ValueError:
            raise ApiError(400, "the request body is not valid JSON") from None
        plan = parse(data, db, model_name, limits, device=device, dtype=dtype)
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue = asyncio.Queue()
        deadline = time.monotonic() + limits.timeout
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
                    exception_handlers={ApiError: api_error, HTTPException: http_error}, lifespan=lifespan)
    app.state.scheduler = scheduler
    app.state.begin_shutdown = begin_shutdown
    return app


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


async def _read_body(request: Request, limit: int) -> bytes:
    size = request.headers.get("content-length", "")
    if size.isdigit() and int(size) > limit:
        raise ApiError(413, f"the request body is over {limit} bytes (--max-body)")
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise ApiError(413, f"the request body is over {limit} bytes (--max-body)")
        chunks.append(chunk)
    return b"".join(chunks)


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
             "finish_reason": "length"} for j in range(len(texts))]


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
def log_config() -> dict:
    """uvicorn's logging with every line on stderr (its access log goes to stdout by default)."""
    import copy

    from uvicorn.config import LOGGING_CONFIG

    cfg = copy.deepcopy(LOGGING_CONFIG)
    for handler in cfg["handlers"].values():
        handler["stream"] = "ext://sys.stderr"
    return cfg


def server(app: Starlette, host: str = "127.0.0.1", port: int = 8000, grace: float = 10.0, access_log: bool = True):
    """The uvicorn server of the app (its `run()` blocks; tests run it in a thread). On shutdown
    the app itself cancels what runs past `grace` (each request then ends with a 503 or an error
    event); uvicorn's own cancelling of tasks, a few seconds later, is only a backstop."""
    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None):
            app.state.begin_shutdown(grace)
            await super().shutdown(sockets)

    return Server(uvicorn.Config(app, host=host, port=port, log_config=log_config(), access_log=access_log,
                                 timeout_graceful_shutdown=grace + 5, lifespan="on"))


def run(app: Starlette, host: str, port: int, grace: float = 10.0) -> None:
    """Serve until SIGINT/SIGTERM: then take no new connections, let running requests finish for
    `grace` seconds, cancel what is left (the sampler stops at its next step), stop the worker."""
    server(app, host, port, grace).run()
