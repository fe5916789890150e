"""The token inspector's engine side: top-k candidates recorded at each reveal, masking times,
the trajectory's replay fields, and replaying a file without the model."""

import json
import math

import pytest
import torch

from dbert_core.storage import checkpoint
from dbert_core.config import STRATEGIES
from dbert_core.sampling.inspector import masking_time, token_info
from dbert_core.sampling.sample import frames, parse_prompt
from dbert_core.sampling.trajectory import trajectory


@pytest.fixture(scope="module")
def lin_db(tiny_linear_checkpoint):
    return checkpoint.load(tiny_linear_checkpoint)


def run(db, topk=0, seed=3, **kw):
    kw = {"n": 3, "length": 10, "steps": 16, "sampler": "ancestral", **kw}
    return list(frames(db, generator=torch.Generator().manual_seed(seed), topk=topk, **kw))


@pytest.mark.parametrize("sampler", STRATEGIES)
def test_top_k_recorded_at_each_reveal_without_changing_the_draws(tiny_db, sampler):
    plain = run(tiny_db, sampler=sampler)
    fs = run(tiny_db, topk=5, sampler=sampler)
    assert len(plain) == len(fs) and torch.equal(plain[-1].ids, fs[-1].ids)  # same draws
    assert plain[-1].top_ids is None
    last = fs[-1]
    assert last.top_ids.shape == (3, 10, 5) and last.top_probs.shape == (3, 10, 5)
    shown = ~last.masked
    assert (last.top_ids[shown][:, 0] >= 0).all()
    p = last.top_probs[shown].double()
    assert (p[:, :-1] >= p[:, 1:] - 1e-7).all()  # best first
    assert (p.sum(1) <= 1 + 1e-5).all()
    # the chosen token's p' (confidence) is its probability among the candidates when it is one of them
    for b, i in shown.nonzero().tolist():
        ids = last.top_ids[b, i].tolist()
        tok = int(last.ids[b, i])
        if tok in ids and sampler != "remdm":
            assert math.isclose(float(last.top_probs[b, i, ids.index(tok)]), float(last.confidence[b, i]), rel_tol=1e-5)
        assert float(last.confidence[b, i]) <= float(last.top_probs[b, i, 0]) + 1e-6  # nothing beats the best


def test_prompt_positions_have_no_candidates(tiny_db):
    template = parse_prompt(tiny_db, "once upon a [MASK] there", 8)
    fs = list(frames(tiny_db, template=template, n=1, length=8, steps=8, sampler="ancestral", topk=3,
                     generator=torch.Generator().manual_seed(0)))
    given = template != tiny_db.model.mask_id
    assert (fs[-1].top_ids[0][given] == -1).all() and (fs[-1].top_ids[0][~given][:, 0] >= 0).all()


def test_masking_time_linear_and_spindle(tiny_db, lin_db):
    T = lin_db.schedule.T
    assert torch.allclose(masking_time(lin_db.schedule, torch.tensor([5, 9])), torch.tensor([(T + 1) / 2] * 2, dtype=torch.float64))
    c = tiny_db.schedule.centered
    rare, common = int(torch.argmin(c)), int(torch.argmax(c))
    times = masking_time(tiny_db.schedule, torch.tensor([rare, common]))
    assert times[0] < times[1]  # rare tokens are masked earlier, so revealed later


def test_trajectory_carries_the_candidates_and_replays_without_the_model(tiny_db, tmp_path):
    from dbert_core.sampling.replay import load

    fs = run(tiny_db, topk=5)
    data = trajectory(tiny_db, {"sampler": "ancestral", "n": 3, "steps": 16}, fs)
    assert data["top"]["k"] == 5 and len(data["top"]["ids"][0][0]) == 5
    assert set(data["special"]) == {"sep", "cls", "pad", "unk", "mask"}
    assert len(data["expected_masked"]) == 17 and data["expected_masked"][0] == 1.0
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    r = load(path)
    assert len(r.frames) == len(fs) and torch.equal(r.frames[-1].ids.long(), fs[-1].ids)
    assert [r.db.decode(row) for row in r.frames[-1].ids] == data["texts"]  # the same words, cased the same
    info = token_info(r.frames[-1], r.order, 0, 2, lambda i: r.db.tokenizer.pieces.get(i), r.db.masking_time)
    assert info["piece"] == data["tokens"][0][2] and info["step"] == data["reveal_step"][0][2]
    assert len(info["top"]) == 5 and info["masking_time"] > 0


def test_replay_refuses_what_is_not_a_trajectory(tmp_path):
    from dbert_core.errors import DbertError
    from dbert_core.sampling.replay import load

    bad = tmp_path / "x.json"
    bad.write_text('{"format": "other"}')
    with pytest.raises(DbertError, match="not a dbert trajectory"):
        load(bad)
    bad.write_text('{"format": "dbert-trajectory/1", "frames": [{"ids": 1}]}')
    with pytest.raises(DbertError, match="not a readable"):
        load(bad)
