"""Story-level measures of samples: is each one whole story, how long are they, do the names hold.

A sample is **one complete story** when it
- begins at a story start: its first word does not refer back to something before it ("She was
  three", "Then they went", "But"): BACK_REFERENCES;
- ends with a sentence end (. ! ? and any closing quotes);
- opens no second story: no document mark (the [SEP] shown as the paragraph sign, STORY_BREAKS) and
  no story opening ("Once upon a time", "The end.") after its start.
A paragraph break inside one story is fine; the rule reads the text only, so it scores real stories
and samples alike (real TinyStories pass it almost always: the README of docs/stories.md says how often).

Names: a **doubled name** is one name joined to itself ("Lily and Lily", "Tom, Tom"); a **changed
name** is a story whose main character (the first one introduced by name in its first half, "a girl
named Lily") is gone
from its second half while a name not seen in its first half takes the stage there (used at least
twice): the sampler forgot who the story was about. Both are heuristics stated here and counted the
same way on held-out stories, so the two rates are compared, not read alone.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Iterable
from typing import Any

BACK_REFERENCES = frozenset(
    "she he they it them her his their its him then but so and or after afterwards later also too still "
    "finally suddenly soon next because meanwhile anyway instead again there's".split())
STORY_BREAKS = ("\u00b6", "[SEP]")          # the document mark as dbert writes it, and a raw [SEP]
_ONCE = re.compile(r"\bonce upon a time\b", re.IGNORECASE)
_THE_END = re.compile(r"\bthe end\s*[.!]", re.IGNORECASE)
_FIRST_WORD = re.compile(r"[A-Za-z']+")
_ENDS = re.compile(r"([.!?][\"'\u201d\u2019\u00bb)\]]*|\bthe end)\s*$", re.IGNORECASE)
_DOUBLED = re.compile(r"\b([A-Z][a-z]+)(?: and |, | with | or | & )\1\b")
_NAMED = re.compile(r"\b(?:named|called) ([A-Z][a-z]+)")
_CAPITAL = re.compile(r"(?<![.!?\"]\s)(?<!^)\b([A-Z][a-z]+)\b")
_NOT_NAMES = frozenset("I The A An One Once Mom Dad Mommy Daddy Mum Mr Mrs Miss Sir Lady King Queen".split())


def first_word(text: str) -> str:
    m = _FIRST_WORD.search(text)
    return m.group(0).lower() if m else ""


def one_story(text: str) -> dict:
    """Why a text is or is not one complete story: {"start", "end", "single", "ok"}."""
    body = text.strip()
    start = bool(body) and first_word(body) not in BACK_REFERENCES
    end = bool(_ENDS.search(body))
    single = not any(mark in body for mark in STORY_BREAKS) and not _second_story(body)
    return {"start": start, "end": end, "single": single, "ok": start and end and single}


def _second_story(body: str) -> bool:
    """A story opening after the start, or "The end." before the end."""
    return any(m.start() > 3 for m in _ONCE.finditer(body)) or \
        any(m.end() < len(body) - 3 for m in _THE_END.finditer(body))


def doubled_name(text: str) -> bool:
    return _DOUBLED.search(text) is not None


def _name_set(text: str) -> set[str]:
    """Names of a story: capitalised words used inside a sentence somewhere (not only as a
    sentence's first word), and every "named X"; titles and 'I' are not names."""
    found = {m.group(1) for m in _CAPITAL.finditer(text)} | {m.group(1) for m in _NAMED.finditer(text)}
    return found - _NOT_NAMES


def _uses(text: str, names: set[str]) -> list[str]:
    """Every use of those names in text, in order (a sentence's first word too)."""
    return [w for w in re.findall(r"\b[A-Z][a-z]+\b", text) if w in names]


def changed_name(text: str) -> bool:
    """The main character (the first one introduced by name in the story's first half, "named X"
    or "called X") is gone from its second half while a name not in the first half is used there
    at least twice."""
    half = len(text) // 2
    m = _NAMED.search(text, 0, half)
    if m is None:
        return False
    hero, names = m.group(1), _name_set(text)
    first, second = set(_uses(text[:half], names)), _uses(text[half:], names)
    if hero in second:
        return False
    return any(n not in first and second.count(n) >= 2 for n in set(second))


def quartiles(values) -> tuple[float, float, float]:
    """(q1, median, q3) by linear interpolation; zeros for no values (a list or an array of ints)."""
    if not len(values):
        return 0.0, 0.0, 0.0
    v: Any
    if isinstance(values, list):
        v = sorted(values)
    else:  # an array of a corpus's lengths: sorted by numpy, not as a list of Python ints
        import numpy as np

        v = np.sort(np.asarray(values, dtype=np.int64))

    def q(p: float) -> float:
        x = p * (len(v) - 1)
        lo = int(x)
        hi = min(lo + 1, len(v) - 1)
        a, b = int(v[lo]), int(v[hi])
        return a + (b - a) * (x - lo)

    return q(0.25), q(0.5), q(0.75)


def story_report(texts: list[str], references: Iterable[str] | None = None) -> dict:
    """The story-level measures of texts (and of references, the same way, under "human_"; read
    once, as they come: a stream of a corpus's stories keeps only counts and a length each)."""
    out = _measure(texts)
    if references is not None:
        out.update({"human_" + k: v for k, v in _measure(references).items()})
    return out


def _measure(items: Iterable[str]) -> dict:
    n = ok = start = end = single = doubled = changed = 0
    lengths = array("l")
    for t in items:
        c = one_story(t)
        n += 1
        ok, start, end, single = ok + c["ok"], start + c["start"], end + c["end"], single + c["single"]
        doubled, changed = doubled + doubled_name(t), changed + changed_name(t)
        lengths.append(len(t.split()))
    q1, med, q3 = quartiles(lengths)
    n = max(n, 1)
    return {"frac_one_story": ok / n, "frac_story_start": start / n, "frac_story_end": end / n,
            "frac_single_story": single / n, "words_q1": q1, "words_median": med, "words_q3": q3,
            "frac_doubled_name": doubled / n, "frac_changed_name": changed / n}
