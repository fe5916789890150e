"""What a sampler is: the state a sampler family works on, the Frame it yields after each step,
and the network and reveal probabilities it is handed.

A sampler family is a generator function (the Sampler protocol below)

    family(state: State, **options) -> Iterator[Frame]

that fills in the [MASK]s of state.x (B, L) in place: state.masked (B, L) and state.confidence
(B, L) are written as positions are revealed, and revealed tokens are never masked again
(carry-over; remdm is the one family that masks on purpose, and says so in Frame.remasked). It
calls the model only through state.net (a Net, which counts calls, rows and FLOPs), draws its
uniforms from state.gen in a fixed order (same seed, same samples), chooses tokens only through
draw.draw_tokens (so the Shaping: temperature, top-k, top-p; the never-drawn ids, no_draw; and the
repeat block apply alike to every family), writes them in with state.reveal and yields
state.frame(...) after each step or reveal event, the last one with nothing masked.
state.kern holds the reveal probabilities of the step budget (a family with a path of its own,
remdm, puts its kernel there first); state.top, when given, records the candidates of each reveal
(inspector.TopK); state.params are the strategy's resolved parameters and the options its fixed
keywords (strategies.py declares both).

The families: ancestral.py (ancestral, cached), first_hitting.py, ordered.py (confidence, margin,
entropy, threshold, entropy-bounded), remdm.py. strategies.py names them; sample._reverse builds
the State and hands it to the strategy's family.

The reveal probabilities per class: r(v) depends on v only through the schedule's per-token
constant (spindle: the centred information f(v) - fbar), so the vocabulary splits into C classes
of equal r and R = sum_c P(c) r(c) with P(c) the mass p puts on class c: a (M, C) x (C,) product
per step instead of a vocabulary-wide one (C = 1 for the linear schedule). That is the Kernel.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Iterator, NamedTuple, Protocol

import torch

from ..errors import DbertError
from ..maths.bf16_weights import bf16_twin
from ..maths.decided_cache import DecidedCache
from ..maths.end_padding import hidden_keys, length_groups, needed_lengths
from ..maths.model import forward_flops
from ..maths.prefix_cache import PrefixCache
from ..maths.schedule import step_grid
from .draw import RepeatBlock


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
    settled     (B,) the columns at the start of each row that no later frame changes (a long
                story's finished windows: blocks.story_frames); None: nothing before the last frame
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
    settled: torch.Tensor | None = None

    @property
    def done(self) -> bool:
        return self.step == self.steps and not self.touch_up


def last_frame(last: Frame | None) -> Frame:
    """`last` after a loop over a run's frames: a run yields one frame at least (a canvas with no
    [MASK] its one frame, State.nothing_to_fill), so None means the loop never ran."""
    if last is None:
        raise RuntimeError("a reverse run yielded no frame")
    return last


class Shaping(NamedTuple):
    """How a revealed position's token is drawn from p (draw.shape_probs reads it in this order)."""

    temperature: float
    top_k: int      # 0: off
    top_p: float    # 1: off
    keep: int = -1  # the id whose unshaped chance is kept (a story's end mark with natural_length); -1: none


@dataclass
class State:
    """What a sampler family works on (the module docstring): the batch it writes in, the network,
    the random stream, the token choice and the run's strategy parameters."""

    x: torch.Tensor                 # (B, L) ids, [MASK] where still masked
    masked: torch.Tensor            # (B, L) bool
    confidence: torch.Tensor        # (B, L) float64, p' of each revealed token (nan: masked or given)
    kern: Kernel
    net: Net
    gen: torch.Generator
    shaping: Shaping
    no_draw: list[int]              # ids never drawn
    block_repeats: RepeatBlock | None
    db: Any = None                  # the checkpoint (a family may read its schedule or model)
    steps: int = 0                  # the step budget S asked for
    params: dict = field(default_factory=dict)  # the strategy's resolved parameters
    top: Any = None                 # an inspector.TopK, or None

    def reveal(self, revealed: torch.Tensor, chosen: torch.Tensor, conf: torch.Tensor) -> None:
        """Write the tokens drawn at the revealed (B, L) positions in (carry-over: they stay)."""
        if self.top is not None:
            self.top.put(revealed)
        self.x[revealed] = chosen
        self.confidence[revealed] = conf
        self.masked &= ~revealed

    def frame(self, revealed: torch.Tensor, step: int, row_steps: torch.Tensor | None = None,
              remasked: torch.Tensor | None = None) -> Frame:
        """The Frame of the batch now, `step` steps into the budget (row_steps: each row's; default: all at step)."""
        B = self.x.shape[0]
        return Frame(ids=self.x.clone(), masked=self.masked.clone(), revealed=revealed,
                     confidence=self.confidence.clone(), step=step, steps=len(self.kern.grid) - 1,
                     t=self.kern.grid[step], nfe=self.net.nfe, rows=self.net.rows, flops=self.net.flops,
                     row_steps=torch.full((B,), step) if row_steps is None else row_steps, remasked=remasked)

    def nothing_to_fill(self) -> Iterator[Frame]:
        """The one frame of a family that found no [MASK] and made no call, else nothing."""
        if self.net.nfe == 0:
            yield self.frame(torch.zeros_like(self.masked), len(self.kern.grid) - 1)


