"""The contraction touch-up (contractions.py, touchup.py): contractions English does not write are
found in pieces and in printed text, masked again and refilled without apostrophes, inside the run."""

from dataclasses import replace

import pytest
import torch

from dbert_core.text.contractions import apostrophe_ids, broken, broken_in_text, broken_positions, valid
from dbert_core.evaluation.metrics import readability
from dbert_core.sampling.sample import _reverse, frames
from dbert_core.sampling.settings import config
from dbert_core.sampling.touchup import touch_up

from helpers import DATA


@pytest.mark.parametrize("text", ["don't", "Can't", "won't", "I'm", "you're", "they'll", "we've", "he'd", "it's",
                                  "let's", "Lily's", "boss's", "octopus's", "there's", "who'd"])
def test_what_english_writes_is_valid(text):
    word, suffix = text.split("'")
    assert valid(word, suffix) and broken_in_text(f"She said {text} twice.") == []


@pytest.mark.parametrize("text", ["you't", "I's", "we'm", "friends're", "does't", "friends's", "don's", "lily't",
                                  "said't", "her's", "they't"])
def test_what_the_model_joins_wrongly_is_broken(text):
    word, suffix = text.split("'")
    assert not valid(word, suffix) and broken_in_text(f"She said {text} twice.") == [text]


def test_a_negated_stem_needs_its_t():
    assert broken_in_text('But don \'that know. I didn\'t go. "Don\'t!"') == ["don '"]
    assert broken(["don", "'", "that"]) == [range(0, 2)]
    assert broken(["didn", "'", "t"]) == [] and broken(["can", "'", "go"]) == []  # "can" is a word


def test_broken_pieces_cover_the_whole_word():
    assert broken(["the", "fri", "##ends", "'", "s", "ball"]) == [range(1, 5)]
    assert broken(["you", "'", "t", "go"]) == [range(0, 3)]
    assert broken(["lily", "'", "s", "ball"]) == []
    assert broken([",", "'", "s"]) == []                       # no word before the apostrophe
    assert broken(["you", "'", "s", "##ay"]) == []             # 'say: a word, not a suffix
    assert broken(["you", "'", "[MASK]"], [False, False, True]) == []  # not written yet


def test_a_suffix_after_no_word_is_broken():
    """Two of 300 default stories opened a quotation with `"'M just glad`: an apostrophe after the
    quote and a suffix no English writes alone. A single quote before a word stays."""
    assert broken(['"', "'", "m", "just"]) == [range(1, 3)]
    assert broken(["[SEP]", "'", "ll", "go"]) == [range(1, 3)]
    assert broken(['"', "'", "t", "##is"]) == []                 # 'tis: a word
    assert broken(['"', "'", "hello", "'"]) == []                # a quotation in single quotes
    assert broken([",", "'", "s"]) == []                         # 's alone may be the letter
    assert broken(['"', "'", "m", "[MASK]"], [False] * 3 + [True]) == []  # its word not written yet
    assert broken_in_text('The man smiled. "\'M just glad," he said. "I\'m glad." \'Tis so.') == ["'M"]


def test_the_rule_accepts_what_the_training_text_writes():
    """On TinyStories' train.txt every contraction and possessive but one ("James's") is valid."""
    path = DATA / "tinystories" / "train.txt"
    if not path.exists():
        pytest.skip("the shared corpus is not here")
    assert broken_in_text(path.read_text(encoding="utf-8")) == ["James's"]


def test_readability_counts_broken_contractions():
    r = readability(["You don's worry, she said today.", "It's Lily's ball and they're happy now."])
    assert r["frac_broken_contraction"] == 0.5


def _ids(db, *pieces):
    return torch.tensor([db.tokenizer.backend_tokenizer.token_to_id(p) for p in pieces])


def test_a_prompts_own_apostrophe_stays(tiny_db):
    ids = _ids(tiny_db, "you", "'", "t", "go").unsqueeze(0)
    free = torch.tensor([[False, False, True, True]])
    assert not broken_positions(tiny_db, ids, free).any()
    free = torch.tensor([[False, True, True, True]])
    assert broken_positions(tiny_db, ids, free).tolist() == [[False, True, True, False]]


@torch.inference_mode()
def test_touch_up_refills_broken_contractions_inside_the_run(tiny_db):
    cfg = config(tiny_db, None, {"n": 4, "length": 16, "steps": 16, "pair_quotes": False})
    raw = list(frames(tiny_db, cfg, generator=torch.Generator().manual_seed(0)))
    x = raw[-1].ids.clone()
    x[0, 3:6] = _ids(tiny_db, "you", "'", "t")
    x[1, 8:11] = _ids(tiny_db, "don", "'", "that")
    final = replace(raw[-1], ids=x)
    free = torch.ones_like(x, dtype=torch.bool)
    before = broken_positions(tiny_db, x, free)
    assert before.nonzero().tolist() == [[0, 3], [0, 4], [0, 5], [1, 8], [1, 9]]
    out = list(touch_up(_reverse, tiny_db, cfg, torch.Generator().manual_seed(1), final, free))
    assert out[0].ids is final.ids or torch.equal(out[0].ids, x)
    assert torch.equal(out[1].remasked, before) and torch.equal(out[1].masked, before)
    assert all(f.touch_up for f in out[:-1]) and out[-1].done and not out[-1].masked.any()
    last = out[-1]
    assert not broken_positions(tiny_db, last.ids, free).any()
    assert torch.equal(last.ids[~before], x[~before])            # only the broken pieces changed
    assert not torch.isin(last.ids[before], torch.tensor(apostrophe_ids(tiny_db.tokenizer))).any()
    assert last.nfe > final.nfe


def test_nothing_to_fix_draws_nothing_more(tiny_db):
    """The tiny model writes no contraction: with the touch-up on or off, the same run."""
    kw = {"n": 16, "length": 16, "steps": 16, "pair_quotes": False, "known_words": False}
    a = list(frames(tiny_db, generator=torch.Generator().manual_seed(2), fix_contractions=False, **kw))
    b = list(frames(tiny_db, generator=torch.Generator().manual_seed(2), **kw))
    assert not broken_positions(tiny_db, a[-1].ids, torch.ones_like(a[-1].masked)).any()
    assert torch.equal(a[-1].ids, b[-1].ids) and a[-1].nfe == b[-1].nfe


def test_cli_takes_raw_contractions(tiny_checkpoint):
    from typer.testing import CliRunner

    from dbert_core.cli import app

    args = ["sample", "--checkpoint", str(tiny_checkpoint), "--n", "4", "--seed", "4", "--length", "16",
            "--steps", "16"]
    raw = CliRunner().invoke(app, args + ["--raw-contractions"])
    fixed = CliRunner().invoke(app, args + ["--fix-contractions"])
    assert raw.exit_code == 0 and fixed.exit_code == 0 and raw.stdout.count("\n") == 4
