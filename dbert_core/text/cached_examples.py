"""`--unit line` and `--unit sentence` examples drawn from a token cache when asked, not held as lists.

`CachedExamples(cache, docs, seq_len)` is data.tokenize's list of the cache's documents `docs` (an
entry of unit line or sentence holds one example a document): the non-empty ones, in that order,
each cut to seq_len, as two integers an example (where it starts in the flat array, its length),
its ids read from the memory-mapped tokens when it is indexed. `packed(sep)` is data.pack of them:
their ids each followed by [SEP], one stream cut into full seq_len windows. `token_counts` is
data.token_counts of the examples, counted a stretch of the flat array at a time (`range_counts`)
and kept beside the entry (`kept_counts`: a second run of the same split reads them).
`SentenceWindows(cache, seq_len, sep, short, seed)` is data.document_windows of an entry of unit
"sentence-pack" (`--unit sentence --pack`): the same windows, as two stream positions a window.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import torch

from ..disk import layout

CHUNK_TOKENS = 1 << 21  # tokens of the flat array range_counts reads at a time


def range_counts(cache, starts: np.ndarray, lens: np.ndarray, vocab_size: int) -> np.ndarray:
    """(V,) int64: how often each id occurs in the runs tokens[start:start + len] of the flat array,
    a token counted once for every run that holds it (runs may overlap: a difference array over a
    stretch of about CHUNK_TOKENS at a time, read into memory of its own)."""
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], starts[order] + lens[order]
    counts = np.zeros(vocab_size, dtype=np.float64)  # sums of whole numbers far below 2**53: exact
    i = 0
    while i < len(starts):
        j = max(i + 1, int(np.searchsorted(starts, starts[i] + CHUNK_TOKENS, side="left")))
        lo, hi = int(starts[i]), int(ends[i:j].max())
        if hi > lo:
            n = hi - lo
            cover = np.cumsum(np.bincount(starts[i:j] - lo, minlength=n + 1)[:n + 1] -
                              np.bincount(ends[i:j] - lo, minlength=n + 1)[:n + 1])[:n]
            counts += np.bincount(cache.read(lo, hi), weights=cover, minlength=vocab_size)[:vocab_size]
        i = j
    return counts.astype(np.int64)


def kept_counts(cache, shape: list[int], arrays: list[np.ndarray], count) -> torch.Tensor:
    """count() (a (V,) int64 tensor, V = shape[-1]), kept in the entry's folder under a key of the
    examples' shape and which they are (`arrays`): a second run of the same split reads it."""
    vocab_size = shape[-1]
    h = hashlib.sha256(np.array(shape, dtype=np.int64).tobytes())
    for a in arrays:  # as int64, a stretch at a time: the key of before for an int32 array too
        for i in range(0, len(a), 1 << 20):
            h.update(np.ascontiguousarray(a[i:i + (1 << 20)], dtype=np.int64).tobytes())
    path = Path(cache.folder) / layout.CACHE_COUNTS.format(key=h.hexdigest()[:32])
    try:
        counts = np.load(path)
        if counts.shape == (vocab_size,) and counts.dtype == np.int64:
            return torch.from_numpy(counts)
    except (OSError, ValueError):
        pass
    counts = count()
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        with open(part, "wb") as f:
            np.save(f, counts.numpy())
        os.replace(part, path)
    except OSError:  # a read-only cache: counted again next time
        part.unlink(missing_ok=True)
    return counts


LINES = -1  # the key's tag for CachedExamples (StoryWindows' keys start with seq_len)
PACKED = -2


