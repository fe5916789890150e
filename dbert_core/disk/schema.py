"""dbert.json: the one schema a checkpoint's diffusion settings are checked against.

Every reader goes through `check` (load, import, fetch, the store listing, the TUI), so a value
of the wrong type or out of range is one DbertError naming the field, never a crash or a hang
further on. Keys not listed are kept as they are: provenance a newer dbert may add.
Torch-free, so listing the store stays quick.
"""

from __future__ import annotations

import math

from ..config import DOC_SEPS, MAX_LAMBDA, MAX_NGRAM, MAX_T, SCHEDULES, TIME_MODES, UNITS  # the choices and ranges, defined once
from ..errors import DbertError

FORMAT = 1                                    # the checkpoint format this dbert writes (checkpoint.save)
MAX_SEQ_LEN = 1_000_000                       # the largest seq_len dbert.json may record


def _whole(lo: int, hi: int | None = None):
    def ok(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= lo and (hi is None or v <= hi)
    return ok, f"a whole number {'>= ' + str(lo) if hi is None else f'in [{lo}, {hi}]'}"


def _number(lo: float, hi: float = math.inf):
    def ok(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and lo <= v <= hi
    return ok, f"a finite number {'>= ' + f'{lo:g}' if math.isinf(hi) else f'in [{lo:g}, {hi:.4g}]'}"


def _one_of(choices: tuple):
    return (lambda v: isinstance(v, str) and v in choices), "one of " + ", ".join(choices)


def _kind(*types, none: bool = False):
    def ok(v) -> bool:
        return (none and v is None) or (isinstance(v, types) and not (bool not in types and isinstance(v, bool)))
    names = " or ".join({str: "a string", bool: "true or false", dict: "an object", list: "a list"}[t] for t in types)
    return ok, names + (" or null" if none else "")


def _strings():
    return (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)), "a list of strings"


def _digests():
    def ok(v) -> bool:
        return isinstance(v, dict) and all(
            isinstance(k, str) and k.endswith(".safetensors") and "/" not in k and isinstance(d, str) and len(d) == 64 and all(c in "0123456789abcdef" for c in d)
            for k, d in v.items())
    return ok, "an object mapping weight files (*.safetensors) to sha256 digests (64 lower-case hex digits)"



# name -> (required, (accepts, what it must be))
FIELDS = {
    "schedule": (True, _one_of(SCHEDULES)),
    "T": (True, _whole(1, MAX_T)),
    "lambda": (False, _number(0.0, MAX_LAMBDA)),
    "time": (False, _one_of(TIME_MODES)),
    "format": (False, _whole(1, FORMAT)),
    "seq_len": (False, _whole(1, MAX_SEQ_LEN)),
    "parameters": (False, _whole(0)),
    "step": (False, _whole(0)),
    "tokens_seen": (False, _whole(0)),
    "train_examples": (False, _whole(0)),
    "train_tokens": (False, _whole(0)),
    "data_files": (False, _kind(list)),
    "val_ppl_token": (False, _number(0.0)),
    "val_data_files": (False, _kind(list)),
    "train_seconds": (False, _number(0.0)),
    "world_size": (False, _whole(1)),
    "pack": (False, _kind(bool)),
    "from_scratch": (False, _kind(bool)),
    "preset": (False, _kind(str, none=True)),
    "init": (False, _kind(str, none=True)),
    "unit": (False, (lambda v: v is None or (isinstance(v, str) and v in UNITS), "one of " + ", ".join(UNITS) + " or null")),
    "end_padding": (False, _one_of(("seen", "hidden"))),
    "device": (False, _kind(str, none=True)),
    "created": (False, _kind(str)),
    "saved": (False, _kind(str)),
    "data": (False, _strings()),
    "trim_vocab": (False, _kind(dict, bool, none=True)),
    "train_config": (False, _kind(dict)),
    "sha256": (False, _digests()),
    "sampling": (False, _kind(dict)),
    "quality": (False, _kind(dict)),  # the checkpoint's one quality figure (quality_line), measured after training
}

# the fields inside those objects that sampling and eval read (name -> (accepts, what it must be));
# T: the field's upper bound is the checkpoint's T (a step budget, a cache interval)
SAMPLING = {
    "min_length": _whole(0),  # tokens of the shortest story: any length
    "openings": ((lambda v: isinstance(v, list) and all(_whole(0)[0](x) for x in v)), "a list of token ids (whole numbers >= 0)"),
    "from_stories": _whole(0),
    "openings_cover": _number(0.0, 1.0),
    "decoding": _kind(dict),
}
DECODING = {
    "steps": lambda T: _whole(1, T),
    "temperature": lambda T: _number(0.0, 1e6),
    "top_k": lambda T: _whole(0),
    "top_p": lambda T: ((lambda v: _number(0.0, 1.0)[0](v) and v > 0), "a number in (0, 1]"),
    "cache_refresh": lambda T: _whole(0, T),
    "cache_masked": lambda T: _kind(bool),
    "no_repeat_ngram": lambda T: _whole(0, MAX_NGRAM),
    "sampler": lambda T: _kind(str),    # a strategy's name (sampling.settings.recommended_sampler checks it at use)
    "params": lambda T: _kind(dict),    # that strategy's parameters
}
QUALITY = {
    "ppl_token": _number(1.0),  # a perplexity per token: at least 1
    "what": _kind(str),
    "measured": _kind(str),
}
TRAIN_CONFIG = {
    "story_context": _whole(1),  # and below the story window: checked with the model (checkpoint.load)
    "doc_sep": _one_of(DOC_SEPS),  # the rest is read only by --resume, which checks every field's type
}


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check(meta, where) -> dict:
    """meta (dbert.json parsed) if it fits the schema; DbertError naming the first bad field."""
    if not isinstance(meta, dict):
        raise DbertError(f"checkpoint {where}: dbert.json must hold a JSON object, not {type(meta).__name__}")
    for name, (required, (accepts, expected)) in FIELDS.items():
        if name not in meta:
            if required:
                raise DbertError(f"checkpoint {where}: dbert.json lacks the field {name!r} ({expected})")
            continue
        if not accepts(meta[name]):
            raise DbertError(f"checkpoint {where}: dbert.json field {name!r} is {_shown(meta[name])}; "
                             f"it must be {expected}")
    sampling = meta.get("sampling") or {}
    _inner(sampling, SAMPLING, "sampling", where)
    _inner(sampling.get("decoding") or {}, {k: f(meta["T"]) for k, f in DECODING.items()}, "sampling.decoding", where)
    _inner(meta.get("quality") or {}, QUALITY, "quality", where)
    train = meta.get("train_config") or {}
    _inner(train, TRAIN_CONFIG, "train_config", where, none=True)
    return meta


def _inner(obj: dict, fields: dict, prefix: str, where, none: bool = False) -> None:
    """The fields of one of dbert.json's objects; none: null stands for the default (a TrainConfig's None)."""
    for name, (accepts, expected) in fields.items():
        if name in obj and not (none and obj[name] is None) and not accepts(obj[name]):
            raise DbertError(f"checkpoint {where}: dbert.json field '{prefix}.{name}' is {_shown(obj[name])}; "
                             f"it must be {expected}" + (" or null" if none else ""))


def check_with_model(meta: dict, positions: int, vocab: int, where) -> None:
    """The fields whose range is the model's, once it is built: a story model's
    `train_config.story_context` inside its window (sampling.blocks.window: seq_len, at most the
    model's positions; the range `dbert train --story-context` allows), `sampling.openings`
    inside the vocabulary."""
    given = (meta.get("train_config") or {}).get("story_context")
    if given is not None and meta.get("unit") == "story":
        window = min(int(meta.get("seq_len", 64)), positions)
        if not 1 <= given < window:
            raise DbertError(f"checkpoint {where}: dbert.json field 'train_config.story_context' is {given}; it must "
                             f"be a whole number in [1, {window - 1}] (tokens of a {window}-token story window) or null")
    bad = [t for t in (meta.get("sampling") or {}).get("openings") or [] if t >= vocab]
    if bad:
        raise DbertError(f"checkpoint {where}: dbert.json field 'sampling.openings' holds {bad[0]}; token ids must be "
                         f"below the vocabulary's {vocab}")
