"""--cache-refresh K: decided positions keep their keys and values between calls (maths/decided_cache.py);
a call computes only what is masked, changed or read, and every K-th call is the whole forward."""

from __future__ import annotations

import json

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
        whole = db.model(ids, att, select, cache=cache)
        assert cache.reused == 0
        torch.testing.assert_close(whole, exact, rtol=1e-5, atol=1e-5)
        again = db.model(ids, att, select, cache=cache)
        assert cache.reused > 0  # only the masked positions were computed
        torch.testing.assert_close(again, exact, rtol=1e-4, atol=1e-4)
        rows = torch.tensor([3, 1])
        part = db.model(ids[rows], att[rows], select[rows], cache=cache, rows=rows)
        torch.testing.assert_close(part, _exact(db, ids[rows], select[rows]), rtol=1e-4, atol=1e-4)


def test_calls_on_changing_subsets_read_each_rows_own_states(story_model):
    """The cache moves the rows a partial call reads to the front of its arrays (one slice, no copy
    per call): whatever subsets follow one another, each row attends to its own kept states."""
    db = story_model
    ids = _batch(db, rows=5, seed=3)
    select = ids == db.model.mask_id
    att = torch.ones_like(ids, dtype=torch.bool)
    cache = DecidedCache(every=100)
    with torch.no_grad():
        exact = [_exact(db, ids[r:r + 1], select[r:r + 1]) for r in range(5)]
        db.model(ids, att, select, cache=cache)
        for order in ([3, 1], [4, 3, 1], [0, 2], [2], [1, 0, 4, 3, 2], [4, 0]):
            rows = torch.tensor(order)
            part = db.model(ids[rows], att[rows], select[rows], cache=cache, rows=rows)
            assert cache.reused > 0
            assert torch.equal(cache.slot[rows], torch.arange(len(order)))  # the rows read are the front slice
            torch.testing.assert_close(part, torch.cat([exact[r] for r in order]), rtol=1e-4, atol=1e-4)


def test_a_revealed_token_is_computed_and_the_rest_is_kept_until_the_refresh(story_model):
    """A token revealed since the last call is computed afresh (its own states are new); the decided
    positions keep the states of the call that computed them (the approximation: other logits than
    the exact forward's), until the K-th call computes everything again."""
    db = story_model
    ids = _batch(db, rows=2, masked=10, seed=1)
    att = torch.ones_like(ids, dtype=torch.bool)
    cache = DecidedCache(every=3)
    with torch.no_grad():
        db.model(ids, att, ids == db.model.mask_id, cache=cache)  # call 1: whole
        later = ids.clone()
        first = (later == db.model.mask_id).nonzero()[:4]
        later[first[:, 0], first[:, 1]] = db.model.config.vocab_size // 2 + torch.arange(4)  # four reveals
        select = later == db.model.mask_id
        approx = db.model(later, att, select, cache=cache)  # call 2: partial
        assert cache.reused > 0
        exact = _exact(db, later, select)
        finite = exact.isfinite()
        assert not torch.allclose(approx[finite], exact[finite], atol=1e-6)  # stale decided states
        assert (approx - exact)[finite].abs().max() < 0.5  # but close: a few tokens changed
        db.model(later, att, select, cache=cache)  # call 3: partial
        refreshed = db.model(later, att, select, cache=cache)  # call 4: whole again
        assert cache.reused == 0
        torch.testing.assert_close(refreshed, exact, rtol=1e-5, atol=1e-5)


