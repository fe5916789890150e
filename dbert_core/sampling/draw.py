"""Choosing the token of each revealed position, the same for every sampler family.

Temperature, top-k, top-p and the repeat block reshape the token choice only: whether a position
is revealed is decided from the model's raw p, and which token from the reshaped p' weighted by r
(p'(v) r(v)). The repeat block (on by default, `block_repeats`, RepeatBlock) removes from p' the
ids of the position's revealed left and right neighbours and of the word beyond a comma next to
it: a model that predicts each position's marginal fills "once upon a time, there [MASK] was"
with "there" far too often, and a reader sees "there there" or "once, once". Neighbours revealed
in the same event are drawn in three passes so they see each other. The n-gram block
(`no_repeat_ngram` N, off unless set or recommended: the `no_repeat_ngram_size` of autoregressive
decoding, on both sides) removes the ids that would write, with the position's N-1 revealed
neighbours on its left (or on its right), an N-gram the row already shows: a model decoding left
to right at a cool temperature otherwise loops ("She couldn't find it. But she couldn't find it.").
Categorical draws use float64.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch


def shape_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                keep: int = -1) -> torch.Tensor:
    """p' = softmax(logits / temperature) restricted to top-k / nucleus top-p, float64 (M, V).
    temperature 0 is its limit: the most likely tokens, equally likely where several tie (the
    seeded draw picks among them), whatever top-k and top-p say.
    keep >= 0 (a story's end mark, SampleConfig.natural_length): that id keeps its unshaped chance
    p(keep) = softmax(logits)[keep] and the other ids share the rest as the shaping says, so a cooler
    temperature or a nucleus changes which word a position takes, not whether the story ends there."""
    if keep >= 0:
        z = logits.double()
        p_keep = torch.softmax(z, dim=-1)[:, keep : keep + 1]
        words = shape_probs(z.index_fill(1, torch.tensor([keep]), float("-inf")), temperature, top_k, top_p)
        words = torch.nan_to_num(words, nan=0.0)  # a row whose only possible id is `keep`
        out = words * (1 - p_keep)
        out[:, keep : keep + 1] = p_keep
        return out / out.sum(-1, keepdim=True)
    if temperature == 0:
        z = logits.double()
        best = z == z.max(dim=-1, keepdim=True).values
        return best.double() / best.sum(-1, keepdim=True)
    z = logits.double() / temperature
    if top_k and top_k < z.shape[-1]:
        kth = torch.topk(z, top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    p = torch.softmax(z, dim=-1)
    if top_p < 1.0:
        p = nucleus(p, top_p)
    return p


LOWEST_BIN = -64  # p < 2^-63 (and 0) share the lowest bin of nucleus()


def nucleus(p: torch.Tensor, top_p: float) -> torch.Tensor:
    """p (M, V) restricted to its nucleus (the most likely tokens until their mass reaches top_p:
    a token stays while the mass strictly above it is below top_p) and renormalised.

    Sorting whole rows of the vocabulary is what made the nucleus slow (a row's sort costs ten
    to forty times a topk of a few dozen), and the nucleus is usually a few dozen to a few hundred
    tokens. So each row's probabilities are binned by their power of two (one pass over the
    float64 exponent field), the bins summed from the top until they hold top_p: every token below
    that bin has at least top_p above it, so the nucleus lies among the tokens of that bin and
    above (at most about twice the nucleus). Only those candidates are sorted (each row's, side by
    side in one array) and cut where the mass above reaches top_p. The tokens are the nucleus of a
    whole sort; among equal probabilities the lower id comes first."""
    M, V = p.shape
    bins = (p.double().view(torch.int64) >> 52).sub_(1023 + LOWEST_BIN).clamp_(0, -LOWEST_BIN)  # p in [2^b, 2^(b+1)): b + 1023 - LOWEST_BIN
    nb = 1 - LOWEST_BIN
    mass = torch.zeros(M, nb, dtype=p.dtype, device=p.device).scatter_add_(1, bins, p)
    above = mass.flip(1).cumsum(1)  # the mass of the top bins, highest first
    reach = nb - 1 - (above < top_p).sum(1, keepdim=True).clamp_max(nb - 1)  # the bin where the mass reaches top_p
    rows, ids = (bins >= reach).nonzero(as_tuple=True)  # candidates, row-major
    n = torch.bincount(rows, minlength=M)
    col = torch.arange(len(rows), device=p.device) - (n.cumsum(0) - n)[rows]  # place within its row
    sp = torch.full((M, int(n.max())), -1.0, dtype=p.dtype, device=p.device)  # -1: no candidate
    sp[rows, col] = p[rows, ids]
    sp, order = torch.sort(sp, dim=-1, descending=True, stable=True)  # each row's candidates, most likely first
    idx = torch.zeros(sp.shape, dtype=torch.long, device=p.device)
    idx[rows, col] = ids
    idx = idx.gather(1, order)
    sp.clamp_(min=0.0)
    keep = (sp.cumsum(-1) - sp < top_p) & (sp > 0)  # the mass strictly above each is below top_p
    rows, ids, vals = keep.nonzero(as_tuple=True)[0], idx[keep], sp[keep]
    out = torch.zeros_like(p)
    out[rows, ids] = vals
    return out / out.sum(-1, keepdim=True)


def categorical(p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw from rows of p (M, V) with uniforms u (M,), in float64."""
    cdf = p.double().cumsum(-1)
    x = (u.double() * cdf[:, -1]).unsqueeze(-1)
    return torch.searchsorted(cdf, x, right=True).squeeze(-1).clamp_max(p.shape[-1] - 1)


