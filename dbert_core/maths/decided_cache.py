"""The decided-position cache (`dbert sample --cache-refresh K`, an approximation).

Used by maths/model.DiffusionBert.forward (its `cache`) and sampling/base.Net (one cache per
reverse run).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .model import Bert


class DecidedCache:
    """Keys and values of a batch's decided positions, kept from call to call: a call computes only
    what changed.

    A time-agnostic sampler calls the network once per step on the same rows, and between two calls
    only a few positions change ([MASK] -> a token). Every `every`-th call (and the first, and any
    call on a row the cache does not hold) is the whole forward, and the cache keeps every
    position's keys and values in every layer. The calls between compute only the *active*
    positions: those still [MASK], those whose token differs from the one the cache last saw (just
    revealed, or set by the end rule) and those whose logits are asked for; their queries attend to
    the kept keys and values of every other position and to their own fresh ones, which replace
    the kept ones. So a call costs in proportion to what is still undecided (with every key read).

    An approximation, not the model's p: in the exact forward a decided position's states see every
    token revealed since, here they are those of the last call that computed it (at most `every` - 1
    calls old). Fast-dLLM's dual cache (Wu et al. 2025) and dLLM-Cache keep a block's context the
    same way; this keeps any decided position, with no blocks. Rows are kept by their index in the
    batch (`rows`), so a sampler may call any subset of its rows, in any order.

    masked=True (`--cache-masked`) keeps the [MASK] positions' states too: a call between refreshes
    computes only the positions changed since and the ones read, so a sampler that reads few (first-
    hitting, reusing the reveal chances of the last whole call) pays for a handful of positions a row;
    a [MASK]'s states are then as stale as a decided one's (Fast-dLLM's dual cache keeps the masked
    blocks after the current one the same way). Samplers that read every [MASK] are unaffected."""

    def __init__(self, every: int, masked: bool = False):
        if every < 1:
            raise ValueError("the decided-position cache refreshes every 1 or more calls")
        self.every = every
        self.masked = masked  # also keep [MASK] positions' states: a call computes only what changed or is read
        self.calls = 0
        # no rows (B = 0) until the first whole call makes the arrays (_put)
        self.ids = torch.zeros(0, 0, dtype=torch.long)  # (B, N) the tokens the kept states were computed from
        self.held = torch.zeros(0, dtype=torch.bool)  # (B,) bool: rows computed whole at least once
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []  # per layer (B, h, N, d) keys and values
        self.slot = torch.zeros(0, dtype=torch.long)  # (B,) where each batch row's keys and values lie in kv
        self.reused = 0  # positions the last call took from the cache (0: it ran the whole forward)

    def restart(self) -> None:
        """The next call runs the whole forward, and the count to the next refresh starts there
        (blockwise refreshes where a row enters its next block, as Fast-dLLM's dual cache does)."""
        self.calls = 0

    def whole_next(self, rows: torch.Tensor, n: int) -> bool:
        """Whether the next call on rows (R,) of n positions each (with [CLS] and [SEP]) runs the
        whole forward."""
        return self.calls % self.every == 0 or not self._fits(rows.cpu(), n)

    def _fits(self, rows: torch.Tensor, n: int) -> bool:
        return (self.ids.shape[1] == n and int(rows.max()) < len(self.held)
                and bool(self.held[rows].all()))

    def hidden(self, bert: Bert, ids: torch.Tensor, attention: torch.Tensor, select: torch.Tensor,
               rows: torch.Tensor | None, mask_id: int) -> torch.Tensor:
        """Final hidden states (M, H) at the select (R, N) positions of ids (R, N), row-major;
        attention (R, N) bool, False: a key no position reads; rows (R,) the rows' batch indices."""
        R, N = ids.shape
        rows = torch.arange(R) if rows is None else rows.cpu()
        mask = None if bool(attention.all()) else attention[:, None, None, :].bool()
        whole = self.whole_next(rows, N)
        self.calls += 1
        if whole:
            self.reused = 0
            x = bert.embeddings(bert.embeddings.word_embeddings(ids))
            for i, layer in enumerate(bert.layers):
                x = layer(x, mask, kv=lambda k, v, i=i: self._put(i, len(bert.layers), ids, rows, k, v))
            self.ids[rows] = ids
            self.held[rows] = True
            return x[select]
        active = (ids != self.ids[rows].to(ids.device)) | select
        if not self.masked:
            active |= ids == mask_id
        A = max(1, int(active.sum(1).max()))
        # each row's active positions first, in order; a row with fewer is padded with decided ones
        # (computed afresh too, which only brings their kept states up to date)
        idx = torch.sort(active.to(torch.int8), dim=1, descending=True, stable=True).indices[:, :A]
        self.reused = N - A
        if not bool((self.slot[rows] == torch.arange(R)).all()):
            self._front(rows)  # the called rows' states first, so that they are one slice (no copy per call)
        x = bert.embeddings(bert.embeddings.word_embeddings(ids.gather(1, idx)), positions=idx)
        at = (torch.arange(R, device=idx.device)[:, None], idx)  # (row, position) of each fresh state
        for i, layer in enumerate(bert.layers):
            K, V = self.kv[i]
            keys, values = K[:R], V[:R]  # views: the fresh states are written in place

            def merge(k, v, keys=keys, values=values):
                # an index_put_ on (R, N, h, d) views: scatter_ copies the whole array first in
                # torch 2.13 (its out-of-place kernel), 4-12x slower at 8-40 fresh positions a row
                keys.transpose(1, 2).index_put_(at, k.transpose(1, 2).to(keys.dtype))
                values.transpose(1, 2).index_put_(at, v.transpose(1, 2).to(values.dtype))
                return keys, values

            x = layer(x, mask, kv=merge)
        self.ids[rows] = ids.to(self.ids.device)
        return x[select.gather(1, idx)]

    def spread(self, src: int, rows: torch.Tensor) -> None:
        """Row src's kept states copied to rows (R,): a whole call whose rows were one input ran
        on src alone (sampling/base.Net.one_input)."""
        rows = rows.cpu()
        B = int(rows.max()) + 1
        if B > len(self.held):
            self._grow(B)
        at, s = self.slot[rows], int(self.slot[src])
        for K, V in self.kv:
            K[at], V[at] = K[s].clone(), V[s].clone()
        self.ids[rows] = self.ids[src].clone()
        self.held[rows] = True

    def _grow(self, B: int) -> None:
        """Arrays for B rows, the rows held so far kept."""
        n = len(self.held)
        ids = self.ids.new_zeros((B, self.ids.shape[1]))
        ids[:n] = self.ids
        held = torch.zeros(B, dtype=torch.bool)
        held[:n] = self.held
        kv = []
        for K, V in self.kv:
            K2, V2 = K.new_zeros((B, *K.shape[1:])), V.new_zeros((B, *V.shape[1:]))
            K2[:n], V2[:n] = K, V
            kv.append((K2, V2))
        self.ids, self.held, self.kv = ids, held, kv
        self.slot = torch.cat([self.slot, torch.arange(n, B)])

    def _front(self, rows: torch.Tensor) -> None:
        """The kept states reordered so that rows (R,) lie in slots 0..R-1, in that order, the other
        rows after them in their present order: one copy of the arrays when the set of rows called
        changes (a sampler's finished rows leave it), instead of a gather and a write-back per call."""
        B = len(self.held)
        rest = torch.ones(B, dtype=torch.bool)
        rest[rows] = False
        others = rest.nonzero().squeeze(1)
        others = others[self.slot[others].argsort()]
        order = torch.cat([rows, others])  # the batch row in each new slot
        perm = self.slot[order]
        for i, (K, V) in enumerate(self.kv):
            self.kv[i] = (K[perm], V[perm])
        self.slot[order] = torch.arange(B)

    def _put(self, i: int, layers: int, ids: torch.Tensor, rows: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A whole call's keys and values k, v (R, h, N, d) of layer i written into the kept arrays
        (made at layer 0 when they cannot hold the call: new length, dtype or more rows; the rows
        they held are then computed whole when called). Where the rows' slots are one run (a
        sampler calls its active rows, which _front put first), the queries attend to that slice
        of the arrays, contiguous: one copy of k and v per layer, where attending to the layer's
        own strided k, v and keeping them costs a copy for the products and a scatter for the cache."""
        if i == 0:
            B = int(rows.max()) + 1
            same = self.ids.shape[1] == ids.shape[1] and self.kv[0][0].dtype == k.dtype
            if not same or B > len(self.held):
                B = max(B, len(self.held)) if same else B
                self.ids = torch.zeros(B, ids.shape[1], dtype=ids.dtype, device=ids.device)
                self.held = torch.zeros(B, dtype=torch.bool)
                self.kv = [(k.new_zeros((B, *k.shape[1:])), v.new_zeros((B, *v.shape[1:]))) for _ in range(layers)]
                self.slot = torch.arange(B)
        K, V = self.kv[i]
        at = self.slot[rows]
        lo = int(at[0])
        if bool((at == torch.arange(lo, lo + len(at))).all()):
            keys, values = K[lo:lo + len(at)], V[lo:lo + len(at)]
            keys.copy_(k)
            values.copy_(v)
            return keys, values
        K[at], V[at] = k, v
        return k, v
