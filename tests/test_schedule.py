import math

import pytest
import torch

from dbert_core.maths.diffusion import corrupt
from dbert_core.maths.schedule import LinearSchedule, SpindleSchedule, make_schedule, step_grid

T = 100


def zipf_counts(V=50):
    return torch.tensor([int(10_000 / (i + 1)) for i in range(V)])


@pytest.fixture(params=["linear", "spindle"])
def schedule(request):
    return make_schedule(request.param, T, zipf_counts(), lam=0.3)


def test_end_points_and_monotone(schedule):
    ts = torch.arange(T + 1, dtype=torch.float32)
    a = schedule.alpha_vocab(ts)  # (T+1, V) or (T+1, 1)
    assert torch.all(a[0] == 1) and torch.all(a[-1] == 0)
    assert torch.all(a[1:] <= a[:-1] + 1e-7), "a_t must not increase with t"
    assert torch.all((a >= 0) & (a <= 1))


def test_spindle_with_lambda_zero_is_linear():
    tokens = torch.arange(50)
    lin, sp = LinearSchedule(T), SpindleSchedule(T, zipf_counts(), lam=0.0)
    for t in [0, 1, 17, 50, 99, 100]:
        assert torch.allclose(lin.alpha(t, tokens), sp.alpha(t, tokens))


def test_spindle_masks_rare_tokens_earlier():
    sp = SpindleSchedule(T, zipf_counts(), lam=0.3)
    frequent, rare = torch.tensor([0]), torch.tensor([49])
    for t in range(1, T):
        assert sp.alpha(t, rare) < sp.alpha(t, frequent)
    # mean masking time E[tau] = sum_t P(tau > t) = sum_t a_t: rare tokens are masked earlier,
    # and at mid-process the empirical mask rate of a rare token is higher
    ts = torch.arange(T, dtype=torch.float32)
    e_tau = sp.alpha_vocab(ts).sum(0)
    assert e_tau[49] < e_tau[0] - 5
    g = torch.Generator().manual_seed(0)
    ids = torch.tensor([[0, 49]]).repeat(20_000, 1)
    m = corrupt(ids, torch.ones_like(ids, dtype=torch.bool), torch.full((20_000,), T // 2), sp, g)
    assert m[:, 1].float().mean() > m[:, 0].float().mean() + 0.1


def test_spindle_lambda_must_keep_monotone():
    with pytest.raises(ValueError):
        SpindleSchedule(T, zipf_counts(), lam=0.5)


def test_unknown_schedule_and_missing_counts():
    with pytest.raises(ValueError, match="unknown schedule"):
        make_schedule("cosine", T)
    with pytest.raises(ValueError, match="token counts"):
        make_schedule("spindle", T)


def test_empirical_mask_rates_match_alpha(schedule):
    g = torch.Generator().manual_seed(1)
    V, n = 50, 200_000
    tokens = torch.randint(0, V, (1, n), generator=g)
    for t in [10, 50, 90]:
        mask = corrupt(tokens, torch.ones_like(tokens, dtype=torch.bool), torch.tensor([t]), schedule, g)
        expected = 1 - schedule.alpha(t, tokens)
        # overall rate, and per token for a frequent and a rare one
        assert abs(mask.float().mean() - expected.mean()) < 4 * math.sqrt(0.25 / n)
        for v in (0, 49):
            sel = tokens == v
            k = int(sel.sum())
            assert abs(mask[sel].float().mean() - expected[sel].mean()) < 5 * math.sqrt(0.25 / k)


def test_reveal_prob_is_the_posterior(schedule):
    # P(visible at s | masked at t) = (a_s - a_t) / (1 - a_t), in [0, 1], 1 at s = 0
    tokens = torch.arange(50)
    for t, s in [(100, 99), (60, 30), (5, 0)]:
        r = schedule.reveal_prob(torch.tensor(float(t)), torch.tensor(float(s)), tokens=tokens)
        at, as_ = schedule.alpha(t, tokens), schedule.alpha(s, tokens)
        assert torch.allclose(r, (as_ - at) / (1 - at))
        if s == 0:
            assert torch.all(r == 1)


def test_step_grid():
    assert step_grid(8, 4) == [8, 6, 4, 2, 0]
    assert step_grid(2048, 2048)[:3] == [2048, 2047, 2046]
    with pytest.raises(ValueError):
        step_grid(8, 9)
    with pytest.raises(ValueError):
        step_grid(8, 0)