def neighbours(x: torch.Tensor, masked: torch.Tensor, where: torch.Tensor, comma: int = -1,
               joiners: tuple[int, ...] = (), names: torch.Tensor | None = None) -> torch.Tensor:
    """(K, J) ids the `where` positions of x may not take under the repeat block (-1: none): the
    revealed left and right neighbours (J = 2); when `comma` is the comma's id (J = 5) also the
    word beyond a revealed comma on either side and the comma itself between two equal words
    ("once, once"); with `names` ((V,) bool: the checkpoint's proper names) each of `joiners`
    ("and", "or", "with") adds the name beyond it on either side (2 more) and, between a name and
    itself, the joiners (one each), so "Lily and Lily" cannot be written in any order while
    "laughed and laughed" still can."""
    pad = torch.full((x.shape[0], 1), -1, dtype=x.dtype)
    shown = torch.where(masked, torch.full_like(x, -1), x)
    left = torch.cat([pad, shown[:, :-1]], 1)
    right = torch.cat([shown[:, 1:], pad], 1)
    out = [left[where], right[where]]
    if comma < 0 and not (joiners and names is not None):
        return torch.stack(out, 1)
    left2 = torch.cat([pad, pad, shown[:, :-2]], 1)[:, : x.shape[1]]  # two to the left / right
    right2 = torch.cat([shown[:, 2:], pad, pad], 1)[:, : x.shape[1]]
    if comma >= 0:
        between = torch.where((left == right) & (left >= 0), comma, -1)  # no comma between two equal words
        out += [torch.where(left == comma, left2, -1)[where], torch.where(right == comma, right2, -1)[where],
                between[where]]
    if joiners and names is not None:
        joined = torch.tensor(joiners, dtype=x.dtype)

        def name_beyond(side, beyond):
            ok = torch.isin(side, joined) & (beyond >= 0) & names[beyond.clamp(0, len(names) - 1)]
            return torch.where(ok, beyond, -1)[where]

        same_name = (left == right) & (left >= 0) & names[left.clamp(0, len(names) - 1)]
        out += [name_beyond(left, left2), name_beyond(right, right2)]
        out += [torch.where(same_name, j, -1)[where] for j in joiners]  # no joiner between a name and itself
    return torch.stack(out, 1)


