"""Evaluation: ELBO perplexity, BLEU-4 / Self-BLEU-4 (the paper's protocol), distinct-n, and
gen-PPL under a causal judge (judge.py).

Perplexity comes from the S-step ELBO (diffusion.elbo), a true upper bound on -log p(x_0):
ppl_token divides the nats by WordPiece tokens, ppl_word by whitespace words of the text
(the paper's 63.78 on LM1B is per word; MDLM/SEDD report per token).

BLEU-4 as NLTK's corpus_bleu([all references], [sample]) without smoothing, computed
exactly but fast: the clipping counts "max over references" are built once, and Self-BLEU's
"max over the other samples" comes from each n-gram's two largest counts.
"""

from __future__ import annotations

import itertools
import math
import re
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable
import numpy as np
import torch

from ..text.contractions import broken_in_text
from ..sampling.blocks import is_story_model
from ..text.data import Special, collate, count_words, iter_encode, scored_tokens
from ..text.sources import SENTENCE_PACK, iter_documents, iter_examples
from ..maths.diffusion import RowDraws, elbo
from .story_metrics import story_report
from ..errors import DbertError

_WORD = re.compile(r"\w+|[^\w\s]")


def words(text: str) -> list[str]:
    """BLEU tokens: lower-cased words and punctuation marks."""
    return _WORD.findall(text.lower())


def ngrams(tokens: list[str], n: int) -> Counter:
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def _closest_length(sorted_lengths: list[int], c: int) -> int:
    """NLTK's closest reference length (ties go to the shorter one)."""
    i = bisect_left(sorted_lengths, c)
    cands = [sorted_lengths[j] for j in (i - 1, i) if 0 <= j < len(sorted_lengths)]
    return min(cands, key=lambda r: (abs(r - c), r))


def _bleu(hyp: list[str], max_counts: list[dict], ref_len: int, max_n: int = 4) -> float:
    if not hyp:
        return 0.0
    logs = []
    for n in range(1, max_n + 1):
        grams = ngrams(hyp, n)
        total = sum(grams.values())
        match = sum(min(c, max_counts[n - 1].get(g, 0)) for g, c in grams.items())
        if n == 1 and match == 0:
            return 0.0
        if total == 0 or match == 0:
            logs.append(math.log(2.2250738585072014e-308))  # NLTK's unsmoothed zero
        else:
            logs.append(math.log(match / total))
    c = len(hyp)
    bp = 1.0 if c > ref_len else math.exp(1 - ref_len / c)
    return bp * math.exp(sum(logs) / max_n)


def bleu(samples: list[str], references: Iterable[str], max_n: int = 4) -> float:
    """Mean over samples of BLEU-4 against all references (the paper's quality metric). The
    references are read once, as they come (a stream of a corpus of gigabytes): of each one's
    n-grams only the samples' own are kept (the clipping counts need no other), and of its length
    only whether a reference has it (the closest length needs no more)."""
    hyps = [words(h) for h in samples]
    wanted = [set().union(*(ngrams(h, n) for h in hyps)) for n in range(1, max_n + 1)]
    max_counts: list[dict] = [{} for _ in range(max_n)]
    lengths: set[int] = set()
    for r in references:
        ref = words(r)
        lengths.add(len(ref))
        for n in range(1, max_n + 1):
            mc, want = max_counts[n - 1], wanted[n - 1]
            for g, c in ngrams(ref, n).items():
                if c > mc.get(g, 0) and g in want:
                    mc[g] = c
    ordered = sorted(lengths)
    scores = [_bleu(h, max_counts, _closest_length(ordered, len(h)), max_n) for h in hyps]
    return sum(scores) / len(scores)


def self_bleu(samples: list[str], max_n: int = 4) -> float:
    """Mean over samples of BLEU-4 of each sample against all the others (lower = more diverse)."""
    toks = [words(s) for s in samples]
    top: list[dict] = [{} for _ in range(max_n)]  # ngram -> [best, second, index of best]
    for i, t in enumerate(toks):
        for n in range(1, max_n + 1):
            d = top[n - 1]
            for g, c in ngrams(t, n).items():
                b = d.setdefault(g, [0, 0, -1])
                if c > b[0]:
                    b[1], b[0], b[2] = b[0], c, i
                elif c > b[1]:
                    b[1] = c
    all_lengths = sorted(len(t) for t in toks)
    scores = []
    for i, h in enumerate(toks):
        others = _Others(top, i)
        lengths = list(all_lengths)
        lengths.pop(bisect_left(lengths, len(h)))
        scores.append(_bleu(h, others, _closest_length(lengths, len(h)), max_n) if lengths else 0.0)
    return sum(scores) / len(scores)


