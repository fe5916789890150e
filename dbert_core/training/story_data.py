"""A `--unit story` run's data from the token cache: windows, held-out split, statistics, defaults.

What prepare.py made from lists of the whole corpus (read_documents, encode_stories, _hold_out,
DocumentStats.of, story_defaults.recommend), made from the cache's arrays instead
(text/token_cache.py, text/cached_windows.py): the same windows, the same split for a seed
(the same torch.randperm draws), the same counts, with the corpus tokenized once per
(files, tokenizer) and kept on disk. `report` hears the tokenization's progress.
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
from ..text.cached_windows import StoryWindows
from ..text.data import DocumentStats, fingerprints
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
    """The first n stories' texts (what a preset's tokenizer is learnt from), read no further."""
    from ..text.sources import iter_documents

    return [" ".join(d) for d in itertools.islice(iter_documents(c.data, c.doc_sep), n)]


@dataclass
class StoryData:
    train: StoryWindows
    val: list
    stats: DocumentStats
    val_stats: DocumentStats | None
    sampling: dict
    cache: token_cache.TokenCache


def _entry(patterns, c: TrainConfig, tokenizer, report):
    entry = token_cache.cached(patterns, c.doc_sep, tokenizer, cache_root(), unit="story", report=report,
                               files=file_prints(patterns))
    if report is not None:
        report({"stage": "built" if entry.built else "cached", "folder": str(entry.folder),
                "tokens": int(entry.offsets[-1]), "documents": len(entry)})
    return entry


def stories(c: TrainConfig, tokenizer, report=None) -> StoryData:
    """The run's windows and held-out windows, the documents' statistics and the sampling defaults."""
    entry = _entry(c.data, c, tokenizer, report)
    windows = StoryWindows(entry, c.seq_len, tokenizer.sep_token_id, c.story_context)
    g = torch.Generator().manual_seed(c.seed + 99)  # prepare._hold_out's draws, on window numbers
    val_stats = None
    if c.val_data:
        val_entry = _entry(c.val_data, c, tokenizer, report)
        held = StoryWindows(val_entry, c.seq_len, tokenizer.sep_token_id, c.story_context)
        keep = torch.randperm(len(held), generator=g)[:c.val_examples].sort().values.tolist()
        train, val, val_stats = windows, [held[i] for i in keep], val_entry.stats()
    else:
        n_val = min(c.val_examples, max(1, len(windows) // 20))
        perm = torch.randperm(len(windows), generator=g)
        out = sorted(perm[:n_val].tolist())
        mask = np.ones(len(windows), dtype=bool)
        mask[out] = False
        train, val = windows.select(np.flatnonzero(mask)), [windows[i] for i in out]
    lengths = entry.lengths
    some = lengths > 0
    sampling = story_defaults.from_counts(lengths[some], entry.firsts())
    return StoryData(train, val, entry.stats(), val_stats, sampling, entry)
