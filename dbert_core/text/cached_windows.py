"""Whole-story windows drawn from a token cache when asked, not held as lists.

`StoryWindows(cache, seq_len, sep_id, context)` is the sequence data.story_windows makes of the
cache's documents, in its order, window for window (a test pins them equal): two integers a
window (its document, where in the document's stream it starts) computed with numpy, and the
window itself (a data.Window) made from the memory-mapped tokens when it is indexed. `select`
keeps some windows (the held-out split); `token_counts` is data.token_counts of all of them,
counted in bounded chunks and kept beside the entry (a second run of the same split reads them). Every window is seq_len tokens long (`uniform_length`).
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import DbertError
from .cached_examples import kept_counts, range_counts
from .data import Window


class StoryWindows:
    def __init__(self, cache, seq_len: int, sep_id: int, context: int | None = None, doc=None, at=None):
        ctx = seq_len // 2 if context is None else context
        if not 0 < ctx < seq_len:
            raise DbertError(f"story context must be in [1, {seq_len - 1}] tokens (got {ctx})")
        self.cache, self.seq_len, self.sep, self.ctx = cache, seq_len, sep_id, ctx
        self.step = seq_len - ctx
        self.uniform_length = seq_len
        if doc is None:
            doc, at = self._windows(cache.lengths)
        self.doc, self.at = doc, at

    def _windows(self, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(doc, at) of every window of stories of n tokens: int32 where every number fits (a corpus
        of gigabytes: half the memory), computed in place where numpy can."""
        seq_len, step = self.seq_len, self.step
        it = np.int32 if int(n.sum()) + len(n) + seq_len < 2**31 else np.int64  # windows, stories, positions
        n = n.astype(it)
        k = n + (1 - (seq_len - 1))  # a story's stream is its n tokens and one [SEP]: what the first window leaves
        np.maximum(k, 0, out=k)
        k = -(-k // step)
        k += 1
        k[n == 0] = 0
        del n
        doc = np.repeat(np.arange(len(k), dtype=it), k)
        at: np.ndarray = np.arange(len(doc), dtype=it)
        at -= np.repeat(np.cumsum(k, dtype=it) - k, k)  # each window's number within its story
        del k
        first = at == 0
        at -= 1
        at *= step
        at += seq_len - 1
        at[first] = 0
        return doc, at

    def __len__(self) -> int:
        return len(self.doc)

    def select(self, index) -> "StoryWindows":
        """The windows at these positions, in that order, or where a bool mask is True."""
        index = np.asarray(index)
        if index.dtype != np.bool_:
            index = index.astype(np.int64, copy=False)
        return StoryWindows(self.cache, self.seq_len, self.sep, self.ctx, self.doc[index], self.at[index])

    def _stream(self, d: int, a: int, b: int) -> list[int]:
        """The story's stream (its tokens, then [SEP]) from a to b."""
        off, n = int(self.cache.offsets[d]), int(self.cache.offsets[d + 1] - self.cache.offsets[d])
        out = self.cache.read(off + a, off + min(b, n)).tolist()
        return out + [self.sep] if b > n >= a else out

    def __getitem__(self, i) -> Window:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]  # type: ignore[return-value]  # a slice: the list of them
        d, at, L, sep = int(self.doc[i]), int(self.at[i]), self.seq_len, self.sep
        if at == 0:
            first = self._stream(d, 0, L - 1)
            return Window.of([sep, *first, *[sep] * (L - 1 - len(first))], 1, len(first))
        new = self._stream(d, at, at + self.step)
        given = self._stream(d, max(0, at - self.ctx), at)
        if len(given) < self.ctx:
            given = [sep, *given][-self.ctx:]
        body = [*given, *new]
        return Window.of([*body, *[sep] * (L - len(body))], len(given), len(new))

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def _ranges(self):
        """Each window's run of the flat token array (start, length): its story tokens."""
        offsets = self.cache.offsets
        n = offsets[self.doc + 1] - offsets[self.doc]
        lo = np.where(self.at == 0, 0, np.maximum(0, self.at - self.ctx))
        hi = np.where(self.at == 0, self.seq_len - 1, self.at + self.step)
        hi = np.minimum(hi, n)
        return offsets[self.doc] + lo, np.maximum(0, hi - lo)

    def token_counts(self, vocab_size: int) -> torch.Tensor:
        """data.token_counts of the windows (count_tokens), kept in the entry's folder under a key
        of the windows' shape and which they are: a second run of the same split reads them."""
        return kept_counts(self.cache, [self.seq_len, self.ctx, vocab_size], [self.doc, self.at],
                           lambda: self.count_tokens(vocab_size))

    def count_tokens(self, vocab_size: int) -> torch.Tensor:
        """data.token_counts of the windows: (V,) int64; all that is not a story token is [SEP]. Each
        token is counted once with the number of windows that hold it (range_counts), not once a window."""
        starts, lens = self._ranges()
        out = range_counts(self.cache, starts, lens, vocab_size)
        out[self.sep] += len(self) * self.seq_len - int(lens.sum())
        return torch.from_numpy(out)

    def total_tokens(self) -> int:
        return len(self) * self.seq_len
