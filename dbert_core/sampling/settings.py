"""A SampleConfig made concrete for one checkpoint, once per run, and handed down.

resolve(cfg, db) checks what SampleConfig.validate checks, fills in the length, sampler (the
checkpoint's recommendation, else the fastest exact one), precision and the strategy's parameters, then makes the checks that need the checkpoint (validate). frames()
and generate() take a config resolve made as it is (they ask is_resolved), and resolve any other.
"""

from __future__ import annotations

import weakref
from dataclasses import fields, replace

from .. import strategies
from ..config import DECODING, MAX_NGRAM, SampleConfig
from ..errors import DbertError
from ..hardware import compute_dtype
from .blocks import context, is_story_model, window
from .parallel import auto_workers

MAX_STORY = 8192  # tokens a story model may be asked for (SampleConfig.length), in windows one after another


def validate(db, steps: int, length: int, sampler: str, params: dict | None = None, min_length: int = 0) -> None:
    """The checks that need the checkpoint (SampleConfig.validate makes the others)."""
    T = db.schedule.T
    if not 1 <= steps <= T:
        raise DbertError(f"must be between 1 and T={T}, got {steps}", "steps", steps)
    longest = MAX_STORY if is_story_model(db) else db.model.max_length  # a story continues block by block
    if not 1 <= length <= longest:
        raise DbertError(f"must be between 1 and {longest} for this model, got {length}", "length", length)
    if min_length and not is_story_model(db):
        raise DbertError("needs a story checkpoint (one trained on whole stories); this one has no story end",
                         "min_length", min_length)
    if min_length > length:
        raise DbertError(f"({min_length}) is more than $length ({length}): no story could end", "min_length",
                         min_length, ("length",))
    strategy = strategies.get(sampler)
    reason = strategy.supports(db)
    if reason is not None:
        raise DbertError(reason)
    strategy.check(strategy.resolve(params), steps)


def recommended_sampler(db) -> tuple[str, dict] | None:
    """(name, parameters) of the sampler the checkpoint's dbert.json recommends (`sampling.decoding`'s
    `sampler` and `params`, read blind for it: docs/stories.md), or None when it names none, or one
    that is not registered, cannot run on it, or whose parameters do not resolve."""
    given = (db.meta.get("sampling") or {}).get("decoding") or {}
    name = given.get("sampler") if isinstance(given, dict) else None
    params = given.get("params") or {} if isinstance(given, dict) else {}
    if not isinstance(name, str) or name not in strategies.names() or not isinstance(params, dict):
        return None
    strategy = strategies.get(name)
    try:
        resolved = strategy.resolve(params)
    except DbertError:
        return None
    return (name, resolved) if strategy.supports(db) is None else None


def default_sampler(db) -> str:
    """What `dbert sample` uses unless told: the sampler the checkpoint recommends (recommended_sampler),
    else the fastest exact sampler this model allows."""
    recommended = recommended_sampler(db)
    return recommended[0] if recommended else strategies.default_for(db).name


def default_params(db, sampler: str) -> dict | None:
    """The parameters `sampler` runs with unless told: the checkpoint's when it recommends this sampler,
    else None (the strategy's own defaults)."""
    recommended = recommended_sampler(db)
    return dict(recommended[1]) if recommended and recommended[0] == sampler else None


def window_length(db) -> int:
    """Tokens of text one window holds: the length the checkpoint was trained on (a story model:
    after the [SEP] that opens the story)."""
    return window(db) - 1 if is_story_model(db) else window(db)


def default_length(db) -> int:
    """Tokens per sample unless told: the checkpoint's window (window_length); a story model's
    canvas is one window and one continuation window more (383 tokens for 256-token windows, more
    than 99% of the stories it was trained on), so a story the first window cannot hold goes on
    to its end instead of stopping mid-sentence, and rows that ended cost nothing more."""
    if not is_story_model(db):
        return window_length(db)
    return window_length(db) + window(db) - context(db)


