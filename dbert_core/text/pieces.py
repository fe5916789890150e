"""Long texts tokenized in bounded pieces: the Rust tokenizer's memory grows with the text it is
handed at once (about 340 bytes a character: a 10 MB story needed 3.4 GB, and under a 2 GB
address-space limit it aborted the process with SIGABRT, no message, its lock file left). A text
longer than PIECE_CHARS is cut into pieces of at most that many characters, each cut at a place
where the tokenizer splits anyway (between paragraphs, sentences or words, else after
punctuation), and one call of the tokenizer is given at most BATCH_CHARS characters; the ids
of the pieces, joined, are the whole text's (tests/test_hostile.py checks it on the stories).
"""

from __future__ import annotations

import unicodedata
from typing import Iterable, Iterator

PIECE_CHARS = 100_000  # characters of one piece of a long text
BATCH_CHARS = 1 << 20  # characters in one call of the tokenizer (about 340 MB at its peak)
_CUTS = ("\n\n", "\n", ". ", " ")  # where a piece may end, best first: the cut is at the space


def pieces(text: str, limit: int | None = None) -> list[str]:
    """text cut into pieces of at most limit characters (PIECE_CHARS), each cut just before a
    whitespace character (a paragraph's end first, then a line's, a sentence's, a word's) in the
    second half of the room, else just after a punctuation mark; a run of limit / 2 characters
    with neither (a "word" far past WordPiece's 100 characters, [UNK] either way) is cut as is."""
    limit = limit or PIECE_CHARS
    out, start = [], 0
    while len(text) - start > limit:
        end, half = start + limit, start + limit // 2
        cut = -1
        for sep in _CUTS:
            i = text.rfind(sep, half, end)
            if i != -1:
                cut = i + (1 if sep == ". " else 0)
                break
        if cut == -1:
            cut = next((i for i in range(end - 1, half, -1) if text[i].isspace()), -1)
        if cut == -1:
            cut = next((i + 1 for i in range(end - 1, half, -1) if _punctuation(text[i])), end)
        out.append(text[start:cut])
        start = cut
    out.append(text[start:])
    return out


def _punctuation(ch: str) -> bool:
    """BERT's pre-tokenizer's rule: ASCII symbols and every Unicode punctuation mark split words."""
    o = ord(ch)
    return 33 <= o <= 47 or 58 <= o <= 64 or 91 <= o <= 96 or 123 <= o <= 126 or \
        unicodedata.category(ch).startswith("P")


def encoded(backend, texts: Iterable[str], field: str = "ids", most: int = 4096) -> Iterator[list]:
    """For each text, in order, the `field` ("ids", "tokens") of its encoding by the Rust
    tokenizer `backend` (no special tokens), the pieces of a long one joined; at most `most`
    texts and BATCH_CHARS characters in one call."""
    batch: list[str] = []
    size = 0
    for text in texts:
        if batch and (len(batch) >= most or size + len(text) > BATCH_CHARS):
            yield from _fields(backend.encode_batch(batch, add_special_tokens=False), field)
            batch, size = [], 0
        if len(text) <= PIECE_CHARS:
            batch.append(text)
            size += len(text)
            continue
        if batch:
            yield from _fields(backend.encode_batch(batch, add_special_tokens=False), field)
            batch, size = [], 0
        joined: list = []
        parts = pieces(text)
        step = max(1, BATCH_CHARS // PIECE_CHARS)
        for i in range(0, len(parts), step):
            for enc in backend.encode_batch(parts[i:i + step], add_special_tokens=False):
                joined.extend(getattr(enc, field))
        yield joined
    if batch:
        yield from _fields(backend.encode_batch(batch, add_special_tokens=False), field)


def _fields(encodings, field: str) -> Iterator[list]:
    for enc in encodings:
        yield getattr(enc, field)