@dataclass(frozen=True, eq=False)
class RepeatBlock:
    """The repeat block: a revealed position never takes its revealed neighbour's id, nor the id
    of the word beyond a comma next to it, nor a comma between two equal words, nor the name beyond
    an "and" / "or" / "with" next to it ("Lily and Lily"; names: the truecasing table's capitalised
    words). Positions revealed in one event are drawn in three passes (by column mod 3), so of any
    three neighbours revealed together the last drawn sees the other two."""

    comma: int = -1
    joiners: tuple[int, ...] = ()
    names: torch.Tensor | None = None  # (V,) bool
    neighbours: bool = True            # the neighbour rules above (block_repeats); False: only the n-gram block
    ngram: int = 0                     # N of the n-gram block (no_repeat_ngram_ids); 0: off
    specials: torch.Tensor | None = None  # ids no n-gram holds ([SEP], [CLS], [PAD]: a story's end padding)


def no_repeat_ngram_ids(x: torch.Tensor, masked: torch.Tensor, where: torch.Tensor, n: int,
                        specials: torch.Tensor | None = None) -> torch.Tensor:
    """(K, J) ids the `where` positions of rows x (R, L) may not take under the n-gram block (-1: none):
    each id v such that v, after the position's n-1 revealed left neighbours (or before its n-1
    revealed right neighbours), writes an n-gram the row already shows revealed: the position ends
    (or starts) the n-gram, as a left-to-right decoder's next token ends one. A position between
    revealed neighbours on both sides is not held to the n-grams it would sit inside: the word that
    fits there is seldom free (blocking "s" in "Lily ' _ mom" writes "Lily 'her mom"). n-grams holding
    a masked position or one of `specials` do not count; n = 1 blocks every id the row shows."""
    shown = torch.where(masked, torch.full_like(x, -1), x)
    if specials is not None and len(specials):
        shown = torch.where(torch.isin(shown, specials), torch.full_like(x, -1), shown)
    rows, cols = where.nonzero(as_tuple=True)  # row-major, as the reveals are
    R, L = x.shape
    m = n - 1
    if m == 0:
        return shown[rows]
    pad = torch.full((R, m), -1, dtype=x.dtype)
    padded = torch.cat([pad, shown, pad], 1)  # column j + m is shown's column j
    sides = (torch.stack([padded[:, k: k + L] for k in range(m)], -1),               # shown[j - m + k]
             torch.stack([padded[:, m + 1 + k: m + 1 + k + L] for k in range(m)], -1))  # shown[j + 1 + k]
    out = []
    for ctx in sides:  # (R, L, m): each column's n-1 neighbours on this side
        whole = (ctx >= 0).all(-1) & (shown >= 0)  # the n-grams the row shows, ending (or starting) at a column
        mine = ctx[rows, cols]  # (K, m)
        same = (ctx[rows] == mine[:, None, :]).all(-1) & whole[rows] & (mine >= 0).all(-1, keepdim=True)
        out.append(torch.where(same, shown[rows], torch.full_like(shown[rows], -1)))
    return torch.cat(out, 1)


JOINERS = ("and", "or", "with")


def repeat_block(db, neighbours: bool = True, ngram: int = 0) -> RepeatBlock | None:
    """The checkpoint's repeat block: its comma, its joiners and its names (from the truecasing
    table: the words written capitalised inside a sentence), built once per loaded checkpoint (every
    window and touch-up round of a run asks for it); with `neighbours` False only the n-gram block,
    with ngram 0 none; None when neither is on."""
    if not neighbours and not ngram:
        return None
    cached = getattr(db, "_repeat_block", None)
    if cached is None:
        cached = _repeat_block(db)
        setattr(db, "_repeat_block", cached)
    if neighbours and not ngram:
        return cached
    return replace(cached, neighbours=neighbours, ngram=ngram)


