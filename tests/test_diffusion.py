"""The variational bound: a true bound, exact and Monte-Carlo estimates agree, training lowers it."""

import math

import pytest
import torch

from dbert_core.storage import checkpoint
from dbert_core.text.data import Special, collate, read_examples, tokenize
from dbert_core.maths.diffusion import Workspace, elbo, step_kl
from dbert_core.maths.schedule import make_schedule
from helpers import TINYSTORIES_VALID


def test_step_kl_matches_direct_kl():
    """The closed form equals KL between the two explicit (V+1)-way distributions."""
    torch.manual_seed(0)
    V, M = 12, 5
    sched = make_schedule("spindle", 50, torch.randint(1, 1000, (V,)), lam=0.3)
    logits = torch.randn(M, V)
    targets = torch.randint(0, V, (M,))
    rows = torch.tensor([0, 0, 1, 1, 1])
    t, s = torch.tensor([30.0, 7.0]), torch.tensor([20.0, 6.0])
    got = step_kl(logits, targets, rows, t, s, sched)
    p = logits.softmax(-1)
    for i in range(M):
        ti, si = t[rows[i]], s[rows[i]]
        r = sched.reveal_prob(ti, si)  # (V,)
        q_true = torch.zeros(V + 1)
        q_true[targets[i]] = r[targets[i]]
        q_true[V] = 1 - r[targets[i]]
        q_model = torch.cat([p[i] * r, (1 - (p[i] * r).sum()).view(1)])
        nz = q_true > 0
        direct = (q_true[nz] * (q_true[nz] / q_model[nz]).log()).sum()
        assert torch.allclose(got[i], direct, atol=1e-5)
        assert got[i] >= -1e-6


def _val_batch(db, n=48):
    texts = read_examples([str(TINYSTORIES_VALID)], "sentence")[:n]
    ex = tokenize(texts, db.tokenizer, 24)
    return collate(ex, Special.of(db.tokenizer))


def test_exact_and_monte_carlo_elbo_agree(tiny_db):
    ids, att, noisable = _val_batch(tiny_db)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        exact = elbo(tiny_db.model, ids, att, noisable, tiny_db.schedule, 16, g, exact=True)
        mc = elbo(tiny_db.model, ids, att, noisable, tiny_db.schedule, 16, g, mc=64)
    # per-token bound: the MC average of 64 draws sits within a few percent of the full sum
    n = noisable.sum()
    assert abs(exact.sum() / n - mc.sum() / n) / (exact.sum() / n) < 0.05
    # and the bound is above the nats of a uniform-free lower limit: positive and finite
    assert torch.all(exact > 0) and torch.isfinite(exact).all()


def test_bound_tightens_with_more_steps(tiny_db):
    ids, att, noisable = _val_batch(tiny_db)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        two = elbo(tiny_db.model, ids, att, noisable, tiny_db.schedule, 2, g, mc=16).sum()
        many = elbo(tiny_db.model, ids, att, noisable, tiny_db.schedule, 64, g, mc=16).sum()
    assert many < two


def test_trained_model_beats_untrained(tiny_checkpoint, tmp_path):
    from dbert_core.training.train import Trainer
    from helpers import tiny_config

    fresh = Trainer(tiny_config(tmp_path / "fresh", max_steps=1))
    fresh.prepare()
    trained = checkpoint.load(tiny_checkpoint)
    from dbert_core.evaluation.metrics import perplexity

    data = [str(TINYSTORIES_VALID)]
    untrained_ppl = perplexity(fresh.db, data, steps=32, limit=200, unit="sentence")["ppl_token"]
    trained_ppl = perplexity(trained, data, steps=32, limit=200, unit="sentence")["ppl_token"]
    assert trained_ppl < 0.5 * untrained_ppl
    assert math.isfinite(trained_ppl)


def _reference_step_kl(logits, targets, rows, t, s, schedule):
    """step_kl written with autograd only (the form before the hand-written backward)."""
    logp = torch.log_softmax(logits.double(), dim=-1)
    lp_x = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    r_x = schedule.reveal_prob(t[rows], s[rows], tokens=targets).double()
    r_v = schedule.reveal_prob(t, s).double()
    R = r_v[rows, 0] if r_v.shape[-1] == 1 else (logp.exp() * r_v[rows]).sum(-1)
    stay = 1.0 - r_x
    term = stay * (torch.log(stay.clamp_min(1e-30)) - torch.log((1.0 - R).clamp_min(1e-30)))
    return -r_x * lp_x + torch.where(stay > 0, term, torch.zeros_like(term)), -lp_x


