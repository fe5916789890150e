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
The export may add `decoding` ({steps, top_k, top_p, cache_refresh}: the decoding measured best for the
checkpoint, not learnt from its data; scripts/export_default.py --steps/--top-k/--top-p/--cache-refresh), which settings.default_decoding
reads.
"""

from __future__ import annotations

from collections import Counter

OPENING_SHARE = 0.001  # a token opens at least this share of the training stories to be an opening
SHORTEST_PERCENTILE = 1.0


def recommend(stories: list[list[int]]) -> dict:
    """{min_length, openings} from the training stories' token ids (empty stories skipped)."""
    stories = [s for s in stories if s]
    return from_counts([len(s) for s in stories], [s[0] for s in stories])


def from_counts(lengths: list[int], firsts: list[int]) -> dict:
    """recommend() from each non-empty story's length and first token (what a token cache holds)."""
    if not lengths:
        return {}
    lengths = sorted(lengths)
    at = min(len(lengths) - 1, int(len(lengths) * SHORTEST_PERCENTILE / 100))
    first = Counter(firsts)
    least = max(2, -(-len(lengths) * OPENING_SHARE // 1))
    openings = sorted(int(t) for t, k in first.items() if k >= least)
    return {"min_length": int(lengths[at]), "openings": openings,
            "from_stories": len(lengths), "openings_cover": round(sum(first[t] for t in openings) / len(lengths), 4)}


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

