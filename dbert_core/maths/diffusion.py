"""The forward process and the variational bound (docs/method.md sections 1, 2 and 3).

Notation: x_0 are the clean tokens, x_t has some of them replaced by [MASK]. A position that
is masked at step t and whose clean token is x is visible at an earlier step s with
probability r(x) = (a_s(x) - a_t(x)) / (1 - a_t(x)). The model predicts p(v) = p(x_0 = v | x_t)
and reveals v with probability p(v) r(v). The KL between the true and the model's reverse
step at one masked position is

    -r(x) log p(x) + (1 - r(x)) log[(1 - r(x)) / (1 - sum_v p(v) r(v))].

Summed over the S steps of a budget it gives the ELBO: a true upper bound on -log p(x_0).
"""

from __future__ import annotations

import torch

from .schedule import Schedule, step_grid


class RowDraws:
    """Randomness keyed to each example instead of to its batch, for bound estimates: row b
    draws from its own generator, seeded by (seed, the example's index in its data set), and
    only at its own noisable positions, so an example's estimate is the same whatever the batch
    size, the batch's padding or the examples beside it (with one generator for the batch, the
    shipped story model's 200 held-out stories, one draw, seed 1234, scored 14.4 per token in
    batches of 16 and 15.5 in batches of 128; exactly, 14.4). Training
    keeps one generator: its draws need no such identity, and it runs per step."""

    def __init__(self, seed: int, indices):
        self.gens = [torch.Generator().manual_seed(seed * 1_000_003 + int(i)) for i in indices]

    def steps(self) -> torch.Tensor:
        """One uniform in [0, 1) a row: (B,) float64."""
        return torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in self.gens])

    def positions(self, noisable: torch.Tensor) -> torch.Tensor:
        """Uniforms at each row's noisable positions (1 elsewhere: never masked): (B, N), on the CPU."""
        cpu = noisable.cpu()
        u = torch.ones(cpu.shape)
        for b, g in enumerate(self.gens):
            where = cpu[b].nonzero(as_tuple=True)[0]
            u[b, where] = torch.rand(len(where), generator=g)
        return u


def corrupt(ids, noisable, t, schedule: Schedule, gen: "torch.Generator | RowDraws | None" = None):
    """Sample x_t ~ q(x_t | x_0): each noisable position is [MASK] with probability 1 - a_t(x).

    ids (B, N), noisable (B, N) bool, t (B,) steps. Returns the mask (B, N) bool.
    """
    a = schedule.alpha(t.view(-1, 1).float(), ids)
    u = gen.positions(noisable) if isinstance(gen, RowDraws) else torch.rand(ids.shape, generator=gen, device="cpu")
    u = u.to(ids.device)
    return noisable & (u >= a)


def step_kl(logits, targets, rows, t, s, schedule: Schedule, with_nll: bool = False,
            workspace: "Workspace | None" = None):
    """KL(q(x_s | x_t, x_0) || p(x_s | x_t)) at M masked positions, in nats: (M,).

    logits (M, V) from the model; targets (M,) clean tokens; rows (M,) the example each
    position belongs to; t, s (B,) steps per example with s < t. with_nll=True also returns
    -log p(x_0) (M,), the cross-entropy of the hybrid loss, from the same softmax.
    workspace: a Workspace whose arrays the loss reuses (a trainer keeps one across steps).
    """
    r_x = schedule.reveal_prob(t[rows], s[rows], tokens=targets).float()
    r_v = schedule.reveal_prob(t.cpu(), s.cpu()).to(logits.device).float()  # (B, V), or (B, 1) if token-free
    backward = torch.is_grad_enabled() and logits.requires_grad  # will a backward come to free the workspace?
    kl, nll = _StepKL.apply(logits, targets, rows, r_x, r_v, workspace, backward)
    return (kl, nll) if with_nll else kl


def _stay_term(r_x, R):
    """(1 - r(x)) log[(1 - r(x)) / (1 - R)], 0 where r(x) = 1 (the last step reveals all)."""
    stay = 1.0 - r_x
    term = stay * (torch.log(stay.clamp_min(1e-30)) - torch.log((1.0 - R).clamp_min(1e-30)))
    return torch.where(stay > 0, term, torch.zeros_like(term))


