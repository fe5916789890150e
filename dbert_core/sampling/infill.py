"""Infill of unknown length: a span `[MASK*A-B]` in a prompt means "A to B tokens".

For every length in the range (every combination, when a prompt has several such spans; at most
MAX_VARIANTS) the sampler fills the template with that many [MASK] slots, `per_length` times,
exactly as `--prompt` does (the prompt's tokens fixed, the reverse process over the slots only).
The completed texts are then ranked by the model's own bound: the S-step ELBO of the whole
completed sequence (diffusion.elbo, all S terms, every content token noisable, the same bound
as `dbert eval`; averaged over DRAWS corruptions, the same ones for every text of a length),
divided by its token count: nats per token, lower is better.

That is a ranking rule, not an exact posterior over lengths: the bound is an upper bound on
-log p(x) whose slack differs between texts, and per-token normalisation is one choice among
several (it does not favour short fillers the way a total would). Same seed, same candidates
and scores.

An infill template is its own length: nothing is appended after it (a [MASK*N] or [MASK] slot
elsewhere in it is filled as usual).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, replace

import torch

from ..errors import DbertError
from ..maths.diffusion import RowDraws

RANGE = re.compile(r"\[mask\s*\*\s*(\d+)\s*-\s*(\d+)\]", re.IGNORECASE)
MAX_VARIANTS = 64      # length combinations tried at most
PER_LENGTH = 4         # candidates drawn for each length unless told
SCORE_STEPS = 16       # the S of the bound that ranks them (docs/usage.md, "Infill's ranking")
DRAWS = 4              # corruptions the bound is averaged over
CHUNK_POSITIONS = 4096 # positions (rows x columns) of one ranking forward at most


@dataclass
class Candidate:
    text: str
    lengths: tuple[int, ...]   # the length chosen for each [MASK*A-B] span, left to right
    nats: float                # the S-step bound on -log p(x) of the completed sequence
    tokens: int                # its content tokens
    ids: list[int]
    row: int = 0               # its row in its length's batch (the frames `keep` holds)

    @property
    def score(self) -> float:
        """Nats per token (lower is better): the ranking rule."""
        return self.nats / self.tokens

    def record(self) -> dict:
        return {"text": self.text, "lengths": list(self.lengths), "nats": round(self.nats, 4), "tokens": self.tokens,
                "nats_per_token": round(self.score, 4)}


def has_range(template: str | None) -> bool:
    return bool(template and RANGE.search(template))


def ranges(template: str) -> list[tuple[int, int]]:
    """The (A, B) of each [MASK*A-B] span, checked: 1 <= A <= B."""
    from .prompt import MAX_SLOTS

    out = []
    for m in RANGE.finditer(template):
        a, b = (int(g) if len(g.lstrip("0")) <= 9 else 10**9 for g in m.groups())
        if not 1 <= a <= b:
            raise DbertError(f"{m.group(0)[:40]}: a span of unknown length needs 1 <= A <= B")
        if b > MAX_SLOTS:
            raise DbertError(f"{m.group(0)[:40]}: a span holds at most {MAX_SLOTS:,} tokens (no model has more "
                             "positions); write a smaller B")
        out.append((a, b))
    return out


def checked_variants(db, template: str) -> list[tuple[tuple[int, ...], str, int]]:
    """(span lengths, the template with [MASK*k] for each, its token count) for every length
    combination, all checked against the model's positions before any is sampled: a range that
    reaches past the model is one DbertError naming the longest it allows, not an error after
    minutes of sampling the shorter ones."""
    from .prompt import expand_template, slots

    tok = db.tokenizer
    out = []
    for combo, written in variants(template):
        L = len(tok.encode(slots(tok, expand_template(written)), add_special_tokens=False))
        if L > db.model.max_length:
            spans = ", ".join(m.group(0) for m in RANGE.finditer(template))
            raise DbertError(f"with the span lengths {combo} of {spans} the prompt is {L} tokens, longer than the "
                             f"model's {db.model.max_length} positions; shorten the range by {L - db.model.max_length}")
        out.append((combo, written, L))
    return out


def variants(template: str) -> list[tuple[tuple[int, ...], str]]:
    """Every combination of span lengths, with the template written with [MASK*k] for each."""
    spans = ranges(template)
    count = 1
    for a, b in spans:
        count *= b - a + 1
    if count > MAX_VARIANTS:
        raise DbertError(f"the prompt's [MASK*A-B] spans make {count} length combinations; at most {MAX_VARIANTS}")
    out = []
    for lengths in itertools.product(*(range(a, b + 1) for a, b in spans)):
        it = iter(lengths)
        out.append((lengths, RANGE.sub(lambda m: f"[MASK*{next(it)}]", template)))
    return out


class TextDraws(RowDraws):
    """The corruptions of a batch that holds `draws` rows for each text, text after text: each
    text's rows draw from a generator of its own seeded by `seed` alone, exactly as the text
    scored on its own would (uniforms over its [CLS] x [SEP] columns, draws x (n + 2) a step), so
    a score does not depend on the texts batched beside it, and texts of one length see the same
    masks (a paired comparison)."""

    def __init__(self, seed: int, lengths: list[int], draws: int):
        self.lengths, self.draws = lengths, draws
        self.gens = [torch.Generator().manual_seed(seed) for _ in lengths]

    def steps(self) -> torch.Tensor:  # the exact bound sums every step: it never draws one
        raise NotImplementedError("TextDraws serves the exact bound, which draws no step")

    def positions(self, noisable: torch.Tensor) -> torch.Tensor:
        u = torch.ones(noisable.shape)
        d = self.draws
        for i, (g, n) in enumerate(zip(self.gens, self.lengths)):
            u[i * d:(i + 1) * d, :n + 2] = torch.rand((d, n + 2), generator=g)
        return u


def chunks(lengths: list[int], draws: int, budget: int = CHUNK_POSITIONS) -> list[range]:
    """The texts (indices, in order) that share one forward: at most `budget` positions of
    draws x (longest + 2) padded rows, and at least one text."""
    out, first, longest = [], 0, 0
    for i, n in enumerate(lengths):
        longest = max(longest, n)
        if i > first and draws * (i + 1 - first) * (longest + 2) > budget:
            out.append(range(first, i))
            first, longest = i, n
    out.append(range(first, len(lengths)))
    return out


@torch.inference_mode()
def bound(db, rows: list[list[int]], steps: int = SCORE_STEPS, seed: int = 0, draws: int = DRAWS,
          dtype: str = "fp32", on_progress=None, cost: dict | None = None) -> list[float]:
    """The S-step ELBO of each row of content ids in nats: all S terms (diffusion.elbo exact,
    the same sum), averaged over `draws` corruptions. The rows' draws share forwards (at most
    CHUNK_POSITIONS positions each), yet each row's corruptions come from its own generator
    seeded by `seed` (TextDraws): a text's score is the one it gets scored alone, and texts of
    one length are compared under the same masks (common random numbers). Every row of a
    forward is at the same step, so the reveal chances over the vocabulary are computed once a
    forward, not once a row. dtype "bf16": the network under autocast, as the sampler runs it
    (the bound itself in float32/float64). on_progress(texts done, fraction done) after every
    forward; cost: a dict that receives the forwards, rows and FLOPs spent."""
    from ..maths.bf16_weights import bf16_twin
    from ..maths.diffusion import corrupt, step_kl
    from ..maths.model import forward_flops
    from ..maths.schedule import step_grid
    from ..text.data import Special, collate

    steps = max(1, min(steps, db.schedule.T))
    db.model.eval()
    bf16 = dtype == "bf16" and next(db.model.parameters()).dtype == torch.float32
    model = bf16_twin(db.model) if bf16 else db.model
    special = Special.of(db.tokenizer)
    grid = torch.tensor(step_grid(db.schedule.T, steps)[::-1])  # t_0 = 0 ... t_S = T, as diffusion.masked_kl
    parts = chunks([len(r) for r in rows], draws)
    out: list[float] = []
    cost = {} if cost is None else cost
    if on_progress is not None:
        on_progress(0, 0.0)
    for p, part in enumerate(parts):
        texts = [rows[i] for i in part]
        ids, att, noisable = collate([r for r in texts for _ in range(draws)], special, db.device)
        gen = TextDraws(seed, [len(r) for r in texts], draws)
        B = ids.shape[0]
        total = torch.zeros(B, dtype=torch.float64, device=ids.device)
        for k in range(1, steps + 1):
            t = grid[k].expand(B).to(ids.device)
            mask = corrupt(ids, noisable, t, db.schedule, gen)
            with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=bf16):
                logits = model(ids.masked_fill(mask, model.mask_id), att, mask, t=t)
            where = mask.nonzero(as_tuple=True)[0]
            one = torch.zeros_like(where)  # every row at this step: one row of reveal chances serves all
            kl = step_kl(logits, ids[mask], one, grid[k:k + 1], grid[k - 1:k], db.schedule)
            total += torch.zeros(B, device=ids.device).index_add_(0, where, kl).double()
            cost["forwards"] = cost.get("forwards", 0) + 1
            cost["rows"] = cost.get("rows", 0) + B
            cost["flops"] = cost.get("flops", 0.0) + forward_flops(model.config, B, ids.shape[1], int(mask.sum()))
            if on_progress is not None:
                on_progress(len(out), (p * steps + k) / (len(parts) * steps))
        out.extend(float(v) for v in total.view(len(texts), draws).mean(1))
    if on_progress is not None:
        on_progress(len(out), 1.0)
    return out


def infill(db, cfg, per_length: int = PER_LENGTH, score_steps: int = SCORE_STEPS, on_frame=None, *,
           cased: bool = True, paragraph: str | None = None, keep: dict | None = None,
           topk: int = 0, draws: int = DRAWS, on_rank=None, stats: dict | None = None) -> list[Candidate]:
    """Candidates for cfg.prompt (a template with [MASK*A-B] spans), best first, duplicates
    (the same text) kept once. cfg.n is not used here: the caller keeps the top n.
    keep: a dict that receives, per length combination, every frame of its batch (the TUI
    plays the winner's batch back); topk: the frames' candidates (sample.frames).
    on_rank(texts ranked, texts, fraction of the ranking done) as the bound is computed;
    stats: a dict that receives the run's cost, the sampling's and the ranking's (`dbert sample --stats`)."""
    import time

    from .base import last_frame
    from .prompt import parse_prompt, prompt_words
    from .sample import frames

    if not has_range(cfg.prompt):
        raise DbertError("infill needs a [MASK*A-B] span in the prompt")
    if per_length < 1:
        raise DbertError("must be >= 1", "candidates", per_length)
    start = time.perf_counter()
    seed = cfg.seed if cfg.seed is not None else torch.seed() % 2**63
    gen = torch.Generator().manual_seed(seed)
    drawn = []  # (lengths, template, its rows) per length combination
    nfe = rows_sampled = 0
    flops = 0.0
    for lengths, template, L in checked_variants(db, cfg.prompt):  # every length checked before the first
        ids = parse_prompt(db, template, L)
        # a story model's story does not end inside the template (its last token is given): no end before L
        least = min(cfg.min_length, L) if cfg.min_length else cfg.min_length
        run = replace(cfg, prompt=None, n=per_length, length=L, min_length=least)
        last = None
        kept = keep.setdefault(lengths, []) if keep is not None else None
        for last in frames(db, run, generator=gen, template=ids, topk=topk):
            if on_frame is not None:
                on_frame(last)
            if kept is not None:
                kept.append(last)
        last = last_frame(last)
        nfe, rows_sampled, flops = nfe + int(last.nfe), rows_sampled + int(last.rows), flops + last.flops
        drawn.append((lengths, template, [[int(i) for i in row] for row in last.ids]))
    sampled = time.perf_counter()
    every = [row for _, _, rows in drawn for row in rows]
    cost: dict = {}
    nats = iter(bound(db, every, score_steps, seed, draws, cfg.dtype, cost=cost,
                      on_progress=None if on_rank is None else lambda done, f: on_rank(done, len(every), f)))
    out: dict[str, Candidate] = {}
    for lengths, template, rows in drawn:
        verbatim = prompt_words(db, template)
        for b, row in enumerate(rows):
            text = db.decode(row, cased=cased, paragraph=paragraph, verbatim=verbatim)
            c = Candidate(text, lengths, next(nats), len(row), row, b)
            if text not in out or c.score < out[text].score:
                out[text] = c
    if stats is not None:
        end = time.perf_counter()
        stats.update({"samples": len(every), "lengths": len(drawn), "nfe": nfe, "rows": rows_sampled,
                      "gflop": float(f"{flops / 1e9:.4g}"), "seconds": round(end - start, 3),
                      "sampling_seconds": round(sampled - start, 3),
                      "ranking": {"texts": len(every), "steps": max(1, min(score_steps, db.schedule.T)), "draws": draws,
                                  "dtype": cfg.dtype, "forwards": cost.get("forwards", 0), "rows": cost.get("rows", 0),
                                  "gflop": float(f"{cost.get('flops', 0.0) / 1e9:.4g}"),
                                  "seconds": round(end - sampled, 3)}})
    return sorted(out.values(), key=lambda c: c.score)
