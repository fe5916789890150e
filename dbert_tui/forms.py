"""The Generate screen's dialogs as data, without Textual: the settings form's fields, its text
read back as settings (checked against the checkpoint, the first bad field named), and the
prompt form. widgets/generate/controls.py applies them; screens/dialogs.FormDialog shows them.
"""

from __future__ import annotations

import dataclasses
import re

from dbert_core.errors import DbertError

from .controller import MAX_N

SIDES = "AB"

# the settings dialog's field for an option named in an engine error (--top-k ...)
OPTION_FIELDS = {"--n": "n", "--steps": "steps", "--temperature": "temperature", "--top-k": "top_k",
                 "--top-p": "top_p", "--length": "length", "--min-length": "min_length", "--sampler": "sampler", "--param": "params",
                 "--seed": "seed", "--cache-refresh": "cache_refresh",
                 "--cache-masked": "cache_masked"}

PROMPT_TITLE = ("Prompt / infill template: text with \\[MASK] slots (\\[MASK*N]: N of them, "
                "\\[MASK*A-B]: A to B tokens, ranked by the model's ELBO per token); masks are "
                "appended up to the length (empty: unconditional)")


class FieldError(Exception):
    """A bad value in the settings dialog: `key` names its field (None: no one field)."""

    def __init__(self, key: str | None, message: str) -> None:
        super().__init__(message)
        self.key, self.message = key, message


def field_of(message: str) -> str | None:
    for option in re.findall(r"--[a-z-]+", message):
        if option in OPTION_FIELDS:
            return OPTION_FIELDS[option]
    return next((key for key in ("steps", "length", "sampler") if key in message), None)


def settings_form(s, side: int | None) -> tuple[str, list]:
    """The settings dialog of settings `s`: its title (naming the side in a comparison) and fields."""
    from dbert_core.strategies import names

    fields = [
        ("steps", "steps (1..T)", "" if s.steps is None else str(s.steps), "the checkpoint's"),
        ("temperature", "temperature (0: greedy)", "" if s.temperature is None else f"{s.temperature:g}", "the checkpoint's"),
        ("top_k", "top-k (0: off)", "" if s.top_k is None else str(s.top_k), "the checkpoint's"),
        ("top_p", "top-p (0..1]", "" if s.top_p is None else f"{s.top_p:g}", "the checkpoint's"),
        ("length", "length (tokens)", "" if s.length is None else str(s.length), "the checkpoint's"),
        ("min_length", "shortest story (tokens)", "" if s.min_length is None else str(s.min_length),
         "the checkpoint's (story models)"),
        ("n", "samples", str(s.n), ""),
        ("seed", "seed", str(s.seed), ""),
        ("sampler", "sampler", s.sampler or "", "auto: " + " | ".join(names())),
        ("params", "sampler parameters", " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                                                  for k, v in (s.params or {}).items()), "NAME=VALUE ...: defaults"),
        ("cache_refresh", "cache refresh (0: exact)", "" if s.cache_refresh is None else str(s.cache_refresh),
         "the checkpoint's: a whole forward every K calls"),
        ("cache_masked", "cache keeps masks: yes/no", "" if s.cache_masked is None else ("yes" if s.cache_masked else "no"),
         "the checkpoint's: masked positions' states kept too"),
        ("pace_ms", "ms per step (0: fastest)", str(s.pace_ms), ""),
    ]
    title = "Sampling settings (Enter applies and restarts)"
    if side is not None:
        title = f"Side {SIDES[side]}: " + title
    return title, fields


def settings_fields(values: dict, old, db) -> dict:
    """The dialog's text as settings replacing `old`, checked against the checkpoint `db` (None:
    on their own); raises FieldError naming the first bad field."""
    fields: dict = {}
    for key, kind in (("steps", int), ("temperature", float), ("top_k", int), ("top_p", float), ("n", int),
                      ("seed", int), ("pace_ms", int), ("length", int), ("min_length", int), ("cache_refresh", int)):
        text = values.get(key, "")
        if key in ("length", "min_length", "steps", "temperature", "top_k", "top_p", "cache_refresh") and not text.strip():
            fields[key] = None if key == "min_length" else getattr(old, key)
            continue
        try:
            fields[key] = kind(text)
        except ValueError:
            whole = "a whole number" if kind is int else "a number"
            name = {"n": "samples", "pace_ms": "ms per step", "min_length": "shortest story",
                    "cache_refresh": "cache refresh"}.get(key, key.replace("_", "-"))
            raise FieldError(key, f"{name} must be {whole}, got {text!r}") from None
    masks = values.get("cache_masked", "").strip().lower()
    if not masks:
        fields["cache_masked"] = old.cache_masked
    elif masks in ("yes", "y", "on", "true", "1", "no", "n", "off", "false", "0"):
        fields["cache_masked"] = masks in ("yes", "y", "on", "true", "1")
    else:
        raise FieldError("cache_masked", f"cache keeps masks must be yes or no, got {masks!r}")
    if not 1 <= fields["n"] <= MAX_N:
        raise FieldError("n", f"samples must be 1..{MAX_N}")
    if fields["pace_ms"] < 0:
        raise FieldError("pace_ms", "the pace must be >= 0 ms")
    fields["sampler"] = values["sampler"].strip() or None
    fields["params"] = None
    try:
        if values.get("params", "").strip():
            if fields["sampler"] is None:
                raise FieldError("params", "sampler parameters need a sampler named")
            from dbert_core.strategies import parse_params

            fields["params"] = parse_params(fields["sampler"], values["params"].split())
    except DbertError as e:
        raise FieldError("params", str(e)) from None
    try:
        new = dataclasses.replace(old, **fields)
        if db is not None:
            from dbert_core.sampling.sample import resolve

            resolve(new, db)
        else:
            new.validate()
    except DbertError as e:
        raise FieldError(field_of(str(e)), str(e).replace("--", "")) from None
    return fields


def check_prompt(prompt: str, db, length) -> None:
    """Raises DbertError for a prompt the checkpoint cannot take (an infill's spans are checked;
    each of its lengths is the template's own)."""
    from dbert_core.sampling.infill import has_range, variants
    from dbert_core.sampling.sample import parse_prompt

    if has_range(prompt):
        variants(prompt)
    else:
        parse_prompt(db, prompt, length)