class _Others(list):
    """max_counts view that leaves sample i out: the top count, or the runner-up where i holds it."""

    def __init__(self, top, i):
        super().__init__(_OthersN(d, i) for d in top)


class _OthersN:
    def __init__(self, d, i):
        self.d, self.i = d, i

    def get(self, g, default=0):
        b = self.d.get(g)
        if b is None:
            return default
        return b[1] if b[2] == self.i else b[0]


def distinct_n(samples: list[str], n: int) -> float:
    """Unique n-grams / all n-grams over the samples."""
    grams: Counter[tuple[str, ...]] = Counter()
    for s in samples:
        grams.update(ngrams(words(s), n))
    total = sum(grams.values())
    return len(grams) / total if total else 0.0


def unigram_entropy(samples: list[str]) -> float:
    counts = Counter(w for s in samples for w in words(s))
    total = sum(counts.values())
    return -sum(c / total * math.log(c / total) for c in counts.values()) if total else 0.0


def _longest_run(tokens: list[str]) -> int:
    best = run = 0
    for i, t in enumerate(tokens):
        run = run + 1 if i and t == tokens[i - 1] else 1
        best = max(best, run)
    return best


def _doubled(tokens: list[str]) -> bool:
    return any(a == b and a[0].isalnum() for a, b in zip(tokens, tokens[1:]))


def _repeats(tokens: list[str]) -> bool:
    """A word said twice in a row, across a comma, or in an 'x and x and x' chain: "was was",
    "once, once", "red and red and red"."""
    for i, a in enumerate(tokens):
        if not a[0].isalnum():
            continue
        if tokens[i + 1:i + 2] == [a] or tokens[i + 1:i + 3] == [",", a] or tokens[i + 1:i + 5] == ["and", a, "and", a]:
            return True
    return False


def _starts_sentence(text: str) -> bool:
    """The text begins as a sentence does: a capital letter or a digit, after any opening quote."""
    s = text.lstrip().lstrip("\"'\u201c\u2018(")
    return bool(s) and (s[0].isupper() or s[0].isdigit())


def _quotes_balanced(text: str) -> bool:
    """Every double quote pairs up: an even number, opening ones before closing ones (an opening
    quote has a space or the start before it, a closing one a space, punctuation or the end after)."""
    depth = 0
    for i, ch in enumerate(text):
        if ch != '"':
            continue
        opening = (i == 0 or text[i - 1] in " (\u00b6") and (i + 1 < len(text) and text[i + 1] not in " .,!?")
        if opening and depth == 0:
            depth = 1
        elif not opening and depth == 1:
            depth = 0
        else:
            return False
    return depth == 0


def readability(samples: list[str], min_words: int = 8) -> dict:
    """The first checks a reader makes: length in words, leftover [MASK]/[UNK], one token repeated.

    A word is a whitespace-separated piece with a letter or digit in it ([MASK] and [UNK] are not);
    runs are counted over the BLEU tokens (words and punctuation), so '" " "' is a run of 3 like
    'the the the'; a doubled word is one alphanumeric token twice in a row ("there there");
    "liked it. it was" is not one, but frac_echo_over_punct counts those too (the word is the
    same on both sides of punctuation: "timmy. timmy"). frac_repeat: a word twice in a row,
    across a comma or in an "x and x and x" chain; frac_sentence_start: the sample begins with a
    capital (after any opening quote); frac_quotes_balanced: its double quotes pair up, opening
    before closing; frac_ends_sentence: it ends with . ! ? or a closing quote;
    frac_broken_contraction: it holds a contraction English does not write ("you't", "friends's":
    contractions.py).
    """
    n = max(len(samples), 1)
    lengths = [sum(any(c.isalnum() for c in w) for w in s.replace("[MASK]", " ").replace("[UNK]", " ").split())
               for s in samples]
    toks = [words(s) for s in samples]
    return {
        "words_per_sample": sum(lengths) / n,
        f"frac_over_{min_words}_words": sum(k > min_words for k in lengths) / n,
        "frac_mask_or_unk": sum("[MASK]" in s or "[UNK]" in s for s in samples) / n,
        "frac_run3": sum(_longest_run(t) >= 3 for t in toks) / n,
        "frac_doubled_word": sum(_doubled(t) for t in toks) / n,
        "frac_echo_over_punct": sum(_longest_run([w for w in t if w[0].isalnum()]) >= 2 for t in toks) / n,
        "frac_repeat": sum(_repeats(t) for t in toks) / n,
        "frac_sentence_start": sum(_starts_sentence(s) for s in samples) / n,
        "frac_quotes_balanced": sum(_quotes_balanced(s) for s in samples) / n,
        "frac_ends_sentence": sum(s.rstrip()[-1:] in ('.', '!', '?', '"') for s in samples) / n,
        "frac_broken_contraction": sum(bool(broken_in_text(s)) for s in samples) / n,
    }