def test_a_runs_network_holds_one_cache_and_hands_it_to_the_forward(story_model, monkeypatch):
    """sampling.base.Net keeps one `cache` (kept_states): a continuation window's PrefixCache, else
    a DecidedCache for --cache-refresh on a time-agnostic model, else none (never both); every
    forward of the model is handed that very object."""
    from types import SimpleNamespace

    from dbert_core.maths.prefix_cache import PrefixCache
    from dbert_core.sampling.base import Net, kept_states

    db = story_model
    assert Net(db).cache is None
    assert isinstance(Net(db, prefix=5, refresh=4).cache, PrefixCache)  # a continuation window's context wins
    net = Net(db, refresh=3, masked=True)
    assert isinstance(net.cache, DecidedCache) and (net.cache.every, net.cache.masked) == (3, True)
    timed = SimpleNamespace(time="film")  # a time-conditioned model keeps no decided states; the prefix one it ignores
    assert kept_states(timed, 0, 4, False) is None and isinstance(kept_states(timed, 3, 4, False), PrefixCache)
    handed = []
    forward = type(db.model).forward
    monkeypatch.setattr(type(db.model), "forward", lambda self, *a, **k: handed.append(k.get("cache")) or forward(self, *a, **k))
    x = torch.full((3, 12), db.model.mask_id)
    x[0, 3] = db.tokenizer.sep_token_id  # the rows differ: a whole call on each, then two partial ones
    t = torch.full((3,), db.schedule.T)
    for call in range(3):
        net(x, x == db.model.mask_id, t)
        x[:, 5 + call] = db.model.config.vocab_size - 1 - call  # a token revealed in each row
    assert len(handed) == 3 and all(c is net.cache for c in handed)
    assert net.cache.reused > 0  # the third call took decided states from it


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


def test_keeping_masked_states_computes_only_what_changed_or_is_read(story_model):
    """--cache-masked: a partial call computes the positions changed since and the ones read, not
    every [MASK]; with nothing changed since the whole call its logits are the exact ones."""
    db = story_model
    ids = _batch(db, rows=3, masked=10, seed=2)
    att = torch.ones_like(ids, dtype=torch.bool)
    masked = ids == db.model.mask_id
    read = torch.zeros_like(masked)
    for r in range(3):  # two of each row's masks are read
        read[r, masked[r].nonzero()[:2, 0]] = True
    cache = DecidedCache(every=100, masked=True)
    with torch.no_grad():
        db.model(ids, att, masked, cache=cache)  # whole
        got = db.model(ids, att, read, cache=cache)
        assert cache.reused == ids.shape[1] - 2  # the two read positions, nothing else
        torch.testing.assert_close(got, _exact(db, ids, read), rtol=1e-4, atol=1e-4)
        later = ids.clone()
        later[0, masked[0].nonzero()[-1, 0]] = db.model.config.vocab_size // 2  # one reveal in row 0
        fresh = DecidedCache(every=100)  # the same calls with every [MASK] computed
        db.model(ids, att, masked, cache=fresh)
        unread = int(masked[0].nonzero()[3, 0])  # a mask of row 0 no call reads
        before = cache.kv[-1][0][0, :, unread].clone()
        db.model(later, att, read, cache=cache)
        assert cache.reused == ids.shape[1] - 3  # row 0: its two read positions and the reveal
        db.model(later, att, read, cache=fresh)
        assert fresh.reused == ids.shape[1] - 10  # every mask left and the reveal (10 in each row)
        assert torch.equal(cache.kv[-1][0][0, :, unread], before)  # kept: it has not seen the reveal
        assert not torch.equal(fresh.kv[-1][0][0, :, unread], before)  # computed afresh: it has


def test_sampling_with_masked_states_is_labelled_and_cheaper_still(story_model):
    from dbert_core.config import SampleConfig
    from dbert_core.sampling.sample import generate, resolve

    db = story_model
    out = {}
    for K, m in ((0, False), (1, True), (4, False), (4, True)):
        cfg = resolve(SampleConfig(n=4, steps=16, seed=5, length=20, min_length=0, cache_refresh=K, cache_masked=m), db)
        out[K, m] = generate(db, cfg)
    assert out[1, True][0] == out[0, False][0]  # every call whole: the reveal chances are current, the same samples
    st = out[4, True][1]
    assert st["exact"] is False and st["cache_refresh"] == 4 and st["cache_masked"] is True
    assert "cache_masked" not in out[4, False][1]
    cfg = resolve(SampleConfig(n=2, steps=8, seed=5, length=20, min_length=0, cache_refresh=4, cache_masked=True,
                               sampler="confidence"), db)
    assert "cache_masked" not in generate(db, cfg)[1]  # it reads every mask: nothing is kept for it
    assert st["nfe"] == out[4, False][1]["nfe"] or st["gflop"] < out[4, False][1]["gflop"]
    assert st["gflop"] / st["nfe"] < out[4, False][1]["gflop"] / out[4, False][1]["nfe"]  # cheaper calls
    assert all(t.strip() for t in out[4, True][0])


