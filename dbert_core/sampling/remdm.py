"""ReMDM: ancestral with remasking.

A masked position reveals v with p(v) (a_s - (1 - sigma) a_t) / (1 - a_t), a revealed one is
masked again with sigma, per token class as the Kernel (base.py); sigma from the cap, rescale or
loop schedule. sigma = 0 is the ancestral sampler (ancestral.py). A heuristic: it changes the law.
"""

from __future__ import annotations

import math
from typing import Iterator

import torch

from ..maths.schedule import step_grid
from .base import Frame, Kernel, State, masked_at
from .draw import draw_tokens


def remdm_path(db, steps: int, params: dict) -> list[int]:
    """The S+1 times of ReMDM's reverse path. cap and rescale: the usual grid. loop: the grid from
    T down to t_on_time (the time at which the expected visible fraction is alpha_on) in
    round(S (1 - t_on)) steps, round(S t_off) steps from there to 0 at the end, and the steps
    between at t_on_time itself (remasking at constant alpha)."""
    T = db.schedule.T
    if params["schedule"] != "loop":
        return step_grid(T, steps)
    lo, hi = 0, T  # the smallest integer time whose expected masked fraction reaches 1 - alpha_on
    goal = 1.0 - params["alpha_on"]
    while lo < hi:
        mid = (lo + hi) // 2
        if float(masked_at(db, torch.tensor([float(mid)]))[0]) >= goal - 1e-12:
            hi = mid
        else:
            lo = mid + 1
    t_loop = lo
    n1 = max(1, round(steps * (1.0 - params["t_on"])))
    n3 = max(1, round(steps * params["t_off"]))
    if n1 + n3 > steps:
        n1 = steps - n3
    n2 = steps - n1 - n3
    first = [round(T - j * (T - t_loop) / n1) for j in range(n1 + 1)]
    last = [round(t_loop - j * t_loop / n3) for j in range(1, n3 + 1)]
    return first + [t_loop] * n2 + last


def remdm_kernel(db, steps: int, params: dict) -> tuple[Kernel, torch.Tensor]:
    """ReMDM's per-step reveal probabilities r' (S, C) as a Kernel over its path, and sigma (S, C).

    For a token class with a_t, a_s at a step: sigma = min(eta, (1 - a_s) / a_t) (cap and loop;
    the cap keeps r' <= 1) or eta * min(1, (1 - a_s) / a_t) (rescale), r' = (a_s - (1 - sigma)
    a_t) / (1 - a_t). At the last step a_s = 1: sigma = 0 and r' = 1."""
    schedule = db.schedule
    path = remdm_path(db, steps, params)
    t = torch.tensor(path[:-1], dtype=torch.float32).unsqueeze(-1)  # (S, 1)
    s = torch.tensor(path[1:], dtype=torch.float32).unsqueeze(-1)
    if schedule.token_free:
        a_t, a_s = schedule.alpha_vocab(t.squeeze(-1)).double(), schedule.alpha_vocab(s.squeeze(-1)).double()  # (S, 1)
        inverse = None
    else:
        inverse, rep = schedule.classes()
        a_t, a_s = schedule.alpha(t, rep).double(), schedule.alpha(s, rep).double()  # (S, C)
    room = torch.where(a_t > 0, (1.0 - a_s) / a_t.clamp_min(1e-300), torch.full_like(a_t, math.inf))
    eta = params["eta"]
    sigma = eta * room.clamp_max(1.0) if params["schedule"] == "rescale" else room.clamp_max(eta)
    denom = 1.0 - a_t
    r = torch.where(denom > 0, ((a_s - (1.0 - sigma) * a_t) / denom.clamp_min(1e-300)).clamp(0.0, 1.0),
                    torch.ones_like(a_t))
    r[-1] = 1.0
    sigma[-1] = 0.0
    return Kernel(path, r.contiguous(), inverse), sigma.contiguous()


def remdm(state: State) -> Iterator[Frame]:
    """ancestral with remasking: per step, masked positions reveal as in ancestral with r', and
    revealed ones (not the prompt's) are masked again with sigma of their token's class. Its
    kernel (over its own path: remdm_kernel) takes the place of the step budget's in state."""
    state.kern, sigma = remdm_kernel(state.db, state.steps, state.params)
    x, masked, confidence, kern, net, gen = state.x, state.masked, state.confidence, state.kern, state.net, state.gen
    mask_id, time_agnostic = state.db.model.mask_id, state.db.model.time == "none"
    S = kern.r.shape[0]
    given = ~masked.clone()
    logits, dirty = None, True  # a time-agnostic model's logits stay valid while no row changes
    for k in range(S):
        t = kern.grid[k]
        u_reveal = torch.rand(x.shape, generator=gen, dtype=torch.float64)
        u_token = torch.rand(x.shape, generator=gen, dtype=torch.float64)
        u_remask = torch.rand(x.shape, generator=gen, dtype=torch.float64)
        shown = ~masked & ~given
        revealed = torch.zeros_like(masked)
        if masked.any():
            rows = masked.any(1).nonzero().squeeze(1)
            if dirty or not time_agnostic or logits is None:
                logits = net(x[rows], masked[rows], torch.full((len(rows),), t), rows=rows)
                dirty = False
            revealed = kern.reveals(k, masked, u_reveal, lambda: kern.class_mass(logits))
            if revealed.any():
                chosen, conf = draw_tokens(x, masked, revealed, logits[revealed[masked].to(logits.device)],
                                           kern.r_vocab(torch.tensor([k])), state.no_draw, state.shaping,
                                           u_token[revealed], state.block_repeats, state.top)
                state.reveal(revealed, chosen, conf)  # at positions masked before: shown's tokens stay as they were
        remasked = torch.zeros_like(masked)
        if shown.any() and float(sigma[k].max()) > 0:
            sig = sigma[k, 0] if kern.inverse is None else sigma[k][kern.inverse[x[shown]]]  # None: token-free
            remasked[shown] = u_remask[shown] < sig
        if remasked.any():
            x[remasked] = mask_id
            confidence[remasked] = float("nan")
            masked |= remasked
        dirty = dirty or bool(revealed.any()) or bool(remasked.any())
        yield state.frame(revealed, k + 1, remasked=remasked)
