"""What a story checkpoint recommends to its sampler, learnt from its training stories.

A run with `--unit story` writes `sampling` into dbert.json (prepare.py; scripts/export_default.py
for a checkpoint trained before this existed):

    min_length   the shortest story it writes, in tokens: the 1st percentile of its training
                 stories' lengths (`dbert sample --min-length`), so a sample does not stop after
                 ten words where almost no story it learnt from does;
    openings     the token ids that open at least OPENING_SHARE of its training stories (and at
                 least two): a story's first token is drawn among them (`--start-as-trained`),
                 so no sample opens with "And once upon a time" or "But".

sampling/settings.py reads them; a checkpoint without them samples with neither rule's data.
The export may add `decoding` ({steps, temperature, top_k, top_p, cache_refresh, cache_masked}: the decoding measured best for the
checkpoint, not learnt from its data; scripts/export_default.py --steps/--top-k/--top-p/--cache-refresh), which settings.default_decoding
reads.
"""

from __future__ import annotations


OPENING_SHARE = 0.001  # a token opens at least this share of the training stories to be an opening
SHORTEST_PERCENTILE = 1.0


def recommend(stories: list[list[int]]) -> dict:
    """{min_length, openings} from the training stories' token ids (empty stories skipped)."""
    stories = [s for s in stories if s]
    return from_counts([len(s) for s in stories], [s[0] for s in stories])


def from_counts(lengths, firsts) -> dict:
    """recommend() from each non-empty story's length and first token (what a token cache holds:
    arrays, counted with numpy, no list of the stories)."""
    import numpy as np

    lengths, firsts = np.asarray(lengths, dtype=np.int64), np.asarray(firsts, dtype=np.int64)
    n = len(lengths)
    if not n:
        return {}
    at = min(n - 1, int(n * SHORTEST_PERCENTILE / 100))
    shortest = int(np.partition(lengths, at)[at])  # the at-th of the lengths sorted
    ids, seen = np.unique(firsts, return_counts=True)
    least = max(2, -(-n * OPENING_SHARE // 1))
    common = seen >= least
    return {"min_length": shortest, "openings": [int(t) for t in ids[common]],
            "from_stories": n, "openings_cover": round(int(seen[common].sum()) / n, 4)}


def from_files(paths: list[str], tokenizer, sep: str = "auto") -> dict:
    """recommend() for the stories of training files, read and tokenized as `--unit story` does."""
    from ..text.data import encode, read_documents, story_texts

    return recommend(encode(story_texts(read_documents(paths, sep)), tokenizer))


def of_run(meta: dict, tokenizer) -> dict:
    """A story run's sampling defaults: the ones its dbert.json records (`meta["sampling"]`), else,
    for a run from before runs recorded them, from_files() on the training files it names."""
    if "sampling" in meta:
        return meta["sampling"]
    sep = (meta.get("train_config") or {}).get("doc_sep", "auto")
    return from_files(list(meta.get("data") or []), tokenizer, sep)

