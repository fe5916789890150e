"""What the token inspector shows about one position of a run: the candidates the sampler had
when it revealed the position, and, per token, the time the noise schedule masks it.

- `TopK`: the sampler's recorder (sample.frames(..., topk=k)). At every reveal it keeps the k
  most likely ids of p' (the distribution the token was drawn from: temperature, top-k/top-p
  and the repeat block applied) and their probabilities; cheap: k ids and k floats per reveal.
- `masking_time`: the mean time at which the forward process masks a token, E[tau] =
  sum_{t=0}^{T-1} a_t(v) (P(tau > t) = a_t(v)). Linear: (T + 1) / 2 for every token; spindle:
  earlier for rare, informative tokens (so the reverse process reveals them later).
- `token_info`: one position of a trajectory-like record as a dict (what the panel prints).
"""

from __future__ import annotations

from typing import Any

import torch


class TopK:
    """ids (B, L, k) and probs (B, L, k) of p' at each position's latest reveal (-1 / nan before).

    The sampler calls keep(p) with the (K, V) p' of the K positions it is about to reveal (or
    at(idx).keep(p) for the rows idx of them, when it draws them in passes), then put(revealed)
    with the (B, L) mask of those positions (row-major, the order of the K rows)."""

    def __init__(self, shape: tuple[int, int], k: int) -> None:
        self.k = k
        self.ids = torch.full((*shape, k), -1, dtype=torch.long)
        self.probs = torch.full((*shape, k), float("nan"), dtype=torch.float32)
        self._parts: list = []

    def keep(self, p: torch.Tensor, idx: torch.Tensor | None = None) -> None:
        k = min(self.k, p.shape[-1])
        values, ids = torch.topk(p, k, dim=-1)
        self._parts.append((idx, ids, values.float()))

    def at(self, idx: torch.Tensor) -> "_Rows":
        return _Rows(self, idx)

    def put(self, revealed: torch.Tensor) -> None:
        K = int(revealed.sum())
        parts, self._parts = self._parts, []
        if not parts or K == 0:
            return
        ids = torch.full((K, self.k), -1, dtype=torch.long)
        probs = torch.full((K, self.k), float("nan"), dtype=torch.float32)
        for idx, i, v in parts:
            rows = slice(None) if idx is None else idx
            ids[rows, : i.shape[1]] = i
            probs[rows, : v.shape[1]] = v
        self.ids[revealed] = ids
        self.probs[revealed] = probs


class _Rows:
    """TopK.at(idx): keep() for the rows idx of the positions being revealed."""

    def __init__(self, top: TopK, idx: torch.Tensor) -> None:
        self.top, self.idx = top, idx

    def keep(self, p: torch.Tensor) -> None:
        self.top.keep(p, self.idx)


def masking_time(schedule, ids: torch.Tensor) -> torch.Tensor:
    """E[tau] of each token id (any shape), float64: sum_{t=0}^{T-1} a_t(v)."""
    t = torch.arange(schedule.T, dtype=torch.float32)
    ids = ids.long().clamp_min(0)
    alpha = schedule.alpha_vocab(t).double()  # (T, V) or (T, 1)
    per_token = alpha.sum(0)  # (V,) or (1,)
    if per_token.shape[0] == 1:
        return torch.full(ids.shape, float(per_token[0]), dtype=torch.float64)
    return per_token[ids]


def token_info(frame, order, b: int, pos: int, piece, masking=None) -> dict:
    """One position of a frame (sample.Frame or a compact copy; `order` (B, L) the reveal steps,
    0: given) as the inspector prints it: {position, id, piece, masked, given, step, confidence,
    top: [(piece, p), ...], masking_time}. piece(id) spells an id; masking(id) is its E[tau]
    (None: not shown). A position still masked in this frame has only its masking state."""
    import math

    tid = int(frame.ids[b, pos])
    out: dict[str, Any] = {"position": pos, "id": tid, "masked": bool(frame.masked[b, pos])}
    if out["masked"]:
        out["piece"] = None
        return out
    out["piece"] = piece(tid)
    step = int(order[b, pos]) if order is not None else 0
    out["given"] = step == 0
    out["step"] = step
    c = float(frame.confidence[b, pos])
    out["confidence"] = None if math.isnan(c) else c
    ids = getattr(frame, "top_ids", None)
    if ids is not None and not out["given"] and int(ids[b, pos, 0]) >= 0:
        probs = frame.top_probs[b, pos]
        out["top"] = [(piece(int(i)), float(p)) for i, p in zip(ids[b, pos], probs) if int(i) >= 0]
    if masking is not None:
        out["masking_time"] = float(masking(tid))
    return out
