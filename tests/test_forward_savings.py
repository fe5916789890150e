"""Two exact savings of the sampler's network calls: rows that are one input computed once
(sampling/base.Net.one_input), and the bf16 twin whose matrices are cast once (maths/bf16_weights.py).
Both must leave every sample as it was."""

import pytest
import torch

from dbert_core.maths.bf16_weights import bf16_twin
from dbert_core.sampling import base
from dbert_core.sampling.sample import frames
from dbert_core.strategies import NAMES


def _run(db, seed=0, **kw):
    kw.setdefault("n", 4)
    kw.setdefault("length", 12)
    kw.setdefault("steps", 16)
    kw.setdefault("pair_quotes", False)
    return list(frames(db, generator=torch.Generator().manual_seed(seed), **kw))


@pytest.mark.parametrize("sampler", NAMES)
@pytest.mark.parametrize("cache", [0, 3])
def test_rows_of_one_input_computed_once_change_no_sample(tiny_db, monkeypatch, sampler, cache):
    """Every family, with and without the decided-position cache (incl. --cache-masked's kept states):
    the same samples and calls with the fold as without it, and fewer rows computed."""
    kw = dict(sampler=sampler, cache_refresh=cache, cache_masked=bool(cache))
    if cache and sampler in ("remdm",):
        kw.pop("cache_masked")
    folded = _run(tiny_db, **kw)
    monkeypatch.setattr(base.Net, "one_input", lambda self, *a: False)
    whole = _run(tiny_db, **kw)
    assert torch.equal(folded[-1].ids, whole[-1].ids)
    assert folded[-1].nfe == whole[-1].nfe
    assert folded[0].rows == 1 < whole[0].rows == 4  # the first call: four rows of [MASK], one computed
    assert folded[-1].flops < whole[-1].flops


def test_one_input_is_only_rows_that_are_the_same(tiny_db):
    net = base.Net(tiny_db, "fp32")
    mask = tiny_db.model.mask_id
    x = torch.full((3, 6), mask)
    sel = torch.ones(3, 6, dtype=torch.bool)
    t = torch.zeros(3)
    rows = torch.arange(3)
    assert net.one_input(x, sel, t, rows)
    x2 = x.clone()
    x2[1, 2] = 5
    assert not net.one_input(x2, sel, t, rows)  # one row differs
    sel2 = sel.clone()
    sel2[2, 0] = False
    assert not net.one_input(x, sel2, t, rows)  # reads other positions
    assert not net.one_input(x, sel, torch.tensor([0.0, 1.0, 0.0]), rows)  # another time
    assert not net.one_input(x[:1], sel[:1], t[:1], rows[:1])  # one row: nothing to save
    # the logits of the folded call are the whole call's, each row's in its place
    out = net(x, sel, t)
    assert net.repeats == 3 and out.shape[0] == 3 * 6
    plain = base.Net(tiny_db, "fp32")
    plain.one_input = lambda *a: False
    assert torch.allclose(out, plain(x, sel, t), atol=1e-5)
    assert net.rows == 1 and plain.rows == 3
    assert net(x, sel, t, fold=True).shape[0] == 6  # folded: the one row's logits, once
    net(x2, sel, t)
    assert net.repeats == 1


def test_a_partial_call_of_the_cache_is_never_folded(tiny_db):
    """Rows alike now but with different kept states must each read their own (not the same input)."""
    net = base.Net(tiny_db, "fp32", refresh=4, masked=True)
    mask = tiny_db.model.mask_id
    x = torch.full((2, 6), mask)
    sel = torch.ones(2, 6, dtype=torch.bool)
    net(x, sel, torch.zeros(2))  # whole: folded, the cache spread to both rows
    assert net.repeats == 2
    assert all(torch.equal(K[0], K[1]) for K, _ in net.cache.kv)
    assert not net.one_input(x, sel, torch.zeros(2), torch.arange(2))  # the next call is partial


def test_the_bf16_twin_gives_autocasts_logits_bit_for_bit(tiny_db):
    model = tiny_db.model
    ids = torch.full((2, 10), model.mask_id)
    ids[:, 3] = 7
    att = torch.ones(2, 10, dtype=torch.bool)
    sel = torch.ones(2, 10, dtype=torch.bool)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = model(ids, att, sel)
        twin = bf16_twin(model)
        got = twin(ids, att, sel)
    assert torch.equal(got, want)
    assert twin.bert.layers[0].qkv.weight.dtype == torch.bfloat16 and twin.bert.decoder.dtype == torch.bfloat16
    assert twin.bert.embeddings.word_embeddings.weight is model.bert.embeddings.word_embeddings.weight  # shared, fp32
    assert model.bert.layers[0].qkv.weight.dtype == torch.float32 and model.bert.decoder is None  # the model untouched
    assert "decoder" not in "".join(model.state_dict())
    assert bf16_twin(model) is twin  # kept while the weights are the same


def test_the_bf16_twin_follows_the_weights(tiny_checkpoint):
    from dbert_core.storage import checkpoint

    db = checkpoint.load(tiny_checkpoint)  # its own copy: the weights change below
    twin = bf16_twin(db.model)
    with torch.no_grad():
        db.model.bert.layers[0].qkv.weight.add_(0.5)  # a training step in the same process
    again = bf16_twin(db.model)
    assert again is not twin
    assert torch.equal(again.bert.layers[0].qkv.weight, db.model.bert.layers[0].qkv.weight.to(torch.bfloat16))


def test_a_twin_made_in_inference_mode_serves_a_call_outside_it():
    """The twin is cached per model: one made while sampling under torch.inference_mode must still
    serve a later call with autograd on (the order the whole test suite ran them in)."""
    from dbert_core.maths.bf16_weights import _TWINS
    from dbert_core.maths.model import Bert, BertConfig, DiffusionBert

    cfg = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=32)
    model = DiffusionBert(Bert(cfg), mask_id=3)
    ids = torch.randint(4, 64, (2, 10))
    att = torch.ones_like(ids, dtype=torch.bool)
    sel = torch.zeros_like(att)
    sel[:, 3] = True
    with torch.inference_mode():
        twin = bf16_twin(model)
    assert _TWINS[model][1] is twin
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = bf16_twin(model)(ids, att, sel)
    assert bf16_twin(model) is twin and torch.isfinite(out.float()).all()


def test_class_mass_in_blocks_is_the_whole_softmax(monkeypatch):
    """Kernel.class_mass a few rows at a time gives the class sums of the whole (M, V) softmax,
    bit for bit, from float32 and bfloat16 logits alike."""
    from dbert_core.sampling import base

    V, C = 50, 7
    inverse = torch.arange(V) % C
    kern = base.Kernel([2, 1, 0], torch.rand(2, C, dtype=torch.float64), inverse)
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        logits = (3 * torch.randn(23, V, generator=g)).to(dtype)
        whole = torch.zeros(23, C).index_add_(1, inverse, torch.softmax(logits.float(), -1)).double()
        monkeypatch.setattr(base, "CLASS_MASS_BLOCK", 4 * V)  # blocks of 4 rows, the last of 3
        assert torch.equal(kern.class_mass(logits), whole)
        monkeypatch.setattr(base, "CLASS_MASS_BLOCK", 1)  # one row at a time
        assert torch.equal(kern.class_mass(logits), whole)
