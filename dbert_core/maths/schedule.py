"""Noise schedules of the absorbing-state forward process.

A schedule gives a_t(v): the probability that a token v of x_0 is still visible
(not yet [MASK]) at step t of T. a_0 = 1, a_T = 0, and a_t is non-increasing in t.

Spindle centering (docs/method.md section 1): the paper centres each token's information on the
mean over its own sentence, which makes a_t depend on the whole of x_0; the sampler never
knows x_0, so that ELBO is not exact. We centre on the corpus mean instead, so a_t(v)
depends on the token alone and the reverse kernel and the bound below use the same a_t.
"""

from __future__ import annotations

import math

import torch

from ..config import SCHEDULES


class Schedule:
    """Base class: a_t(v) for steps t in [0, T] and vocabulary ids v.

    Besides the maths, a schedule states its own structure, so the sampler and the TUI ask it
    instead of probing: `token_free` (a_t the same for every token), `classes()` (the groups
    of tokens with equal a_t) and `expected_masked(t, counts)` (the masked fraction the
    reverse process is expected to leave at time t)."""

    name: str = "base"
    token_free: bool = False  # True when a_t(v) is the same for every token v (alpha_vocab's last dim is 1)

    def __init__(self, T: int):
        if T < 1:
            raise ValueError(f"T must be >= 1, got {T}")
        self.T = T

    def alpha(self, t: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """a_t(x) for integer steps t (broadcastable against tokens), float32."""
        raise NotImplementedError

    def alpha_vocab(self, t: torch.Tensor) -> torch.Tensor:
        """a_t(v) for every vocabulary id: (*t.shape, V), or (*t.shape, 1) if token-free."""
        raise NotImplementedError

    def reveal_prob(self, t: torch.Tensor, s: torch.Tensor, tokens=None) -> torch.Tensor:
        """r = (a_s - a_t) / (1 - a_t): chance a position masked at t is visible at s < t.

        With tokens=None it is returned per vocabulary id (last dim V, or 1 for linear);
        otherwise for the given tokens. Where a_t = 1 a token cannot be masked at t; we
        return 1 there so the value is finite (it never carries probability mass).
        """
        if tokens is None:
            at, as_ = self.alpha_vocab(t), self.alpha_vocab(s)
        else:
            at, as_ = self.alpha(t, tokens), self.alpha(s, tokens)
        denom = 1.0 - at
        r = (as_ - at) / denom.clamp_min(1e-12)
        return torch.where(denom > 0, r.clamp(0.0, 1.0), torch.ones_like(r))

    def classes(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(inverse (V,), representatives (C,)): the class of each vocabulary id, classes being
        the groups of ids with equal a_t(v), and one id of each class; None when token-free."""
        raise NotImplementedError

    def expected_masked(self, t: torch.Tensor, counts: torch.Tensor | None = None) -> torch.Tensor:
        """The expected masked fraction at times t (K,): 1 - a_t(v) averaged over the corpus
        with weights `counts` (V,) (the token frequencies; unused when token-free), (K,) float64."""
        alpha = self.alpha_vocab(t).to(torch.float64)  # (K, V) or (K, 1)
        if alpha.shape[-1] == 1:
            return 1.0 - alpha[:, 0]
        if counts is None:
            raise ValueError("a token-wise schedule's expected masked fraction needs the token counts")
        counts = counts.to(torch.float64)
        return 1.0 - (alpha * counts).sum(-1) / counts.sum().clamp_min(1e-300)

    def config(self) -> dict:
        return {"schedule": self.name, "T": self.T}


class LinearSchedule(Schedule):
    """D3PM's mutual-information schedule: a_t = 1 - t/T, the same for every token."""

    name = "linear"
    token_free = True

    def classes(self):
        return None

    def alpha(self, t, tokens):
        t = torch.as_tensor(t, dtype=torch.float32, device=tokens.device)
        return torch.broadcast_to(1.0 - t / self.T, tokens.shape).clone()

    def alpha_vocab(self, t):
        t = torch.as_tensor(t, dtype=torch.float32)
        return (1.0 - t / self.T).unsqueeze(-1)


class SpindleSchedule(Schedule):
    """DiffusionBERT's token-aware schedule, centred on the corpus mean.

        a_t(v) = clip(1 - t/T + lambda * sin(pi t / T) * (f(v) - fbar), 0, 1)

    f(v) = log(1 + count(v)) / max_w log(1 + count(w)) is high for frequent tokens, so rare,
    informative tokens get a smaller a_t: they are masked earlier and generated later.
    fbar is the mean of f over the corpus' tokens. With lambda * pi <= 1 the curve is
    monotone for every token; lambda = 0 is the linear schedule.
    """

    name = "spindle"

    def __init__(self, T: int, counts: torch.Tensor, lam: float = 0.3):
        super().__init__(T)
        if not 0.0 <= lam <= 1.0 / math.pi:
            raise ValueError(f"spindle lambda must be in [0, 1/pi] to keep a_t monotone, got {lam}")
        counts = counts.to(torch.float64)
        logc = torch.log1p(counts)
        f = logc / logc.max().clamp_min(1e-12)
        total = counts.sum()
        fbar = (f * counts).sum() / total if total > 0 else f.mean()
        self.lam = lam
        self.counts = counts
        self.centered = (f - fbar).to(torch.float32)  # (V,)

    def _alpha(self, t, c):
        u = t / self.T
        a = 1.0 - u + self.lam * torch.sin(math.pi * u) * c
        a = a.clamp(0.0, 1.0)
        # exact end points whatever rounding does
        a = torch.where(u <= 0, torch.ones_like(a), a)
        return torch.where(u >= 1, torch.zeros_like(a), a)

    def alpha(self, t, tokens):
        t = torch.as_tensor(t, dtype=torch.float32, device=tokens.device)
        c = self.centered.to(tokens.device)[tokens]
        return self._alpha(t, c)

    def alpha_vocab(self, t):
        t = torch.as_tensor(t, dtype=torch.float32)
        return self._alpha(t.unsqueeze(-1), self.centered.to(t.device))

    def classes(self):
        _, inverse = torch.unique(self.centered, return_inverse=True)  # equal centred f: equal a_t(v)
        C = int(inverse.max()) + 1
        rep = torch.empty(C, dtype=torch.long).scatter_(0, inverse, torch.arange(len(inverse)))
        return inverse, rep

    def config(self):
        return {"schedule": self.name, "T": self.T, "lambda": self.lam}




def make_schedule(name: str, T: int, counts: torch.Tensor | None = None, lam: float = 0.3) -> Schedule:
    """Factory: 'linear' or 'spindle' (which needs the corpus token counts)."""
    if name == "linear":
        return LinearSchedule(T)
    if name == "spindle":
        if counts is None:
            raise ValueError("the spindle schedule needs token counts from the training corpus")
        return SpindleSchedule(T, counts, lam)
    raise ValueError(f"unknown schedule {name!r}; choose one of: {', '.join(SCHEDULES)}")


def step_grid(T: int, steps: int) -> list[int]:
    """The S+1 time points T = t_S > ... > t_0 = 0 of an S-step reverse process."""
    if not 1 <= steps <= T:
        raise ValueError(f"steps must be between 1 and T={T}, got {steps}")
    return [round(k * T / steps) for k in range(steps, -1, -1)]
