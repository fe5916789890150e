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

from collections import Counter

OPENING_SHARE = 0.001  # a token opens at least this share of the training stories to be an opening
SHORTEST_PERCENTILE = 1.0


def recommend(stories: list[list[int]]) -> dict:
    """{min_length, openings} from the training stories' token ids (empty stories skipped)."""
    stories = [s for s in stories if s]
    if not stories:
        return {}
    lengths = sorted(len(s) for s in stories)
    at = min(len(lengths) - 1, int(len(lengths) * SHORTEST_PERCENTILE / 100))
    first = Counter(s[0] for s in stories)
    least = max(2, -(-len(stories) * OPENING_SHARE // 1))
    openings = sorted(int(t) for t, k in first.items() if k >= least)
    return {"min_length": int(lengths[at]), "openings": openings,
            "from_stories": len(stories), "openings_cover": round(sum(first[t] for t in openings) / len(stories), 4)}


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

