"""Reverse diffusion: fill [MASK]s in, one frame per reverse step (or per reveal event).

The reverse step (docs/method.md section 2), for a masked position at step t jumping to s < t:
    reveal token v with probability p(v) r(v),  stay masked with 1 - R,  R = sum_v p(v) r(v),
    r(v) = (a_s(v) - a_t(v)) / (1 - a_t(v)),  p = p_theta(x_0 | x_t).
Revealed tokens are never masked again ("carry-over"). Temperature, top-k, top-p and the
repeat block reshape the token choice only: whether a position is revealed is decided from the
model's raw p, and which token from the reshaped p' weighted by r. The repeat block (on by
default, `block_repeats`, `RepeatBlock`) removes from p' the ids of the position's revealed left
and right neighbours and of the word beyond a comma next to it: a model that predicts each
position's marginal fills "once upon a time, there [MASK] was" with "there" far too often, and a
reader sees "there there" or "once, once". Neighbours revealed in the same event are drawn in
three passes so they see each other. Categorical draws use float64. At the last
step (s = 0) a_0 = 1, so r = 1: every position still masked is revealed.

r(v) depends on v only through the schedule's per-token constant (spindle: the centred
information f(v) - fbar), so the vocabulary splits into C classes of equal r and
R = sum_c P(c) r(c) with P(c) the mass p puts on class c: a (M, C) x (C,) product per step
instead of a vocabulary-wide one (C = 1 for the linear schedule).

Samplers (S = the step budget, grid t_0 = T > t_1 > ... > t_S = 0):
    ancestral      one network call per step, on the whole batch.
    cached         a time-agnostic model's prediction depends on x_t only, so a row's logits
                   are recomputed only when that row changed since they were computed, and for
                   a schedule whose r does not depend on the token (linear) only when the row
                   reveals something at this step. Same random draws and, because rows of a
                   batch are computed independently, the same samples as ancestral.
    first-hitting  (Zheng et al. 2024) draws, for each row, the step of its next reveal event
                   directly and jumps there: one network call per event, all rows of a batch
                   advancing one event per call, so a sample of L tokens costs at most L calls
                   whatever S is. Exact in distribution for the S-step ancestral sampler:
                   a row with masked positions i at step k has not revealed anything by step
                   m with probability  prod_{j=k..m-1} prod_i (1 - R_i(j)),  R_i(j) = P_i . r_j
                   (p_i is fixed while x does not change: time-agnostic model). The event step
                   is drawn by inversion of that survival function (an Exp(1) threshold on the
                   cumulative hazard, scanned over windows of steps); given the event step m,
                   the positions revealed at m are independent Bernoulli(R_i(m)) conditioned
                   on at least one, and their tokens are drawn from p'(v) r_m(v) as in ancestral.
                   Linear schedule: the survival is (t_m / t_k)^n, i.e. the next reveal time is
                   t_k u^(1/n) snapped to the grid; then the logits are needed only at the
                   revealed positions, and any time conditioning works (the model is called at
                   the event's t). Several positions can share a step (always at the last one,
                   where r = 1), so an event may reveal more than one token; for S >> L that is
                   rare and the call count approaches L.

Those three are exact: they draw from the law above. The heuristic strategies change it
(strategies.py names each one, its label and parameters; docs/decoding.md measures them):
    confidence, margin, entropy
                   each step reveals the k masked positions the model is surest of (top-1
                   probability, top-1 minus top-2, lowest entropy), k such that a row's revealed
                   count follows the schedule's expected masked fraction (frequency-weighted
                   over the vocabulary, as the TUI's curve); no call at a step where no row
                   reveals anything, so S >= L costs about L calls and S < L costs S.
    threshold, entropy-bounded
                   one call per frame until nothing is masked: reveal every position whose
                   top-1 probability exceeds tau (Fast-dLLM), or the lowest-entropy positions
                   while sum(H) - max(H) <= gamma (EB-sampler); at least one per row and call.
                   --steps sets only the time grid: a frame's step is the grid step whose
                   expected masked fraction the row has reached (the model is called there).
    remdm          ancestral with remasking (ReMDM): a masked position reveals v with
                   p(v) (a_s - (1 - sigma) a_t) / (1 - a_t), a revealed one is masked again
                   with sigma, per token class as the kernel above; sigma from the cap, rescale
                   or loop schedule. sigma = 0 is the ancestral sampler.
The scores that rank positions come from the raw p (with the never-drawn ids left out), the
tokens from p' (temperature, top-k, top-p, repeat block) as in the exact samplers.
"""

from __future__ import annotations

import re

import functools
import math
import time as _time
import weakref
from dataclasses import dataclass, field, fields, replace
from typing import Iterator

import torch

from .. import strategies
from .touchup import touch_up
from .blocks import is_story_model, story_frames, story_of, story_template, window, with_end_rule
from ..config import SampleConfig
from ..errors import DbertError
from ..hardware import compute_dtype
from ..maths.model import forward_flops
from ..maths.schedule import step_grid