def trained_unit(meta: dict) -> tuple[str, str]:
    """The --unit that scores text the way a checkpoint trained on it, and why: its dbert.json's
    `unit` (a story model: whole stories; `--unit sentence --pack`: its windows), "line" where
    it records none (a checkpoint made elsewhere)."""
    unit, pack = meta.get("unit"), bool(meta.get("pack"))
    if unit == "sentence" and pack:
        return "window", "the checkpoint trained on --unit sentence --pack windows"
    if unit in ("line", "sentence", "story"):
        return unit, f"the checkpoint trained with --unit {unit}"
    return "line", "the checkpoint records no training unit"


def _story_windows(db, data: list[str], doc_sep: str, limit: int | None, report=None):
    """(the whole-story windows, each one's words, the documents' statistics) of the files, from their
    token cache entry (a training run's, reused where it read the files with the same --doc-sep)."""
    from ..sampling.settings import window_length
    from ..text.cached_windows import StoryWindows
    from ..training.story_data import entry as cache_entry

    entry = cache_entry(data, doc_sep, db.tokenizer, "story", report)
    context = (db.meta.get("train_config") or {}).get("story_context")
    kept = StoryWindows(entry, window_length(db), db.tokenizer.sep_token_id, context)
    if limit:  # --limit counts stories, each in as many windows as it takes
        kept = kept.select(np.flatnonzero(kept.doc < limit))
    return kept, np.where(kept.at == 0, entry.words[kept.doc], 0).tolist(), entry.stats()  # a story's words count once


def _sentence_windows(db, data: list[str], doc_sep: str, limit: int | None, report=None):
    """(the sentence-start windows of the checkpoint's length, each one's words, the documents'
    statistics): `dbert train --unit sentence --pack`'s windows (data.document_windows), drawn from
    the files' "sentence-pack" entry (a training run's, reused)."""
    from ..sampling.settings import window_length
    from ..text.cached_examples import SentenceWindows
    from ..training.story_data import entry as cache_entry

    kept = SentenceWindows(cache_entry(data, doc_sep, db.tokenizer, SENTENCE_PACK, report), window_length(db),
                           db.tokenizer.sep_token_id)
    if limit:
        kept = kept.select(np.arange(min(limit, len(kept))))
    return kept, kept.words().tolist(), kept.stats()


def _line_examples(db, data: list[str], unit: str, doc_sep: str, limit: int | None, report=None):
    """(the examples, their words, how many were skipped: no ids, or longer than the model) of
    `--unit line` or `sentence`, in the files' order up to --limit. From the files' entry of the unit (a
    training run's, reused; built now without --limit), the examples drawn from it when a batch takes
    them; with --limit and no entry, read and encoded only as far as they are consumed (a --limit over
    a large file tokenizes no more than it needs)."""
    from ..text.cached_examples import CachedExamples
    from ..text.token_cache import cache_key, open_entry
    from ..training.story_data import cache_root, entry as cache_entry, file_prints

    max_len = db.model.max_length
    if not limit or open_entry(cache_root() / cache_key(file_prints(data), db.tokenizer, unit, doc_sep)[0]) is not None:
        entry = cache_entry(data, doc_sep, db.tokenizer, unit, report)  # built now without --limit
        n = entry.lengths
        keep = np.flatnonzero((n > 0) & (n <= max_len))[:limit or None]
        seen = int(keep[-1]) + 1 if limit and len(keep) == limit else len(entry)  # where the old loop stopped
        return CachedExamples(entry, keep, max_len), entry.words[keep].tolist(), seen - len(keep)
    kept: list[list[int]] = []
    kept_words, skipped = [], 0
    texts = iter_examples(data, unit, doc_sep)
    while len(kept) < limit and (part := list(itertools.islice(texts, 4096))):
        for text, ids in zip(part, iter_encode(part, db.tokenizer)):
            if not ids or len(ids) > max_len:
                skipped += 1
                continue
            kept.append(ids)
            kept_words.append(count_words(text))
            if len(kept) >= limit:
                break
    return kept, kept_words, skipped


