"""The first-hitting sampler (Zheng et al. 2024): one network call per reveal event.

It draws, for each row, the step of its next reveal event directly and jumps there: one network
call per event, all rows of a batch advancing one event per call, so a sample of L tokens costs
at most L calls whatever S is. Exact in distribution for the S-step ancestral sampler
(ancestral.py): a row with masked positions i at step k has not revealed anything by step m with
probability  prod_{j=k..m-1} prod_i (1 - R_i(j)),  R_i(j) = P_i . r_j  (p_i is fixed while x
does not change: time-agnostic model). The event step is drawn by inversion of that survival
function (an Exp(1) threshold on the cumulative hazard, scanned over windows of steps); given the
event step m, the positions revealed at m are independent Bernoulli(R_i(m)) conditioned on at
least one, and their tokens are drawn from p'(v) r_m(v) as in ancestral.

Linear schedule: the survival is (t_m / t_k)^n, i.e. the next reveal time is t_k u^(1/n) snapped
to the grid; then the logits are needed only at the revealed positions, and any time conditioning
works (the model is called at the event's t). Several positions can share a step (always at the
last one, where r = 1), so an event may reveal more than one token; for S >> L that is rare and
the call count approaches L.

With a network that keeps [MASK] positions' states between refreshes (`--cache-refresh K
--cache-masked`, maths/decided_cache.py) the spindle's event step is drawn from the class mass read at
the row's last whole call, and only the positions revealed are asked for: a call between refreshes
computes what was revealed since and what is revealed now. An approximation twice over (stale reveal
chances, stale [MASK] states); measured, the stale chances cost nothing and the stale states some
gen-PPL (docs/performance.md).
"""

from __future__ import annotations

from typing import Iterator

import torch

from ..errors import DbertError
from .base import Frame, State
from .draw import draw_tokens


