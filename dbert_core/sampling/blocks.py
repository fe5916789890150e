"""Whole stories: where a story starts and ends, and stories longer than a window (block continuation).

A story checkpoint (trained with `--unit story`, data.story_windows) reads a window as
`[SEP] story [SEP] [SEP] ...`: the first [SEP] opens the story and is given, the next one is its
end, and everything after the end is end padding the model learnt like text. So a sample is one
story whose length the model chooses:

- the story start: the canvas begins with the given [SEP] (story_template);
- the end rule: once a position the sampler fills is revealed as [SEP], the rest of that row is
  end padding at once (end_fill): those positions are decided without a network call, text after
  an end never appears, and a row whose story has ended drops out of the batch (the samplers only
  run rows with masks left);
- where a story may start and end (StoryRules, applied to the network's logits so every sampler
  draws from p given them): its first token one that opens the stories the checkpoint learnt
  from (cfg.start_as_trained), its end not before the shortest story (cfg.min_length,
  `--min-length`) and only after a sentence end (cfg.end_at_sentence), so no story opens with
  "But" or stops after ten words or after "And";
- block continuation: a story that has not ended when its window is full goes on in a next
  window holding the story's last `context` tokens as a given prompt and new masks after them,
  as the model was trained on continuation windows, until it ends or reaches the length asked
  for; story_frames shows it all as frames of one canvas (the CLI prints the last, the TUI
  draws each).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from ..errors import DbertError
from .base import last_frame


def is_story_model(db) -> bool:
    """Trained on whole stories (`dbert train --unit story`)."""
    return db.meta.get("unit") == "story"


def window(db) -> int:
    """Tokens of one story window: the length the checkpoint was trained on."""
    return min(int(db.meta.get("seq_len", 64)), db.model.max_length)


def context(db) -> int:
    """Tokens of earlier text a continuation window carries (the training run's --story-context)."""
    given = (db.meta.get("train_config") or {}).get("story_context")
    return int(given) if given else window(db) // 2


def end_fill(x: torch.Tensor, masked: torch.Tensor, free: torch.Tensor, end_id: int) -> torch.Tensor:
    """The end rule, in place: in each row, every position after the first [SEP] the sampler
    revealed (a `free` position, not a given one) becomes [SEP] and is no longer masked; text
    revealed there before the end was is replaced too. Returns the positions changed (B, L)."""
    L = x.shape[1]
    ended = (x == end_id) & free & ~masked
    first = torch.where(ended.any(1), ended.to(torch.int8).argmax(1), torch.full((x.shape[0],), L))
    after = (torch.arange(L) > first.unsqueeze(1)) & free & (x != end_id)
    x[after] = end_id
    masked &= ~after
    return after


def with_end_rule(frames: Iterator, x: torch.Tensor, masked: torch.Tensor, end_id: int) -> Iterator:
    """A sampler's frames with the end rule applied before each is shown; the frame is the state
    after the rule (ids, masked; the filled positions count as revealed at that step)."""
    free = masked.clone()
    for f in frames:
        filled = end_fill(x, masked, free, end_id)
        if bool(filled.any()):
            f.ids, f.masked = x.clone(), masked.clone()
            f.revealed = f.revealed | filled
            if not bool(masked.any()):
                f.step = f.steps  # every row has ended: the run is done
        yield f


FINALS = (".", "!", "?", '"')  # what a story's last token may be under the sentence-end rule


@dataclass
class StoryRules:
    """Where a story may start and end, applied to the network's logits (Net) so that every
    sampler draws from the model's p given the rules:
    - `openings` (ids; `start_as_trained`): the story's first token (canvas column 1) is one that
      opens its training stories (training/story_defaults.py), so no story opens with "But";
    - `no_end` (min length): before the shortest story the end ([SEP]) has no mass;
    - `finals` (the ids of FINALS; `end_at_sentence`): a position may be the end only where its
      left neighbour is still masked or ends a sentence, the position just before a revealed end
      may only end a sentence, and no story is one token long, so none stops after "And"."""

    sep: int
    mask: int
    no_end: torch.Tensor | None = None   # (L,) bool
    finals: torch.Tensor | None = None   # ids
    openings: torch.Tensor | None = None  # ids
    first: int | None = None             # the window column of the story's first token (1), if it holds it

    def apply(self, out: torch.Tensor, x: torch.Tensor, select: torch.Tensor) -> None:
        """In place on logits out (M, V) of the select (R, L) positions of rows x, row-major."""
        rows, cols = select.nonzero(as_tuple=True)
        ban = torch.zeros(len(cols), dtype=torch.bool) if self.no_end is None else self.no_end[cols].clone()
        if self.openings is not None and self.first is not None:
            self._only(out, cols == self.first, self.openings)
        if self.finals is not None:
            ban |= cols <= 2  # a story of one token would be "." alone
            left = x[rows, (cols - 1).clamp_min(0)]
            ban |= (cols > 0) & (left != self.mask) & ~torch.isin(left, self.finals)
            L = x.shape[1]
            right = x[rows, (cols + 1).clamp_max(L - 1)]
            self._only(out, (cols + 1 < L) & (right == self.sep), self.finals)  # the last token ends a sentence
        if bool(ban.any()):
            out[ban.to(out.device), self.sep] = float("-inf")

    @staticmethod
    def _only(out: torch.Tensor, where: torch.Tensor, ids: torch.Tensor) -> None:
        if bool(where.any()):
            keep = torch.full((out.shape[1],), float("-inf"), device=out.device)
            keep[ids.to(out.device)] = 0.0
            out[where.to(out.device)] += keep


def story_rules(db, width: int, offset: int, cfg) -> StoryRules | None:
    """A story model's StoryRules for a window of `width` columns at canvas column `offset`
    (cfg: min_length, end_at_sentence, start_as_trained), or None when nothing restricts it."""
    no_end = no_end_columns(width, offset, cfg.min_length)
    finals = openings = None
    if cfg.end_at_sentence:
        ids = [db.tokenizer.backend_tokenizer.token_to_id(t) for t in FINALS]
        finals = torch.tensor([i for i in ids if i is not None], dtype=torch.long) if any(ids) else None
    given = (db.meta.get("sampling") or {}).get("openings")
    if cfg.start_as_trained and offset == 0 and isinstance(given, list) and given:
        V = db.model.config.vocab_size
        openings = torch.tensor([i for i in given if isinstance(i, int) and 0 <= i < V], dtype=torch.long)
        openings = openings if len(openings) else None
    if no_end is None and finals is None and openings is None:
        return None
    return StoryRules(db.tokenizer.sep_token_id, db.model.mask_id, no_end, finals, openings, 1 if offset == 0 else None)


def no_end_columns(width: int, offset: int, min_length: int | None) -> torch.Tensor | None:
    """(width,) bool: the columns of a window placed at canvas column `offset` where the story may
    not end yet, or None when it may end anywhere. Canvas column c holds story token c - 1 (column
    0 is the [SEP] that opens it), so an end at column c makes a story of c - 1 tokens: with
    min_length m, columns 1..m may not be the end."""
    if not min_length:
        return None
    cols = torch.arange(width) + offset
    return (cols >= 1) & (cols <= min_length)


START = 1  # the canvas column of a story's first token: column 0 is the [SEP] that opens it


def canvas_words(words: dict[int, str] | None) -> dict[int, str] | None:
    """A story prompt's own words (prompt.prompt_words: by the prompt's token positions) by
    their columns on the story's canvas, where the prompt starts at START (story_canvas)."""
    return None if words is None else {START + i: w for i, w in words.items()}


def story_canvas(db, prompt_ids: torch.Tensor | None, length: int) -> torch.Tensor:
    """A story's whole canvas (1 + length,): the given [SEP] that opens it, then the prompt's
    tokens (if any) and masks. A prompt longer than `length` is one DbertError (never cut)."""
    tok = db.tokenizer
    if prompt_ids is not None and len(prompt_ids) > length:
        raise DbertError(f"the prompt is {len(prompt_ids)} tokens, longer than $length {length}", refs=("length",))
    body = torch.full((length,), tok.mask_token_id, dtype=torch.long)
    if prompt_ids is not None:
        body[:len(prompt_ids)] = prompt_ids
    return torch.cat([torch.tensor([tok.sep_token_id] * START), body])


def story_template(db, prompt_ids: torch.Tensor | None, length: int) -> torch.Tensor:
    """The first window of a story: story_canvas's first min(length, window - 1) tokens after
    the [SEP] (a prompt longer than a window goes on in the windows after it: story_frames)."""
    return story_canvas(db, prompt_ids, length)[:min(length, window(db) - 1) + 1]


def prompt_end(canvas: torch.Tensor, mask: int) -> int:
    """The canvas column of a story canvas's last given prompt token (0: no prompt): the story
    may not end before it, or the prompt's words after a [MASK] slot would fall after its end."""
    given = (canvas[1:] != mask).nonzero()
    return int(given[-1, 0]) + 1 if len(given) else 0


def story_of(row: torch.Tensor, end_id: int, start: int = 1) -> list[int]:
    """A sampled window's story tokens: from `start` up to the first [SEP] (the end)."""
    ids = row[start:].tolist()
    return ids[:ids.index(end_id)] if end_id in ids else ids


def story_frames(db, cfg, frames_fn: Callable, generator: torch.Generator, first: torch.Tensor,
                 topk: int = 0) -> Iterator:
    """cfg.n stories as frames of one canvas (n, 1 + cfg.length): the opening [SEP], then each
    story's tokens as they are written, window after window. `first` is the first window ((L,) or
    (n, L), story_template) or the whole canvas (story_canvas): a prompt longer than a window is
    given text in every window it reaches, each window's new columns taken from it. A row that
    has not ended when its window is full continues in a next window holding its last `context`
    tokens (given), then the canvas's next columns (the prompt's tokens, or masks), placed on the
    canvas right after the story so far; columns no window has reached yet are [MASK], columns after an end are end
    padding. Every frame has the canvas's shape; `step` counts on across windows (steps = the step
    budget times the most windows the length can take), so only the very last frame is `done`.
    frames_fn is sample.frames (each window runs cfg's sampler and touch-ups)."""
    from dataclasses import replace

    end, mask = db.tokenizer.sep_token_id, db.model.mask_id
    n, width = cfg.n, 1 + cfg.length
    template = first if first.dim() == 2 else first.unsqueeze(0).repeat(n, 1)
    ctx = context(db)
    canvas = torch.full((n, width), mask, dtype=torch.long)
    canvas[:, :template.shape[1]] = template  # the prompt's tokens where it reaches, masks after
    template = template[:, :window(db)]
    most = 1 + max(0, -(-(cfg.length - (template.shape[1] - 1)) // (window(db) - ctx)))  # windows at most
    confidence = torch.full((n, width), float("nan"), dtype=torch.float64)
    top: tuple[torch.Tensor, torch.Tensor] | None = None  # the canvas's candidates (ids, probs), once a frame has them
    rows, col, start = list(range(n)), 0, 1  # col: the canvas column of the window's column 0
    settled = torch.zeros(n, dtype=torch.long)  # columns no later window changes: finished windows' text
    nfe = calls = 0
    flops = 0.0
    for block in range(most):
        S = cfg.steps
        last = None
        for f in frames_fn(db, replace(cfg, n=len(rows)), generator=generator, template=template, topk=topk,
                           offset=col, prefix=start if block else 0):
            last = f
            if f.top_ids is not None and top is None:
                top = (torch.full((n, width, f.top_ids.shape[-1]), -1, dtype=f.top_ids.dtype),
                       torch.zeros((n, width, f.top_ids.shape[-1]), dtype=f.top_probs.dtype))
            row_steps = torch.full((n,), block * S, dtype=torch.long)
            if f.row_steps is not None:
                row_steps[rows] = block * S + f.row_steps
            yield replace(f, **_laid(f, canvas, mask, confidence, top, rows, col, start),
                          row_steps=row_steps, steps=S * most,
                          step=block * S + f.step, nfe=nfe + f.nfe, rows=calls + f.rows, flops=flops + f.flops,
                          touch_up=True, settled=settled.clone())  # more follows: the last frame, below, is done
        last = last_frame(last)
        W = last.ids.shape[1]
        canvas[rows, col:col + W] = last.ids
        confidence[rows, col + start:col + W] = last.confidence[:, start:]
        if last.top_ids is not None and last.top_probs is not None and top is not None:
            top[0][rows, col + start:col + W] = last.top_ids[:, start:]
            top[1][rows, col + start:col + W] = last.top_probs[:, start:]
        nfe, calls, flops = nfe + last.nfe, calls + last.rows, flops + last.flops
        ended = _ended(canvas, last, rows, start, end)
        rows = [r for r in rows if r not in ended]
        written = col + W  # the canvas columns written so far (the same for every row still going)
        settled[ended] = width  # an ended story is final; a going one up to the window just finished
        settled[rows] = written
        if not rows or written >= width:
            break
        room = min(window(db) - ctx, width - written)
        template = canvas[rows, written - ctx:written + room].clone()  # the context, then the prompt's tokens or masks
        col, start = written - ctx, ctx
    yield replace(last_frame(last), ids=canvas.clone(), masked=canvas == mask, revealed=torch.zeros(n, width, dtype=torch.bool),
                   confidence=confidence.clone(), top_ids=None if top is None else top[0].clone(),
                   top_probs=None if top is None else top[1].clone(), remasked=None,
                   row_steps=torch.full((n,), S * most, dtype=torch.long), steps=S * most, step=S * most,
                   nfe=nfe, rows=calls, flops=flops, touch_up=False, settled=torch.full((n,), width, dtype=torch.long))


def _laid(f, canvas: torch.Tensor, mask: int, confidence: torch.Tensor, top: tuple[torch.Tensor, torch.Tensor] | None,
          rows: list[int], col: int, start: int) -> dict:
    """A window's frame `f` laid on copies of the canvas so far at the window's columns (col on;
    before `start`, its given context, the canvas's confidences and candidates `top` (ids, probs) stay): the frame's
    ids, masked, revealed, confidence, top_ids, top_probs and remasked, canvas-wide."""
    W = f.ids.shape[1]
    ids = canvas.clone()
    ids[rows, col:col + W] = f.ids
    masked = ids == mask
    revealed = torch.zeros_like(masked)
    revealed[rows, col:col + W] = f.revealed
    conf = confidence.clone()
    conf[rows, col + start:col + W] = f.confidence[:, start:]
    t_ids = t_probs = None
    if f.top_ids is not None and top is not None:  # top: made at the first frame with candidates
        t_ids, t_probs = top[0].clone(), top[1].clone()
        t_ids[rows, col + start:col + W] = f.top_ids[:, start:]
        t_probs[rows, col + start:col + W] = f.top_probs[:, start:]
    remasked = None
    if f.remasked is not None:
        remasked = torch.zeros_like(masked)
        remasked[rows, col:col + W] = f.remasked
    return {"ids": ids, "masked": masked, "revealed": revealed, "confidence": conf, "top_ids": t_ids,
            "top_probs": t_probs, "remasked": remasked}


def _ended(canvas: torch.Tensor, last, rows: list[int], start: int, end: int) -> list[int]:
    """The rows whose story ended in the window just finished (its last frame `last`); the rest
    of each one's canvas row set to end padding, in place."""
    ended = [r for i, r in enumerate(rows) if end in last.ids[i, start:].tolist()]
    for r in ended:  # the rest of an ended story's row is end padding
        first_end = (canvas[r, 1:] == end).nonzero()[0, 0] + 1
        canvas[r, first_end:] = end
    return ended
