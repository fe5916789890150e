"""The token cache: a corpus's documents tokenized once, kept on disk as memory-mapped arrays.

One entry is a folder named by its key under the dbert home's cache folder
($DBERT_HOME/cache/tokens/KEY/), nanoGPT-style flat arrays that numpy maps, never loads:

    tokens.bin       every document's token ids, one after another (uint16, or uint32 for a
                     vocabulary over 65,536 pieces)
    offsets.npy      int64, documents + 1: document i is tokens[offsets[i]:offsets[i + 1]]
    words.npy        int64 per document: its words (white-space separated), for DocumentStats
    paragraphs.npy   int32 per document: its paragraphs
    info.json        the key's parts and the counts, written last: an entry without it is not one

The key is a SHA-256 of what the ids depend on: each data file's size and SHA-256 (data.fingerprints),
the tokenizer (a SHA-256 of its tokenizer.json: vocabulary, normaliser, pre-tokeniser), the unit
and the document separator, and this format's version. A document's ids are data.iter_encode's
(no special tokens; a literal [MASK] in the text becomes [UNK]) of its paragraphs joined by a space
(data.story_texts). The entry is built in a marked temporary folder beside its place and renamed
into place when complete (disk/temp_folders.py): a killed or interrupted build leaves nothing a
later run trusts, and the next build clears what it left. The tokenizer encodes batches of about
4 MB on every core (tokenizers' own encode_batch); `report` hears the progress after each batch.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..disk import layout
from ..disk.temp_folders import clean, discard, temp_dir
from ..errors import DbertError
from .data import DocumentStats, fingerprints

VERSION = 1
BATCH_CHARS = 4 << 20  # text per encode_batch call: enough for every core, short enough to stop at once


def tokenizer_hash(tokenizer) -> str:
    """SHA-256 of the tokenizer's own serialisation (its vocabulary and every rule)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        text = backend.to_str()
    else:  # a Python-side tokenizer: its vocabulary in id order and its class
        text = type(tokenizer).__name__ + json.dumps(sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def cache_key(files: list[dict], tokenizer, unit: str, doc_sep: str) -> tuple[str, dict]:
    """(the entry's name, what it is made of) for fingerprinted files under a tokenizer."""
    parts = {"version": VERSION, "files": [[f["size"], f["sha256"]] for f in files],
             "tokenizer": tokenizer_hash(tokenizer), "unit": unit, "doc_sep": doc_sep}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32], parts