@pytest.mark.parametrize("schedule", ["spindle", "linear"])
@pytest.mark.parametrize("order", ["grouped", "shuffled"])
def test_step_kl_gradient_equals_autograd(schedule, order):
    """The hand-written backward gives autograd's gradient of any mix of the KL and the CE, for
    both schedules, rows grouped by example (training) or not, and positions at the last step
    (s = 0, r(x) = 1)."""
    torch.manual_seed(0)
    V, M = 40, 23
    sched = make_schedule(schedule, 50, torch.randint(1, 1000, (V,)), lam=0.3)
    logits = (3 * torch.randn(M, V, dtype=torch.float64)).requires_grad_()
    targets = torch.randint(0, V, (M,))
    rows = torch.randint(0, 4, (M,)).sort().values
    if order == "shuffled":
        rows = rows[torch.randperm(M)]
    t, s = torch.tensor([30.0, 7.0, 50.0, 2.0]), torch.tensor([20.0, 6.0, 0.0, 0.0])
    w_kl, w_ce = torch.rand(M, dtype=torch.float64), torch.rand(M, dtype=torch.float64)
    kl, nll = step_kl(logits, targets, rows, t, s, sched, with_nll=True)
    got = torch.autograd.grad((w_kl * kl + w_ce * nll).sum(), logits)[0]
    ref_kl, ref_nll = _reference_step_kl(logits, targets, rows, t, s, sched)
    want = torch.autograd.grad((w_kl * ref_kl + w_ce * ref_nll).sum(), logits)[0]
    torch.testing.assert_close(kl.double(), ref_kl, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(nll.double(), ref_nll, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert (rows == 2).any() or (rows == 3).any()  # some positions are at the last step


def test_step_kl_keeps_the_logits_dtype_and_leaves_them_alone():
    """bf16 logits (autocast) get a bf16 gradient; fp32 logits are not modified in place."""
    torch.manual_seed(1)
    sched = make_schedule("spindle", 50, torch.randint(1, 1000, (30,)), lam=0.3)
    rows, targets = torch.tensor([0, 0, 1]), torch.tensor([3, 7, 9])
    t, s = torch.tensor([30.0, 7.0]), torch.tensor([20.0, 6.0])
    for dtype in (torch.bfloat16, torch.float32):
        logits = torch.randn(3, 30).to(dtype).requires_grad_()
        before = logits.detach().clone()
        kl = step_kl(logits, targets, rows, t, s, sched)
        kl.sum().backward()
        assert logits.grad.dtype == dtype and torch.equal(logits.detach(), before)
        with torch.autocast("cpu", dtype=torch.bfloat16):  # training's autocast: the loss stays fp32
            under = step_kl(logits, targets, rows, t, s, sched)
        assert under.dtype == torch.float32 and torch.equal(under, kl)


def _kl_case(seed=0, V=40, M=23, dtype=torch.float32):
    torch.manual_seed(seed)
    sched = make_schedule("spindle", 50, torch.randint(1, 1000, (V,)), lam=0.3)
    logits = (3 * torch.randn(M, V)).to(dtype).requires_grad_()
    rows = torch.randint(0, 4, (M,)).sort().values
    return sched, logits, torch.randint(0, V, (M,)), rows, torch.tensor([30.0, 7.0, 50.0, 2.0]), \
        torch.tensor([20.0, 6.0, 0.0, 0.0])


def _kl_grad(case, workspace=None):
    sched, logits, targets, rows, t, s = case
    kl, nll = step_kl(logits, targets, rows, t, s, sched, with_nll=True, workspace=workspace)
    grad, = torch.autograd.grad((kl + 0.3 * nll).sum(), logits)
    return kl.detach(), grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_workspace_gives_the_same_loss_and_gradient_and_is_reused(dtype):
    """With a Workspace the loss and gradient are bit-identical to fresh arrays; its arrays are
    allocated once, reused by a smaller batch, regrown by a larger one, and free between losses."""
    ws = Workspace()
    case = _kl_case(dtype=dtype)
    want_kl, want_grad = _kl_grad(case)
    got_kl, got_grad = _kl_grad(case, ws)
    assert torch.equal(got_kl, want_kl) and torch.equal(got_grad, want_grad) and got_grad.dtype == dtype
    assert not ws.held
    p_buffer = ws._arrays["p"].data_ptr()
    # the gradient is a workspace array: p itself (fp32 logits) or the bf16 "grad" array
    assert got_grad.data_ptr() == ws._arrays["p" if dtype == torch.float32 else "grad"].data_ptr()
    small = _kl_case(seed=1, M=11, dtype=dtype)
    assert torch.equal(_kl_grad(small, ws)[1], _kl_grad(small)[1])
    assert ws._arrays["p"].data_ptr() == p_buffer  # reused, not reallocated
    big = _kl_case(seed=2, M=60, dtype=dtype)
    assert torch.equal(_kl_grad(big, ws)[1], _kl_grad(big)[1])
    assert ws._arrays["p"].numel() >= 60 * 40 * Workspace.SLACK


def test_workspace_held_by_one_loss_at_a_time():
    """Two losses summed before one backward: the second gets fresh arrays, so both gradients
    are right; a second backward through the same graph is refused (the first works in place)."""
    ws = Workspace()
    sched, logits, targets, rows, t, s = _kl_case()
    kl_a = step_kl(logits, targets, rows, t, s, sched, workspace=ws)
    assert ws.held
    kl_b = step_kl(logits * 0.5, targets, rows, t, s, sched, workspace=ws)
    got, = torch.autograd.grad(kl_a.sum() + 2 * kl_b.sum(), logits, retain_graph=True)
    ref_a = step_kl(logits, targets, rows, t, s, sched)
    ref_b = step_kl(logits * 0.5, targets, rows, t, s, sched)
    want, = torch.autograd.grad(ref_a.sum() + 2 * ref_b.sum(), logits)
    torch.testing.assert_close(got, want)
    assert not ws.held
    with pytest.raises(RuntimeError, match="runs once"):
        torch.autograd.grad(kl_a.sum(), logits)
    with torch.no_grad():  # no backward will come: the arrays are not kept held
        step_kl(logits, targets, rows, t, s, sched, workspace=ws)
    assert not ws.held
