"""The Generate screen's dialogs as data, without Textual: the settings form's fields, its text
read back as settings (checked against the checkpoint, the first bad field named), and the
prompt form. widgets/generate/controls.py applies them; screens/dialogs.FormDialog shows them.
"""

from __future__ import annotations

import dataclasses

from dbert_core import strategies
from dbert_core.errors import DbertError
from dbert_core.settings import SAMPLE, Setting, label

from .controller import MAX_N

SIDES = "AB"

# the settings dialog: the sampling settings the schema puts on a form (dbert_core/settings.py), in
# its order, then the one setting of watching alone
PACE = Setting("pace_ms", int, "Minimum time per shown step while playing.", 0, label="ms per step",
               note="0: fastest")
FORM = tuple(s for s in SAMPLE if s.label) + (PACE,)
WATCHED = Setting("n", int, "", 1, MAX_N, label="samples")  # the dialog's own range for n: a few to watch

PROMPT_TITLE = ("Prompt / infill template: text with \\[MASK] slots (\\[MASK*N]: N of them, "
                "\\[MASK*A-B]: A to B tokens, ranked by the model's ELBO per token); masks are "
                "appended up to the length (empty: unconditional)")


class FieldError(Exception):
    """A bad value in the settings dialog: `key` names its field (None: no one field)."""

    def __init__(self, key: str | None, message: str) -> None:
        super().__init__(message)
        self.key, self.message = key, message


def said(error: DbertError) -> str:
    """An engine error as the Generate screen says it: its settings by the dialog's labels."""
    return error.said(lambda name: label(name, FORM))


def _shown(s, setting: Setting) -> str:
    """A setting's value as the dialog's text ("" for None: the checkpoint's)."""
    value = getattr(s, setting.name)
    if value is None:
        return ""
    if setting.name == "params":
        return " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in value.items())
    if setting.kind is bool:
        return "yes" if value else "no"
    return f"{value:g}" if setting.kind is float else str(value)


def settings_form(s, side: int | None) -> tuple[str, list]:
    """The settings dialog of settings `s`: its title (naming the side in a comparison) and fields."""
    blank = {"sampler": "auto: " + " | ".join(strategies.names())}
    fields = [(f.name, f.shown, _shown(s, f), blank.get(f.name, f.blank)) for f in FORM]
    title = "Sampling settings (Enter applies and restarts)"
    if side is not None:
        title = f"Side {SIDES[side]}: " + title
    return title, fields


def _number(setting: Setting, text: str):
    try:
        return setting.kind(text)
    except ValueError:
        whole = "a whole number" if setting.kind is int else "a number"
        raise FieldError(setting.name, f"{setting.label} must be {whole}, got {text!r}") from None


def _yes_no(setting: Setting, text: str) -> bool:
    if text in ("yes", "y", "on", "true", "1", "no", "n", "off", "false", "0"):
        return text in ("yes", "y", "on", "true", "1")
    raise FieldError(setting.name, f"{setting.label} must be yes or no, got {text!r}")


def settings_fields(values: dict, old, db) -> dict:
    """The dialog's text as settings replacing `old`, checked against the checkpoint `db` (None:
    on their own); raises FieldError naming the first bad field, in the dialog's words."""
    fields: dict = {}
    for setting in FORM:
        text = values.get(setting.name, "").strip()
        if setting.kind not in (int, float, bool):
            continue
        if not text and setting.blank:  # empty: the checkpoint's (the shortest story: its own again)
            fields[setting.name] = None if setting.name == "min_length" else getattr(old, setting.name)
        elif setting.kind is bool:
            fields[setting.name] = _yes_no(setting, text.lower())
        else:
            fields[setting.name] = _number(setting, text)
    fields["sampler"] = values["sampler"].strip() or None
    fields["params"] = None
    try:
        if values.get("params", "").strip():
            if fields["sampler"] is None:
                raise FieldError("params", "sampler parameters need a sampler named")
            from dbert_core.strategies import parse_params

            fields["params"] = parse_params(fields["sampler"], values["params"].split())
    except DbertError as e:  # a parameter's own message (strategies.py)
        raise FieldError("params", said(e)) from None
    try:
        for setting in (WATCHED, PACE):
            setting.check(fields[setting.name])
        new = dataclasses.replace(old, **fields)
        if db is not None:
            from dbert_core.sampling.sample import resolve

            resolve(new, db)
        else:
            new.validate()
    except DbertError as e:
        raise FieldError(e.setting, said(e)) from None
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