def test_blockwise_refreshes_where_a_row_enters_its_next_block(story_model, monkeypatch):
    """Fast-dLLM's dual cache: blockwise reads only the blocks it may reveal in, so with the masks kept a
    call between refreshes computes about a block a row, and the call after a row enters its next block
    computes every position afresh (whatever --cache-refresh's count says)."""
    from dbert_core.config import SampleConfig
    from dbert_core.sampling.sample import generate, resolve

    db, whole = story_model, []
    hidden = DecidedCache.hidden

    def spy(self, *a, **k):
        out = hidden(self, *a, **k)
        whole.append(self.reused == 0)
        return out

    monkeypatch.setattr(DecidedCache, "hidden", spy)
    base = dict(n=2, workers=1, steps=24, seed=5, length=24, min_length=0, sampler="blockwise",
                pair_quotes=False, fix_contractions=False, known_words=False)  # one batch, the reverse run alone
    stats, refreshes = {}, {}
    for block, K, m in ((8, 0, False), (8, 1000, True), (8, 1000, False), (24, 1000, True)):
        whole.clear()
        cfg = SampleConfig(cache_refresh=K, cache_masked=m, params={"block": block}, **base)
        samples, stats[block, K, m] = generate(db, resolve(cfg, db))
        assert all(s.strip() for s in samples)
        refreshes[block, K, m] = sum(whole)
    # one block: no block to enter; blocks of 8: each row enters its two later blocks (rows may enter apart)
    assert 2 <= refreshes[8, 1000, True] - refreshes[24, 1000, True] <= 2 * 2, refreshes
    assert stats[8, 1000, True]["cache_masked"] is True and stats[8, 1000, True]["exact"] is False
    assert stats[8, 1000, True]["gflop"] < stats[8, 1000, False]["gflop"] < stats[8, 0, False]["gflop"]


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
        assert resolve(SampleConfig(), db).cache_masked is False
        sampling["decoding"] = {"steps": 16, "cache_refresh": 6, "cache_masked": True}
        assert resolve(SampleConfig(), db).cache_masked is True
        assert resolve(SampleConfig(cache_masked=False), db).cache_masked is False
        sampling["decoding"] = {"cache_refresh": "often", "cache_masked": True}
        got = resolve(SampleConfig(), db)
        assert got.cache_refresh == 0 and got.cache_masked is False  # malformed: the exact forward
        sampling["decoding"] = {"cache_refresh": 6, "cache_masked": "yes"}
        assert resolve(SampleConfig(), db).cache_masked is False
    finally:
        sampling.pop("decoding", None)
    code, out, err = run(["sample", "--checkpoint", str(db.path), "--n", "1", "--cache-refresh", "-1"], capsys, monkeypatch)
    assert code != 0 and out == "" and "--cache-refresh" in err and "Traceback" not in err
    code, out, err = run(["sample", "--checkpoint", str(db.path), "--n", "2", "--steps", "8", "--length", "20",
                          "--cache-refresh", "4", "--cache-masked", "--stats", "--seed", "1"], capsys, monkeypatch)
    assert code == 0 and len(out.splitlines()) == 2
    stats = json.loads(err.strip().splitlines()[-1])
    assert stats["cache_masked"] is True and stats["cache_refresh"] == 4 and stats["exact"] is False


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
    values["cache_masked"] = "yes"
    assert settings_fields(values, old, story_model)["cache_masked"] is True
    values["cache_masked"] = ""
    assert settings_fields(values, old, story_model)["cache_masked"] is None
    values["cache_masked"] = "maybe"
    with pytest.raises(FieldError) as e:
        settings_fields(values, old, story_model)
    assert e.value.key == "cache_masked"
    values["cache_masked"] = ""
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
    shown = _value(Settings(sampler="first-hitting", cache_refresh=8, cache_masked=True), "sampler")
    assert shown == "first-hitting cache 8+masks"
    shown = _value(Settings(sampler="confidence", cache_refresh=8, cache_masked=True), "sampler")
    assert shown.endswith("cache 8")  # it reads every mask: keeping them changes nothing
