"""Made-up words: the training text's multi-piece words kept in the checkpoint (text/lexicon.py) and
the touch-up that refills the words a sample spells from pieces no text joins."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch

from dbert_core.errors import DbertError
from dbert_core.text import lexicon
from dbert_core.text.tokenizer import WordPieceTokenizer

PIECES = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "the", "little", "bird", "tw", "##ir", "##l", "##ed",
          "##wi", "##s", "star", "##or", "cafe"]


def tokenizer():
    return WordPieceTokenizer.from_vocab({p: i for i, p in enumerate(PIECES)})


def test_learn_keeps_the_training_words_as_the_tokenizer_spells_them():
    words = lexicon.learn(["The little bird twirled.", "Stars! The CAFÉ twirls"], tokenizer())
    assert words == {"the", "little", "bird", "twirled", "twirls", "stars", "cafe"}  # uncased, accents stripped


def test_word_runs_of_arrays_added_in_pieces_are_the_words_lexicon_learns():
    """learnt_tables.WordRuns (the word list from a token cache entry's ids, arrays one after
    another, each distinct run spelt once at the end) = lexicon.learn of the same lines: runs with
    an [UNK] left out, single pieces counted apart from longer runs, runs too long to pack (12 pieces
    of 18 ids: 60 bits, the last that packs; 13 do not) and longer than lexicon._MAX_WORD."""
    from dbert_core.text.learnt_tables import WordRuns, _encoded

    tok = tokenizer()
    lines = ["The little bird twirled.", "Stars! The CAFÉ twirls", "the twirlstwirled bird", "x little",
             "the " + "tw" + "wis" * 11, "the " + "tw" + "wis" * 12, "tw" + "wis" * 70, "starors the"]
    runs = WordRuns(tok)
    for i in range(0, len(lines), 3):
        runs.add(_encoded(lines[i:i + 3], tok))
    assert runs.words() == lexicon.learn(lines, tok)
    assert "tw" + "wis" * 12 in runs.words() and "tw" + "wis" * 70 not in runs.words()
    assert not any("x" in w for w in runs.words())  # "x" is no piece: an [UNK] run spells no word
    empty = WordRuns(tok)
    empty.add([])
    assert empty.words() == frozenset()


def test_made_up_spans():
    words = frozenset({"twirled", "the", "little", "star", "bird", "go", "she"})
    row = ["[SEP]", "the", "tw", "##ir", "##l", "##ed", "little", "##wi", ".", "##s", "star", "##or", "[SEP]", "tw"]
    assert lexicon.made_up(row, words) == [(6, 8), (9, 10), (10, 12), (13, 14)]  # "tw" alone is no word
    assert lexicon.made_up(["##ed", "bird"], words) == [(0, 1)]  # a continuation that opens the row
    assert lexicon.made_up(["the", "bird", ".", "[SEP]"], words) == []
    stems, marks = frozenset({"didn"}), ("'",)
    words |= {"didn", "t"}  # "didn't": the training text's pre-tokens
    assert lexicon.made_up(["she", "didn", "go", "."], words, stems, marks) == [(1, 2)]  # "didn" needs its 't
    assert lexicon.made_up(["she", "didn", "'", "t", "go"], words, stems, marks) == []


def test_training_keeps_the_words_and_a_bad_list_is_one_line(tmp_path):
    from dbert_core.disk.layout import WORDS
    from dbert_core.storage import checkpoint
    from helpers import train_tiny

    run = train_tiny(tmp_path / "run", words=True, max_steps=2)
    db = checkpoint.load(run)
    from dbert_core.text.truecase import key

    text = key(open(db.meta["train_config"]["data"][0], encoding="utf-8").read())  # as the uncased tokenizer reads it
    assert len(db.words) > 1000 and {"once", "upon", "time"} <= db.words  # learnt from the training text
    assert all(w in text for w in sorted(db.words)[::100])
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    (copy / WORDS).write_text(json.dumps({"format": 1, "words": [3]}))
    with pytest.raises(DbertError, match="dbert_words.json is not valid"):
        checkpoint.load(copy)
    (copy / WORDS).unlink()
    assert checkpoint.load(copy).words is None  # an older checkpoint: no check


def test_the_touch_up_refills_made_up_words(tiny_db):
    """The tiny model spells many words its training text never writes: the touch-up refills them
    (more calls, far fewer made-up words than the same draws without it)."""
    from dbert_core.sampling.sample import frames

    from dbert_core.text.data import read_lines

    db = dataclasses.replace(tiny_db, words=lexicon.learn(read_lines(tiny_db.meta["train_config"]["data"]), tiny_db.tokenizer))
    kw = {"n": 16, "length": 24, "steps": 16, "pair_quotes": False, "fix_contractions": False}

    def count(ids):
        return sum(len(lexicon.made_up(db.tokenizer.convert_ids_to_tokens(r), db.words)) for r in ids.tolist())

    off = list(frames(db, generator=torch.Generator().manual_seed(5), known_words=False, **kw))[-1]
    on = list(frames(db, generator=torch.Generator().manual_seed(5), **kw))[-1]
    assert count(off.ids) >= 3
    assert count(on.ids) < count(off.ids) / 2 and on.nfe > off.nfe