@torch.no_grad()  # no graph kept: each batch's activations are freed once its bound is summed
def perplexity(db, data: list[str], steps: int = 128, limit: int | None = None, exact: bool = False,
               mc: int = 1, batch_size: int = 32, seed: int = 0, unit: str = "line", examples: bool = False,
               progress=None, doc_sep: str = "auto", report=None) -> dict:
    """ELBO perplexity of a data file's examples under db with an S-step budget; the documents
    (and a line's text: a JSONL line's or a table's "text") read as --doc-sep `doc_sep` says (text.sources).

    examples=True also returns each example's bound in nats and its token count
    ("example_nats", "example_tokens"), for paired comparisons of models on the same data.
    progress: called with (examples scored, examples) before the first batch (0 scored) and after each.
    The examples are drawn from the files' token cache entry, `dbert train`'s (story_data.entry); report hears
    its tokenizing where it is built now, as a training run's callbacks do (on_prepare)."""
    if not 1 <= steps <= db.schedule.T:
        raise DbertError(f"must be between 1 and T={db.schedule.T}, got {steps}", "steps", steps)
    if mc < 1:
        raise DbertError("must be >= 1", "mc_samples")
    skipped, documents = 0, None
    if unit == "story":  # whole documents, in the whole-story windows the checkpoint trained on
        kept, kept_words, documents = _story_windows(db, data, doc_sep, limit, report)
    elif unit == "window":  # the checkpoint's own training windows of the documents: the trainer's validation bound
        kept, kept_words, documents = _sentence_windows(db, data, doc_sep, limit, report)
    else:
        kept, kept_words, skipped = _line_examples(db, data, unit, doc_sep, limit, report)
    if not kept:
        raise DbertError("no example of the data file fits the model's length")
    special = Special.of(db.tokenizer)
    model = db.model
    model.eval()
    per_example = []
    if progress is not None:  # a line before the first batch, which may take minutes (long stories, --exact)
        progress(0, len(kept))
    for i in range(0, len(kept), batch_size):
        batch = kept[i:i + batch_size]
        ids, att, noisable = collate(batch, special, db.device)
        draws = RowDraws(seed, range(i, i + len(batch)))  # each example's draws its own: --batch-size changes nothing
        per_example.append(elbo(model, ids, att, noisable, db.schedule, steps, draws, exact=exact, mc=mc).cpu())
        if progress is not None:
            progress(min(i + batch_size, len(kept)), len(kept))
    nats = torch.cat(per_example)
    n_tok = scored_tokens(kept)  # a story window's padding is not text; its end mark is
    n_words = sum(kept_words)
    total = nats.sum().item()
    se = (nats.var(unbiased=True).item() * len(nats)) ** 0.5 if len(nats) > 1 and not exact else 0.0
    result = {
        "examples": len(kept), "skipped_too_long": skipped, "tokens": n_tok, "words": n_words,
        "steps": steps, "T": db.schedule.T, "exact": exact, "mc_samples": None if exact else mc,
        "nats_per_token": total / n_tok, "nats_per_token_se": se / n_tok,
        "ppl_token": math.exp(total / n_tok), "ppl_word": math.exp(total / n_words),
        "nats_per_word": total / n_words, "nats_per_word_se": se / n_words,
    }
    if documents is not None:  # what a user checks first: were the documents read as documents?
        result.update(documents=documents.count, document_words_median=documents.median_words,
                      document_words_longest=documents.longest_words)
        warning = documents.warning(doc_sep)  # as `dbert train` warns: boundaries that look wrong
        if warning:
            result["documents_warning"] = warning
    if examples:
        result.update(example_nats=[round(v, 4) for v in nats.tolist()], example_tokens=[scored_tokens([e]) for e in kept])
    return result


