"""Prompts: a template of words and [MASK] slots ([MASK*N]: N of them) -> token ids, and the
prompt's own words as the user typed them (printed in place of their word pieces)."""

from __future__ import annotations

import re

import torch

from ..errors import DbertError


_MASK_RUN = re.compile(r"\[mask\s*\*\s*(\d{1,5})\]", re.IGNORECASE)


def expand_template(template: str) -> str:
    """A prompt template with each `[MASK*N]` written out as N `[MASK]` slots."""
    return _MASK_RUN.sub(lambda m: " ".join(["[MASK]"] * int(m.group(1))), template)


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
        raise DbertError(f"the prompt is {len(ids)} tokens, longer than --length {length}")
    return torch.tensor(ids + [tok.mask_token_id] * (length - len(ids)), dtype=torch.long)
