"""A run's data from the token cache: windows or examples, held-out split, statistics, defaults.

What prepare.py made from lists of the whole corpus (read_documents, encode_stories, _hold_out,
DocumentStats.of, story_defaults.recommend), made from the cache's arrays instead
(text/token_cache.py, text/cached_windows.py): the same windows, the same split for a seed
(the same torch.randperm draws), the same counts, with the corpus tokenized once per
(files, tokenizer) and kept on disk. `report` hears the tokenization's progress. `examples` does
the same for `--unit line` and `--unit sentence` (what prepare.py made with read_examples,
_hold_out, tokenize and pack): the same examples and split for a seed (text/cached_examples.py);
`sentence_windows` for `--unit sentence --pack` (what it made with read_documents,
document_sentences, document_windows and _hold_out). In a run of several processes rank 0 makes
what is kept on disk first (`rank_0_first`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..config import TrainConfig
from ..disk import layout
from ..storage.store import home
from ..text import token_cache
from ..text.cached_examples import CachedExamples, SentenceWindows
from ..text.cached_windows import StoryWindows
from ..text.data import DocumentStats, fingerprints, pack
from ..text.sources import SENTENCE_PACK, story_units
from . import story_defaults


def cache_root() -> Path:
    """Where token cache entries live: $DBERT_HOME/cache/tokens/."""
    return home() / layout.CACHE / layout.TOKEN_CACHE


def tables_root() -> Path:
    """Where the learnt tables live: $DBERT_HOME/cache/tables/."""
    return home() / layout.CACHE / layout.TABLES_CACHE


_PRINTS: dict = {}


def file_prints(patterns: list[str]) -> list[dict]:
    """data.fingerprints, hashed once per process for a file unchanged since (path, size, mtime, inode)."""
    import os

    from ..text.data import expand_paths

    out = []
    for path in expand_paths(patterns):
        try:
            st = os.stat(path)
        except OSError:
            return fingerprints(patterns)  # its own message
        mark = (os.path.abspath(path), st.st_size, st.st_mtime_ns, st.st_ino)
        if mark not in _PRINTS:
            _PRINTS[mark] = fingerprints([path])[0]
        out.append(_PRINTS[mark])
    return out


def first_texts(c: TrainConfig, n: int) -> list[str]:
    """The first n examples' texts (what a preset's tokenizer is learnt from: stories, lines or
    sentences; `--unit sentence --pack` the units its windows are made of), read no further."""
    from ..text.sources import iter_examples, unit_documents

    if c.by_document and not c.by_story:
        return list(itertools.islice(_units(c), n))
    if not c.by_story:
        return list(itertools.islice(iter_examples(c.data, c.unit, c.doc_sep), n))
    return [" ".join(d) for d in itertools.islice(unit_documents(c.data, "story", c.doc_sep), n)]


def train_texts(c: TrainConfig):
    """The training texts, streamed (what --trim-vocab keeps the pieces of): every story's text;
    for line and sentence the examples `examples` trains on, the held-out ones left out (counted
    in a first pass: the split needs the number of examples); `--unit sentence --pack` every
    unit of the files (its split is of windows, made after the vocabulary)."""
    from ..text.sources import iter_examples, unit_documents

    if c.by_story:
        return (" ".join(d) for d in unit_documents(c.data, "story", c.doc_sep))
    if c.by_document:
        return _units(c)
    held: set = set()
    if not c.val_data:
        n = sum(1 for _ in iter_examples(c.data, c.unit, c.doc_sep))
        held = set(_held_out(c, n, torch.Generator().manual_seed(c.seed + 99)).tolist())
    return (t for i, t in enumerate(iter_examples(c.data, c.unit, c.doc_sep)) if i not in held)


def _units(c: TrainConfig):
    """The units of `--unit sentence --pack` (data.document_sentences' sentences), streamed."""
    return (u for u in story_units(c.data, c.doc_sep) if isinstance(u, str))


def _held_out(c: TrainConfig, n: int, g: torch.Generator) -> np.ndarray:
    """prepare._hold_out's held-out numbers among n examples, sorted."""
    n_val = min(c.val_examples, max(1, n // 20))
    return np.sort(torch.randperm(n, generator=g)[:n_val].numpy())


@dataclass
class StoryData:
    train: StoryWindows
    val: list
    stats: DocumentStats
    val_stats: DocumentStats | None
    sampling: dict
    cache: token_cache.TokenCache


def rank_0_first(make):
    """make() in every process of the run, rank 0's first: the others wait at a barrier until it has
    made it (built a cache entry, counted tokens, downloaded a dataset) and then find it on disk, so
    the work is done once, not once a rank (a rank whose dbert home is not rank 0's, another
    machine's disk, makes its own copy then). One process: make()."""
    import torch.distributed as dist

    ranks = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    if ranks and dist.get_rank() != 0:
        dist.barrier()  # rank 0 is making it
    try:
        return make()
    finally:
        if ranks and dist.get_rank() == 0:
            dist.barrier()  # made (or failed: the others then try, and fail with the same line)


def entry(patterns, doc_sep: str, tokenizer, unit: str, report=None) -> token_cache.TokenCache:
    """The files' entry of `unit` (token_cache.cached, keyed as every run keys it), built by rank 0 in
    a run of several processes (rank_0_first): the corpus is tokenized once, not once a rank; then
    one report of where it is ("built" or "cached"). `dbert eval` reads its examples from it too."""
    found = rank_0_first(lambda: token_cache.cached(patterns, doc_sep, tokenizer, cache_root(), unit=unit,
                                                    report=report, files=file_prints(patterns)))
    if report is not None:  # a sentence-pack entry's documents are its stories (its heads), not its units
        n = int(np.count_nonzero(found.paragraphs > 0)) if unit == SENTENCE_PACK else len(found)
        report({"stage": "built" if found.built else "cached", "folder": str(found.folder),
                "tokens": int(found.offsets[-1]), "documents": n})
    return found


def _entry(patterns, c: TrainConfig, tokenizer, report, unit: str | None = None):
    """A run's entry of the files (entry): its unit, or `unit` (SENTENCE_PACK)."""
    return entry(patterns, c.doc_sep, tokenizer, unit or c.unit, report)


def stories(c: TrainConfig, tokenizer, report=None) -> StoryData:
    """The run's windows and held-out windows, the documents' statistics and the sampling defaults."""
    entry = _entry(c.data, c, tokenizer, report)
    windows = StoryWindows(entry, c.seq_len, tokenizer.sep_token_id, c.story_context)
    held = None
    if c.val_data:
        val_entry = _entry(c.val_data, c, tokenizer, report)
        held = StoryWindows(val_entry, c.seq_len, tokenizer.sep_token_id, c.story_context)
    train, val = _split(c, windows, held)
    val_stats = val_entry.stats() if held is not None else None
    lengths = entry.lengths
    some = lengths > 0
    sampling = story_defaults.from_counts(lengths[some], entry.firsts())
    return StoryData(train, val, entry.stats(), val_stats, sampling, entry)


def examples(c: TrainConfig, tokenizer, report=None):
    """(train, val, the training files' entry) of a `--unit line` or `--unit sentence` run:
    CachedExamples (PackedExamples with --pack) and the held-out examples as lists; prepare._hold_out's split of the texts, then
    data.tokenize (and data.pack), as before the cache."""
    entry = _entry(c.data, c, tokenizer, report)
    g = torch.Generator().manual_seed(c.seed + 99)  # prepare._hold_out's draws, on example numbers
    if c.val_data:
        val_entry = _entry(c.val_data, c, tokenizer, report)
        keep = torch.randperm(len(val_entry), generator=g)[:c.val_examples].sort().values.numpy()
        train, val = CachedExamples(entry, np.arange(len(entry)), c.seq_len), CachedExamples(val_entry, keep, c.seq_len)
    else:
        held = _held_out(c, len(entry), g)
        mask = np.ones(len(entry), dtype=bool)
        mask[held] = False
        train, val = CachedExamples(entry, np.flatnonzero(mask), c.seq_len), CachedExamples(entry, held, c.seq_len)
    if c.pack:
        return train.packed(tokenizer.sep_token_id), pack(list(val), c.seq_len, tokenizer.sep_token_id), entry
    return train, list(val), entry


def sentence_windows(c: TrainConfig, tokenizer, report=None):
    """(train, val, the training windows' stats, the held-out files' stats or None) of a `--unit
    sentence --pack` run: SentenceWindows of an entry of unit "sentence-pack" (the same windows as
    data.document_windows of the documents' sentences) and the held-out windows as lists;
    prepare._hold_out's split of the windows, as before the cache."""
    entry = _entry(c.data, c, tokenizer, report, SENTENCE_PACK)
    windows = SentenceWindows(entry, c.seq_len, tokenizer.sep_token_id, short=c.short_windows, seed=c.seed)
    held = None
    if c.val_data:
        held = SentenceWindows(_entry(c.val_data, c, tokenizer, report, SENTENCE_PACK), c.seq_len,
                               tokenizer.sep_token_id)
    train, val = _split(c, windows, held)
    return train, val, windows.stats(), held.stats() if held is not None else None


def _split(c: TrainConfig, windows, held):
    """(train, val): with --val-data, every training window and `c.val_examples` of the held-out file's
    windows `held` drawn at random; else prepare._hold_out's split of the training windows (the draws
    on window numbers, as before the cache)."""
    g = torch.Generator().manual_seed(c.seed + 99)
    if held is not None:
        keep = torch.randperm(len(held), generator=g)[:c.val_examples].sort().values.tolist()
        return windows, [held[i] for i in keep]
    out = _held_out(c, len(windows), g).tolist()
    mask = np.ones(len(windows), dtype=bool)
    mask[out] = False
    return windows.select(mask), [windows[i] for i in out]