class CachedExamples:
    """data.tokenize's examples of the cache's documents `docs`, made when indexed."""

    def __init__(self, cache, docs, seq_len: int):
        docs = np.asarray(docs, dtype=np.int64)
        offsets = cache.offsets
        n = offsets[docs + 1] - offsets[docs]
        some = n > 0  # tokenize drops a text that gives no tokens
        self.cache, self.seq_len = cache, seq_len
        at = np.int32 if int(offsets[-1]) < 2**31 else np.int64  # a corpus of gigabytes: half the memory
        self.starts = offsets[docs[some]].astype(at)
        self.lengths = np.minimum(n[some], seq_len).astype(np.int32)  # what the trainer sorts batches by

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        s = int(self.starts[i])
        return self.cache.read(s, s + int(self.lengths[i])).tolist()

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def token_counts(self, vocab_size: int) -> torch.Tensor:
        return kept_counts(self.cache, [LINES, self.seq_len, vocab_size], [self.starts, self.lengths],
                           lambda: torch.from_numpy(range_counts(self.cache, self.starts, self.lengths, vocab_size)))

    def total_tokens(self) -> int:
        return int(self.lengths.sum())

    def packed(self, sep_id: int) -> "PackedExamples":
        return PackedExamples(self, sep_id)


class PackedExamples:
    """data.pack of CachedExamples: their ids each followed by [SEP], one stream cut into full
    seq_len windows, the last part that does not fill one dropped."""

    def __init__(self, examples: CachedExamples, sep_id: int):
        self.src, self.sep = examples, sep_id
        self.uniform_length = L = examples.seq_len  # every window is full: nothing to sort batches by
        self.ends = np.cumsum(examples.lengths + 1)  # the stream position after each example's [SEP]
        self.n = (int(self.ends[-1]) if len(self.ends) else 0) // L

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if not -self.n <= i < self.n:
            raise IndexError(i)
        L, src = self.uniform_length, self.src
        pos, hi = (i % self.n) * L, (i % self.n + 1) * L
        k = int(np.searchsorted(self.ends, pos, side="right"))  # the example whose stream holds pos
        out: list[int] = []
        while pos < hi:
            n, s = int(src.lengths[k]), int(src.starts[k])
            begin = int(self.ends[k]) - n - 1
            a, b = pos - begin, min(n + 1, hi - begin)  # its stream (n ids, then [SEP]) from a to b
            out.extend(src.cache.read(s + min(a, n), s + min(b, n)).tolist())
            if b == n + 1:
                out.append(self.sep)
            pos, k = begin + b, k + 1
        return out

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def token_counts(self, vocab_size: int) -> torch.Tensor:
        src = self.src
        covered = self.n * self.uniform_length
        begins = self.ends - src.lengths - 1
        ids = np.clip(covered - begins, 0, src.lengths)  # each example's ids inside the windows

        def count() -> torch.Tensor:
            out = range_counts(src.cache, src.starts, ids, vocab_size)
            out[self.sep] += int(np.count_nonzero(self.ends <= covered))
            return torch.from_numpy(out)

        return kept_counts(src.cache, [PACKED, self.uniform_length, self.sep, vocab_size], [src.starts, src.lengths],
                           count)

    def total_tokens(self) -> int:
        return self.n * self.uniform_length


SENTENCES = -3


def _window_ends(cache, seq_len: int, short: float, seed: int, docs: int = 1 << 16) -> np.ndarray:
    """data.pack_sentences' windows as the stream positions where each ends (the stream: each story
    with tokens, [SEP] then its units' ids), the same rooms drawn from random.Random(seed); the
    entry's lengths and paragraphs read `docs` documents at a time, the ends kept as 8 bytes each."""
    import random
    from array import array

    rng = random.Random(seed)

    def room() -> int:
        return rng.randint(1, seq_len) if short > 0 and rng.random() < short else seq_len

    ends = array("q")
    pos = cur = 0
    limit, first = room(), True
    for a in range(0, len(cache), docs):
        b = min(len(cache), a + docs)
        for n, head in zip(np.diff(cache.offsets[a:b + 1]).tolist(), (cache.paragraphs[a:b] > 0).tolist()):
            if head:
                first = True
                continue
            if not n:
                continue
            u, first = n + first, False  # a story's first unit brings its [SEP]
            if cur and cur + u > limit:
                ends.append(pos)
                cur, limit = 0, room()
            while u > seq_len:
                pos, u = pos + seq_len, u - seq_len
                ends.append(pos)
            pos, cur = pos + u, cur + u
    if cur:
        ends.append(pos)
    return np.frombuffer(ends, dtype=np.int64) if len(ends) else np.zeros(0, np.int64)


