"""A completions request, read and checked before anything is queued: its body read by the
request's deadline and at most --max-body bytes (read_body), decoded as JSON (decode_body), then
checked field by field into a Plan (parse) of one Prepared a prompt: a SampleConfig resolved for
the checkpoint, the prompt's and the suffix's lengths in tokens, and whether the whole line is
answered. Every refusal is an ApiError (400, 404, 408, 413) naming the first bad field; fields
OpenAI defines and dbert does not use are ignored."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from starlette.requests import ClientDisconnect, Request

from .. import settings, strategies
from ..config import SampleConfig
from ..errors import DbertError
from ..settings import Setting, field
from ..sampling.blocks import is_story_model, window
from ..sampling.infill import has_range
from ..sampling.prompt import _MASK_RUN, expand_template, slots as _slots
from ..sampling.sample import default_length, resolve
from .api_error import ApiError
from .options import Limits

MASK = "[MASK]"
OWN_FIELDS = ("template", "stream_steps", "lowercase")  # the dbert object's fields that are the server's, no setting's
BY_STRATEGY = ("sampler", "params")  # dbert.* settings read together by _strategy: parameters belong to their sampler
_JSON = {int: (int, "a whole number"), float: ((int, float), "a number"), bool: (bool, "true or false"),
         str: (str, "a string")}  # a setting's kind: the JSON values it takes, in words


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


def max_span(db) -> int:
    """max_tokens at most unless --max-tokens says: a story model's story length (`dbert sample`'s
    default length: 383 tokens for the shipped model, a window and a continuation window), at
    least 256 (the span of a model trained on shorter lines)."""
    return max(256, default_length(db))


def parse(body, db, model_name: str, limits: Limits, device: str = "auto", dtype: str = "auto") -> Plan:
    """A completions request body -> a Plan, or ApiError(400/404) naming the first bad field.
    Fields that OpenAI defines and dbert does not use (logprobs, stop, user, ...) are ignored."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != model_name:
        raise ApiError(404, f"the model {model!r} is not loaded here; this server serves {model_name!r}",
                       param="model", code="model_not_found")
    prompts = _prompt_list(body)
    suffix = _optional(body, "suffix", str, "a string", "")
    asked = _openai_fields(body, db, limits, len(prompts))
    extra = _dbert_fields(body, asked["stream"])
    template = extra.pop("template")
    if template is not None and (any(prompts) or suffix or len(prompts) > 1):
        raise ApiError(400, "dbert.template replaces prompt and suffix: leave those empty", param="dbert.template")
    limit = db.model.max_length
    prompts = [_slots_of(p, "prompt", limit) for p in prompts]
    suffix = _slots_of(suffix, "suffix", limit)
    template = None if template is None else _slots_of(template, "dbert.template", limit)
    out = [_prepared(db, p, suffix, template is not None, asked, extra, device, dtype)
           for p in (prompts if template is None else [template])]
    return Plan(out, asked["n"], asked["stream"], extra["stream_steps"], asked["include_usage"],
                cased=not extra["lowercase"])


def _prompt_list(body: dict) -> list[str]:
    """prompt: a string (missing or null: "") or a non-empty list of strings, as a list."""
    prompt = body.get("prompt", "")
    if prompt is None:
        prompt = ""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return prompt
    raise ApiError(400, "prompt must be a string or a non-empty list of strings (token ids are not accepted)",
                   param="prompt")


