"""Prompts: a template of words and [MASK] slots ([MASK*N]: N of them) -> token ids, and the
prompt's own words as the user typed them (printed in place of their word pieces)."""

from __future__ import annotations

import re

import torch

from ..errors import DbertError


_MASK_RUN = re.compile(r"\[mask\s*\*\s*(\d+)\]", re.IGNORECASE)
MAX_SLOTS = 8192  # [MASK] slots one template may ask for (settings.MAX_STORY: no run is longer)


def expand_template(template: str) -> str:
    """A prompt template with each `[MASK*N]` written out as N `[MASK]` slots. The slots are
    counted before they are written out: more than MAX_SLOTS in all is one DbertError (no model
    has that many positions), so `[MASK*100000000]` costs nothing."""
    count_slots(template)
    return _MASK_RUN.sub(lambda m: " ".join(["[MASK]"] * int(m.group(1))), template)


def count_slots(template: str, most: int = MAX_SLOTS) -> int:
    """The [MASK] slots of the template's [MASK*N] runs; DbertError past `most` (a run of any
    number of digits is read, never left as text the tokenizer spells as [UNK] pieces)."""
    total = 0
    for m in _MASK_RUN.finditer(template):
        digits = m.group(1).lstrip("0") or "0"
        total += int(digits) if len(digits) <= 9 else 10**9
        if total > most:
            raise DbertError(f"{m.group(0)[:40]}: a prompt holds at most {most:,} [MASK] slots "
                             f"(no model has more positions); write fewer")
    return total


def slots(tok, template: str) -> str:
    """The template with its mask slots spelled as the tokenizer's mask token in any case
    (`[mask]` is a slot too, not three word pieces); the length is unchanged, so offsets hold."""
    return re.sub(re.escape(tok.mask_token), lambda m: tok.mask_token, template, flags=re.IGNORECASE)


def prompt_words(db, template: str) -> dict[int, str]:
    """{position: the prompt's own text there} for the tokens of a template (not its [MASK]s):
    what is printed for them, case and accents as the user typed them."""
    tok = db.tokenizer
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        return {}
    template = slots(tok, expand_template(template))
    enc = backend.encode(template, add_special_tokens=False)
    if len(enc.ids) != len(tok.encode(template, add_special_tokens=False)):
        return {}
    return {i: template[a:b] for i, (t, (a, b)) in enumerate(zip(enc.ids, enc.offsets))
            if t != tok.mask_token_id and b > a}


def prompt_notes(db, template: str) -> list[str]:
    """What a user should know about a prompt before sampling: no [MASK] slot (the masks are
    appended after it), and the words the tokenizer cannot spell (the model sees [UNK] there;
    the output keeps them as typed)."""
    notes = []
    full = expand_template(template)
    if not re.search(r"\[mask\]", full, re.IGNORECASE):
        notes.append("the prompt has no [MASK] slot: masks are appended after it up to --length")
    tok = db.tokenizer
    full = slots(tok, full)
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:
        enc = backend.encode(full, add_special_tokens=False)
        unknown = [full[a:b] for t, (a, b) in zip(enc.ids, enc.offsets) if t == tok.unk_token_id and b > a]
        if unknown:
            shown = ", ".join(repr(u) for u in dict.fromkeys(unknown[:5]))
            notes.append(f"the tokenizer cannot spell {shown}: the model sees [UNK] there (printed as typed)")
    return notes


def prompt_ids(db, template: str) -> torch.Tensor:
    """A template's token ids (its [MASK] slots as masks), nothing appended."""
    tok = db.tokenizer
    ids = tok.encode(slots(tok, expand_template(template)), add_special_tokens=False)
    return parse_prompt(db, template, len(ids))


def parse_prompt(db, template: str, length: int) -> torch.Tensor:
    """Token ids (length,) of a template with [MASK] slots ([MASK*N]: N of them), masks appended
    up to length."""
    tok = db.tokenizer
    template = slots(tok, expand_template(template))
    ids = tok.encode(template, add_special_tokens=False)
    bad = {tok.cls_token_id, tok.sep_token_id, tok.pad_token_id}
    ids = [tok.unk_token_id if i in bad else i for i in ids]
    if len(ids) > length:
        raise DbertError(f"the prompt is {len(ids)} tokens, longer than $length {length}", refs=("length",))
    return torch.tensor(ids + [tok.mask_token_id] * (length - len(ids)), dtype=torch.long)


def prompt_lines(data: bytes, where: str) -> list[str]:
    """The prompts of a prompt file or stdin (`where` names it): one per line, blank lines
    skipped. Bytes that are not UTF-8 text (Latin-1, a binary file, NUL bytes) are one DbertError
    naming the first bad byte, never text full of surrogates that fails inside the tokenizer."""
    if b"\0" in data:
        raise DbertError(f"{where} holds NUL bytes (binary data, not text); give UTF-8 text, one prompt per line")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise DbertError(f"{where} is not UTF-8 text: byte 0x{data[e.start]:02x} on line {line} (Latin-1? "
                         "convert it with iconv -f latin1 -t utf-8)") from None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise DbertError(f"no prompts given ({where} holds no text)")
    return lines
