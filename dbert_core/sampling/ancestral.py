"""The reverse step, and the two samplers that take it one step at a time: ancestral and cached.

The reverse step (docs/method.md section 2), for a masked position at step t jumping to s < t:
    reveal token v with probability p(v) r(v),  stay masked with 1 - R,  R = sum_v p(v) r(v),
    r(v) = (a_s(v) - a_t(v)) / (1 - a_t(v)),  p = p_theta(x_0 | x_t).
Revealed tokens are never masked again ("carry-over"). Which token: draw.py (p' reshaped by
temperature, top-k, top-p and the repeat block, weighted by r). At the last step (s = 0) a_0 = 1,
so r = 1: every position still masked is revealed. R per position is a (C,) product with the
Kernel's classes (base.py).

    ancestral      one network call per step, on the whole batch.
    cached         a time-agnostic model's prediction depends on x_t only, so a row's logits
                   are recomputed only when that row changed since they were computed, and for
                   a schedule whose r does not depend on the token (linear) only when the row
                   reveals something at this step. Same random draws and, because rows of a
                   batch are computed independently, the same samples as ancestral.
"""

from __future__ import annotations

from typing import Iterator

import torch

from .base import Frame, State
from .draw import draw_tokens


def ancestral(state: State, cached: bool = False) -> Iterator[Frame]:
    """ancestral and cached: one frame per step, the same random draws in both."""
    x, masked, kern, net, gen = state.x, state.masked, state.kern, state.net, state.gen
    B, L = x.shape
    S = len(kern.grid) - 1
    token_free = kern.inverse is None
    stale = torch.ones(B, dtype=torch.bool)  # cached: the row changed since its logits were made
    buf = mass = None  # cached: (B, L, V) logits and (B, L, C) class mass at masked positions

    def refresh(rows: torch.Tensor, t: int) -> None:
        nonlocal buf, mass
        idx = rows.nonzero().squeeze(1)
        logits = net(x[idx], masked[idx], torch.full((len(idx),), t), rows=idx)
        where = torch.zeros_like(masked)
        where[idx] = masked[idx]
        if buf is None:
            buf = torch.empty(B, L, logits.shape[-1], dtype=logits.dtype, device=logits.device)
            mass = torch.empty(B, L, kern.classes, dtype=torch.float64)
        buf[where.to(buf.device)] = logits
        if not token_free:
            mass[where] = kern.class_mass(logits)
        stale[idx] = False

    def kept(array: torch.Tensor | None) -> torch.Tensor:
        """cached: buf or mass, which the first step's refresh makes (every row is stale then)."""
        assert array is not None
        return array

    for k in range(S):
        t = kern.grid[k]
        u_reveal = torch.rand(x.shape, generator=gen, dtype=torch.float64)
        u_token = torch.rand(x.shape, generator=gen, dtype=torch.float64)
        revealed = torch.zeros_like(masked)
        if masked.any():
            logits = None
            if not cached:
                logits = net(x, masked, torch.full((B,), t))
            elif not token_free and (stale & masked.any(1)).any():
                refresh(stale & masked.any(1), t)
            revealed = kern.reveals(k, masked, u_reveal,
                                    lambda: kern.class_mass(logits) if logits is not None else kept(mass)[masked])
            if revealed.any():
                if logits is None:  # cached
                    if (stale & revealed.any(1)).any():
                        refresh(stale & revealed.any(1), t)
                    chosen_logits = kept(buf)[revealed.to(kept(buf).device)]
                else:
                    chosen_logits = logits[revealed[masked].to(logits.device)]
                r_v = kern.r_vocab(torch.tensor([k]))
                chosen, conf = draw_tokens(x, masked, revealed, chosen_logits, r_v, state.no_draw, state.shaping,
                                           u_token[revealed], state.block_repeats, state.top)
                state.reveal(revealed, chosen, conf)
                stale |= revealed.any(1)
        yield state.frame(revealed, k + 1)