def _segments(rows: torch.Tensor, B: int) -> list[tuple[int, int, int]] | None:
    """(example, first, end) of each example's positions when rows are grouped by example (the
    order of mask.nonzero(), as in training); None when they are not."""
    if not rows.numel() or not bool((rows[1:] >= rows[:-1]).all()):
        return None
    bounds = torch.searchsorted(rows, torch.arange(B + 1, device=rows.device)).tolist()
    return [(b, lo, hi) for b, (lo, hi) in enumerate(zip(bounds, bounds[1:])) if hi > lo]


class Workspace:
    """Reusable (M, V) arrays for step_kl: the fp32 softmax, kept from the forward to the
    backward, and the gradient of the logits handed to the decoder's backward.

    They are a training step's largest arrays (120 and 60 MB for 1,000 masked positions and
    V = 30,522); allocated fresh every step they cost more in page faults than in arithmetic
    (docs/performance.md). One loss holds them at a time, from its forward to the end of its
    backward; a loss computed while they are held (two losses summed before one backward)
    gets fresh arrays, so the result never depends on whether a workspace was passed.
    """

    SLACK = 1.25  # grow to 25% more rows than asked: the masked count varies from step to step

    def __init__(self):
        self._arrays: dict[str, torch.Tensor] = {}
        self.held = False

    def take(self) -> bool:
        """Hold the arrays if they are free; False if another loss holds them."""
        if self.held:
            return False
        self.held = True
        return True

    def give_back(self) -> None:
        self.held = False

    def array(self, name: str, shape: tuple[int, int], dtype: torch.dtype, device) -> torch.Tensor:
        """A (rows, cols) view of the array `name`, reallocated only when it is too small."""
        rows, cols = shape
        buf = self._arrays.get(name)
        if buf is None or buf.dtype != dtype or buf.device != torch.device(device) or buf.numel() < rows * cols:
            self._arrays.pop(name, None)  # free the old one first
            buf = self._arrays[name] = torch.empty(int(rows * self.SLACK + 1) * cols, dtype=dtype, device=device)
        return buf[: rows * cols].view(rows, cols)


class _StepKL(torch.autograd.Function):
    """step_kl's KL and -log p(x) with a hand-written backward.

    The vocabulary-wide work is the cost of a training step's loss ((M, V) with V = 30,522 for
    an untrimmed BERT): autograd through log_softmax, exp, gather and the (M, V) x (V, B)
    product makes about a dozen passes over (M, V) floats, most into fresh (M, V) arrays. Here
    the forward works in place on one fp32 copy (cast, max, exp, sum, divide) and keeps p; the
    backward makes one pass more, from the closed form (docs/method.md section 3.4), with
    a = g_kl r(x) + g_nll and c = g_kl (1 - r(x)) / (1 - R):

        d/dz_j = p_j (a + c (r(j) - R)) - a [j = x],     R = sum_v p(v) r(v).
    """

    @staticmethod
    def forward(ctx, logits, targets, rows, r_x, r_v, workspace=None, backward=True):
        held = workspace is not None and workspace.take()
        if held:  # p lives in the workspace until the backward is done with it
            p = workspace.array("p", logits.shape, torch.float32, logits.device).copy_(logits)
        else:
            p = logits.float()
            p = p.clone() if p is logits else p  # an fp32 copy, then softmax in place: no (M, V) temporaries
        top = p.amax(-1, keepdim=True)
        total = p.sub_(top).exp_().sum(-1, keepdim=True)
        p.div_(total)
        lp_x = logits.gather(-1, targets.unsqueeze(-1)).float().sub_(top + total.log()).squeeze(-1)
        token_free = r_v.shape[-1] == 1
        ctx.segments = segments = None if token_free else _segments(rows, r_v.shape[0])
        if token_free:
            R = r_v[rows, 0]
        elif segments is None or p.device.type != "cpu":  # on a GPU the one product is the faster
            with torch.autocast(p.device.type, enabled=False):  # fp32: under autocast it would be a bf16 product
                R = (p @ r_v.T).gather(1, rows.unsqueeze(1)).squeeze(1)
        else:  # one matrix-vector product per example: on the CPU 2.5x faster than the (M, V) x (V, B) product
            R = p.new_empty(rows.shape)
            for b, lo, hi in segments:
                torch.mv(p[lo:hi], r_v[b], out=R[lo:hi])
        ctx.save_for_backward(p, targets, rows, r_x, r_v, R)
        ctx.dtype, ctx.workspace, ctx.spent = logits.dtype, workspace if held and backward else None, False
        if held and not backward:  # no backward will come to give the arrays back
            workspace.give_back()
        return -r_x * lp_x + _stay_term(r_x, R), -lp_x

    @staticmethod
    def backward(ctx, g_kl, g_nll):
        if ctx.spent:  # p was overwritten by the first backward
            raise RuntimeError("step_kl's backward runs once per forward (it works in place); "
                               "retain_graph=True is not supported")
        ctx.spent = True
        p, targets, rows, r_x, r_v, R = ctx.saved_tensors
        a = g_kl * r_x + g_nll
        if r_v.shape[-1] == 1:  # token-free: R does not depend on p, so c = 0 (and there are no segments)
            p.mul_(a.unsqueeze(1))
        else:
            c = torch.where((r_x < 1) & (R < 1), g_kl * (1.0 - r_x) / (1.0 - R).clamp_min(1e-30), torch.zeros_like(a))
            c0, c1 = (a - c * R).unsqueeze(1), c.unsqueeze(1)
            if ctx.segments is not None:
                for b, lo, hi in ctx.segments:
                    p[lo:hi].mul_(torch.addcmul(c0[lo:hi], c1[lo:hi], r_v[b]))
            else:
                p.mul_(torch.addcmul(c0, c1, r_v[rows]))
        p.scatter_add_(1, targets.unsqueeze(1), -a.unsqueeze(1))
        ws = ctx.workspace
        if ws is None:
            return p.to(ctx.dtype), None, None, None, None, None, None
        grad = p if p.dtype == ctx.dtype else ws.array("grad", p.shape, ctx.dtype, p.device).copy_(p)
        ws.give_back()
        return grad, None, None, None, None, None, None


