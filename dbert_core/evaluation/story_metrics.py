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


def quartiles(values: list[int]) -> tuple[float, float, float]:
    """(q1, median, q3) by linear interpolation; zeros for no values."""
    if not values:
        return 0.0, 0.0, 0.0
    v = sorted(values)

    def q(p: float) -> float:
        x = p * (len(v) - 1)
        lo = int(x)
        hi = min(lo + 1, len(v) - 1)
        return v[lo] + (v[hi] - v[lo]) * (x - lo)

    return q(0.25), q(0.5), q(0.75)


def story_report(texts: list[str], references: list[str] | None = None) -> dict:
    """The story-level measures of texts (and of references, the same way, under "human_")."""
    def measure(items: list[str]) -> dict:
        n = max(len(items), 1)
        checks = [one_story(t) for t in items]
        q1, med, q3 = quartiles([len(t.split()) for t in items])
        return {"frac_one_story": sum(c["ok"] for c in checks) / n,
                "frac_story_start": sum(c["start"] for c in checks) / n,
                "frac_story_end": sum(c["end"] for c in checks) / n,
                "frac_single_story": sum(c["single"] for c in checks) / n,
                "words_q1": q1, "words_median": med, "words_q3": q3,
                "frac_doubled_name": sum(map(doubled_name, items)) / n,
                "frac_changed_name": sum(map(changed_name, items)) / n}

    out = measure(texts)
    if references is not None:
        out.update({"human_" + k: v for k, v in measure(references).items()})
    return out