def _openai_fields(body: dict, db, limits: Limits, prompts: int) -> dict:
    """The OpenAI fields dbert reads: each one a setting declares (settings.openai_settings: max_tokens
    is length, min_tokens min_length, ...) of that setting's type and range (_setting), then the
    server's own bounds, checked in order: --max-tokens (or the model's story length) and --max-n."""
    declared = settings.openai_settings()

    def given(name: str):
        value = body.get(name)
        return None if value is None else _setting(name, declared[name], value)

    most = limits.max_tokens if limits.max_tokens is not None else max_span(db)
    max_tokens = given("max_tokens")
    if max_tokens is not None and max_tokens > most:
        raise ApiError(400, f"max_tokens must be in [1, {most}] (got {max_tokens})", param="max_tokens")
    min_tokens = given("min_tokens")  # vLLM's name: no end before this many
    if min_tokens is not None and min_tokens > most:
        raise ApiError(400, f"min_tokens must be in [0, {most}] (got {min_tokens})", param="min_tokens")
    temperature, top_p = given("temperature"), given("top_p")  # None: the checkpoint's recommendation
    n = 1 if body.get("n") is None else given("n")
    if prompts * n > limits.max_n:
        raise ApiError(400, f"this request asks for {prompts * n} completions (prompts x n); "
                            f"the server allows {limits.max_n} (--max-n)", param="n")
    seed = given("seed")
    stream = _optional(body, "stream", bool, "true or false", False)
    echo = _optional(body, "echo", bool, "true or false", False)
    options = _optional(body, "stream_options", dict, "an object", {})
    include_usage = _type("stream_options.include_usage", options.get("include_usage", False), bool, "true or false")
    return {"max_tokens": max_tokens, "min_tokens": min_tokens, "temperature": temperature, "top_p": top_p, "n": n,
            "seed": seed, "stream": stream, "echo": echo, "include_usage": include_usage}


def dbert_fields() -> tuple[str, ...]:
    """The fields a request's dbert object may hold: every dbert.* setting (settings.dbert_settings),
    then the server's own."""
    return (*settings.dbert_settings(), *OWN_FIELDS)


def _dbert_fields(body: dict, stream: bool) -> dict:
    """The request's dbert object, each field checked: "settings", the SampleConfig fields it gives
    (each dbert.* setting of settings.SAMPLE, of its type and range; sampler and params as _strategy
    reads them; one left out: SampleConfig's default), and the server's own fields (OWN_FIELDS)."""
    extra = _optional(body, "dbert", dict, "an object", {})
    served, known = settings.dbert_settings(), dbert_fields()
    unknown = sorted(set(extra) - set(known))
    if unknown:
        raise ApiError(400, f"unknown dbert field {unknown[0]!r}; known: {', '.join(known)}", param="dbert")
    sampler, params = _strategy(extra)
    given = {"sampler": sampler, "params": params}
    given.update({s.name: _setting(f"dbert.{name}", s, extra[name]) for name, s in served.items()
                  if name not in BY_STRATEGY and extra.get(name) is not None})
    got = {"settings": given, "template": _optional(extra, "template", str, "a string"),
           "stream_steps": _optional(extra, "stream_steps", bool, "true or false", False),
           "lowercase": _optional(extra, "lowercase", bool, "true or false", False)}
    if got["stream_steps"] and not stream:
        raise ApiError(400, "dbert.stream_steps needs stream: true", param="dbert.stream_steps")
    return got


def _setting(name: str, s: Setting, value):
    """The value of setting `s` that the request's field `name` gives: of the setting's kind (a
    number's range in words) and in its range (Setting.check), or a 400 naming the field. A
    repeatable setting (params) is read by hand."""
    kinds, what = _JSON[s.kind]
    _type(name, value, kinds, s.what() if s.kind in (int, float) else what)
    try:
        s.check(value)
    except DbertError as e:
        raise ApiError(400, e.said(lambda _: name), param=name) from None
    return value


def _tokens(tok, text: str) -> list[int]:
    """A text's ids as sample.parse_prompt reads a template ([mask] in any case a slot)."""
    return tok.encode(_slots(tok, text), add_special_tokens=False) if text else []