def draw_steps(B: int, steps: int, gen: "torch.Generator | RowDraws | None", stratified: bool = True) -> torch.Tensor:
    """B step indices k in 1..steps; stratified (one per stratum of [0, 1)) to cut variance.
    With RowDraws each row draws its own step (never stratified: strata tie rows together)."""
    if isinstance(gen, RowDraws):
        if stratified:
            raise ValueError("stratified steps tie a batch's rows together; RowDraws keeps them apart")
        u = gen.steps()
    else:
        u = torch.rand(B, generator=gen, dtype=torch.float64)
    if stratified:
        u = (torch.randperm(B, generator=gen).double() + u) / B  # type: ignore[arg-type]  # a Generator: RowDraws raised above
    return (u * steps).floor().long().clamp(0, steps - 1) + 1


def masked_kl(model, ids, attention, noisable, k, steps, schedule, gen, return_ce=False, workspace=None):
    """Per-example sum of step-k KL terms (B,) for the budget `steps` (k (B,) in 1..steps)."""
    grid = torch.tensor(step_grid(schedule.T, steps)[::-1], device=ids.device)  # t_0 = 0 ... t_S = T
    t, s = grid[k.to(ids.device)], grid[k.to(ids.device) - 1]
    mask = corrupt(ids, noisable, t, schedule, gen)
    x_t = ids.masked_fill(mask, getattr(model, "module", model).mask_id)  # DDP wraps the model
    logits = model(x_t, attention, mask, t=t)  # (M, V)
    rows = mask.nonzero(as_tuple=True)[0]
    targets = ids[mask]
    kl, nll = step_kl(logits, targets, rows, t, s, schedule, with_nll=True, workspace=workspace)
    per_example = torch.zeros(ids.shape[0], device=ids.device).index_add_(0, rows, kl)
    if return_ce:  # the hybrid loss's CE shares the KL's log-softmax (one pass over the vocabulary)
        return per_example, nll.sum(), mask.sum()
    return per_example


def elbo(model, ids, attention, noisable, schedule, steps: int, gen=None,
         exact: bool = False, mc: int = 1) -> torch.Tensor:
    """Upper bound on -log p(x_0) in nats per example (B,) with an S-step reverse process.

    exact=True sums all S terms (one draw of x_t each); otherwise an unbiased Monte-Carlo
    estimate from `mc` uniformly drawn steps, each weighted by S. gen: a generator, or
    RowDraws for an estimate that does not depend on how the examples are batched.
    """
    B = ids.shape[0]
    total = torch.zeros(B, dtype=torch.float64, device=ids.device)
    if exact:
        for k in range(1, steps + 1):
            kk = torch.full((B,), k, dtype=torch.long)
            total += masked_kl(model, ids, attention, noisable, kk, steps, schedule, gen).double()
        return total
    for _ in range(mc):
        kk = draw_steps(B, steps, gen, stratified=False)  # not `k`: the int of the loop above
        total += steps * masked_kl(model, ids, attention, noisable, kk, steps, schedule, gen).double()
    return total / mc
