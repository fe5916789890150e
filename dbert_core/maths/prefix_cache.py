"""The prefix cache of a story's continuation windows (`dbert sample --prefix-cache`, an approximation).

Used by maths/model.DiffusionBert.forward (its `cache`) and sampling/base.Net (one cache per window).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .model import Bert


class PrefixCache:
    """Fast-dLLM's prefix cache (Wu et al. 2025) for a window whose first `length` positions are given
    and never change: a story's continuation window, [CLS] and the story's last tokens before the
    new block (sampling/blocks.py). The first call computes the whole window and keeps those
    positions' keys and values in every layer; every later call computes only the positions after
    them, attending to the kept keys and values beside their own.

    An approximation, not the model's p: in the exact forward the context's states see the block
    being written and change as it fills; here they stay as they were at the window's first call,
    when the block was all [MASK]. Rows are kept by the content of their prefix, so a sampler may
    call any subset of its rows, in any order (rows with one prefix share one entry)."""

    def __init__(self, length: int):
        self.length = length
        self.rows: dict[bytes, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.reused = 0  # positions the last call took from the cache (0: it ran the whole forward)

    def _keys(self, ids: torch.Tensor) -> list[bytes]:
        return [row.tobytes() for row in ids[:, :self.length].cpu().numpy()]

    def _holds(self, ids: torch.Tensor, keys: list[bytes]) -> bool:
        return ids.shape[1] > self.length and all(k in self.rows for k in keys)

    def holds(self, ids: torch.Tensor) -> bool:
        """Every row's prefix is kept: a call on ids computes only the positions after it."""
        return self._holds(ids, self._keys(ids))

    def hidden(self, bert: Bert, ids: torch.Tensor, attention: torch.Tensor, select: torch.Tensor,
               rows: torch.Tensor | None = None, mask_id: int | None = None) -> torch.Tensor:
        """Final hidden states (M, H) at the select (B, N) positions of ids (B, N), row-major (select
        False in the prefix); attention (B, N) bool. Rows are kept by their prefix: `rows` and
        `mask_id` (a DecidedCache's) are not needed here."""
        h = self.forward(bert, ids, None if bool(attention.all()) else attention[:, None, None, :].bool())
        return h[select[:, ids.shape[1] - h.shape[1]:]]  # h: the positions after the prefix when it was kept

    def forward(self, bert: Bert, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Bert.forward with this cache (no time input; mask (B, 1, 1, N) over all N keys, or None);
        sets `reused`."""
        P, keys = self.length, self._keys(ids)
        self.reused = P if self._holds(ids, keys) else 0
        if self.reused:
            kept = [self.rows[k] for k in keys]
            x = bert.embeddings(bert.embeddings.word_embeddings(ids[:, P:]), start=P)
            for i, layer in enumerate(bert.layers):
                past = (torch.stack([r[i][0] for r in kept]), torch.stack([r[i][1] for r in kept]))
                x = layer(x, mask, kv=partial(_after, past))
            return x
        x = bert.embeddings(bert.embeddings.word_embeddings(ids))
        got: list = []
        for layer in bert.layers:
            x = layer(x, mask, kv=partial(_kept, got))
        for b, key in enumerate(keys):
            self.rows.setdefault(key, [(k[b, :, :P].clone(), v[b, :, :P].clone()) for k, v in got])
        return x


def _after(past: tuple[torch.Tensor, torch.Tensor], k: torch.Tensor, v: torch.Tensor):
    """A later call's layer: its queries attend to the kept prefix's keys and values (B, h, P, d), then their own."""
    return torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)


def _kept(got: list, k: torch.Tensor, v: torch.Tensor):
    """The first call's layer: its keys and values, appended to `got` (the prefix is cut from them after)."""
    got.append((k, v))
    return k, v
