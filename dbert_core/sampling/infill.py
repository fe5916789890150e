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

RANGE = re.compile(r"\[mask\s*\*\s*(\d+)\s*-\s*(\d+)\]", re.IGNORECASE)
MAX_VARIANTS = 64      # length combinations tried at most
PER_LENGTH = 4         # candidates drawn for each length unless told
SCORE_STEPS = 32       # the S of the bound that ranks them
DRAWS = 8              # corruptions the bound is averaged over


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
    return bool(template) and RANGE.search(template) is not None


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


@torch.inference_mode()
def bound(db, rows: list[list[int]], steps: int = SCORE_STEPS, seed: int = 0, draws: int = DRAWS) -> list[float]:
    """The S-step ELBO of each row of content ids in nats: all S terms (diffusion.elbo exact),
    averaged over `draws` corruptions. Each row is scored on its own, its corruptions drawn
    from `seed`: a text's score does not depend on the others scored with it, and texts of one
    length are compared under the same random masks (common random numbers)."""
    from ..text.data import Special, collate
    from ..maths.diffusion import elbo

    steps = max(1, min(steps, db.schedule.T))
    db.model.eval()
    out = []
    for row in rows:
        ids, att, noisable = collate([row] * draws, Special.of(db.tokenizer), db.device)
        gen = torch.Generator(device=ids.device).manual_seed(seed)
        out.append(float(elbo(db.model, ids, att, noisable, db.schedule, steps, gen, exact=True).mean()))
    return out


def infill(db, cfg, per_length: int = PER_LENGTH, score_steps: int = SCORE_STEPS, on_frame=None, *,
           cased: bool = True, paragraph: str | None = None, keep: dict | None = None,
           topk: int = 0) -> list[Candidate]:
    """Candidates for cfg.prompt (a template with [MASK*A-B] spans), best first, duplicates
    (the same text) kept once. cfg.n is not used here: the caller keeps the top n.
    keep: a dict that receives, per length combination, every frame of its batch (the TUI
    plays the winner's batch back); topk: the frames' candidates (sample.frames)."""
    from .prompt import parse_prompt, prompt_words
    from .sample import frames

    if not has_range(cfg.prompt):
        raise DbertError("infill needs a [MASK*A-B] span in the prompt")
    if per_length < 1:
        raise DbertError("--candidates must be >= 1")
    tok = db.tokenizer
    seed = cfg.seed if cfg.seed is not None else torch.seed() % 2**63
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, Candidate] = {}
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
        rows = [[int(i) for i in row] for row in last.ids]
        nats = bound(db, rows, score_steps, seed)
        verbatim = prompt_words(db, template)
        for b, (row, v) in enumerate(zip(rows, nats)):
            text = db.decode(row, cased=cased, paragraph=paragraph, verbatim=verbatim)
            c = Candidate(text, lengths, float(v), len(row), row, b)
            if text not in out or c.score < out[text].score:
                out[text] = c
    return sorted(out.values(), key=lambda c: c.score)
