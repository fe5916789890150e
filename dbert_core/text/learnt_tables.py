"""The tables a run learns from its raw text (truecase.learn, lexicon.learn), learnt once per corpus.

Both read the documents' text as training reads it (data.text_lines: each paragraph of
sources.iter_documents with --doc-sep, streamed, so never all in memory, in every format: a JSONL
line's "text", never its JSON; no <|endoftext|> mark). The word list is lexicon.learn's set, found
from token ids with numpy (words_of_ids): from the run's token cache entry when it has one
(nothing tokenized again), else from the paragraphs encoded 16,384 at a time, a long one in
bounded pieces (pieces.py). The result is kept as one JSON file under the dbert
home's cache folder ($DBERT_HOME/cache/tables/KEY.json), KEY a SHA-256 of the files' sizes and
SHA-256, the tokenizer's and the --doc-sep (token_cache.cache_key), written atomically; a later run of the same
files and tokenizer (a re-run, --resume) reads it instead of the corpus.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from ..disk.atomic import atomic_write_text
from ..errors import DbertError
from . import lexicon, truecase
from .sources import iter_documents
from .token_cache import cache_key

if TYPE_CHECKING:
    import threading

CHUNK = 16_384        # paragraphs encoded at a time for the word list
CHUNK_TOKENS = 1 << 21  # a token cache's ids read at a time


def text_of(patterns: list[str], sep: str = "auto"):
    """data.text_lines, streamed and in every format sources reads: each paragraph of each
    document (a JSONL line's "text", a Parquet row's), no <|endoftext|> mark."""
    for doc in iter_documents(patterns, sep):
        yield from doc


def _encoded(lines: list[str], tokenizer):
    import itertools

    import numpy as np

    from .pieces import encoded
    from .token_cache import fast_backend

    ids = encoded(fast_backend(tokenizer.backend_tokenizer), lines, "ids", len(lines))  # a long one in pieces
    return np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64)


class Learning:
    """The tables of the files' documents' text (text_of), learnt in a thread of their own while the caller goes on (a
    story run tokenizes its corpus meanwhile; tokenizers' encoding lets go of the interpreter, so
    the two share the cores): `start`, then `finish(entry)` for the result, or `cancel()`.

    With the files' token cache entry read with the same --doc-sep (from_entry: its documents are
    these paragraphs joined by a space, or one paragraph or one of its sentences each, which
    splits no word piece) the word list comes from its
    ids at the finish: nothing is tokenized again. Otherwise the paragraphs are encoded CHUNK at a
    time in the thread."""

    def __init__(self, patterns: list[str], tokenizer, from_entry: bool = False, sep: str = "auto"):
        self.patterns, self.tokenizer, self.sep = patterns, tokenizer, sep
        self.from_entry = from_entry
        self.words: set[str] = set()
        self.table: dict[str, str] | None = None
        self.error: BaseException | None = None
        self._stop = False
        self.thread: threading.Thread | None = None

    def start(self) -> "Learning":
        import threading

        self.thread = threading.Thread(target=self._run, name="dbert-tables", daemon=True)
        self.thread.start()
        return self

    def _lines(self):
        buf: list[str] = []
        for ln in text_of(self.patterns, self.sep):
            if self._stop:
                raise _Cancelled
            if not self.from_entry:
                buf.append(ln)
                if len(buf) >= CHUNK:
                    self.words.update(words_of_ids(_encoded(buf, self.tokenizer), self.tokenizer))
                    buf.clear()
            yield ln
        if buf:
            self.words.update(words_of_ids(_encoded(buf, self.tokenizer), self.tokenizer))

    def _run(self) -> None:
        try:
            self.table = truecase.learn(self._lines())
        except _Cancelled:
            pass
        except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread by finish()
            self.error = e

    def cancel(self) -> None:
        self._stop = True
        if self.thread is not None:
            self.thread.join()

    def finish(self, entry=None) -> tuple[dict, frozenset]:
        if self.thread is None:
            self._run()
        else:
            self.thread.join()
        if self.error is not None:
            raise self.error
        if self.table is None:
            raise RuntimeError("the tables were cancelled before they were learnt")
        if self.from_entry:
            runs = WordRuns(self.tokenizer)
            for ids in _pieces(entry):
                runs.add(ids)
            self.words.update(runs.words())
        return self.table, frozenset(self.words)


class _Cancelled(Exception):
    pass


def learn(patterns: list[str], tokenizer, entry=None, sep: str = "auto") -> tuple[dict, frozenset]:
    """(the truecasing table, the word list) of the files' documents' text (data.text_lines with
    --doc-sep `sep`), in one streamed pass (Learning, in this thread); entry: the files' token
    cache entry read with the same `sep`."""
    return Learning(patterns, tokenizer, entry is not None, sep).finish(entry)


def _pieces(entry):
    """The entry's ids in pieces of about CHUNK_TOKENS, cut at documents' starts."""
    import numpy as np

    offsets = entry.offsets
    at = 0
    while at < len(offsets) - 1:
        end = max(at + 1, int(np.searchsorted(offsets, offsets[at] + CHUNK_TOKENS, side="right")) - 1)
        end = min(end, len(offsets) - 1)
        yield entry.read(int(offsets[at]), int(offsets[end])).astype(np.int64)
        at = end


class Tables:
    """The tables of a run, from the cache ($DBERT_HOME/cache/tables/KEY.json) or learnt: `begin`
    starts learning them (in a thread) unless the cache has them; `end(entry)` gives them and
    keeps what was learnt; `cancel()` stops the thread (a preparation that failed)."""

    def __init__(self, patterns: list[str], tokenizer, root: Path, files: list[dict], story: bool = False,
                 sep: str = "auto"):
        key, _ = cache_key(files, tokenizer, "text tables", sep)  # the documents' text: not the raw lines' tables
        self.path = Path(root) / f"{key}.json"
        self.learning = None
        self.found = self._read()
        if self.found is None:
            self.learning = Learning(patterns, tokenizer, story, sep).start()

    def _read(self):
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            return truecase.from_json(data["truecase"]), lexicon.from_json(data["words"])
        except (OSError, ValueError, KeyError, TypeError):
            return None  # none yet, or not whole: learnt again

    def cancel(self) -> None:
        if self.learning is not None:
            self.learning.cancel()

    def end(self, entry=None) -> tuple[dict, frozenset, bool]:
        """(table, words, learnt now)."""
        if self.found is not None:
            return (*self.found, False)
        assert self.learning is not None  # started in __init__ when nothing was found
        table, words = self.learning.finish(entry)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.path, json.dumps({"truecase": truecase.to_json(table),
                                                     "words": lexicon.to_json(words)}, ensure_ascii=False))
        except (OSError, DbertError):
            pass  # a cache that cannot be written costs the next run this pass again, nothing more
        return table, words, True


def words_of_ids(ids, tokenizer) -> frozenset[str]:
    """lexicon.learn of lines from their ids, one flat array of the lines' encodings one after
    another (a line opens with a head piece, so no word runs across two): WordRuns of one array."""
    runs = WordRuns(tokenizer)
    runs.add(ids)
    return runs.words()


class WordRuns:
    """The words of flat id arrays added one after another (each cut where a line starts): each
    run of a word piece and its continuations found with numpy, kept as one integer per distinct
    run (its ids packed) while arrays come, and spelt once at the end (`words`), however many
    arrays wrote it."""

    def __init__(self, tokenizer):
        import numpy as np

        backend = tokenizer.backend_tokenizer
        self.size = backend.get_vocab_size(with_added_tokens=True)
        self.pieces = [backend.id_to_token(i) or "" for i in range(self.size)]
        unk = getattr(tokenizer, "unk_token", "[UNK]")
        self.cont = np.array([p.startswith(lexicon.CONTINUATION) for p in self.pieces])
        self.head_ok = np.array([lexicon.word_piece(p) and p != unk for p in self.pieces])
        self.bad = np.array([p == unk for p in self.pieces])
        self.bits = max(1, int(self.size - 1).bit_length())
        self.packed: dict[int, list] = {}  # run length -> arrays of distinct packed runs
        self.long: set[tuple[int, ...]] = set()  # runs too long to pack into 63 bits

    def add(self, ids) -> None:
        import numpy as np

        ids = np.asarray(ids, dtype=np.int64)
        if not len(ids):
            return
        heads = np.flatnonzero(~self.cont[ids])
        lengths = np.diff(np.append(heads, len(ids)))
        keep = self.head_ok[ids[heads]] & (lengths <= lexicon._MAX_WORD)
        unknown = self.bad[ids]
        if unknown.any():  # a run with an [UNK] in it spells no word
            unk_before = np.concatenate([[0], np.cumsum(unknown)])
            keep &= unk_before[heads + lengths] - unk_before[heads] == 0
        for n in np.flatnonzero(np.bincount(lengths[keep])).tolist():  # the run lengths there are
            starts = heads[keep & (lengths == n)]
            if n * self.bits > 63:  # too long to pack into one integer: rows, rare
                self.long.update(map(tuple, np.unique(ids[starts[:, None] + np.arange(n)], axis=0).tolist()))
                continue
            got = self.packed.setdefault(n, [])
            if n == 1:  # one piece: the distinct ids by counting, no sort
                got.append(np.flatnonzero(np.bincount(ids[starts], minlength=self.size)))
            else:  # a run packed into one integer: a 1-D unique, far faster than rows'
                runs = ids[starts[:, None] + np.arange(n)]
                got.append(np.unique((runs << (np.arange(n, dtype=np.int64) * self.bits)).sum(axis=1)))
            if len(got) > 8:  # joined now and then: memory of the distinct runs, not of every array's
                self.packed[n] = [np.unique(np.concatenate(got))]

    def words(self) -> frozenset[str]:
        import numpy as np

        out: set[str] = set()
        mask = (1 << self.bits) - 1
        for n, got in self.packed.items():
            for v in np.unique(np.concatenate(got)).tolist():
                out.add(lexicon.spell([self.pieces[(v >> (self.bits * i)) & mask] for i in range(n)]))
        out.update(lexicon.spell([self.pieces[i] for i in row]) for row in self.long)
        return frozenset(out)
