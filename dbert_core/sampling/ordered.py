"""The heuristic strategies that choose which positions to reveal by how sure the model is.

They change the law of the exact samplers (strategies.py names each, its label and parameters;
docs/decoding.md measures them):
    confidence, margin, entropy
                   each step reveals the k masked positions the model is surest of (top-1
                   probability, top-1 minus top-2, lowest entropy), k such that a row's revealed
                   count follows the schedule's expected masked fraction (frequency-weighted
                   over the vocabulary, as the TUI's curve); no call at a step where no row
                   reveals anything, so S >= L costs about L calls and S < L costs S.
    blockwise      the same counts, the canvas read in blocks of `block` tokens left to right
                   (LLaDA's semi-autoregressive remasking): a step reveals the surest masked
                   positions of a row's first block that still has any, spilling into the next
                   block only when that one has fewer left than the step reveals; each call
                   computes those blocks whole (with the decided-position cache, the rest is kept).
    threshold, entropy-bounded
                   one call per frame until nothing is masked: reveal every position whose
                   top-1 probability exceeds tau (Fast-dLLM), or the lowest-entropy positions
                   while sum(H) - max(H) <= gamma (EB-sampler); at least one per row and call.
                   --steps sets only the time grid: a frame's step is the grid step whose
                   expected masked fraction the row has reached (the model is called there).
The scores that rank positions come from the raw p (with the never-drawn ids left out), the
tokens from p' (temperature, top-k, top-p, repeat block) as in the exact samplers.
"""

from __future__ import annotations

from typing import Iterator

import torch

from .base import Frame, State, masked_curve
from .draw import draw_tokens


def position_scores(logits: torch.Tensor, no_draw: list[int], by: str) -> torch.Tensor:
    """(M,) float64 on the host: how sure the model is of each position, from its raw p (softmax
    of the logits with the never-drawn ids left out), computed where the logits are.

    confidence: top-1 probability; margin: top-1 minus top-2; entropy: H(p) in nats."""
    z = logits.float().clone()
    if no_draw:
        z[:, torch.tensor(no_draw, device=z.device)] = float("-inf")
    logp = torch.log_softmax(z, dim=-1)
    p = logp.exp()
    if by == "confidence":
        out = p.max(-1).values
    elif by == "margin":
        top = p.topk(min(2, p.shape[-1]), dim=-1).values
        out = top[:, 0] - (top[:, 1] if top.shape[-1] > 1 else 0.0)
    elif by == "entropy":
        out = -(p * logp.masked_fill(p == 0, 0.0)).sum(-1)
    else:
        raise ValueError(f"unknown score {by!r}")
    return out.cpu().double()


def _reveal_tokens(state: State, rows, mk, rev, logits, u_token, read=None, shaping=None):
    """Draw tokens from p' at the rev (R, L) positions of batch rows `rows` (their masked
    positions mk; the logits those of `read`, default mk, in row-major order) and write them in;
    returns the (B, L) revealed mask. shaping: the token choice's (default the run's)."""
    revealed = torch.zeros_like(state.masked)
    if not rev.any():
        return revealed
    read = mk if read is None else read
    chosen, conf = draw_tokens(state.x[rows], mk, rev, logits[rev[read].to(logits.device)], None, state.no_draw,
                               shaping or state.shaping, u_token[rows][rev], state.block_repeats, state.top)
    revealed[rows] = rev
    state.reveal(revealed, chosen, conf)
    return revealed


def _reveal_opening(state: State, rows, mk, rev, logits, u_token, read, front) -> torch.Tensor:
    """_reveal_tokens with the rows still in the canvas's first block (front: each row's first block
    with a [MASK]) drawn at blockwise's `opening` temperature, the others at the run's."""
    first = (front[rows] == 0).unsqueeze(1)
    warm = state.shaping._replace(temperature=float(state.params["opening"]))
    return _reveal_tokens(state, rows, mk, rev & first, logits, u_token, read, warm) | \
        _reveal_tokens(state, rows, mk, rev & ~first, logits, u_token, read)


def blockwise(state: State) -> Iterator[Frame]:
    """blockwise: ordered() with its score (`by`) ranked within blocks of `block` tokens, left to right."""
    return ordered(state, state.params["by"], block=state.params["block"])