def quality(db, data: list[str], n: int, steps: int | None = 128, length: int = 64, top_k: int | None = None,
            top_p: float | None = None, batch_size: int = 32, seed: int = 0, unit: str = "line", sampler: str | None = None,
            block_repeats: bool = True, params: dict | None = None, temperature: float | None = None,
            judge=None, texts: dict | None = None, on_frame=None, pair_quotes: bool = True,
            fix_contractions: bool = True, known_words: bool = True, doc_sep: str = "auto") -> dict:
    """The paper's protocol: n samples for BLEU-4 against the data, n more for Self-BLEU-4
    (on_frame: called with the frames of both runs a progress line needs: generate(every_frame=False)).

    steps, temperature, top_k, top_p: None: the checkpoint's recommendation (settings.default_decoding), as `dbert sample`.
    sampler and params: the decoding strategy (strategies.py). judge (a judge.Judge or the name
    of a causal LM): also the first n samples' gen-PPL and entropy under it, and the same for n
    pieces of the data of the samples' mean length in words ("human_"). texts: a dict that
    receives the samples ("first", "second") and the human pieces, for whoever keeps them."""
    from ..config import SampleConfig
    from ..sampling.sample import generate, resolve
    from ..strategies import get

    cfg = resolve(SampleConfig(n=n, steps=steps, length=length, top_k=top_k, top_p=top_p, batch_size=batch_size,
                               seed=seed, sampler=sampler, block_repeats=block_repeats, params=params,
                               temperature=temperature, pair_quotes=pair_quotes,
                               fix_contractions=fix_contractions, known_words=known_words), db)
    assert cfg.sampler is not None  # resolve fills it in
    sampler = cfg.sampler
    def refs():  # the references, streamed from the files each time they are read (never a list of the corpus)
        if unit == "story":  # whole documents: the samples are stories too
            return (" ".join(d) for d in iter_documents(data, doc_sep))
        return iter_examples(data, "sentence" if unit == "window" else unit, doc_sep)  # windows: their sentences

    next(iter(refs()), None)  # a missing or unreadable file: its line before the sampling, not after
    first, st1 = generate(db, cfg, on_frame, paragraph=" ", every_frame=False)  # on_frame: a progress line
    second, st2 = generate(db, cfg, on_frame, seed=seed + 1, paragraph=" ", every_frame=False)
    out = {
        "samples": n, "sample_steps": cfg.steps, "sample_length": length, "top_k": cfg.top_k, "top_p": cfg.top_p, "sampler": sampler,
        "sampler_exact": get(sampler).exact, "params": cfg.params, "temperature": cfg.temperature,
        "block_repeats": block_repeats, "pair_quotes": pair_quotes, "fix_contractions": fix_contractions,
        "known_words": known_words, "bleu4": bleu(first, refs()), "self_bleu4": self_bleu(second),
        "distinct1": distinct_n(first, 1), "distinct2": distinct_n(first, 2), "distinct3": distinct_n(first, 3),
        "unigram_entropy": unigram_entropy(first), **readability(first),
        "nfe_per_sample": (st1["nfe"] + st2["nfe"]) / (st1["batches"] + st2["batches"]),  # calls each batch made
        "rows_per_sample": (st1["rows"] + st2["rows"]) / (2 * n),  # calls that evaluated each sample's row
        "seconds_per_sample": (st1["seconds"] + st2["seconds"]) / (2 * n),
    }
    if is_story_model(db) or unit == "story":  # one story a sample? its length, its names, as the held-out stories'
        stories = refs() if unit == "story" else (" ".join(d) for d in iter_documents(data, doc_sep))
        out.update(story_report(first, stories))
    if texts is not None:
        texts.update(first=first, second=second)
    if judge is not None:
        out.update(judged(judge, first, refs(), out["words_per_sample"], db.device, texts))
    return out


def judged(judge, samples: list[str], references: list[str], words: float, device="cpu",
           texts: dict | None = None) -> dict:
    """samples' gen-PPL and entropy under judge (a judge.Judge or the name of a causal LM), and the
    same for as many pieces of the references of `words` words each ("human_"); texts receives
    the human pieces ("human"). quality() calls it; a study can call it again on kept samples
    to score them under another judge without drawing them again."""
    from .judge import Judge, human_chunks

    if not isinstance(judge, Judge):
        judge = Judge(judge, device)
    mine = judge.score(samples)
    human = human_chunks(references, len(samples), words)
    theirs = judge.score(human)
    if texts is not None:
        texts.update(human=human)
    return dict(judge=judge.name, gen_ppl=mine["gen_ppl"], log_gen_ppl_se=mine["log_gen_ppl_se"],
                judge_entropy=mine["entropy"], judge_tokens_per_sample=mine["judge_tokens_per_text"],
                human_texts=len(human), human_gen_ppl=theirs["gen_ppl"], human_judge_entropy=theirs["entropy"],
                human_unigram_entropy=unigram_entropy(human))
