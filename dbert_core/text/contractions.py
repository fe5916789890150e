"""Contractions English has: the rule the contraction touch-up (touchup.py) and the reader's checks
(metrics.py) share.

A WordPiece tokenizer cuts "don't" into `don`, `'`, `t`, so a diffusion LM places the three pieces
one by one, from what it sees around each, and can join pieces that make no English word: "you't",
"i's", "we'm", "friends're", "does't". On 200 samples of the default checkpoint at the CLI defaults,
27 held a word that occurs nowhere in its training text, most of them such a contraction.

`valid(word, suffix)` says whether `word'suffix` is a contraction or a possessive English writes:
- 't, 'm, 're, 've, 'll, 'd are closed classes: only the stems listed below take them (the
  stems TinyStories and the fables use, plus the rest of the standard ones);
- 's is open (any noun's possessive, "it's", "let's"), except after a pronoun that does not take it
  ("you's", "hers's"), a negated stem ("don's"), an auxiliary or a few function words
  ("does's", "the's"), and a plural in -s ("friends's"; a singular in -ss, -us, -is or -os keeps
  it: "boss's", "octopus's", "oasis's"). Of the 16,348 contractions and possessives in the
  default model's training files, the rule rejects 11: "James's", "Silas's", "Jenkins's" (names in -s
  read as plurals), "a's", "Not's", "may's".
"""

from __future__ import annotations

import re
from typing import Sequence

import torch

APOSTROPHES = ("'", "\u2019")
SUFFIXES = ("t", "s", "m", "re", "ve", "ll", "d")

_NEGATED = frozenset("don doesn didn can couldn won wouldn shouldn isn aren wasn weren hasn haven hadn "
                     "ain mustn needn mightn shan".split())
_TAKE = {
    "t": _NEGATED,
    "m": frozenset({"i"}),
    "re": frozenset("you we they who what there where here how why".split()),
    "ve": frozenset("i you we they who what could would should might must".split()),
    "ll": frozenset("i you he she it we they that there this who what".split()),
    "d": frozenset("i you he she it we they who that there what".split()),
}
_NO_S = _NEGATED | frozenset(
    "i you we they me him us them my your our their his her its hers ours theirs yours "
    "am is are was were be been do does did has have had will would shall should can could may might must "
    "a an the and or but nor if of to in on at by for with from as than not no so very too said this these those".split())

_SINGULAR_S = ("ss", "us", "is", "os")  # "boss's", "octopus's", "oasis's": a singular that ends in s
STEMS = _NEGATED - {"can", "won"}  # no English word without their 't ("can" and "won" are words)
_APOSTROPHE, _SUFFIX = f"[{''.join(APOSTROPHES)}]", "|".join(SUFFIXES)
_TEXT = re.compile(rf"\b([A-Za-z]+){_APOSTROPHE}({_SUFFIX})\b", re.IGNORECASE)
_CLOSED = tuple(x for x in SUFFIXES if x != "s")  # never a word alone: "'m" after a quote is no English
_ORPHAN = re.compile(rf"(?<![A-Za-z]){_APOSTROPHE}(?:{'|'.join(_CLOSED)})\b", re.IGNORECASE)
_STRANDED = re.compile(rf"\b(?:{'|'.join(sorted(STEMS))}) ?{_APOSTROPHE}(?!(?:{_SUFFIX})\b)",  # a suffix: _TEXT's
                       re.IGNORECASE)


def valid(word: str, suffix: str) -> bool:
    """Whether English writes word + apostrophe + suffix (case ignored); suffix is one of SUFFIXES."""
    word, suffix = word.lower(), suffix.lower()
    if suffix == "s":
        return word not in _NO_S and not (word.endswith("s") and not word.endswith(_SINGULAR_S))
    return word in _TAKE.get(suffix, ())


def broken_in_text(text: str) -> list[str]:
    """The contractions in printed text that English does not write ("you't", "friends's", "don 'that",
    `"'M just glad`: a suffix with no word before its apostrophe)."""
    return ([m.group(0) for m in _TEXT.finditer(text) if not valid(m.group(1), m.group(2))]
            + [m.group(0) for m in _STRANDED.finditer(text)] + [m.group(0) for m in _ORPHAN.finditer(text)])


def broken(pieces: Sequence[str], hidden: Sequence[bool] | None = None) -> list[range]:
    """Each broken contraction in a row of WordPiece pieces, as the range of its positions: the
    word's pieces (a word is a piece and the `##` pieces after it), the apostrophe and the suffix
    ("you ' t"); or a negated stem and its apostrophe with no "t" after them ("don ' that"); or an
    apostrophe after no word and the suffix after it, one of those never written alone (`" ' m just`). A piece
    still hidden ([MASK], hidden[i]) is never read: only contractions fully written count."""
    hidden = hidden or [False] * len(pieces)
    out: list[range] = []
    for i in range(1, len(pieces) - 1):
        if pieces[i] not in APOSTROPHES or hidden[i] or hidden[i + 1] or hidden[i - 1]:
            continue
        start = i - 1
        while start > 0 and pieces[start].startswith("##"):
            start -= 1
        word = "".join(p[2:] if p.startswith("##") else p for p in pieces[start:i]).lower()
        after = pieces[i + 1].lower()
        longer = i + 2 < len(pieces) and pieces[i + 2].startswith("##")  # a longer word after the apostrophe
        if any(hidden[start:i]):
            continue
        if not word.isalpha():  # no word before it: only a suffix that is never a word alone is broken
            if after in _CLOSED and not longer and not (i + 2 < len(pieces) and hidden[i + 2]):
                out.append(range(i, i + 2))  # `" ' m just glad`: the apostrophe and its suffix
            continue
        if after in SUFFIXES and not longer:
            if not valid(word, after):
                out.append(range(start, i + 2))
        elif word in STEMS:
            out.append(range(start, i + 1))
    return out


def apostrophe_ids(tokenizer) -> list[int]:
    """The vocabulary ids of the apostrophe pieces (those the tokenizer has)."""
    return tokenizer.ids_of(APOSTROPHES)


def join_ids(tokenizer) -> list[int]:
    """The ids of the apostrophes and the suffix pieces: what only a contraction uses. A touch-up's
    refill never draws them, or the model would write the mark it was denied as a single quote
    ("'The little girl" where a stray double quote stood) or a stray suffix."""
    return tokenizer.ids_of(APOSTROPHES + SUFFIXES)


def broken_positions(db, ids: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """(B, L) bool: the eligible positions of each row of ids inside a broken contraction whose
    apostrophe is eligible (the sampler's): refilled with apostrophes excluded, that position can no
    longer join a word and a suffix. One whose apostrophe a prompt wrote is the user's and stays."""
    mask = db.tokenizer.mask_token
    out = torch.zeros_like(eligible)
    for r, row in enumerate(ids.tolist()):
        pieces = db.tokenizer.convert_ids_to_tokens(row)
        for span in broken(pieces, [p == mask for p in pieces]):
            if eligible[r, next(i for i in span if pieces[i] in APOSTROPHES)]:
                for i in span:
                    out[r, i] = eligible[r, i]
    return out