def _prepared(db, p: str, suffix: str, templated: bool, asked: dict, extra: dict, device: str, dtype: str) -> Prepared:
    """One prompt's run: its masked span between prompt and suffix (or a dbert.template, masks
    appended up to the length as `dbert sample --prompt`), its story rules, resolved for db."""
    tok, limit = db.tokenizer, db.model.max_length
    max_tokens, min_tokens = asked["max_tokens"], asked["min_tokens"]
    head_ids, tail_ids = _tokens(tok, p), _tokens(tok, suffix)
    h, s = len(head_ids), len(tail_ids)
    if templated:  # as `dbert sample --prompt`: masks appended up to the length
        length = h + max_tokens if max_tokens is not None else max(default_length(db), h)
        text, h, s, whole = p, 0, 0, True
    else:
        span = max_tokens if max_tokens is not None else default_length(db) - h - s
        if span < 1:
            raise ApiError(400, f"the prompt and suffix take {h + s} of the {default_length(db)} tokens this "
                                "checkpoint was trained on; give max_tokens", param="max_tokens")
        text = " ".join(t for t in (p, " ".join([MASK] * span), suffix) if t)
        length = len(_tokens(tok, text))
        whole = asked["echo"] or tok.mask_token_id in head_ids or tok.mask_token_id in tail_ids
    if length > limit:
        raise ApiError(400, f"prompt + max_tokens + suffix is {length} tokens; this model takes at most {limit}",
                       param="max_tokens")
    least = None if min_tokens is None else h + min_tokens  # a story's tokens: the prompt's count too
    if least is not None and is_story_model(db) and least > length - s:  # the client's numbers, not the story's
        room = f"max_tokens ({max_tokens})" if max_tokens is not None else \
            f"the {length - s - h} tokens the span has (max_tokens left out)"
        raise ApiError(400, f"min_tokens ({min_tokens}) is more than {room}: no story could end",
                       param="min_tokens")
    if s and is_story_model(db):  # the suffix is the story's last words: it ends there, not before
        if length > window(db) - 1:
            raise ApiError(400, f"prompt + max_tokens + suffix is {length} tokens; a story with a suffix fits in "
                                f"one window of this model ({window(db) - 1} tokens)", param="max_tokens")
        least = max(least or 0, length - s)
    own = dict(n=asked["n"], temperature=asked["temperature"], top_p=asked["top_p"], seed=asked["seed"],
               length=length, min_length=least, device=device, prompt=text, dtype=dtype)
    cfg = SampleConfig(**{**extra["settings"], **own})  # the dbert.* settings given, then the server's own
    try:
        cfg = resolve(cfg, db)
    except DbertError as e:  # its setting named as the request names it (settings.py: length is max_tokens)
        raise ApiError(400, e.said(field), param=field(e.setting) if e.setting else None) from None
    return Prepared(cfg, h, s, whole)


def _strategy(extra: dict) -> tuple[str | None, dict | None]:
    """dbert.sampler (a registered strategy's name) and dbert.params (that strategy's own parameters,
    checked against their declared types and ranges), or a 400 naming the field."""
    every = ", ".join(strategies.names())
    sampler = _optional(extra, "sampler", str, f"one of {every}")
    if sampler is not None and sampler not in strategies.names():
        raise ApiError(400, f"dbert.sampler must be one of: {every} (got {sampler!r})", param="dbert.sampler")
    params = extra.get("params")
    if params is None:
        return sampler, None
    if sampler is None:
        raise ApiError(400, "dbert.params needs dbert.sampler (parameters belong to the sampler they are named with)",
                       param="dbert.params")
    _type("dbert.params", params, dict, "an object")
    strategy = strategies.get(sampler)
    try:
        strategy.check(strategy.resolve(params, prefix="dbert.params"))
    except strategies.ParamError as e:
        raise ApiError(400, str(e), param=f"dbert.params.{e.param}") from None
    except DbertError as e:  # a check between parameters (remdm's t_off < t_on)
        raise ApiError(400, f"dbert.params: {e}", param="dbert.params") from None
    return sampler, params


CHAT_FIELDS = ("model", "max_tokens", "max_completion_tokens", "min_tokens", "temperature", "top_p", "n", "seed",
               "stream", "stream_options", "dbert")


def chat_body(body) -> dict:
    """A chat completions body as the completions body it asks for: the last user message's text
    is the story's opening (the prompt); system, developer and assistant messages are not read (a
    story model has no instructions to follow, no turns to take). max_completion_tokens is
    max_tokens' newer name. A 400 names the first bad field."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise ApiError(400, "messages must be a non-empty list of message objects", param="messages")
    users = [m for m in messages if m.get("role") == "user"]
    if not users:
        raise ApiError(400, "messages holds no user message: its text is the story's opening", param="messages")
    content = users[-1].get("content")
    if isinstance(content, list):  # content parts: the text ones, in order
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise ApiError(400, "a user message's content parts must all be text parts", param="messages")
        content = " ".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise ApiError(400, "a user message's content must be a string or a list of text parts", param="messages")
    out = {k: body[k] for k in CHAT_FIELDS if k in body}
    if "max_completion_tokens" in out:
        given = out.pop("max_completion_tokens")
        out.setdefault("max_tokens", given)
    out["prompt"] = content.strip()
    return out


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


async def read_body(request: Request, limit: int, deadline: float, timeout: float) -> bytes:
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


def decode_body(body: bytes):
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
