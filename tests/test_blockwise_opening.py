"""blockwise's `opening`: the canvas's first block drawn at a temperature of its own (a story's names and
places), the rest at --temperature; -1 (the default) changes nothing."""

import torch

from dbert_core.sampling.sample import frames

BLOCK = 8


def last(db, seed, **kw):
    kw = dict(n=6, length=24, steps=24, sampler="blockwise", top_k=0, pair_quotes=False, **kw)
    return list(frames(db, generator=torch.Generator().manual_seed(seed), **kw))[-1].ids


def test_an_opening_at_the_run_temperature_is_the_run_itself(tiny_db):
    plain = last(tiny_db, 1, temperature=0.7, params={"block": BLOCK})
    same = last(tiny_db, 1, temperature=0.7, params={"block": BLOCK, "opening": 0.7})
    assert torch.equal(plain, same)


def test_a_greedy_opening_opens_every_seed_alike_and_the_rest_still_varies(tiny_db):
    a = last(tiny_db, 1, temperature=1.0, params={"block": BLOCK, "opening": 0.0})
    b = last(tiny_db, 2, temperature=1.0, params={"block": BLOCK, "opening": 0.0})
    assert torch.equal(a[:, :BLOCK], b[:, :BLOCK])  # the first block: the model's most likely tokens, whatever the seed
    assert not torch.equal(a[:, BLOCK:], b[:, BLOCK:])
    free_a = last(tiny_db, 1, temperature=1.0, params={"block": BLOCK})
    free_b = last(tiny_db, 2, temperature=1.0, params={"block": BLOCK})
    assert not torch.equal(free_a[:, :BLOCK], free_b[:, :BLOCK])  # without it the openings differ: the test can fail
