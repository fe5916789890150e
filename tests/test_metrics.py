"""BLEU-4 and Self-BLEU-4 equal NLTK's corpus_bleu computed the slow way; distinct-n; perplexity."""

import math

import pytest
import torch

from dbert_core.evaluation.metrics import bleu, distinct_n, perplexity, self_bleu, words
from helpers import TINYSTORIES_VALID

nltk_bleu = pytest.importorskip("nltk.translate.bleu_score")

REFS = [
    "the cat sat on the mat .",
    "a dog ran in the park and the cat sat down .",
    "there is a cat on the mat today .",
    "the children played in the park all day long .",
    "she said the cat was very happy .",
]
HYPS = [
    "the cat sat on the mat today .",
    "the dog played in the park .",
    "a cat was on the mat and the dog ran .",
    "children played all day .",
    "completely unrelated words here",
]


def nltk_one(hyp, refs):
    return nltk_bleu.corpus_bleu([[words(r) for r in refs]], [words(hyp)])


def test_bleu_matches_nltk():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = sum(nltk_one(h, REFS) for h in HYPS) / len(HYPS)
    assert bleu(HYPS, REFS) == pytest.approx(expected, abs=1e-9)
    assert bleu([REFS[0]], REFS) == pytest.approx(1.0)


def test_self_bleu_matches_nltk():
    import warnings

    samples = HYPS + REFS
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = sum(nltk_one(s, samples[:i] + samples[i + 1:]) for i, s in enumerate(samples)) / len(samples)
    assert self_bleu(samples) == pytest.approx(expected, abs=1e-9)
    assert self_bleu(["the same sentence here .", "the same sentence here ."]) == pytest.approx(1.0)


def test_distinct_n():
    assert distinct_n(["a b c", "a b d"], 1) == pytest.approx(4 / 6)
    assert distinct_n(["a b c", "a b d"], 2) == pytest.approx(3 / 4)


def test_perplexity_word_and_token(tiny_db):
    r = perplexity(tiny_db, [str(TINYSTORIES_VALID)], steps=16, limit=30, unit="sentence", mc=2)
    assert r["examples"] == 30 and r["tokens"] > r["words"] > 0
    assert math.log(r["ppl_word"]) == pytest.approx(math.log(r["ppl_token"]) * r["tokens"] / r["words"])
    assert r["nats_per_token_se"] > 0
    exact = perplexity(tiny_db, [str(TINYSTORIES_VALID)], steps=16, limit=30, unit="sentence", exact=True)
    # the MC estimate lies within a few standard errors of the full sum
    assert abs(exact["nats_per_token"] - r["nats_per_token"]) < 5 * r["nats_per_token_se"] + 0.05
    kept = perplexity(tiny_db, [str(TINYSTORIES_VALID)], steps=16, limit=30, unit="sentence", mc=2, examples=True)
    assert len(kept["example_nats"]) == len(kept["example_tokens"]) == 30 and sum(kept["example_tokens"]) == r["tokens"]
    assert sum(kept["example_nats"]) / r["tokens"] == pytest.approx(r["nats_per_token"], abs=1e-3)  # same seed, same draws
    assert "example_nats" not in r


def test_a_bound_does_not_depend_on_the_batch_size(tiny_db):
    """Each example draws its own steps and masks: batches of 3 (less padding, other neighbours)
    and of 32 give every example the same bound, as --exact and as Monte-Carlo draws."""
    for kw in (dict(mc=2), dict(exact=True)):
        small = perplexity(tiny_db, [str(TINYSTORIES_VALID)], steps=16, limit=20, unit="sentence", batch_size=3,
                           examples=True, **kw)
        large = perplexity(tiny_db, [str(TINYSTORIES_VALID)], steps=16, limit=20, unit="sentence", batch_size=32,
                           examples=True, **kw)
        assert small["example_nats"] == pytest.approx(large["example_nats"], abs=2e-3), kw
        other = perplexity(tiny_db, [str(TINYSTORIES_VALID)], steps=16, limit=20, unit="sentence", batch_size=3,
                           examples=True, seed=1, **kw)
        assert other["example_nats"] != pytest.approx(small["example_nats"], abs=2e-3)  # the seed still counts