def _repeat_block(db) -> RepeatBlock:
    vocab = db.tokenizer.backend_tokenizer
    joiners = tuple(i for i in (vocab.token_to_id(w) for w in JOINERS) if i is not None)
    names = None
    table = getattr(db, "truecase", None) or {}
    ids = [vocab.token_to_id(w) for w, cased in table.items() if cased[:1].isupper() and w != "i"]
    ids = [i for i in ids if i is not None]
    if ids and joiners:
        names = torch.zeros(db.model.config.vocab_size, dtype=torch.bool)
        names[torch.tensor(ids)] = True
    tok = db.tokenizer
    specials = torch.tensor(sorted({i for i in (tok.sep_token_id, tok.cls_token_id, tok.pad_token_id,
                                                tok.mask_token_id, tok.unk_token_id) if i is not None}))
    return RepeatBlock(comma=comma_id(db), joiners=joiners, names=names, specials=specials)


def draw_tokens(x, masked, revealed, logits, r_v, no_draw, shaping, u, block: RepeatBlock | None, top=None):
    """Tokens for the revealed (R, L) positions of rows x (R, L) whose masked (R, L) positions
    are the ones still masked before this event; logits and u (K,) in row-major order of
    revealed, r_v (K, V), (1, V) or None. Returns (chosen (K,), p'(chosen) (K,)) as `draw`.
    top: frames(topk=k)'s recorder (inspector.TopK), given each pass's candidates."""
    if block is None:
        return draw(logits, r_v, no_draw, shaping, u, top=top)
    K = int(revealed.sum())
    column = torch.arange(revealed.shape[1]).expand_as(revealed) % 3
    chosen = torch.empty(K, dtype=torch.long)
    conf = torch.empty(K, dtype=torch.float64)
    x, masked = x.clone(), masked.clone()
    for part in range(3):
        where = revealed & (column == part)
        sel = where[revealed]  # (K,) the reveals of this pass
        if not sel.any():
            continue
        idx = sel.nonzero().squeeze(1)
        rv = None if r_v is None else (r_v[idx.to(r_v.device)] if r_v.shape[0] == K and K > 1 else r_v)
        blocked = neighbours(x, masked, where, block.comma, block.joiners, block.names) if block.neighbours \
            else torch.full((int(where.sum()), 0), -1, dtype=x.dtype)
        if block.ngram:
            blocked = torch.cat([blocked, no_repeat_ngram_ids(x, masked, where, block.ngram, block.specials)], 1)
        c, pc = draw(logits[idx.to(logits.device)], rv, no_draw, shaping, u[idx], blocked, None if top is None else top.at(idx))
        chosen[idx], conf[idx] = c, pc
        x[where] = c
        masked &= ~where
    return chosen, conf


def comma_id(db) -> int:
    """The id of "," in this checkpoint's vocabulary (-1 if it has none)."""
    cid = db.tokenizer.backend_tokenizer.token_to_id(",")
    return -1 if cid is None else int(cid)


def draw(logits, r_v, no_draw, shaping, u, blocked=None, top=None):
    """Tokens for revealed positions: from p'(v) r(v); returns (chosen (K,), p'(chosen) (K,)).
    logits (K, V) on any device (copied to the host here: the draws are float64 on the CPU).
    blocked (K, J): per position, ids it may not take (neighbours(); -1: none)."""
    logits = logits.to("cpu", copy=True)
    logits[:, no_draw] = float("-inf")
    if blocked is not None:
        rows, cols = (blocked >= 0).nonzero(as_tuple=True)
        logits[rows, blocked[rows, cols]] = float("-inf")
    p = shape_probs(logits, *shaping)
    weights = p if r_v is None else p * r_v
    if r_v is not None:
        r_v = r_v.expand_as(p)  # top-k/top-p can leave no token that can appear now: fall back to p r
        empty = weights.sum(-1) <= 0
        if empty.any():
            raw = torch.softmax(logits[empty].double(), dim=-1) * r_v[empty]
            weights[empty] = torch.where(raw.sum(-1, keepdim=True) > 0, raw, p[empty])
    chosen = categorical(weights, u)
    if top is not None:  # frames(topk=k): the candidates of p' at this reveal
        top.keep(p)
    return chosen, p.gather(-1, chosen.unsqueeze(-1)).squeeze(-1)
