"""The answer to a completions or chat request, from its jobs' events (events: until each job is
done; an ApiError when one fails, the time runs out or the client leaves): a choice's text
(completion_text: the span the model wrote, or the whole line), then either the JSON object of
the finished request (completion_body) or OpenAI's server-sent events (event_stream, Chunks):
each choice's text as a long story's windows settle, its rest when it is done and, with
dbert.stream_steps, a chunk a reverse step."""

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
    """"stop" for a story that ended before max_tokens (a story model's [SEP]), else "length":
    the span holds max_tokens tokens. An infill's span (a suffix after it) is always filled to
    max_tokens, the story ending with the suffix: "length", as OpenAI says of a reply cut there."""
    ended = not prep.tail and db.tokenizer.sep_token_id in row.tolist()
    return "stop" if is_story_model(db) and ended else "length"


def _usage(plan: Plan) -> dict:
    prompt = sum(p.head + p.tail for p in plan.prompts)
    completion = 0
    for p in plan.prompts:
        assert p.cfg.length is not None  # a prepared prompt's cfg is resolved
        completion += (p.cfg.length - p.head - p.tail) * p.cfg.n
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion_body(db, plan: Plan, jobs: list[Job], results: dict, meta: dict, chat: bool = False) -> dict:
    """The finished request: OpenAI's text_completion, or with chat its chat.completion (each
    choice's text as the assistant's message, without the story's leading space)."""
    choices = [c for i in sorted(results) for c in _choices(db, plan, jobs, i, results[i])]
    if chat:
        choices = [{"index": c["index"], "message": {"role": "assistant", "content": c["text"].lstrip()},
                    "logprobs": None, "finish_reason": c["finish_reason"]} for c in choices]
    stats = [results[i][3] for i in sorted(results)]
    cfg = plan.prompts[0].cfg
    return {**meta, "choices": choices, "usage": _usage(plan),
            "dbert": {"steps": cfg.steps, "sampler": cfg.sampler, "params": cfg.params, "length": [p.cfg.length for p in plan.prompts],
                      "nfe": sum(s["nfe"] for s in stats), "seconds": max(s["seconds"] for s in stats)}}


def _sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


def settled_text(db, job: Job, ids: list[int], prep: Prepared) -> str:
    """The part of a choice's text that a story's finished windows fix (ids: its tokens so far, no
    later step changes them), less its last word, which the next window's first pieces may still
    join ("play" + "##ed"): a prefix of the choice's final text."""
    import torch

    row = torch.tensor(ids, dtype=torch.long)
    if len(row) <= prep.head:
        return ""
    line = job.line(db, row)
    if not prep.whole:
        head = job.line(db, row, 0, prep.head) if prep.head else ""
        if not line.startswith(head):
            return ""
        line = line[len(head):]
    cut = line.rstrip().rfind(" ")
    return line[:cut] if cut > 0 else ""


class Chunks:
    """OpenAI's stream chunks for one request, text or chat: each choice's text sent as it settles,
    only ever growing (a piece is sent only when what was sent is a prefix of it; the last piece
    is the rest of the final text)."""

    def __init__(self, meta: dict, chat: bool):
        self.meta, self.chat = meta, chat
        self.sent: dict[int, str] = {}  # each choice's text sent so far
        self.opened: set[int] = set()   # the chat choices whose first delta (with the role) is sent

    def _text(self, text: str) -> str:
        return text.lstrip() if self.chat else text  # a chat message does not open with the story's space

    def piece(self, index: int, text: str, finish: str | None = None, extra: dict | None = None) -> dict | None:
        """The chunk that grows choice `index` to `text` (its whole text so far), None when it adds
        nothing; finish: its finish_reason (the last chunk of the choice)."""
        text, before = self._text(text), self.sent.get(index, "")
        if not text.startswith(before) or (len(text) == len(before) and finish is None and extra is None):
            if finish is None and extra is None:
                return None
            text = before  # never taken back: the final text's end is sent as it is
        self.sent[index] = text
        new = text[len(before):]
        if self.chat:
            delta = {"content": new} if index in self.opened else {"role": "assistant", "content": new}
            self.opened.add(index)
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": index, "text": new, "logprobs": None, "finish_reason": finish}
        if extra is not None:
            choice["dbert"] = extra
        return {**self.meta, "choices": [choice]}


async def event_stream(db, plan: Plan, jobs: list[Job], inbox: asyncio.Queue, deadline: float, meta: dict,
                       chat: bool = False):
    """Server-sent events: OpenAI's chunks (text_completion, or chat.completion.chunk with chat), each
    choice's text as a long story's windows finish and its rest when it is done; a disconnect
    cancels this generator, and so the jobs."""
    chunks = Chunks(meta, chat)
    try:
        async for i, ev in events(inbox, len(jobs), deadline):
            if ev[0] == "step":
                _, step, steps, texts = ev
                for j, t in enumerate(texts):
                    index = i * plan.n + j
                    chunk = chunks.piece(index, chunks.sent.get(index, ""), extra={"step": step, "steps": steps, "text": t})
                    if chunk is not None:
                        yield _sse(chunk)
            elif ev[0] == "settled":
                for j, ids in enumerate(ev[1]):
                    if ids is not None:
                        chunk = chunks.piece(i * plan.n + j, settled_text(db, jobs[i], ids, plan.prompts[i]))
                        if chunk is not None:
                            yield _sse(chunk)
            elif ev[0] == "done":
                for choice in _choices(db, plan, jobs, i, ev):
                    chunk = chunks.piece(choice["index"], choice["text"], finish=choice["finish_reason"])
                    if chunk is not None:
                        yield _sse(chunk)
        if plan.include_usage:
            yield _sse({**meta, "choices": [], "usage": _usage(plan)})
        yield _sse("[DONE]")
    except ApiError as e:
        yield _sse(e.body())
    finally:
        for job in jobs:
            job.cancel()