def default_min_length(db) -> int:
    """The shortest story a story model writes unless told (tokens): the `sampling.min_length` its
    dbert.json recommends (the export measured it), else 0 (the model alone decides where it ends)."""
    if not is_story_model(db):
        return 0
    value = (db.meta.get("sampling") or {}).get("min_length", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


# the decoding of a checkpoint that recommends none: 96 reverse steps (read as 128 do, docs/decoding.md),
# the paper's top-k 30, no nucleus, the exact forward (no decided-position cache, so no [MASK] states kept)
STEPS, TEMPERATURE, TOP_K, TOP_P = 96, 1.0, 30, 1.0
GENERAL_DECODING = {"steps": STEPS, "temperature": TEMPERATURE, "top_k": TOP_K, "top_p": TOP_P,
                    "cache_refresh": 0, "cache_masked": False, "no_repeat_ngram": 0}


def recommended_decoding(db) -> dict:
    """The DECODING values the checkpoint's dbert.json recommends (`sampling.decoding`, measured for
    it: the shipped story model's, 32 steps at top-k 30, in docs/stories.md), only those it gives and
    gives well (a malformed value in a meta not loaded from disk is left out: load refuses it, schema.py)."""
    given = (db.meta.get("sampling") or {}).get("decoding") or {}
    given = given if isinstance(given, dict) else {}
    T, whole, real = db.schedule.T, (int,), (int, float)
    ok = {"steps": (whole, lambda v: 1 <= v <= T), "temperature": (real, lambda v: 0.0 <= v <= 1e6),
          "top_k": (whole, lambda v: v >= 0), "top_p": (real, lambda v: 0.0 < v <= 1.0),
          "cache_refresh": (whole, lambda v: 0 <= v <= T), "no_repeat_ngram": (whole, lambda v: 0 <= v <= MAX_NGRAM)}
    found = {name: given[name] for name, (kinds, within) in ok.items()
             if isinstance(given.get(name), kinds) and not isinstance(given[name], bool) and within(given[name])}
    for name in ("temperature", "top_p"):
        if name in found:
            found[name] = float(found[name])
    if "cache_refresh" in found and isinstance(given.get("cache_masked"), bool):
        found["cache_masked"] = given["cache_masked"]  # kept [MASK] states only with a cache it recommends
    return found


def default_decoding(db) -> dict:
    """{steps, temperature, top_k, top_p, cache_refresh, cache_masked, no_repeat_ngram} a sample uses unless
    told: what the checkpoint recommends (recommended_decoding), each value it does not replaced by the general
    default (GENERAL_DECODING: 96 steps, temperature 1, top-k 30, top-p off, no decided-position cache, no
    n-gram block)."""
    return {**GENERAL_DECODING, **recommended_decoding(db)}


def decoding_origins(cfg: SampleConfig, db) -> dict[str, str]:
    """Where each DECODING value of resolve(cfg, db) comes from: "set" (cfg gives it), "checkpoint"
    (dbert.json recommends it) or "default" (GENERAL_DECODING). The TUI's control bar says so."""
    recommended = recommended_decoding(db)
    return {f: "set" if getattr(cfg, f) is not None else "checkpoint" if f in recommended else "default"
            for f in DECODING}


def resolve(cfg: SampleConfig, db) -> SampleConfig:
    """cfg made concrete for this checkpoint, once per run and handed down: SampleConfig.validate's
    checks, then length, shortest story, steps, top-k and top-p (default_decoding), sampler, precision ("auto": hardware.compute_dtype),
    batches side by side (parallel.auto_workers) and the strategy's parameters filled in, then the checks that need the checkpoint (validate). The copy keeps
    cfg's class (the TUI's Settings stay Settings); frames and generate take it as it is."""
    cfg.validate()
    sampler = cfg.sampler if cfg.sampler is not None else default_sampler(db)
    length = cfg.length if cfg.length is not None else default_length(db)
    least = cfg.min_length if cfg.min_length is not None else min(default_min_length(db), length)
    recommended = default_decoding(db)
    decoding = {f: recommended[f] if getattr(cfg, f) is None else getattr(cfg, f) for f in DECODING}
    workers = cfg.workers if cfg.workers is not None else auto_workers(db.device)
    params = strategies.get(sampler).resolve(cfg.params if cfg.params is not None else default_params(db, sampler))
    out = replace(cfg, length=length, min_length=least, sampler=sampler, **decoding, workers=workers,
                  dtype=compute_dtype(cfg.dtype, db.device), params=params)
    validate(db, decoding["steps"], length, sampler, params, least)
    return mark(out, db)


_RESOLVED: dict[int, tuple] = {}  # id(cfg) -> (checkpoint, field values) of the configs resolve made


def _values(cfg: SampleConfig) -> list:
    return [getattr(cfg, f.name) for f in fields(cfg)]


def mark(cfg: SampleConfig, db) -> SampleConfig:
    """Remember that cfg, as it is now, was resolved for db (the entry goes with cfg)."""
    _RESOLVED[id(cfg)] = (weakref.ref(db), _values(cfg))
    weakref.finalize(cfg, _RESOLVED.pop, id(cfg), None)
    return cfg


def is_resolved(cfg: SampleConfig, db) -> bool:
    """cfg came from resolve(., db) and has not been changed since."""
    entry = _RESOLVED.get(id(cfg))
    return entry is not None and entry[0]() is db and entry[1] == _values(cfg)


def config(db, cfg: SampleConfig | None, overrides: dict) -> SampleConfig:
    """cfg as resolve(cfg, db) made it; otherwise cfg (default: SampleConfig's defaults) with
    overrides, resolved here (frames(db, n=2, steps=16) works as it always did)."""
    if cfg is not None and not overrides and is_resolved(cfg, db):
        return cfg
    return resolve(replace(cfg or SampleConfig(), **overrides), db)