@dataclass
class Frame:
    """The state after one reverse step (first-hitting: one reveal event) of a batch of samples.

    ids         (B, L) content token ids; [MASK] where still masked
    masked      (B, L) bool, still masked after this step
    revealed    (B, L) bool, revealed at this step
    confidence  (B, L) float, p'(chosen token) when it was revealed (nan if masked or given)
    step        1..steps, the number of reverse steps done (first-hitting: by the slowest row)
    steps       the step budget S
    t           the diffusion time reached (T ... 0), t = grid[step]
    nfe         network calls so far
    rows        rows the network evaluated so far (a call on k rows adds k)
    flops       floating-point operations of those calls (the BERT forward, model.forward_flops)
    row_steps   (B,) the step each row's state belongs to (first-hitting: rows run apart, and a
                finished row stays at the step of its last reveal)
    remasked    (B, L) bool, masked again at this step (remdm, the quote touch-up; None for the strategies that never remask)
    touch_up    True while frames of the touch-up follow or are under way (touchup.py): the
                step budget is spent (step == steps) but the run is not done yet
    top_ids     (B, L, k) the k most likely ids of p' at each position's (last) reveal, -1 where
                never revealed; top_probs (B, L, k) their p'. Only when frames(..., topk=k).
    """

    ids: torch.Tensor
    masked: torch.Tensor
    revealed: torch.Tensor
    confidence: torch.Tensor
    step: int
    steps: int
    t: int
    nfe: int
    rows: int = 0
    row_steps: torch.Tensor | None = None
    flops: float = 0.0
    remasked: torch.Tensor | None = None
    touch_up: bool = False
    top_ids: torch.Tensor | None = None
    top_probs: torch.Tensor | None = None

    @property
    def done(self) -> bool:
        return self.step == self.steps and not self.touch_up


def shape_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """p' = softmax(logits / temperature) restricted to top-k / nucleus top-p, float64 (M, V).
    temperature 0 is its limit: the most likely tokens, equally likely where several tie (the
    seeded draw picks among them), whatever top-k and top-p say."""
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
        sp, idx = torch.sort(p, dim=-1, descending=True)
        before = sp.cumsum(-1) - sp  # mass strictly above each token
        sp = sp.masked_fill(before >= top_p, 0.0)
        p = torch.zeros_like(p).scatter_(-1, idx, sp)
        p = p / p.sum(-1, keepdim=True)
    return p


