"""--cache-refresh K: decided positions keep their keys and values between calls (maths/decided_cache.py);
a call computes only what is masked, changed or read, and every K-th call is the whole forward."""

from __future__ import annotations

import pytest
import torch

from dbert_core.maths.decided_cache import DecidedCache
from helpers import run, train_stories


@pytest.fixture(scope="module")
def story_model(tmp_path_factory):
    return train_stories(tmp_path_factory.mktemp("decided"), max_steps=3)


@pytest.fixture(scope="module")
def hiding_model(tmp_path_factory):
    return train_stories(tmp_path_factory.mktemp("decided-hide"), max_steps=3, hide_end_padding=True)


def _batch(db, rows=4, words=20, masked=8, seed=0):
    C, S, M = db.tokenizer.cls_token_id, db.tokenizer.sep_token_id, db.tokenizer.mask_token_id
    g = torch.Generator().manual_seed(seed)
    body = torch.randint(max(C, S, M) + 1, db.model.config.vocab_size, (rows, words), generator=g)
    ids = torch.cat([torch.full((rows, 1), C), torch.full((rows, 1), S), body, torch.full((rows, 1), S)], dim=1)
    for r in range(rows):
        cols = 2 + torch.randperm(words, generator=g)[:masked]
        ids[r, cols] = M
    return ids


def _exact(db, ids, select):
    return db.model(ids, torch.ones_like(ids, dtype=torch.bool), select)


@pytest.mark.parametrize("model", ["story_model", "hiding_model"])
def test_a_call_on_what_the_cache_saw_is_the_exact_forward(model, request):
    """Right after a whole call, a partial one on the same tokens (its decided states are current)
    gives the exact logits, for any subset of the rows in any order."""
    db = request.getfixturevalue(model)
    ids = _batch(db)
    if db.model.hide_end_padding:  # an ended story: the padding after its end is no key
        ids[1, 15:] = db.tokenizer.sep_token_id
    select = ids == db.model.mask_id
    att = torch.ones_like(ids, dtype=torch.bool)
    cache = DecidedCache(every=100)
    with torch.no_grad():
        exact = _exact(db, ids, select)
        whole = db.model(ids, att, select, decided=cache)
        assert cache.reused == 0
        torch.testing.assert_close(whole, exact, rtol=1e-5, atol=1e-5)
        again = db.model(ids, att, select, decided=cache)
        assert cache.reused > 0  # only the masked positions were computed
        torch.testing.assert_close(again, exact, rtol=1e-4, atol=1e-4)
        rows = torch.tensor([3, 1])
        part = db.model(ids[rows], att[rows], select[rows], decided=cache, rows=rows)
        torch.testing.assert_close(part, _exact(db, ids[rows], select[rows]), rtol=1e-4, atol=1e-4)


def test_a_revealed_token_is_computed_and_the_rest_is_kept_until_the_refresh(story_model):
    """A token revealed since the last call is computed afresh (its own states are new); the decided
    positions keep the states of the call that computed them (the approximation: other logits than
    the exact forward's), until the K-th call computes everything again."""
    db = story_model
    ids = _batch(db, rows=2, masked=10, seed=1)
    att = torch.ones_like(ids, dtype=torch.bool)
    cache = DecidedCache(every=3)
    with torch.no_grad():
        db.model(ids, att, ids == db.model.mask_id, decided=cache)  # call 1: whole
        later = ids.clone()
        first = (later == db.model.mask_id).nonzero()[:4]
        later[first[:, 0], first[:, 1]] = db.model.config.vocab_size // 2 + torch.arange(4)  # four reveals
        select = later == db.model.mask_id
        approx = db.model(later, att, select, decided=cache)  # call 2: partial
        assert cache.reused > 0
        exact = _exact(db, later, select)
        finite = exact.isfinite()
        assert not torch.allclose(approx[finite], exact[finite], atol=1e-6)  # stale decided states
        assert (approx - exact)[finite].abs().max() < 0.5  # but close: a few tokens changed
        db.model(later, att, select, decided=cache)  # call 3: partial
        refreshed = db.model(later, att, select, decided=cache)  # call 4: whole again
        assert cache.reused == 0
        torch.testing.assert_close(refreshed, exact, rtol=1e-5, atol=1e-5)


def test_sampling_with_the_cache_is_labelled_and_cheaper(story_model):
    from dbert_core.config import SampleConfig
    from dbert_core.sampling.sample import generate, resolve

    db = story_model
    out = {}
    for K in (0, 1, 4):
        cfg = resolve(SampleConfig(n=4, steps=16, seed=3, length=20, min_length=0, cache_refresh=K), db)
        out[K] = generate(db, cfg)
    assert out[1][0] == out[0][0]  # every call whole: the exact forward, the same samples
    assert out[0][1]["exact"] is True and "cache_refresh" not in out[0][1]
    assert out[4][1]["exact"] is False and out[4][1]["cache_refresh"] == 4
    assert out[4][1]["gflop"] < out[0][1]["gflop"]
    assert all(t.strip() for t in out[4][0])


def test_the_checkpoint_may_recommend_it_and_the_flag_is_checked(story_model, capsys, monkeypatch):
    from dbert_core.config import SampleConfig
    from dbert_core.sampling.settings import default_decoding, resolve

    db = story_model
    assert default_decoding(db)["cache_refresh"] == 0
    sampling = db.meta.setdefault("sampling", {})
    try:
        sampling["decoding"] = {"steps": 16, "cache_refresh": 6}
        assert resolve(SampleConfig(), db).cache_refresh == 6
        assert resolve(SampleConfig(cache_refresh=0), db).cache_refresh == 0  # the user's word wins
        sampling["decoding"] = {"cache_refresh": "often"}
        assert resolve(SampleConfig(), db).cache_refresh == 0  # malformed: the exact forward
    finally:
        sampling.pop("decoding", None)
    code, out, err = run(["sample", "--checkpoint", str(db.path), "--n", "1", "--cache-refresh", "-1"], capsys, monkeypatch)
    assert code != 0 and out == "" and "--cache-refresh" in err and "Traceback" not in err


def test_the_tui_settings_dialog_reads_and_checks_it(story_model):
    from dbert_tui.controller import Settings
    from dbert_tui.forms import FieldError, settings_fields, settings_form

    old = Settings()
    _, fields = settings_form(old, None)
    shown = {key: value for key, _, value, _ in fields}
    assert shown["cache_refresh"] == ""  # not set: the checkpoint's recommendation
    values = {key: value for key, value in shown.items()}
    values["cache_refresh"] = "4"
    assert settings_fields(values, old, story_model)["cache_refresh"] == 4
    values["cache_refresh"] = ""
    assert settings_fields(values, old, story_model)["cache_refresh"] is None
    for bad in ("often", "-1"):
        values["cache_refresh"] = bad
        with pytest.raises(FieldError) as e:
            settings_fields(values, old, story_model)
        assert e.value.key == "cache_refresh" and "cache" in e.value.message


def test_the_tui_control_bar_says_when_the_cache_is_on():
    from dbert_tui.controller import Settings
    from dbert_tui.widgets.generate.controls import _value

    assert _value(Settings(sampler="first-hitting", cache_refresh=8), "sampler") == "first-hitting cache 8"
    assert _value(Settings(sampler="first-hitting", cache_refresh=0), "sampler") == "first-hitting"