def _rank(full: torch.Tensor, block: int) -> torch.Tensor:
    """(R, L) each position's rank: highest score first (ties: leftmost), and with block > 0 every
    masked position (a finite score) of an earlier block of `block` tokens before any of a later one."""
    L = full.shape[1]
    order = torch.argsort(full, dim=1, descending=True, stable=True)
    if block:
        blocks = (order // block).double()  # stable: within a block the score order stands
        blocks[~torch.isfinite(full.gather(1, order))] = float("inf")  # not masked: after every masked one
        order = order.gather(1, torch.argsort(blocks, dim=1, stable=True))
    return torch.empty_like(order).scatter_(1, order, torch.arange(L).expand_as(order).contiguous())


def _window(mk: torch.Tensor, need: torch.Tensor, block: int) -> torch.Tensor:
    """(R, L) every position of each row's leading unfinished blocks of `block` tokens that hold at
    least its `need` (R,) masked ones: what blockwise computes at each call, decided positions
    included (with --cache-refresh and --cache-masked a call between refreshes then computes about
    one block a row, afresh, as Fast-dLLM's dual cache does; the other blocks' states are kept)."""
    L = mk.shape[1]
    blk = (torch.arange(L) // block).expand_as(mk)
    counts = torch.zeros(mk.shape[0], (L + block - 1) // block, dtype=torch.long).scatter_add_(1, blk, mk.long())
    before = counts.cumsum(1) - counts  # masked positions in the blocks before each one
    return ((before < need.unsqueeze(1)) & (counts > 0)).gather(1, blk)


def _first_blocks(masked: torch.Tensor, block: int) -> torch.Tensor:
    """(B,) each row's first block of `block` tokens with a masked position (the row's block count if none)."""
    L = masked.shape[1]
    first = torch.where(masked.any(1), masked.int().argmax(1), torch.full((masked.shape[0],), L))
    return torch.div(first, block, rounding_mode="floor")


def ordered(state: State, by: str, block: int = 0) -> Iterator[Frame]:
    """confidence, margin, entropy (by: the position_scores score): each step reveals the k surest
    masked positions of each row, k such that the row's revealed count is round(n0 (1 - curve[k+1]))
    after step k (curve: the expected masked fraction, base.masked_curve). block > 0 (blockwise):
    only the row's first unfinished blocks are computed and their masked positions read (_window), the surest of the first
    block with a masked position revealed first (_rank), and with --cache-refresh the call after a
    row enters its next block computes every position afresh (Fast-dLLM's dual cache)."""
    x, masked, kern, net, gen, no_draw = state.x, state.masked, state.kern, state.net, state.gen, state.no_draw
    curve = masked_curve(state.db, state.steps)
    S = len(kern.grid) - 1
    n0 = masked.sum(1)
    target = torch.round(n0.double().unsqueeze(0) * (1.0 - curve[1:]).unsqueeze(1)).long()  # (S, B)
    target[-1] = n0
    front = None  # blockwise: each row's first block with a [MASK] at the last call
    opening = state.params.get("opening", -1.0) if block else -1.0
    for k in range(S):
        u_token = torch.rand(x.shape, generator=gen, dtype=torch.float64)
        need = torch.minimum(target[k] - (n0 - masked.sum(1)), masked.sum(1))
        revealed = torch.zeros_like(masked)
        if (need > 0).any():
            rows = (need > 0).nonzero().squeeze(1)
            mk = masked[rows]
            if block:
                now = _first_blocks(masked, block)
                if front is not None and not torch.equal(now[rows], front[rows]):
                    net.refresh_next()  # a row entered its next block: its context is computed afresh
                front = now
            region = _window(mk, need[rows], block) if block else mk
            read = region & mk
            logits = net(x[rows], region, torch.full((len(rows),), kern.grid[k]), rows=rows)
            if block:
                logits = logits[mk[region].to(logits.device)]  # the masked positions' rows, row-major
            score = position_scores(logits, no_draw, by)
            if by == "entropy":
                score = -score
            full = torch.full(mk.shape, float("-inf"), dtype=torch.float64)
            full[read] = score
            rev = read & (_rank(full, block) < need[rows].unsqueeze(1))
            revealed = _reveal_opening(state, rows, mk, rev, logits, u_token, read, now) if opening >= 0 \
                else _reveal_tokens(state, rows, mk, rev, logits, u_token, read)
        yield state.frame(revealed, k + 1)


def adaptive(state: State, rule: str, value: str) -> Iterator[Frame]:
    """threshold (rule "above": the top-1 probability above the parameter `value`) and
    entropy-bounded (rule "budget": the entropy budget `value`): one call per frame, each row
    revealing as many positions as its rule allows (at least one), until nothing is masked."""
    x, masked, kern, net, gen, no_draw = state.x, state.masked, state.kern, state.net, state.gen, state.no_draw
    bound = state.params[value]
    curve = masked_curve(state.db, state.steps)
    B = x.shape[0]
    S = len(kern.grid) - 1
    grid = torch.tensor(kern.grid)
    n0 = masked.sum(1).clamp_min(1)

    def step_of(left: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The grid step whose expected masked fraction each row's `left` masked count has reached."""
        f = left.double() / n0[rows]
        return (curve[1:].unsqueeze(0) >= f.unsqueeze(1) - 1e-12).sum(1)

    everyone = torch.arange(B)
    while masked.any():
        rows = masked.any(1).nonzero().squeeze(1)
        mk = masked[rows]
        u_token = torch.rand(x.shape, generator=gen, dtype=torch.float64)
        k = step_of(mk.sum(1), rows).clamp_max(S - 1)
        logits = net(x[rows], mk, grid[k], rows=rows)
        if rule == "above":
            full = torch.full(mk.shape, float("-inf"), dtype=torch.float64)
            full[mk] = position_scores(logits, no_draw, "confidence")
            rev = mk & (full > bound)
            rev[torch.arange(len(rows)), full.argmax(1)] = True  # at least the most confident one
        else:  # entropy-bounded: sorted by entropy, the longest prefix with sum(H) - max(H) <= gamma
            full = torch.full(mk.shape, float("inf"), dtype=torch.float64)
            full[mk] = position_scores(logits, no_draw, "entropy")
            h, order = torch.sort(full, dim=1, stable=True)
            before = h.cumsum(1) - h  # the sum of the smaller entropies: sum(H) - max(H) of the prefix
            ok = torch.isfinite(h) & (before <= bound + 1e-12)
            ok[:, 0] = True
            rev = torch.zeros_like(mk).scatter_(1, order, ok) & mk
        revealed = _reveal_tokens(state, rows, mk, rev, logits, u_token)
        row_steps = step_of(masked.sum(1), everyone).clamp_min(1)
        left = masked.any(1)
        yield state.frame(revealed, int(row_steps[left].min()) if left.any() else S, row_steps=row_steps)
    yield from state.nothing_to_fill()