def test_readability_counts_what_a_reader_checks_first():
    from dbert_core.evaluation.metrics import readability

    r = readability([
        "the cat sat on the mat near the old red door .",   # 11 words, clean
        "he was born [UNK] in 1990 in paris , france today", # 9 words and an [UNK]
        "the the the river",                                  # a run of 3, a doubled word
        'it was " " " released , again and again',           # a punctuation run, no doubled word
        "she liked it . it was fun",                         # no doubled word, an echo over "."
    ])
    assert r["words_per_sample"] == pytest.approx((11 + 9 + 4 + 6 + 6) / 5)
    assert r["frac_over_8_words"] == pytest.approx(2 / 5)
    assert r["frac_mask_or_unk"] == pytest.approx(1 / 5)
    assert r["frac_run3"] == pytest.approx(2 / 5)
    assert r["frac_doubled_word"] == pytest.approx(1 / 5)
    assert r["frac_echo_over_punct"] == pytest.approx(2 / 5)
    assert readability([])["frac_run3"] == 0


def test_perplexity_keeps_no_autograd_graph_of_the_batches_it_scored(tiny_db, monkeypatch):
    """The bound of each batch is summed without a graph: with one, every scored batch's activations
    stayed alive to the end (about 45 MB an example for the shipped model at batch 1, 13 GB on
    valid.txt's sentences at batch 64), so dbert eval's memory grew with --limit."""
    from dbert_core.evaluation import metrics

    grads, real = [], metrics.elbo

    def watched(*a, **k):
        grads.append(torch.is_grad_enabled())
        out = real(*a, **k)
        grads.append(out.requires_grad)
        return out

    monkeypatch.setattr(metrics, "elbo", watched)
    perplexity(tiny_db, [str(TINYSTORIES_VALID)], steps=8, limit=6, unit="sentence", batch_size=2)
    assert len(grads) == 6 and not any(grads)


def test_bleu_reads_its_references_once_as_a_stream():
    """The references may be a generator (a corpus streamed from disk): read once, the same BLEU as
    the list's (and NLTK's, above), whatever n-grams of theirs no sample holds."""
    many = REFS + [f"word{i} filler{i} more{i} text{i} ." for i in range(500)]
    reads = []

    def stream():
        for r in many:
            reads.append(r)
            yield r

    assert bleu(HYPS, stream()) == pytest.approx(bleu(HYPS, list(many)), abs=1e-12) and len(reads) == len(many)
    assert bleu(["word7 filler7 more7 text7 ."], stream()) == pytest.approx(1.0)


@pytest.mark.parametrize("unit", ["story", "sentence"])
def test_quality_streams_its_references_and_scores_as_the_lists_did(tiny_db, tmp_path, monkeypatch, unit):
    """dbert eval --samples: BLEU-4 and the human_ story measures from references streamed from the
    file, none read whole (a corpus of gigabytes), the same figures as the lists of before."""
    from dbert_core.evaluation import metrics, story_metrics
    from dbert_core.text import data as data_module
    from dbert_core.text.data import read_documents, read_examples, story_texts

    data = tmp_path / "stories.txt"
    data.write_text("\n\n".join(TINYSTORIES_VALID.read_text(encoding="utf-8").split("\n")[:60]), encoding="utf-8")
    texts: dict = {}
    kw = dict(n=3, steps=4, length=24, batch_size=3, seed=5, unit=unit, texts=texts)
    refs = story_texts(read_documents([str(data)])) if unit == "story" else read_examples([str(data)], unit)
    stories = story_texts(read_documents([str(data)]))

    def whole(*a, **k):
        raise AssertionError("a data file read whole")

    monkeypatch.setattr(data_module, "read_documents", whole)
    monkeypatch.setattr(data_module, "_file_lines", whole)
    got = metrics.quality(tiny_db, [str(data)], **kw)
    assert got["bleu4"] == bleu(texts["first"], refs)
    if unit != "story":  # a line model's samples: no story measures
        return
    human = {k: v for k, v in story_metrics.story_report(texts["first"], stories).items() if k.startswith("human_")}
    assert human and all(got[k] == v for k, v in human.items())
    assert human["human_words_median"] == story_metrics.quartiles([len(s.split()) for s in stories])[1]