def categorical(p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw from rows of p (M, V) with uniforms u (M,), in float64."""
    cdf = p.double().cumsum(-1)
    x = (u.double() * cdf[:, -1]).unsqueeze(-1)
    return torch.searchsorted(cdf, x, right=True).squeeze(-1).clamp_max(p.shape[-1] - 1)


def validate(db, steps: int, length: int, sampler: str, params: dict | None = None) -> None:
    """The checks that need the checkpoint (SampleConfig.validate makes the others)."""
    T = db.schedule.T
    if not 1 <= steps <= T:
        raise DbertError(f"--steps must be between 1 and T={T}, got {steps}")
    longest = MAX_STORY if is_story_model(db) else db.model.max_length  # a story continues block by block
    if not 1 <= length <= longest:
        raise DbertError(f"--length must be between 1 and {longest} for this model, got {length}")
    if sampler == "cached" and db.model.time != "none":
        raise DbertError(f"the cached sampler needs a time-agnostic model; this one uses time={db.model.time!r}")
    if sampler == "first-hitting" and db.model.time != "none" and not db.schedule.token_free:
        raise DbertError("the first-hitting sampler needs a time-agnostic model with the "
                         f"{db.schedule.name} schedule; this one uses time={db.model.time!r}")
    if sampler == "remdm" and (params or {}).get("schedule") == "loop" and steps < 2:
        raise DbertError("remdm's loop schedule needs --steps >= 2 (one step to reveal, one to finish)")


def default_sampler(db) -> str:
    """The fastest exact sampler this model allows (what `dbert sample` uses unless told)."""
    return "first-hitting" if db.model.time == "none" or db.schedule.token_free else "ancestral"


def default_length(db) -> int:
    """Tokens per sample unless told: the length the checkpoint was trained on (a story model: the
    story text one window holds, after the [SEP] that opens it)."""
    return window(db) - 1 if is_story_model(db) else window(db)


def resolve(cfg: SampleConfig, db) -> SampleConfig:
    """cfg made concrete for this checkpoint, once per run and handed down: SampleConfig.validate's
    checks, then length, sampler, precision ("auto": hardware.compute_dtype) and the strategy's
    parameters filled in, then the checks that need the checkpoint (validate). The copy keeps
    cfg's class (the TUI's Settings stay Settings); frames and generate take it as it is."""
    cfg.validate()
    sampler = cfg.sampler if cfg.sampler is not None else default_sampler(db)
    out = replace(cfg, length=cfg.length if cfg.length is not None else default_length(db), sampler=sampler,
                  dtype=compute_dtype(cfg.dtype, db.device), params=strategies.get(sampler).resolve(cfg.params))
    validate(db, out.steps, out.length, out.sampler, out.params)
    return _mark(out, db)


_RESOLVED: dict[int, tuple] = {}  # id(cfg) -> (checkpoint, field values) of the configs resolve made


def _values(cfg: SampleConfig) -> list:
    return [getattr(cfg, f.name) for f in fields(cfg)]


def _mark(cfg: SampleConfig, db) -> SampleConfig:
    """Remember that cfg, as it is now, was resolved for db (the entry goes with cfg)."""
    _RESOLVED[id(cfg)] = (weakref.ref(db), _values(cfg))
    weakref.finalize(cfg, _RESOLVED.pop, id(cfg), None)
    return cfg


def _is_resolved(cfg: SampleConfig, db) -> bool:
    """cfg came from resolve(., db) and has not been changed since."""
    entry = _RESOLVED.get(id(cfg))
    return entry is not None and entry[0]() is db and entry[1] == _values(cfg)


MAX_STORY = 8192  # tokens a story model may be asked for (--length), in windows one after another
_MASK_RUN = re.compile(r"\[mask\s*\*\s*(\d{1,5})\]", re.IGNORECASE)


def expand_template(template: str) -> str:
    """A prompt template with each `[MASK*N]` written out as N `[MASK]` slots."""
    return _MASK_RUN.sub(lambda m: " ".join(["[MASK]"] * int(m.group(1))), template)


def _slots(tok, template: str) -> str:
    """The template with its mask slots spelled as the tokenizer's mask token in any case
    (`[mask]` is a slot too, not three word pieces); the length is unchanged, so offsets hold."""
    return re.sub(re.escape(tok.mask_token), lambda m: tok.mask_token, template, flags=re.IGNORECASE)


def prompt_words(db, template: str) -> dict[int, str]:
    """{position: the prompt's own text there} for the tokens of a template (not its [MASK]s):
    what is printed for them, case and accents as the user typed them."""
    tok = db.tokenizer
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        return {}
    template = _slots(tok, expand_template(template))
    enc = backend.encode(template, add_special_tokens=False)
    if len(enc.ids) != len(tok.encode(template, add_special_tokens=False)):
        return {}
    return {i: template[a:b] for i, (t, (a, b)) in enumerate(zip(enc.ids, enc.offsets))
            if t != tok.mask_token_id and b > a}


def prompt_notes(db, template: str) -> list[str]:
    """What a user should know about a prompt before sampling: no [MASK] slot (the masks are
    appended after it), and the words the tokenizer cannot spell (the model sees [UNK] there;
    the output keeps them as typed)."""
    notes = []
    full = expand_template(template)
    if not re.search(r"\[mask\]", full, re.IGNORECASE):
        notes.append("the prompt has no [MASK] slot: masks are appended after it up to --length")
    tok = db.tokenizer
    full = _slots(tok, full)
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:
        enc = backend.encode(full, add_special_tokens=False)
        unknown = [full[a:b] for t, (a, b) in zip(enc.ids, enc.offsets) if t == tok.unk_token_id and b > a]
        if unknown:
            shown = ", ".join(repr(u) for u in dict.fromkeys(unknown[:5]))
            notes.append(f"the tokenizer cannot spell {shown}: the model sees [UNK] there (printed as typed)")
    return notes


def prompt_ids(db, template: str) -> torch.Tensor:
    """A template's token ids (its [MASK] slots as masks), nothing appended."""
    tok = db.tokenizer
    ids = tok.encode(_slots(tok, expand_template(template)), add_special_tokens=False)
    return parse_prompt(db, template, len(ids))


def parse_prompt(db, template: str, length: int) -> torch.Tensor:
    """Token ids (length,) of a template with [MASK] slots ([MASK*N]: N of them), masks appended
    up to length."""
    tok = db.tokenizer
    template = _slots(tok, expand_template(template))
    ids = tok.encode(template, add_special_tokens=False)
    bad = {tok.cls_token_id, tok.sep_token_id, tok.pad_token_id}
    ids = [tok.unk_token_id if i in bad else i for i in ids]
    if len(ids) > length:
        raise DbertError(f"the prompt is {len(ids)} tokens, longer than --length {length}")
    return torch.tensor(ids + [tok.mask_token_id] * (length - len(ids)), dtype=torch.long)


# ---------------------------------------------------------------------------------- kernel
@dataclass
class Kernel:
    """The reveal probabilities of an S-step budget, per class of tokens with equal r.

    grid      the S+1 times T = grid[0] > ... > grid[S] = 0
    r         (S, C) float64: r at step k (grid[k] -> grid[k+1]) for each class
    inverse   (V,) class of each vocabulary id, or None for a token-free schedule (C = 1)
    """

    grid: list[int]
    r: torch.Tensor
    inverse: torch.Tensor | None
    _on_device: dict = field(default_factory=dict, repr=False)  # inverse on the model's device

    @property
    def classes(self) -> int:
        return self.r.shape[1]

    def r_vocab(self, k: torch.Tensor) -> torch.Tensor | None:
        """r over the vocabulary at steps k (K,): (K, V) float64, or None if token-free."""
        return None if self.inverse is None else self.r[k][:, self.inverse]

    def class_mass(self, logits: torch.Tensor) -> torch.Tensor:
        """P (M, C) float64 on the host: the mass softmax(logits) puts on each class.

        Computed where the logits are (on a GPU only the (M, C) result crosses, not (M, V))."""
        if self.inverse is None:
            return torch.ones(logits.shape[0], 1, dtype=torch.float64)
        p = torch.softmax(logits.float(), dim=-1)
        inverse = self._on_device.get(p.device)
        if inverse is None:  # copied once per device: the kernel is cached per schedule and budget
            inverse = self._on_device[p.device] = self.inverse.to(p.device)
        mass = torch.zeros(p.shape[0], self.classes, dtype=p.dtype, device=p.device).index_add_(1, inverse, p)
        return mass.cpu().double()


@functools.lru_cache(maxsize=8)
def kernel(schedule, steps: int) -> Kernel:
    """The Kernel of a schedule and a step budget (cached: it is the same for every batch)."""
    grid = step_grid(schedule.T, steps)
    t = torch.tensor(grid[:-1], dtype=torch.float32).unsqueeze(-1)  # (S, 1)
    s = torch.tensor(grid[1:], dtype=torch.float32).unsqueeze(-1)
    if schedule.token_free:
        r = schedule.reveal_prob(t, s).double().reshape(steps, 1)  # (S, 1)
        inverse = None
    else:
        inverse, rep = schedule.classes()  # classes of equal a_t(v), one id of each
        r = schedule.reveal_prob(t, s, tokens=rep).double()  # (S, C)
    r[-1] = 1.0  # s = 0: a_0 = 1, everything still masked is revealed
    return Kernel(grid, r.contiguous(), inverse)


class _Net:
    """Calls the denoiser on some rows of the batch; counts calls and rows."""

    def __init__(self, db, dtype: str = "fp32"):
        self.model, self.device = db.model, db.device
        self.bf16 = dtype == "bf16" and next(self.model.parameters()).dtype == torch.float32  # autocast; fp32 logits out
        self.cls, self.sep = db.tokenizer.cls_token_id, db.tokenizer.sep_token_id
        self.nfe = 0
        self.rows = 0
        self.flops = 0.0  # of the BERT forward passes (model.forward_flops)

    def __call__(self, x: torch.Tensor, select: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Logits (M, V) float32 at the select (R, L) positions of rows x (R, L), row-major.

        They stay on the model's device: the sampler reduces them there (Kernel.class_mass) and
        brings to the host only the rows of positions it reveals (`_draw`)."""
        R = x.shape[0]
        edge = torch.zeros(R, 1, dtype=torch.bool)
        inp = torch.cat([torch.full((R, 1), self.cls), x, torch.full((R, 1), self.sep)], dim=1)
        sel = torch.cat([edge, select, edge], dim=1)
        attention = torch.ones(inp.shape, dtype=torch.bool, device=self.device)
        self.nfe += 1
        self.rows += R
        self.flops += forward_flops(self.model.config, R, inp.shape[1], int(sel.sum()))
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            out = self.model(inp.to(self.device), attention, sel.to(self.device), t=t.to(self.device)).float()
        total = float(out.detach().sum())  # one pass: -inf marks forbidden tokens; NaN or +inf anywhere makes it NaN or +inf
        if math.isnan(total) or total == math.inf:
            raise DbertError("the model's outputs are not finite (NaN or inf in its weights?); "
                             "this checkpoint cannot be sampled")
        return out


def neighbours(x: torch.Tensor, masked: torch.Tensor, where: torch.Tensor, comma: int = -1) -> torch.Tensor:
    """(K, J) ids the `where` positions of x may not take under the repeat block (-1: none): the
    revealed left and right neighbours (J = 2); when `comma` is the comma's id (J = 5) also the
    word beyond a revealed comma on either side and the comma itself between two equal words
    ("once, once")."""
    pad = torch.full((x.shape[0], 1), -1, dtype=x.dtype)
    shown = torch.where(masked, torch.full_like(x, -1), x)
    left = torch.cat([pad, shown[:, :-1]], 1)
    right = torch.cat([shown[:, 1:], pad], 1)
    out = [left[where], right[where]]
    if comma >= 0:
        left2 = torch.cat([pad, pad, shown[:, :-2]], 1)[:, : x.shape[1]]
        right2 = torch.cat([shown[:, 2:], pad, pad], 1)[:, : x.shape[1]]
        between = torch.where((left == right) & (left >= 0), comma, -1)  # no comma between two equal words
        out += [torch.where(left == comma, left2, -1)[where], torch.where(right == comma, right2, -1)[where],
                between[where]]
    return torch.stack(out, 1)


@dataclass(frozen=True)
class RepeatBlock:
    """The repeat block: a revealed position never takes its revealed neighbour's id, nor the id
    of the word beyond a comma next to it, nor a comma between two equal words. Positions revealed
    in one event are drawn in three passes (by column mod 3), so of any three neighbours revealed
    together the last drawn sees the other two."""

    comma: int = -1


def _draw_tokens(x, masked, revealed, logits, r_v, no_draw, shaping, u, block: RepeatBlock | None, top=None):
    """Tokens for the revealed (R, L) positions of rows x (R, L) whose masked (R, L) positions
    are the ones still masked before this event; logits and u (K,) in row-major order of
    revealed, r_v (K, V), (1, V) or None. Returns (chosen (K,), p'(chosen) (K,)) as `_draw`.
    top: frames(topk=k)'s recorder (inspector.TopK), given each pass's candidates."""
    if block is None:
        return _draw(logits, r_v, no_draw, shaping, u, top=top)
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
        c, pc = _draw(logits[idx.to(logits.device)], rv, no_draw, shaping, u[idx], neighbours(x, masked, where, block.comma),
                      None if top is None else top.at(idx))
        chosen[idx], conf[idx] = c, pc
        x[where] = c
        masked &= ~where
    return chosen, conf


def _comma_id(db) -> int:
    """The id of "," in this checkpoint's vocabulary (-1 if it has none)."""
    cid = db.tokenizer.backend_tokenizer.token_to_id(",")
    return -1 if cid is None else int(cid)


def _draw(logits, r_v, no_draw, shaping, u, blocked=None, top=None):
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


# ---------------------------------------------------------------------------------- frames
def _config(db, cfg: SampleConfig | None, overrides: dict) -> SampleConfig:
    """cfg as resolve(cfg, db) made it; otherwise cfg (default: SampleConfig's defaults) with
    overrides, resolved here (frames(db, n=2, steps=16) works as it always did)."""
    if cfg is not None and not overrides and _is_resolved(cfg, db):
        return cfg
    return resolve(replace(cfg or SampleConfig(), **overrides), db)


@torch.inference_mode()
def frames(db, cfg: SampleConfig | None = None, generator: torch.Generator | None = None,
           template: torch.Tensor | None = None, topk: int = 0, forbid: tuple[int, ...] | list[int] = (),
           **overrides) -> Iterator[Frame]:
    """Run the reverse process for cfg.n samples in one batch, yielding a Frame per step (event).

    cfg holds the settings (SampleConfig's defaults where None); keyword overrides replace
    single fields (frames(db, n=2, steps=16)). template: token ids (length,) with [MASK] slots,
    instead of cfg.prompt's text, or (n, length): one template per row (a server batching
    requests of different prompts into one call). topk > 0: each Frame carries the topk most
    likely candidates of p' (and their p') at each position's reveal (top_ids, top_probs); the
    draws are the same either way. forbid: more ids never drawn. With cfg.pair_quotes or
    cfg.fix_contractions (both on by default) the touch-up's frames follow the last step (touchup.py).
    """
    from .inspector import TopK

    cfg = _config(db, cfg, overrides)
    gen = generator or torch.Generator().manual_seed(cfg.seed if cfg.seed is not None else torch.seed() % 2**63)
    mask_id = db.model.mask_id
    if template is None and is_story_model(db):  # [SEP] opens the story, then the prompt's tokens and masks
        template = story_template(db, prompt_ids(db, cfg.prompt) if cfg.prompt else None, cfg.length)
    elif template is None:
        template = parse_prompt(db, cfg.prompt, cfg.length) if cfg.prompt else \
            torch.full((cfg.length,), mask_id, dtype=torch.long)
    x = template.unsqueeze(0).repeat(cfg.n, 1) if template.dim() == 1 else template.clone()  # (B, L)
    free = x == mask_id  # the positions the sampler fills (a prompt's own tokens are not among them)
    top = TopK(x.shape, topk) if topk > 0 else None

    def tagged(f: Frame) -> Frame:
        if top is not None:
            f.top_ids, f.top_probs = top.ids.clone(), top.probs.clone()
        return f

    if not (cfg.pair_quotes or cfg.fix_contractions):
        for f in _reverse(db, cfg, gen, x, forbid, top):
            yield tagged(f)
        return
    final = None
    for final in _reverse(db, cfg, gen, x, forbid, top):
        if final.done:
            break
        yield tagged(final)
    for f in touch_up(_reverse, db, cfg, gen, final, free, forbid, top):
        yield tagged(f)


def _reverse(db, cfg: SampleConfig, gen: torch.Generator, x: torch.Tensor, forbid=(), top=None) -> Iterator[Frame]:
    """The reverse process of cfg.sampler from x (B, L), [MASK] where it fills in (x is written
    in); top: an inspector.TopK recorder of the candidates at each reveal, or None."""
    mask_id = db.model.mask_id
    state = dict(
        x=x, masked=x == mask_id, confidence=torch.full(x.shape, float("nan"), dtype=torch.float64),
        kern=kernel(db.schedule, cfg.steps), net=_Net(db, cfg.dtype), gen=gen, shaping=(cfg.temperature, cfg.top_k, cfg.top_p),
        no_draw=sorted(set(db.model.forbidden) | {db.tokenizer.unk_token_id} | set(forbid)),  # never sampled
        block_repeats=RepeatBlock(comma=_comma_id(db)) if cfg.block_repeats else None,
    )
    if top is not None:
        state["top"] = top
    if is_story_model(db):  # after a story's end, the rest of its row is end padding, decided at once
        yield from with_end_rule(_strategy(db, cfg, state, mask_id), x, state["masked"], db.tokenizer.sep_token_id)
    else:
        yield from _strategy(db, cfg, state, mask_id)


def _strategy(db, cfg: SampleConfig, state: dict, mask_id: int) -> Iterator[Frame]:
    """The frames of cfg.sampler's reverse process from the state _reverse set up."""
    params = strategies.get(cfg.sampler).resolve(cfg.params)
    if cfg.sampler == "first-hitting":
        yield from _first_hitting(**state)
    elif cfg.sampler in ("ancestral", "cached"):
        yield from _stepwise(cached=cfg.sampler == "cached", **state)
    elif cfg.sampler in ("confidence", "margin", "entropy"):
        yield from _ordered(by=cfg.sampler, curve=masked_curve(db, cfg.steps), **state)
    elif cfg.sampler in ("threshold", "entropy-bounded"):
        yield from _adaptive(rule=cfg.sampler, value=params.get("tau", params.get("gamma")),
                             curve=masked_curve(db, cfg.steps), **state)
    elif cfg.sampler == "remdm":
        kern, sigma = remdm_kernel(db, cfg.steps, params)
        yield from _remdm(**{**state, "kern": kern}, sigma=sigma, mask_id=mask_id,
                          time_agnostic=db.model.time == "none")
    else:  # a name in the registry with no sampler here is a bug, not a user error
        raise AssertionError(f"no sampler for strategy {cfg.sampler!r}")


def _stepwise(x, masked, confidence, kern, net, gen, shaping, no_draw, block_repeats, cached: bool,
              top=None) -> Iterator[Frame]:
    """ancestral and cached: one frame per step, the same random draws in both."""
    B, L = x.shape
    S = len(kern.grid) - 1
    token_free = kern.inverse is None
    stale = torch.ones(B, dtype=torch.bool)  # cached: the row changed since its logits were made
    buf = mass = None  # cached: (B, L, V) logits and (B, L, C) class mass at masked positions

    def refresh(rows: torch.Tensor, t: int) -> None:
        nonlocal buf, mass
        idx = rows.nonzero().squeeze(1)
        logits = net(x[idx], masked[idx], torch.full((len(idx),), t))
        where = torch.zeros_like(masked)
        where[idx] = masked[idx]
        if buf is None:
            buf = torch.empty(B, L, logits.shape[-1], device=logits.device)
            mass = torch.empty(B, L, kern.classes, dtype=torch.float64)
        buf[where.to(buf.device)] = logits
        if not token_free:
            mass[where] = kern.class_mass(logits)
        stale[idx] = False

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
            if k == S - 1:
                revealed = masked.clone()
            elif token_free:
                revealed = masked & (u_reveal < kern.r[k, 0])
            else:
                P = kern.class_mass(logits) if logits is not None else mass[masked]
                revealed[masked] = u_reveal[masked] < P @ kern.r[k]
            if revealed.any():
                if cached:
                    if (stale & revealed.any(1)).any():
                        refresh(stale & revealed.any(1), t)
                    chosen_logits = buf[revealed.to(buf.device)]
                else:
                    chosen_logits = logits[revealed[masked].to(logits.device)]
                r_v = kern.r_vocab(torch.tensor([k]))
                chosen, conf = _draw_tokens(x, masked, revealed, chosen_logits, r_v, no_draw, shaping,
                                            u_token[revealed], block_repeats, top)
                if top is not None:
                    top.put(revealed)
                x[revealed] = chosen
                confidence[revealed] = conf
                masked &= ~revealed
                stale |= revealed.any(1)
        yield Frame(ids=x.clone(), masked=masked.clone(), revealed=revealed, confidence=confidence.clone(),
                    step=k + 1, steps=S, t=kern.grid[k + 1], nfe=net.nfe, rows=net.rows, flops=net.flops,
                    row_steps=torch.full((B,), k + 1))


def _next_event(P: torch.Tensor, mk: torch.Tensor, k: torch.Tensor, r: torch.Tensor,
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
        j = start[rows].unsqueeze(1) + torch.arange(W)  # (a, W) steps scanned
        R = torch.bmm(P[rows], r[j.clamp_max(S - 1)].transpose(1, 2)).clamp_(0.0, 1.0)  # (a, L, W)
        last = (j == S - 1).unsqueeze(1) & mk[rows].unsqueeze(2)
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


def _first_hitting(x, masked, confidence, kern, net, gen, shaping, no_draw, block_repeats, top=None) -> Iterator[Frame]:
    """One network call per reveal event; each row jumps straight to its next event."""
    B, L = x.shape
    S = len(kern.grid) - 1
    token_free = kern.inverse is None
    grid = torch.tensor(kern.grid)
    k = torch.zeros(B, dtype=torch.long)  # the next step each row simulates
    pos = torch.arange(L)
    while masked.any():
        active = masked.any(1).nonzero().squeeze(1)
        A = len(active)
        mk = masked[active]  # (A, L)
        u_time = 1.0 - torch.rand(A, generator=gen, dtype=torch.float64)  # (0, 1]
        u_first = torch.rand(A, generator=gen, dtype=torch.float64)
        u_more = torch.rand(A, L, generator=gen, dtype=torch.float64)
        u_token = torch.rand(A, L, generator=gen, dtype=torch.float64)
        if token_free:  # r is the same for every token: the event needs no prediction
            m, R = _next_event(mk.double().unsqueeze(-1), mk, k[active], kern.r, u_time)
        else:  # time-agnostic model: p is fixed until this row's x changes
            logits = net(x[active], mk, grid[k[active]])
            P = torch.zeros(A, L, kern.classes, dtype=torch.float64)
            P[mk] = kern.class_mass(logits)
            m, R = _next_event(P, mk, k[active], kern.r, u_time)
        # which positions: independent Bernoulli(R_i) given at least one; first the lowest one
        log_stay = torch.log1p(-R.clamp(0.0, 1.0))
        at_least_one = -torch.expm1(log_stay.cumsum(1))  # (A, L) P(some position <= i revealed)
        total = at_least_one[:, -1:]
        first = torch.searchsorted(at_least_one, u_first.unsqueeze(1) * total, right=True).clamp_max(L - 1)
        more = (pos > first) & (u_more < R)
        rev = mk & ((pos == first) | more)
        if token_free:
            logits = net(x[active], rev, grid[m])  # only the revealed positions are projected
        else:
            logits = logits[rev[mk].to(logits.device)]
        row_of = rev.nonzero()[:, 0]
        chosen, conf = _draw_tokens(x[active], mk, rev, logits, kern.r_vocab(m[row_of]), no_draw, shaping,
                                    u_token[rev], block_repeats, top)
        revealed = torch.zeros_like(masked)
        revealed[active] = rev
        if top is not None:
            top.put(revealed)
        x[revealed] = chosen
        confidence[revealed] = conf
        masked &= ~revealed
        k[active] = m + 1
        left = masked.any(1)
        step = int(k[left].min()) if left.any() else S
        yield Frame(ids=x.clone(), masked=masked.clone(), revealed=revealed, confidence=confidence.clone(),
                    step=step, steps=S, t=kern.grid[step], nfe=net.nfe, rows=net.rows, flops=net.flops,
                    row_steps=k.clone())
    if net.nfe == 0:  # nothing to fill in
        yield Frame(ids=x.clone(), masked=masked.clone(), revealed=torch.zeros_like(masked),
                    confidence=confidence.clone(), step=S, steps=S, t=0, nfe=0, rows=0,
                    row_steps=torch.full((B,), S))


# ---------------------------------------------------------------------------------- heuristics
def masked_curve(db, steps: int) -> torch.Tensor:
    """(S+1,) float64: the expected masked fraction after k of S reverse steps (1 at k = 0, 0 at
    k = S), each token's a_t(v) weighted by its corpus frequency (the TUI draws the same curve)."""
    return _masked_at(db, torch.tensor(step_grid(db.schedule.T, steps), dtype=torch.float32))


def _masked_at(db, t: torch.Tensor) -> torch.Tensor:
    """The expected masked fraction at times t (K,), frequency-weighted: (K,) float64."""
    return db.schedule.expected_masked(t, db.counts)


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


def _reveal_tokens(x, masked, confidence, rows, mk, rev, logits, no_draw, shaping, u_token, block_repeats, top=None):
    """Draw tokens from p' at the rev (R, L) positions of batch rows `rows` (their masked
    positions mk, the logits of those in row-major order) and write them in; returns the (B, L)
    revealed mask."""
    revealed = torch.zeros_like(masked)
    if not rev.any():
        return revealed
    chosen, conf = _draw_tokens(x[rows], mk, rev, logits[rev[mk].to(logits.device)], None, no_draw, shaping,
                                u_token[rows][rev], block_repeats, top)
    revealed[rows] = rev
    if top is not None:
        top.put(revealed)
    x[revealed] = chosen
    confidence[revealed] = conf
    masked &= ~revealed
    return revealed


def _ordered(x, masked, confidence, kern, net, gen, shaping, no_draw, block_repeats, by: str,
             curve: torch.Tensor, top=None) -> Iterator[Frame]:
    """confidence, margin, entropy: each step reveals the k surest masked positions of each row,
    k such that the row's revealed count is round(n0 (1 - curve[k+1])) after step k."""
    B, L = x.shape
    S = len(kern.grid) - 1
    n0 = masked.sum(1)
    target = torch.round(n0.double().unsqueeze(0) * (1.0 - curve[1:]).unsqueeze(1)).long()  # (S, B)
    target[-1] = n0
    for k in range(S):
        u_token = torch.rand(x.shape, generator=gen, dtype=torch.float64)
        need = torch.minimum(target[k] - (n0 - masked.sum(1)), masked.sum(1))
        revealed = torch.zeros_like(masked)
        if (need > 0).any():
            rows = (need > 0).nonzero().squeeze(1)
            mk = masked[rows]
            logits = net(x[rows], mk, torch.full((len(rows),), kern.grid[k]))
            score = position_scores(logits, no_draw, by)
            if by == "entropy":
                score = -score
            full = torch.full(mk.shape, float("-inf"), dtype=torch.float64)
            full[mk] = score
            order = torch.argsort(full, dim=1, descending=True, stable=True)  # ties: leftmost first
            rank = torch.empty_like(order).scatter_(1, order, torch.arange(L).expand_as(order).contiguous())
            rev = mk & (rank < need[rows].unsqueeze(1))
            revealed = _reveal_tokens(x, masked, confidence, rows, mk, rev, logits, no_draw, shaping, u_token,
                                      block_repeats, top)
        yield Frame(ids=x.clone(), masked=masked.clone(), revealed=revealed, confidence=confidence.clone(),
                    step=k + 1, steps=S, t=kern.grid[k + 1], nfe=net.nfe, rows=net.rows, flops=net.flops,
                    row_steps=torch.full((B,), k + 1))


def _adaptive(x, masked, confidence, kern, net, gen, shaping, no_draw, block_repeats, rule: str, value: float,
              curve: torch.Tensor, top=None) -> Iterator[Frame]:
    """threshold and entropy-bounded: one call per frame, each row revealing as many positions as
    its rule allows (at least one), until nothing is masked."""
    B, L = x.shape
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
        logits = net(x[rows], mk, grid[k])
        if rule == "threshold":
            full = torch.full(mk.shape, float("-inf"), dtype=torch.float64)
            full[mk] = position_scores(logits, no_draw, "confidence")
            rev = mk & (full > value)
            rev[torch.arange(len(rows)), full.argmax(1)] = True  # at least the most confident one
        else:  # entropy-bounded: sorted by entropy, the longest prefix with sum(H) - max(H) <= gamma
            full = torch.full(mk.shape, float("inf"), dtype=torch.float64)
            full[mk] = position_scores(logits, no_draw, "entropy")
            h, order = torch.sort(full, dim=1, stable=True)
            before = h.cumsum(1) - h  # the sum of the smaller entropies: sum(H) - max(H) of the prefix
            ok = torch.isfinite(h) & (before <= value + 1e-12)
            ok[:, 0] = True
            rev = torch.zeros_like(mk).scatter_(1, order, ok) & mk
        revealed = _reveal_tokens(x, masked, confidence, rows, mk, rev, logits, no_draw, shaping, u_token,
                                  block_repeats, top)
        row_steps = step_of(masked.sum(1), everyone).clamp_min(1)
        left = masked.any(1)
        step = int(row_steps[left].min()) if left.any() else S
        yield Frame(ids=x.clone(), masked=masked.clone(), revealed=revealed, confidence=confidence.clone(),
                    step=step, steps=S, t=kern.grid[step], nfe=net.nfe, rows=net.rows, flops=net.flops,
                    row_steps=row_steps)
    if net.nfe == 0:  # nothing to fill in
        yield Frame(ids=x.clone(), masked=masked.clone(), revealed=torch.zeros_like(masked),
                    confidence=confidence.clone(), step=S, steps=S, t=0, nfe=0, rows=0,
                    row_steps=torch.full((B,), S))


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
        if float(_masked_at(db, torch.tensor([float(mid)]))[0]) >= goal - 1e-12:
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


def _remdm(x, masked, confidence, kern, net, gen, shaping, no_draw, block_repeats, sigma, mask_id: int,
           time_agnostic: bool, top=None) -> Iterator[Frame]:
    """ancestral with remasking: per step, masked positions reveal as in ancestral with r', and
    revealed ones (not the prompt's) are masked again with sigma of their token's class."""
    B, L = x.shape
    S = kern.r.shape[0]
    token_free = kern.inverse is None
    given = ~masked.clone()
    logits, dirty = None, True  # a time-agnostic model's logits stay valid while no row changes
    for k in range(S):
        t = kern.grid[k]
        u_reveal = torch.rand(x.shape, generator=gen, dtype=torch.float64)
        u_token = torch.rand(x.shape, generator=gen, dtype=torch.float64)
        u_remask = torch.rand(x.shape, generator=gen, dtype=torch.float64)
        shown = ~masked & ~given
        revealed = torch.zeros_like(masked)
        chosen = conf = None
        if masked.any():
            rows = masked.any(1).nonzero().squeeze(1)
            if dirty or not time_agnostic or logits is None:
                logits = net(x[rows], masked[rows], torch.full((len(rows),), t))
                dirty = False
            if k == S - 1:
                revealed = masked.clone()
            elif token_free:
                revealed = masked & (u_reveal < kern.r[k, 0])
            else:
                revealed[masked] = u_reveal[masked] < kern.class_mass(logits) @ kern.r[k]
            if revealed.any():
                chosen, conf = _draw_tokens(x, masked, revealed, logits[revealed[masked].to(logits.device)],
                                            kern.r_vocab(torch.tensor([k])), no_draw, shaping, u_token[revealed],
                                            block_repeats, top)
                if top is not None:
                    top.put(revealed)
        remasked = torch.zeros_like(masked)
        if shown.any() and float(sigma[k].max()) > 0:
            sig = sigma[k, 0] if token_free else sigma[k][kern.inverse[x[shown]]]
            remasked[shown] = u_remask[shown] < sig
        if chosen is not None:
            x[revealed] = chosen
            confidence[revealed] = conf
            masked &= ~revealed
        if remasked.any():
            x[remasked] = mask_id
            confidence[remasked] = float("nan")
            masked |= remasked
        dirty = dirty or bool(revealed.any()) or bool(remasked.any())
        yield Frame(ids=x.clone(), masked=masked.clone(), revealed=revealed, confidence=confidence.clone(),
                    step=k + 1, steps=S, t=kern.grid[k + 1], nfe=net.nfe, rows=net.rows, flops=net.flops,
                    row_steps=torch.full((B,), k + 1), remasked=remasked)


def story_stream(db, cfg: SampleConfig, generator: torch.Generator, topk: int = 0) -> Iterator[Frame]:
    """A story model's cfg.n stories as frames of one canvas, block by block (blocks.story_frames):
    what generate() and the TUI run for a story checkpoint."""
    first = story_template(db, prompt_ids(db, cfg.prompt) if cfg.prompt else None, cfg.length)
    return story_frames(db, cfg, frames, generator, first, topk)


def generate(db, cfg: SampleConfig | None = None, on_frame=None, *, cased: bool = True, paragraph: str | None = None,
             topk: int = 0, **overrides) -> tuple[list[str], dict]:
    """cfg.n texts, cfg.batch_size per network call (keeps each batch's last frame), and stats
    {nfe, rows, gflop, seconds, samples, steps, sampler, exact, params}. Same settings, same
    seed: same texts. Texts as DBert.decode writes them (cased, paragraph: its options); a
    prompt's words are printed as typed. topk: the frames handed to on_frame carry the
    candidates at each reveal (frames' topk)."""
    cfg = _config(db, cfg, overrides)
    verbatim = prompt_words(db, cfg.prompt) if cfg.prompt else None
    gen = torch.Generator().manual_seed(cfg.seed if cfg.seed is not None else torch.seed() % 2**63)
    texts: list[str] = []
    nfe = rows = 0
    flops = 0.0
    start = _time.perf_counter()
    for lo in range(0, cfg.n, cfg.batch_size):
        last = None
        batch = _mark(replace(cfg, n=min(cfg.batch_size, cfg.n - lo)), db)  # fewer samples: still resolved
        stream = story_stream(db, batch, gen, topk) if is_story_model(db) else frames(db, batch, generator=gen, topk=topk)
        for last in stream:
            if on_frame is not None:
                on_frame(last)
        nfe += last.nfe
        rows += last.rows
        flops += last.flops
        rows_out = [story_of(row, db.tokenizer.sep_token_id) for row in last.ids] if is_story_model(db) else last.ids
        texts.extend(db.decode(row, cased=cased, paragraph=paragraph, verbatim=verbatim) for row in rows_out)
    strategy = strategies.get(cfg.sampler)
    stats = {"nfe": nfe, "rows": rows, "gflop": float(f"{flops / 1e9:.4g}"), "seconds": round(_time.perf_counter() - start, 3),
             "samples": cfg.n, "steps": cfg.steps, "sampler": cfg.sampler, "exact": strategy.exact,
             "params": strategy.resolve(cfg.params)}
    return texts, stats