class Sampler(Protocol):
    """A sampler family (see the module docstring)."""

    def __call__(self, state: State, **options) -> Iterator[Frame]: ...


CLASS_MASS_BLOCK = 2**20  # values per block of Kernel.class_mass (4 MB of float32; measured in docs/performance.md)


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
    _table: torch.Tensor | None = field(default=None, repr=False)  # r_vocab's (S, V)

    @property
    def classes(self) -> int:
        return self.r.shape[1]

    def r_vocab(self, k: torch.Tensor) -> torch.Tensor | None:
        """r over the vocabulary at steps k (K,): (K, V) float64, or None if token-free. Rows of a
        table of every step's (S, V), made once per kernel where it takes at most 128 MB; else
        gathered from the classes at each call."""
        if self.inverse is None:
            return None
        if self._table is None and self.r.shape[0] * len(self.inverse) <= 2**24:
            self._table = self.r[:, self.inverse]
        return self.r[k][:, self.inverse] if self._table is None else self._table[k]

    def reveals(self, k: int, masked: torch.Tensor, u: torch.Tensor, mass) -> torch.Tensor:
        """(B, L) bool: the masked positions that reveal at step k, u (B, L) their uniforms. Every
        one at the last step (r = 1); else u < R = P . r[k], mass() giving P (M, C) of the masked
        positions in row-major order (not called where r is the same for every token)."""
        if k == self.r.shape[0] - 1:
            return masked.clone()
        if self.inverse is None:
            return masked & (u < self.r[k, 0])
        revealed = torch.zeros_like(masked)
        revealed[masked] = u[masked] < mass() @ self.r[k]
        return revealed

    def class_mass(self, logits: torch.Tensor) -> torch.Tensor:
        """P (M, C) float64 on the host: the mass softmax(logits) puts on each class, the softmax
        in float32 (logits float32 or bfloat16).

        Computed where the logits are (on a GPU only the (M, C) result crosses, not (M, V)), a
        block of rows at a time (CLASS_MASS_BLOCK values) in two float32 arrays made once per call:
        a whole call's (M, V) float32 copy and softmax (tens of MB each, their pages faulted in
        fresh when a call is the largest so far) become two arrays of a few MB that stay in the
        caches between the softmax and the class sums. The same numbers: rows are independent."""
        if self.inverse is None:
            return torch.ones(logits.shape[0], 1, dtype=torch.float64)
        inverse = self._on_device.get(logits.device)
        if inverse is None:  # copied once per device: the kernel is cached per schedule and budget
            inverse = self._on_device[logits.device] = self.inverse.to(logits.device)
        M, V = logits.shape
        mass = torch.zeros(M, self.classes, dtype=torch.float32, device=logits.device)
        n = max(1, min(M, CLASS_MASS_BLOCK // max(V, 1)))
        z = torch.empty(n, V, dtype=torch.float32, device=logits.device)
        p = torch.empty_like(z)
        for a in range(0, M, n):
            b = min(M, a + n)
            z[: b - a].copy_(logits[a:b])
            torch.softmax(z[: b - a], dim=-1, out=p[: b - a])
            mass[a:b].index_add_(1, inverse, p[: b - a])
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


class Net:
    """Calls the denoiser on some rows of the batch; counts calls, rows and FLOPs. It may crop a
    story's decided end (a `--hide-end-padding` model) and keep keys and values between calls in
    one `cache`, which the model's forward takes as it is (DiffusionBert.forward): a continuation
    window's context (a PrefixCache, `--prefix-cache`) or the decided positions (a DecidedCache,
    `--cache-refresh`), never both."""

    def __init__(self, db, dtype: str = "fp32", end_rules=None, prefix: int = 0, refresh: int = 0,
                 masked: bool = False):
        self.model, self.device = db.model, db.device
        self.end_rules = end_rules  # a story's blocks.StoryRules (where it may start and end), or None
        self.cache = kept_states(db.model, prefix, refresh, masked)  # the keys and values kept between calls, or None
        self.bf16 = dtype == "bf16" and next(self.model.parameters()).dtype == torch.float32  # autocast; bf16 logits out
        if self.bf16:  # its matrices cast to bf16 once, not in every call (the same logits)
            self.model = bf16_twin(self.model)
        self.cls, self.sep = db.tokenizer.cls_token_id, db.tokenizer.sep_token_id
        self.nfe = 0
        self.rows = 0
        self.flops = 0.0  # of the BERT forward passes (model.forward_flops)
        self.repeats = 1  # the last call's rows were one input repeated this many times, computed once

    @property
    def by_row(self) -> DecidedCache | None:
        """The cache when it keeps each batch row's states at the call's full width (a DecidedCache):
        its calls keep their width (the end padding hidden by the keys' mask, not cropped) and rows
        that are one input share one row's states (`one_input`); None for a PrefixCache or none."""
        return self.cache if isinstance(self.cache, DecidedCache) else None

    def _forward(self, inp: torch.Tensor, sel: torch.Tensor, t: torch.Tensor,
                 rows: torch.Tensor | None = None) -> torch.Tensor:
        """One forward of the model on rows inp (with [CLS] and [SEP]): the logits at sel, in the
        network's output dtype (rows: their indices in the batch, for the decided-position cache)."""
        attention = torch.ones(inp.shape, dtype=torch.bool, device=self.device)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            cache: dict = {} if self.cache is None else {"cache": self.cache, "rows": rows}  # the model's own call, unless caching
            out = self.model(inp.to(self.device), attention, sel.to(self.device), t=t.to(self.device), **cache)
        reused = self.cache.reused if self.cache is not None else 0  # positions this call took from the cache
        self.flops += forward_flops(self.model.config, inp.shape[0], inp.shape[1], int(sel.sum()), prefix=reused)
        return out

    def refresh_next(self) -> None:
        """With --cache-refresh: the next call computes every position afresh (DecidedCache.restart)."""
        if self.by_row is not None:
            self.by_row.restart()

    @property
    def keeps_masks(self) -> bool:
        """Whether the network keeps [MASK] positions' states between refreshes (--cache-masked)."""
        return self.by_row is not None and self.by_row.masked

    def stale_masks(self, rows: torch.Tensor, L: int) -> bool:
        """Whether the next call on rows (R,) of L positions is a partial call of a cache that keeps
        [MASK] positions too (--cache-masked): a sampler may then reuse what it read of those
        positions at the last refresh and ask only for the ones it reveals."""
        return self.by_row is not None and self.by_row.masked and not self.by_row.whole_next(rows, L + 2)

    def one_input(self, x: torch.Tensor, select: torch.Tensor, t: torch.Tensor, rows: torch.Tensor) -> bool:
        """Whether every row of a call is the same input (ids, positions read, time) and the call
        would run the whole forward for each: a batch's first call (all [MASK], or one prompt).
        Their outputs are then equal, so one row is computed for all (exact)."""
        if x.shape[0] < 2 or isinstance(self.cache, PrefixCache):
            return False
        if self.by_row is not None and not self.by_row.whole_next(rows[:1], x.shape[1] + 2):
            return False  # a partial call reads each row's own kept states
        if t.dim() and len(t) > 1 and not bool((t == t[:1]).all()):
            return False
        return bool((x == x[:1]).all()) and bool((select == select[:1]).all())

    def __call__(self, x: torch.Tensor, select: torch.Tensor, t: torch.Tensor,
                 rows: torch.Tensor | None = None, fold: bool = False) -> torch.Tensor:
        """Logits (M, V) at the select (R, L) positions of rows x (R, L), row-major, float32, or
        bfloat16 where the network computes in bf16 (its output, not widened: a whole call's
        logits are tens of MB; Kernel.class_mass and draw widen the rows they read); rows
        (R,): x's rows' indices in the sampler's batch (None: 0..R-1; the decided-position cache
        keeps rows by them).

        They stay on the model's device: the sampler reduces them there (Kernel.class_mass) and
        brings to the host only the rows of positions it reveals (`draw.draw`).

        Rows that are one input (one_input) are computed once, counted as one row, and their
        logits repeated; fold=True returns them once (M / R rows) instead, for a sampler that reads
        `repeats` (R here, 1 after any other call)."""
        R = x.shape[0]
        ids = torch.arange(R) if rows is None else rows
        if self.one_input(x, select, t, ids):
            out = self(x[:1], select[:1], t[:1] if t.dim() and len(t) == R else t, ids[:1])
            if self.by_row is not None:
                self.by_row.spread(int(ids[0]), ids)
            self.repeats = R
            return out if fold else out.repeat(R, 1)
        self.repeats = 1
        edge = torch.zeros(R, 1, dtype=torch.bool)
        inp = torch.cat([torch.full((R, 1), self.cls), x, torch.full((R, 1), self.sep)], dim=1)
        sel = torch.cat([edge, select, edge], dim=1)
        self.nfe += 1
        self.rows += R
        if self.by_row is not None or not getattr(self.model, "hide_end_padding", False):
            out = self._forward(inp, sel, t, rows)  # a row's kept states hide the end padding by the keys' mask
        else:  # a decided end and its padding stay out of the forward, exactly: rows of like length together
            needed = needed_lengths(hidden_keys(inp, self.sep), sel).tolist()
            groups = length_groups(needed)
            if len(groups) == 1:
                keep = max(needed)
                out = self._forward(inp[:, :keep], sel[:, :keep], t)
            else:
                per_row: list = [None] * R
                for group in groups:  # not `rows`: that is the argument, the batch indices
                    keep = max(needed[r] for r in group)
                    idx = torch.tensor(group)
                    part = self._forward(inp[idx, :keep], sel[idx, :keep], t[idx] if t.dim() and len(t) == R else t)
                    for r, chunk in zip(group, part.split(sel[idx].sum(1).tolist())):
                        per_row[r] = chunk
                out = torch.cat(per_row)
        total = float(out.detach().sum())  # one pass: -inf marks forbidden tokens; NaN or +inf anywhere makes it NaN or +inf
        if math.isnan(total) or total == math.inf:
            raise DbertError("the model's outputs are not finite (NaN or inf in its weights?); "
                             "this checkpoint cannot be sampled")
        if self.end_rules is not None:  # p given where a story may end (--min-length, --end-at-sentence)
            self.end_rules.apply(out, x, select)
        return out


def kept_states(model, prefix: int, refresh: int, masked: bool) -> PrefixCache | DecidedCache | None:
    """The one cache of a reverse run's network, or None (the exact forward). prefix > 0: the window's first
    `prefix` columns are given and never change (a story's continuation window) and their keys and values
    are kept from the first call (--prefix-cache: an approximation; a time-conditioned model ignores it:
    DiffusionBert.forward). Else refresh > 0: decided positions' keys and values are kept between calls
    and computed afresh every `refresh` calls, [MASK] positions' too with `masked` (--cache-refresh: an
    approximation; time-agnostic models only)."""
    if prefix:
        return PrefixCache(1 + prefix)
    if refresh and model.time == "none":
        return DecidedCache(refresh, masked)
    return None


def masked_curve(db, steps: int) -> torch.Tensor:
    """(S+1,) float64: the expected masked fraction after k of S reverse steps (1 at k = 0, 0 at
    k = S), each token's a_t(v) weighted by its corpus frequency (the TUI draws the same curve)."""
    return masked_at(db, torch.tensor(step_grid(db.schedule.T, steps), dtype=torch.float32))


def masked_at(db, t: torch.Tensor) -> torch.Tensor:
    """The expected masked fraction at times t (K,), frequency-weighted: (K,) float64."""
    return db.schedule.expected_masked(t, db.counts)
