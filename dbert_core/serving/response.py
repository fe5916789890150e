"""The answer to a completions request, from its jobs' events (events: until each job is done;
an ApiError when one fails, the time runs out or the client leaves): a choice's text
(completion_text: the span the model wrote, or the whole line), then either the JSON object of
the finished request (completion_body) or OpenAI's server-sent events, a chunk a finished
choice and, with dbert.stream_steps, one a reverse step (event_stream)."""

from __future__ import annotations

import asyncio
import json
import time

from starlette.requests import Request

from ..sampling.blocks import is_story_model
from .api_error import ApiError
from .request import Plan, Prepared
from .serve_queue import Job

_STOPPED = {"timeout": (504, "timeout"), "shutdown": (503, "server_error"), "engine": (500, "server_error"),
            "cancelled": (499, "cancelled")}


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


async def disconnected(request: Request) -> None:
    """Returns when the client goes away (the body is read: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def events(inbox: asyncio.Queue, jobs: int, deadline: float, watcher: asyncio.Future | None = None):
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
             "finish_reason": _finish(db, rows[j], prep)} for j in range(len(texts))]


def _finish(db, row, prep: Prepared) -> str:
    """"stop" for a story that reached its end (a story model's [SEP], or the suffix it ends
    with), else "length"."""
    ended = prep.tail > 0 or db.tokenizer.sep_token_id in row.tolist()
    return "stop" if is_story_model(db) and ended else "length"


def _usage(plan: Plan) -> dict:
    prompt = sum(p.head + p.tail for p in plan.prompts)
    completion = sum((p.cfg.length - p.head - p.tail) * p.cfg.n for p in plan.prompts)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion_body(db, plan: Plan, jobs: list[Job], results: dict, meta: dict) -> dict:
    choices = [c for i in sorted(results) for c in _choices(db, plan, jobs, i, results[i])]
    stats = [results[i][3] for i in sorted(results)]
    cfg = plan.prompts[0].cfg
    return {**meta, "choices": choices, "usage": _usage(plan),
            "dbert": {"steps": cfg.steps, "sampler": cfg.sampler, "length": [p.cfg.length for p in plan.prompts],
                      "nfe": sum(s["nfe"] for s in stats), "seconds": max(s["seconds"] for s in stats)}}


def _sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


async def event_stream(db, plan: Plan, jobs: list[Job], inbox: asyncio.Queue, deadline: float, meta: dict):
    """Server-sent events: OpenAI's chunks; a disconnect cancels this generator, and so the jobs."""
    try:
        async for i, ev in events(inbox, len(jobs), deadline):
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
