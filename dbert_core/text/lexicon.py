"""The words a checkpoint's training text writes, and the made-up words a sample spells instead.

A sample's made-up words ("littlewirled", "fierceest", "staror", "gr", "yu") are word pieces drawn
side by side that no text joins, or the head of a longer word left alone: each piece is likely where
it stands, the word they spell is no word. Nucleus sampling keeps the model's long tail of pieces and
writes one into every fifth story; top-k 30 into every tenth (docs/stories.md). At training time
dbert keeps every word of the raw training text, spelt as the tokenizer's pieces join (lower case
for an uncased one), in the checkpoint (layout.WORDS, about 100 kB for the shipped model's 14,000
words), and the touch-up (sampling/touchup.py, `--made-up-words` to turn it off) masks the pieces
of any word a sample writes outside that list and refills them, as it does a broken contraction.
A continuation piece ("##ed") with no word before it is made up too, and so is a negated stem with
no apostrophe after it ("didn", "wasn": contractions.STEMS).

Torch-free but for made_up_positions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

FORMAT = 1
_WORD = re.compile(r"[^\W_]+")  # a run of letters and digits: one pre-token of BERT's pre-tokenizer
_MAX_WORD = 64
CONTINUATION = "##"


def learn(lines: Iterable[str], tokenizer) -> frozenset[str]:
    """The words of these lines as the tokenizer writes them: each run of a word piece and its
    continuation pieces, spelt (lower case, accents stripped for an uncased tokenizer), the same
    grouping made_up reads a sample with; words with an unknown piece are left out."""
    from .pieces import encoded

    backend, unk = tokenizer.backend_tokenizer, getattr(tokenizer, "unk_token", "[UNK]")
    out: set[str] = set()
    for tokens in encoded(backend, lines, "tokens", 2048):  # a long line in bounded pieces (pieces.py)
        j = 0
        while j < len(tokens):
            k = j + 1
            while k < len(tokens) and tokens[k].startswith(CONTINUATION):
                k += 1
            if word_piece(tokens[j]) and unk not in tokens[j:k] and k - j <= _MAX_WORD:
                out.add(spell(tokens[j:k]))
            j = k
    return frozenset(out)


def spell(pieces: list[str]) -> str:
    """The word a head piece and its continuation pieces write."""
    return "".join(p[len(CONTINUATION):] if p.startswith(CONTINUATION) else p for p in pieces)


def word_piece(token: str) -> bool:
    """The piece can open a word: letters or digits (not a special token, not punctuation)."""
    return bool(_WORD.fullmatch(token))


def made_up(tokens: list[str], words: frozenset[str], stems: frozenset[str] = frozenset(),
            apostrophes: tuple[str, ...] = ()) -> list[tuple[int, int]]:
    """(start, end) spans of the made-up words in one row of tokens: a word piece and its
    continuations that spell no word of `words`, continuations after no word piece, and a word of
    `stems` ("didn", "wasn": English writes them only before an apostrophe) with none after it."""
    spans, i, n = [], 0, len(tokens)
    while i < n:
        if tokens[i].startswith(CONTINUATION):  # no head: after punctuation, a special token, a row's start
            j = i + 1
            while j < n and tokens[j].startswith(CONTINUATION):
                j += 1
            spans.append((i, j))
            i = j
            continue
        j = i + 1
        while j < n and tokens[j].startswith(CONTINUATION):
            j += 1
        if word_piece(tokens[i]) and spell(tokens[i:j]) not in words:
            spans.append((i, j))
        elif stems and spell(tokens[i:j]).lower() in stems and (j == n or tokens[j] not in apostrophes):
            spans.append((i, j))
        elif j - i > 1 and not word_piece(tokens[i]):
            spans.append((i + 1, j))
        i = j
    return spans


def made_up_positions(db, ids, eligible):
    """(B, L) bool: the eligible positions (the sampler's) of each row's made-up words (made_up),
    for the touch-up to refill; a word a prompt wrote whole is the user's and stays."""
    import torch

    from .contractions import APOSTROPHES, STEMS

    out = torch.zeros_like(eligible)
    if db.words is None:
        return out
    for r, row in enumerate(ids.tolist()):
        for a, b in made_up(db.tokenizer.convert_ids_to_tokens(row), db.words, STEMS, APOSTROPHES):
            out[r, a:b] = eligible[r, a:b]
    return out


def to_json(words: frozenset[str]) -> dict:
    return {"format": FORMAT, "words": sorted(words)}


def from_json(data) -> frozenset[str]:
    """The word set from its JSON form; ValueError if it is not one."""
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("words"), list):
        raise ValueError("not a word list (expected {'format': 1, 'words': [...]})")
    words = data["words"]
    bad = [w for w in words if not isinstance(w, str) or not w or len(w) > 4 * _MAX_WORD]
    if bad:
        raise ValueError(f"word list: {len(bad)} entries are not words (e.g. {str(bad[0])[:40]!r})")
    return frozenset(words)
