"""--hide-end-padding: a visible [SEP] after a [SEP] is no key (maths/end_padding.py), so a sampler
leaves a story's decided end out of the forward without changing any output it reads."""

from __future__ import annotations

import pytest
import re
import torch

from dbert_core.errors import DbertError
from dbert_core.maths.end_padding import crop_length, hidden_keys, length_groups, needed_lengths
from helpers import cli_words, run, train_stories


def test_only_padding_after_an_end_is_hidden():
    C, S, M = 1, 2, 9
    ids = torch.tensor([[C, S, 5, 6, S, S, S, S],    # start, story, end, padding, the window's closing [SEP]
                        [C, S, 5, M, S, M, S, S],    # a [SEP] beside a [MASK] is seen; the last after a [SEP] not
                        [C, S, 5, 6, 7, 8, 9, S]])   # no end yet
    hidden = hidden_keys(ids, S)
    assert hidden.tolist() == [[False, False, False, False, False, True, True, True],
                               [False, False, False, False, False, False, False, True],
                               [False] * 8]
    none = torch.zeros_like(hidden)
    assert crop_length(hidden, none) == 8  # row 3 has no decided end: nothing can go
    assert crop_length(hidden[:2], none[:2]) == 7
    assert crop_length(hidden[:1], none[:1]) == 5  # [CLS] [SEP] story and its end
    sel = none[:1].clone()
    sel[0, 6] = True  # a position someone reads is kept, with everything before it
    assert crop_length(hidden[:1], sel) == 7
    assert needed_lengths(hidden, none).tolist() == [5, 7, 8]


def test_rows_go_in_groups_of_like_length():
    assert length_groups([100, 250, 240, 90], overhead=64) == [[1, 2], [0, 3]]
    assert length_groups([100, 250, 240, 90], overhead=10_000) == [[0, 1, 2, 3]]  # a call dearer than any crop
    assert length_groups([100, 250, 240, 90], overhead=0) == [[1], [2], [0], [3]]
    assert length_groups([7]) == [[0]]


@pytest.fixture(scope="module")
def hiding_model(tmp_path_factory):
    """A tiny story model trained with --hide-end-padding for a few steps."""
    return train_stories(tmp_path_factory.mktemp("hide"), max_steps=3, hide_end_padding=True)


def test_the_checkpoint_records_it_and_padding_changes_nothing(hiding_model):
    """Recorded in dbert.json and restored on load; what a hidden position holds, or whether it is
    there at all, changes no logit of the positions before it (with it seen, it would)."""
    db = hiding_model
    assert db.meta["end_padding"] == "hidden" and db.model.hide_end_padding
    C, S, M = db.tokenizer.cls_token_id, db.tokenizer.sep_token_id, db.tokenizer.mask_token_id
    g = torch.Generator().manual_seed(0)
    V = db.model.config.vocab_size
    words = torch.randint(max(C, S, M) + 1, V, (3, 10), generator=g)
    ids = torch.cat([torch.full((3, 1), C), torch.full((3, 1), S), words, torch.full((3, 12), S)], dim=1)
    ids[:, 3:6] = M
    select = ids == M
    att = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        full = db.model(ids, att, select)
        cut = crop_length(hidden_keys(ids, S), select)
        assert cut == 13  # [CLS] [SEP] ten words and the end
        cropped = db.model(ids[:, :cut], att[:, :cut], select[:, :cut])
        torch.testing.assert_close(cropped, full, rtol=1e-5, atol=1e-5)
        db.model.hide_end_padding = False  # the same weights attending to the padding: other numbers
        try:
            seen = db.model(ids, att, select)
        finally:
            db.model.hide_end_padding = True
    finite = full.isfinite()  # forbidden ids are -inf in both
    assert (seen - full)[finite].abs().max() > 1e-4  # a tiny model barely trained: 5e-4 here, 50x the tolerance


def test_samplers_crop_the_decided_end_and_sample_the_same(hiding_model, monkeypatch):
    """Net leaves each row's decided end out of its calls (rows of like length in one forward): the
    same stories as the uncropped forward (seeded), for fewer FLOPs."""
    from dbert_core.config import SampleConfig
    from dbert_core.sampling import base
    from dbert_core.sampling.sample import generate, resolve

    db = hiding_model
    sep = db.tokenizer.sep_token_id

    def early_end(module, args, logits):  # a few steps of training have not taught the end yet
        logits = logits.clone()
        logits[..., sep] += 3.0
        return logits

    handle = db.model.register_forward_hook(early_end)
    out = {}
    try:
        for crop in (True, False):
            if not crop:
                monkeypatch.setattr(base, "needed_lengths", lambda hidden, select: torch.full((len(hidden),), hidden.shape[1]))
            cfg = resolve(SampleConfig(n=6, steps=12, seed=4, min_length=0, pair_quotes=False,
                                       fix_contractions=False, known_words=False), db)
            out[crop] = generate(db, cfg)
    finally:
        handle.remove()
    assert any(len(t.split()) < 15 for t in out[True][0])  # stories that ended inside the window
    assert out[True][0] == out[False][0]
    assert out[True][1]["gflop"] < out[False][1]["gflop"]
    assert out[True][1]["exact"] is True


def test_the_flag_is_for_stories_and_a_resume_keeps_it(tmp_path, capsys, monkeypatch, hiding_model):
    from dbert_core.config import TrainConfig
    from dbert_core.training.prepare import check_model

    with pytest.raises(DbertError) as e:
        TrainConfig(data=["x.txt"], out=str(tmp_path / "o"), unit="sentence", hide_end_padding=True).validate()
    assert "--hide-end-padding is for --unit story" in cli_words(e.value)
    seen = TrainConfig(data=["x.txt"], out="o", preset="tiny", unit="story", seq_len=24, hide_end_padding=False)
    with pytest.raises(DbertError) as e:
        check_model(hiding_model, seen)
    assert re.search("--hide-end-padding False does not continue the checkpoint \\(--resume\\), trained with True", cli_words(e.value))
    text = tmp_path / "t.txt"
    text.write_text("Tom had a kite. It was red.\n")
    code, out, err = run(["train", "--data", str(text), "--out", str(tmp_path / "run"), "--unit", "sentence",
                          "--hide-end-padding", "--max-steps", "1"], capsys, monkeypatch)
    assert code != 0 and out == "" and "--hide-end-padding is for --unit story" in err and "Traceback" not in err