def next_event(P: torch.Tensor, mk: torch.Tensor, k: torch.Tensor, r: torch.Tensor,
                u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The step of each row's next reveal event and each position's reveal chance there.

    P (A, L, C) class mass of each position (0 where not masked), mk (A, L) masked, k (A,)
    the next step each row simulates, r (S, C), u (A,) uniforms in (0, 1]. A row reveals
    nothing in steps k..m with probability exp(-H(m)), H(m) = -sum_{j=k..m} sum_i
    log(1 - R_i(j)); the event step is the first m with H(m) > -log u (inversion).
    Returns (m (A,), R at m (A, L)).
    """
    A, L, _ = P.shape
    S = r.shape[0]
    target = -torch.log(u)
    n = mk.sum(-1)  # masked positions per row
    W = int(((2 * (S - k)) / (n + 1)).ceil().max().item()) + 1  # about twice the mean gap
    acc = torch.zeros(A, dtype=torch.float64)
    start = k.clone()
    m = torch.full((A,), -1, dtype=torch.long)
    R_at = torch.zeros(A, L, dtype=torch.float64)
    pending = torch.ones(A, dtype=torch.bool)
    while pending.any():
        rows = pending.nonzero().squeeze(1)
        if int(start[rows].min()) >= S:  # cannot happen with finite P (the last step reveals); never loop
            raise DbertError("the sampler found no reveal event (non-finite reveal probabilities)")
        W = max(1, min(W, S - int(start[rows].min())))
        every = len(rows) == A  # the first round (and most events): no (a, L, C) copy of P
        j = start[rows].unsqueeze(1) + torch.arange(W)  # (a, W) steps scanned
        R = torch.bmm(P if every else P[rows], r[j.clamp_max(S - 1)].transpose(1, 2)).clamp_(0.0, 1.0)  # (a, L, W)
        last = (j == S - 1).unsqueeze(1) & (mk if every else mk[rows]).unsqueeze(2)
        R = torch.where(last, torch.ones_like(R), R)  # the last step reveals all (p sums to 1 - eps)
        h = -torch.log1p(-R).sum(1)  # (a, W) hazard of each step, +inf where a reveal is certain
        h = torch.where(j < S, h, torch.zeros_like(h))
        H = acc[rows].unsqueeze(1) + h.cumsum(1)
        hit = H > target[rows].unsqueeze(1)
        found = hit.any(1)
        w = hit.to(torch.int8).argmax(1)
        done_rows = rows[found]
        m[done_rows] = j[found, w[found]]
        R_at[done_rows] = R[found, :, w[found]]
        acc[rows] = H[:, -1]
        start[rows] += W
        pending[done_rows] = False
        W *= 2
    return m, R_at


def first_hitting(state: State) -> Iterator[Frame]:
    """One network call per reveal event; each row jumps straight to its next event."""
    x, masked, kern, net, gen = state.x, state.masked, state.kern, state.net, state.gen
    B, L = x.shape
    S = len(kern.grid) - 1
    token_free = kern.inverse is None
    grid = torch.tensor(kern.grid)
    k = torch.zeros(B, dtype=torch.long)  # the next step each row simulates
    pos = torch.arange(L)
    # (mass, held, rows): (A, L, C) class mass read at each active row's last whole call, when the network keeps
    # [MASK] states, (A, L) where it is not 0, and their rows, the active rows' (a finished row never has a mask
    # again: dropped)
    kept: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    while masked.any():
        active = masked.any(1).nonzero().squeeze(1)
        A = len(active)
        mk = masked[active]  # (A, L)
        if kept is not None and len(kept[2]) > A:  # rows finished since: one copy now, none per call
            stay = torch.isin(kept[2], active)
            kept = (kept[0][stay], kept[1][stay], kept[2][stay])
        u_time = 1.0 - torch.rand(A, generator=gen, dtype=torch.float64)  # (0, 1]
        u_first = torch.rand(A, generator=gen, dtype=torch.float64)
        u_more = torch.rand(A, L, generator=gen, dtype=torch.float64)
        u_token = torch.rand(A, L, generator=gen, dtype=torch.float64)
        if token_free:  # r is the same for every token: the event needs no prediction
            m, R = next_event(mk.double().unsqueeze(-1), mk, k[active], kern.r, u_time)
        elif net.stale_masks(active, L):  # --cache-masked: the class mass of the last whole call (approximate)
            assert kept is not None  # masks are stale only after a whole call, which kept their mass (below)
            logits = None
            mass, held, _ = kept
            gone = held & ~mk  # revealed since (here, or filled by the caller's end rule)
            if bool(gone.any()):
                mass[gone] = 0.0
                held &= mk
            m, R = next_event(mass, mk, k[active], kern.r, u_time)
        else:  # time-agnostic model: p is fixed until this row's x changes
            logits = net(x[active], mk, grid[k[active]], rows=active, fold=True)  # rows of one input: once
            keeps = net.keeps_masks
            P = kept[0].zero_() if keeps and kept is not None else torch.zeros(A, L, kern.classes, dtype=torch.float64)
            P[mk] = kern.class_mass(logits).repeat(net.repeats, 1)
            if keeps:
                kept = (P, mk.clone(), active if kept is None else kept[2])
            m, R = next_event(P, mk, k[active], kern.r, u_time)
        # which positions: independent Bernoulli(R_i) given at least one; first the lowest one
        log_stay = torch.log1p(-R.clamp(0.0, 1.0))
        at_least_one = -torch.expm1(log_stay.cumsum(1))  # (A, L) P(some position <= i revealed)
        total = at_least_one[:, -1:]
        first = torch.searchsorted(at_least_one, u_first.unsqueeze(1) * total, right=True).clamp_max(L - 1)
        more = (pos > first) & (u_more < R)
        rev = mk & ((pos == first) | more)
        if token_free or logits is None:
            logits = net(x[active], rev, grid[m], rows=active)  # only the revealed positions are projected
        else:  # (folded: the first len(logits) of rev[mk] repeat for every row)
            logits = logits[(rev[mk].nonzero().squeeze(1) % len(logits)).to(logits.device)]
        row_of = rev.nonzero()[:, 0]
        chosen, conf = draw_tokens(x[active], mk, rev, logits, kern.r_vocab(m[row_of]), state.no_draw, state.shaping,
                                   u_token[rev], state.block_repeats, state.top)
        revealed = torch.zeros_like(masked)
        revealed[active] = rev
        state.reveal(revealed, chosen, conf)
        k[active] = m + 1
        left = masked.any(1)
        yield state.frame(revealed, int(k[left].min()) if left.any() else S, row_steps=k.clone())
    yield from state.nothing_to_fill()