@dataclass
class TokenCache:
    """One entry, opened: its arrays are memory-mapped (tokens) or small (one number a document)."""

    folder: Path
    tokens: np.ndarray      # flat ids, uint16 or uint32
    offsets: np.ndarray     # int64, len(self) + 1
    words: np.ndarray       # int64 per document
    paragraphs: np.ndarray  # int32 per document
    built: bool = False     # made by this call (False: found on disk)
    _fd: tuple[int, int] | None = field(default=None, repr=False, compare=False)  # (process id, open tokens.bin)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def read(self, lo: int, hi: int) -> np.ndarray:
        """tokens[lo:hi] read from the file into memory of its own (not through the map): a scan of
        the whole corpus, or windows drawn from all over it, leave no mapped pages resident behind
        them (a fault on the map brings in its neighbours too: 256 windows of a 1 GB corpus read
        through it held 140 MB). The file stays open for the process (opened again in another one)."""
        dtype = self.tokens.dtype
        if hi <= lo:
            return np.zeros(0, dtype)
        if self._fd is None or self._fd[0] != os.getpid():
            self._fd = (os.getpid(), os.open(self.folder / layout.CACHE_TOKENS, os.O_RDONLY))
        data = os.pread(self._fd[1], (hi - lo) * dtype.itemsize, lo * dtype.itemsize)
        return np.frombuffer(data, dtype=dtype)

    def __del__(self) -> None:
        if self._fd is not None and self._fd[0] == os.getpid():
            os.close(self._fd[1])

    def firsts(self, docs: int = 1 << 16) -> np.ndarray:
        """The first token of each non-empty document, read `docs` documents at a time."""
        out = [np.zeros(0, self.tokens.dtype)]
        starts, some = self.offsets[:-1], self.lengths > 0
        for a in range(0, len(self), docs):
            b = min(len(self), a + docs)
            lo = int(self.offsets[a])
            out.append(self.read(lo, int(self.offsets[b]))[starts[a:b][some[a:b]] - lo])
        return np.concatenate(out)

    def doc(self, i: int) -> np.ndarray:
        return self.read(int(self.offsets[i]), int(self.offsets[i + 1]))

    def stats(self) -> DocumentStats:
        """DocumentStats.of the documents, from their counts."""
        words = np.sort(self.words) if len(self) else np.zeros(1, dtype=np.int64)
        single = int(np.count_nonzero(self.paragraphs == 1)) / max(1, len(self))
        return DocumentStats(len(self), int(words[len(words) // 2]), int(words[-1]), single)


def open_entry(folder: Path) -> TokenCache | None:
    """The entry in folder, or None when it is not a complete one (no info.json, sizes that
    disagree with it: something a later build replaces)."""
    folder = Path(folder)
    try:
        info = json.loads((folder / layout.CACHE_INFO).read_text(encoding="utf-8"))
        dtype = np.dtype(info["dtype"])
        size = (folder / layout.CACHE_TOKENS).stat().st_size
        if size != info["tokens"] * dtype.itemsize:
            return None
        tokens = np.memmap(folder / layout.CACHE_TOKENS, dtype=dtype, mode="r") if size else np.zeros(0, dtype)
        offsets = np.load(folder / layout.CACHE_OFFSETS)
        words = np.load(folder / layout.CACHE_WORDS, mmap_mode="r")  # read by stats() only: mapped, not loaded
        paragraphs = np.load(folder / layout.CACHE_PARAGRAPHS, mmap_mode="r")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    n = info["documents"]
    if not (len(offsets) == n + 1 and len(words) == len(paragraphs) == n and int(offsets[-1]) == info["tokens"]):
        return None
    return TokenCache(folder, tokens, offsets, words, paragraphs)


def _encoder(tokenizer) -> Callable[[list[str]], list[list[int]]]:
    """texts -> their ids as data.iter_encode makes them, before its [UNK] replacement."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return lambda texts: tokenizer(texts, add_special_tokens=False, truncation=False)["input_ids"]
    from tokenizers import Tokenizer

    from .pieces import PIECE_CHARS, encoded

    backend = Tokenizer.from_str(backend.to_str())  # a copy without tokenizer.json's padding/truncation
    backend.no_padding()
    backend.no_truncation()
    fast = fast_backend(backend)

    def encode(texts: list[str]) -> list[list[int]]:
        if all(len(t) <= PIECE_CHARS for t in texts):  # the common case: one call for the batch
            return [e.ids for e in fast.encode_batch(texts, add_special_tokens=False)]
        return list(encoded(fast, texts, "ids", len(texts)))  # a long document in bounded pieces (pieces.py)

    return encode


class fast_backend:
    """A Rust tokenizer whose encode_batch is its encode_batch_fast where it has one (the same ids,
    without the offsets), for pieces.encoded."""

    def __init__(self, backend):
        self.encode_batch = getattr(backend, "encode_batch_fast", backend.encode_batch)


def _batches(docs: Iterable):
    """(texts, words, paragraphs, characters) of about BATCH_CHARS of documents at a time; a
    sources.StoryHead is a document of no text, its words and paragraphs its story's; a str is a
    story's unit (sources.story_units), a document of 0 paragraphs."""
    from .sources import StoryHead

    texts, words, paras, chars = [], [], [], 0
    for doc in docs:
        if isinstance(doc, StoryHead):  # a document of no tokens that carries its story's counts
            texts.append("")
            words.append(doc.words)
            paras.append(doc.paragraphs)
            continue
        unit = isinstance(doc, str)  # a story's unit: no paragraph of its own
        text = doc if unit else " ".join(doc)
        texts.append(text)
        words.append(len(text.split()))
        paras.append(0 if unit else len(doc))
        chars += len(text) + (1 if unit else len(doc))  # a newline per paragraph, roughly what was read
        if chars >= BATCH_CHARS:
            yield texts, words, paras, chars
            texts, words, paras, chars = [], [], [], 0
    if texts:
        yield texts, words, paras, chars


class _Column:
    """One number a document, written to disk as the batches come (never a list of the corpus's
    arrays joined at the end: at 1 GB of lines that join held about 165 MB at once), then made
    the .npy file `path` by its header and a copy of the bytes."""

    def __init__(self, path: Path, dtype):
        self.path, self.dtype, self.n = path, np.dtype(dtype), 0
        self.raw = open(path.with_suffix(".part"), "wb")

    def __enter__(self) -> "_Column":
        return self

    def __exit__(self, *exc) -> None:
        self.raw.close()  # closed on any way out; a failed build's folder is discarded whole

    def append(self, values) -> None:
        values = np.asarray(values, dtype=self.dtype)
        self.raw.write(values.tobytes())
        self.n += len(values)

    def save(self) -> None:
        import shutil

        self.raw.close()
        header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": (self.n,)}
        with open(self.path, "wb") as f, open(self.raw.name, "rb") as raw:
            np.lib.format.write_array_header_1_0(f, header)
            shutil.copyfileobj(raw, f, 1 << 20)
        os.unlink(self.raw.name)


def _write(docs: Iterable[list[str]], tokenizer, folder: Path, parts: dict, total: int | None, report) -> None:
    encode = _encoder(tokenizer)
    dtype = np.dtype(np.uint16 if len(tokenizer) <= 1 << 16 else np.uint32)
    bad = np.array(sorted({tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id,
                           tokenizer.mask_token_id} - {None}), dtype=np.int64)
    unk = tokenizer.unk_token_id
    n_tokens = n_docs = done = 0
    start = time.perf_counter()
    with open(folder / layout.CACHE_TOKENS, "wb") as f, _Column(folder / layout.CACHE_OFFSETS, np.int64) as offsets, \
            _Column(folder / layout.CACHE_WORDS, np.int64) as words, \
            _Column(folder / layout.CACHE_PARAGRAPHS, np.int32) as paras:
        offsets.append(np.zeros(1, dtype=np.int64))
        for texts, w, p, chars in _batches(docs):
            ids = encode(texts)
            lens = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
            flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=int(lens.sum()))
            if len(bad):
                flat[np.isin(flat, bad)] = unk
            f.write(flat.astype(dtype).tobytes())
            offsets.append(n_tokens + np.cumsum(lens))
            words.append(np.asarray(w, dtype=np.int64))
            paras.append(np.asarray(p, dtype=np.int32))
            n_tokens += int(lens.sum())
            n_docs += len(ids)
            done += chars
            if report is not None:
                report({"stage": "tokenize", "bytes": done, "total": total, "tokens": n_tokens,
                        "documents": n_docs, "seconds": time.perf_counter() - start})
        f.flush()
        os.fsync(f.fileno())
        for column in (offsets, words, paras):
            column.save()
    info = {**parts, "dtype": dtype.name, "tokens": n_tokens, "documents": n_docs,
            "seconds": round(time.perf_counter() - start, 3)}
    (folder / layout.CACHE_INFO).write_text(json.dumps(info, indent=1), encoding="utf-8")  # last: complete


def build(docs: Iterable[list[str]], tokenizer, target: Path, parts: dict | None = None, total: int | None = None,
          report=None) -> TokenCache:
    """Tokenize documents into the entry `target`, built beside it and renamed into place whole;
    anything that stops it (an error, Ctrl-C) leaves no entry and no temporary folder."""
    target = Path(target)
    folder = temp_dir(target, "cache")
    try:
        _write(docs, tokenizer, folder, parts or {}, total, report)
        try:
            os.rename(folder, target)
        except OSError:  # another run put the same entry in place first: its entry is as good
            if open_entry(target) is None:
                raise
            discard(folder)
    except BaseException:
        discard(folder)
        raise
    entry = open_entry(target)
    if entry is None:
        raise DbertError(f"the token cache {target} could not be read back after it was written")
    entry.built = True
    return entry


def cached(patterns: list[str], doc_sep: str, tokenizer, root: Path, unit: str = "story", report=None,
           files: list[dict] | None = None) -> TokenCache:
    """The entry of these files under this tokenizer: the one on disk, else one built now. Its
    documents are the unit's (sources.unit_documents): stories, or one line or sentence each, or
    for "sentence-pack" each story's head (no tokens; paragraphs > 0) followed by its units (paragraphs 0)."""
    from .sources import total_bytes, unit_documents

    files = fingerprints(patterns) if files is None else files
    key, parts = cache_key(files, tokenizer, unit, doc_sep)
    target = Path(root) / key
    found = open_entry(target)
    if found is not None:
        return found
    try:
        Path(root).mkdir(parents=True, exist_ok=True)
        clean(Path(root))  # what a killed build left
        if target.exists():  # an incomplete entry (written by hand, or a disk that lost it): rebuilt
            import shutil

            shutil.rmtree(target)
    except OSError as e:
        raise DbertError(f"cannot write the token cache in {root}: {e.strerror or e}") from None
    docs = unit_documents(patterns, unit, doc_sep)
    try:
        return build(docs, tokenizer, target, parts, total_bytes(patterns), report)
    except OSError as e:
        raise DbertError(f"cannot write the token cache in {root}: {e.strerror or e}") from None
