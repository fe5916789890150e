"""Cased text from an uncased model: each word's usual written form, learnt from training text.

An uncased tokenizer (MiniLM, bert-base-uncased) lower-cases and strips accents, so the model
only ever writes "lily went to paris". At training time dbert counts how each word is written
in the raw training text, away from a sentence start (where a capital says nothing about the
word), and keeps the words whose usual form is not their plain lower-case one: "Lily",
"Paris", "I", "café". The table (a few kB) is stored in the checkpoint (layout.TRUECASE) and
detok.spans applies it, together with a capital at every sentence start. The table also keeps
the hyphenated compounds the text writes joined more often than spaced ("well-known": key and
form alike), so detok joins `well - known` but leaves a dash (`lesson - to`) spaced.

Lines with no capital at all are skipped: a corpus lower-cased upstream says nothing about case.
A checkpoint without a table still gets sentence-initial capitals and "I" (FALLBACK).

Torch-free.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Iterable

FORMAT = 1
FALLBACK = {"i": "I"}
_WORD = re.compile(r"[^\W\d_]+")  # a run of letters: what one uncased word piece (and its ##s) spells
_MAX_WORD = 64
_COMPOUND = re.compile(r"(?<![^\W\d_])([^\W\d_]+)( ?)-\2([^\W\d_]+)(?![^\W\d_])")  # well-known, lesson - to
_OPENERS = "\"'\u201c\u2018(["
_SENTENCE_END = re.compile(r"[.!?][\"'\u201d\u2019)\]]*\s+")


@functools.lru_cache(maxsize=1 << 17)  # a corpus writes the same words again and again: each keyed once
def key(word: str) -> str:
    """A word as an uncased tokenizer writes it: lower case, accents stripped."""
    low = unicodedata.normalize("NFD", word.lower())
    return "".join(ch for ch in low if unicodedata.category(ch) != "Mn")


def learn(lines: Iterable[str], min_count: int = 2) -> dict[str, str]:
    """{key: written form} for the words whose most frequent form, away from sentence starts,
    differs from the key and holds a majority of their (at least min_count) occurrences."""
    forms: dict[str, Counter] = defaultdict(Counter)
    compounds: dict[str, Counter] = defaultdict(Counter)
    for line in lines:
        for m in _COMPOUND.finditer(line):
            compounds[key(f"{m.group(1)}-{m.group(3)}")][not m.group(2)] += 1
        if not any(ch.isupper() for ch in line):
            continue
        for sentence in _SENTENCE_END.split(line):
            for j, m in enumerate(_WORD.finditer(sentence)):
                if j == 0:
                    continue
                w = m.group()
                if len(w) > _MAX_WORD:
                    continue
                p = m.start() - 1  # the last character before the word that is not white space
                while p >= 0 and sentence[p].isspace():
                    p -= 1
                if p < 0 or sentence[p] in _OPENERS:
                    continue  # a sentence's or a quotation's first word: its capital is positional
                forms[key(w)][w] += 1
    table = {}
    for k, seen in compounds.items():  # written joined more often than with spaces: "well-known"
        if seen[True] >= min_count and seen[True] > seen[False]:
            table[k] = k
    for k, seen in forms.items():
        form, n = seen.most_common(1)[0]
        if form != k and n >= min_count and 2 * n > sum(seen.values()) and len(form) == len(k):
            table[k] = form
    for k, v in FALLBACK.items():
        table.setdefault(k, v)
    return dict(sorted(table.items()))


def to_json(table: dict[str, str]) -> dict:
    return {"format": FORMAT, "forms": dict(sorted(table.items()))}


def from_json(data) -> dict[str, str]:
    """The table from its JSON form; ValueError if it is not one."""
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("forms"), dict):
        raise ValueError("not a truecasing table (expected {'format': 1, 'forms': {...}})")
    forms = data["forms"]
    bad = [k for k, v in forms.items() if not isinstance(v, str) or len(v) != len(k) or key(v) != k]
    if bad:
        raise ValueError(f"truecasing table: {len(bad)} entries are not a casing of their word (e.g. {bad[0][:40]!r})")
    return dict(forms)


def compound(left: str, right: str, table: dict[str, str] | None) -> bool:
    """left-right is a compound the training text writes joined."""
    return table is not None and key(f"{left}-{right}") in table


def cased(word: str, table: dict[str, str] | None, capital: bool) -> str:
    """word (as the tokenizer wrote it) in its written form; capital: it starts a sentence."""
    form = (table or FALLBACK).get(word, word)
    if capital and form[:1].islower():
        form = form[:1].upper() + form[1:]
    return form
