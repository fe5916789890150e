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
import itertools
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
# A word at a start, found left to right: a sentence's first run of letters (after the line's
# start or a cut: what lies between is no letter), else one a quotation opens (its opener, spaces).
# A quotation that opens a sentence is passed over by the first branch: each start is found once.
_STARTS = re.compile(r"(?:\A|" + _SENTENCE_END.pattern + r")[\W\d_]*?([^\W\d_]+)"
                     r"|[" + re.escape(_OPENERS) + r"]\s*([^\W\d_]+)")
_LINE_BREAK = ". \n"  # lines joined into one text for the regex engine: each starts a sentence
BATCH = 4096  # lines counted at a time


@functools.lru_cache(maxsize=1 << 17)  # a corpus writes the same words again and again: each keyed once
def key(word: str) -> str:
    """A word as an uncased tokenizer writes it: lower case, accents stripped."""
    low = unicodedata.normalize("NFD", word.lower())
    return "".join(ch for ch in low if unicodedata.category(ch) != "Mn")


def learn(lines: Iterable[str], min_count: int = 2) -> dict[str, str]:
    """{key: written form} for the words whose most frequent form, away from sentence starts,
    differs from the key and holds a majority of their (at least min_count) occurrences.

    A word is at a start when it is the first run of letters of a sentence (a line cut at
    _SENTENCE_END) or the last character before it that is not white space opens a quotation
    (_OPENERS). The regex engine counts every run of letters of BATCH lines at once and, apart,
    those at a start, which are then taken away: the counts of a loop over each sentence's words,
    at a fraction of its time on a corpus of gigabytes (tests/test_text.py keeps that loop)."""
    seen_all: Counter = Counter()
    starts: Counter = Counter()
    joins: Counter = Counter()
    for batch in _batched(lines):
        joins.update(_COMPOUND.findall("\n".join(ln for ln in batch if "-" in ln)))  # none runs across a newline
        cased = _LINE_BREAK.join(ln for ln in batch if any(ch.isupper() for ch in ln))
        seen_all.update(_WORD.findall(cased))
        starts.update(_STARTS.findall(cased))
    compounds: dict[str, Counter] = defaultdict(Counter)
    for (left, space, right), n in joins.items():
        compounds[key(f"{left}-{right}")][not space] += n
    table = {}
    for k, seen in compounds.items():  # written joined more often than with spaces: "well-known"
        if seen[True] >= min_count and seen[True] > seen[False]:
            table[k] = k
    for (first, opened), n in starts.items():
        seen_all[first or opened] -= n
    forms: dict[str, Counter] = defaultdict(Counter)
    for w, n in seen_all.items():
        if n > 0 and len(w) <= _MAX_WORD:
            forms[key(w)][w] = n
    for k, seen in forms.items():
        form, n = seen.most_common(1)[0]
        if form != k and n >= min_count and 2 * n > sum(seen.values()) and len(form) == len(k):
            table[k] = form
    for k, v in FALLBACK.items():
        table.setdefault(k, v)
    return dict(sorted(table.items()))


def _batched(lines: Iterable[str]):
    it = iter(lines)
    while batch := list(itertools.islice(it, BATCH)):
        yield batch


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