class SentenceWindows:
    """data.document_windows of an entry of unit "sentence-pack" (sources.story_units): the stories'
    sentence-start windows, window for window, as two stream positions each (lo, hi); a window's
    ids are its run of the flat array with [SEP] put in where a story begins. `select` keeps some."""

    def __init__(self, cache, seq_len: int, sep_id: int, short: float = 0.0, seed: int = 0, lo=None, hi=None):
        self.cache, self.seq_len, self.sep, self.short, self.seed = cache, seq_len, sep_id, short, seed
        heads = np.flatnonzero(cache.paragraphs > 0)
        flat = cache.offsets[heads]  # where each story's ids start (a head holds none)
        n = np.diff(np.append(flat, cache.offsets[-1]))
        flat = flat[n > 0]  # a story of no tokens brings no [SEP]
        self.flat = flat
        self.seps = flat + np.arange(len(flat), dtype=np.int64)  # each [SEP]'s stream position
        if lo is None:
            hi = _window_ends(cache, seq_len, short, seed)
            lo = np.concatenate([np.zeros(1, np.int64), hi])[:len(hi)]  # each begins where the last ended
        self.lo, self.hi = lo, hi
        self.lengths = hi - lo  # what the trainer sorts batches by

    def __len__(self) -> int:
        return len(self.lo)

    def select(self, index) -> "SentenceWindows":
        """The windows at these positions, in that order, or where a bool mask is True."""
        index = np.asarray(index)
        if index.dtype != np.bool_:
            index = index.astype(np.int64, copy=False)
        return SentenceWindows(self.cache, self.seq_len, self.sep, self.short, self.seed, self.lo[index],
                               self.hi[index])

    def _flat(self, pos):
        """The flat array's position of stream position pos (the [SEP]s before it taken away)."""
        return pos - np.searchsorted(self.seps, pos, side="left")

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        lo, hi = int(self.lo[i]), int(self.hi[i])
        a, b = int(self._flat(lo)), int(self._flat(hi))
        out = self.cache.read(a, b).tolist()
        j, k = np.searchsorted(self.seps, [lo, hi], side="left")
        for at in self.seps[j:k].tolist():  # in stream order: each lands at its place in the window
            out.insert(at - lo, self.sep)
        return out

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def token_counts(self, vocab_size: int) -> torch.Tensor:
        def count() -> torch.Tensor:
            a, b = self._flat(self.lo), self._flat(self.hi)
            out = range_counts(self.cache, a, b - a, vocab_size)
            out[self.sep] += int(self.lengths.sum() - (b - a).sum())
            return torch.from_numpy(out)

        return kept_counts(self.cache, [SENTENCES, self.seq_len, self.sep, vocab_size], [self.lo, self.hi], count)

    def total_tokens(self) -> int:
        return int(self.lengths.sum())

    def words(self) -> np.ndarray:
        """Each window's words, as data.document_windows(words=True) counts them: a unit's words in the
        window where its first id lies (a cut unit's in its first piece), a unit of no ids in none."""
        c = self.cache
        units = np.flatnonzero((c.paragraphs == 0) & (c.lengths > 0))
        first = c.offsets[units]
        pos = first + np.searchsorted(self.flat, first, side="right")  # the [SEP]s of its story and those before
        order = np.argsort(self.lo, kind="stable")
        k = np.searchsorted(self.lo[order], pos, side="right") - 1
        inside = (k >= 0) & (pos < self.hi[order][np.maximum(k, 0)])
        return np.bincount(order[k[inside]], weights=c.words[units][inside], minlength=len(self)).astype(np.int64)

    def stats(self):
        """DocumentStats of the stories (their heads' counts), as data.DocumentStats.of them."""
        from .data import DocumentStats

        heads = self.cache.paragraphs > 0
        words = np.sort(self.cache.words[heads])
        if not len(words):
            words = np.zeros(1, dtype=np.int64)
        single = int(np.count_nonzero(self.cache.paragraphs[heads] == 1)) / max(1, int(heads.sum()))
        return DocumentStats(int(heads.sum()), int(words[len(words) // 2]), int(words[-1]), single)
