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
- block continuation: a story that has not ended when its window is full goes on in a next
  window holding the story's last `context` tokens as a given prompt and new masks after them,
  as the model was trained on continuation windows (run_stories), until it ends or reaches the
  length asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch


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


def story_template(db, prompt_ids: torch.Tensor | None, length: int) -> torch.Tensor:
    """The first window of a story: the given [SEP] that opens it, then the prompt's tokens (if
    any) and masks, min(length, window - 1) tokens in all."""
    tok = db.tokenizer
    room = min(length, window(db) - 1)
    body = torch.full((room,), tok.mask_token_id, dtype=torch.long)
    if prompt_ids is not None:
        body[:min(room, len(prompt_ids))] = prompt_ids[:room]
    return torch.cat([torch.tensor([tok.sep_token_id]), body])


def story_of(row: torch.Tensor, end_id: int, start: int = 1) -> list[int]:
    """A sampled window's story tokens: from `start` up to the first [SEP] (the end)."""
    ids = row[start:].tolist()
    return ids[:ids.index(end_id)] if end_id in ids else ids


@dataclass
class StoryRun:
    """The stories of one batch as they grow: each row's tokens so far and whether it ended."""

    tokens: list[list[int]]
    ended: list[bool]
    nfe: int = 0
    rows: int = 0
    flops: float = 0.0
    blocks: int = 0
    prompt_tokens: list[int] = field(default_factory=list)  # tokens of the prompt at each row's start


def run_stories(db, cfg, frames_fn: Callable, generator: torch.Generator, first: torch.Tensor,
                on_frame: Callable | None = None, topk: int = 0) -> StoryRun:
    """cfg.n stories (cfg: resolved, cfg.length = the longest story in tokens) from the first
    window `first` ((L,) or (n, L), story_template), continued block by block while a row has
    not ended and is shorter than cfg.length. frames_fn is sample.frames. on_frame sees every
    frame with three attributes set: `block` (0, 1, ...), `story_rows` (which samples the
    window's rows continue) and `story_start` (per row, the window column where its new text
    begins) and `story_before` (per row, the story's tokens before this window)."""
    from dataclasses import replace

    end = db.tokenizer.sep_token_id
    mask = db.model.mask_id
    n = cfg.n
    template = first if first.dim() == 2 else first.unsqueeze(0).repeat(n, 1)
    run = StoryRun(tokens=[[] for _ in range(n)], ended=[False] * n)
    ctx = context(db)
    rows = list(range(n))  # the samples this window continues
    start = 1  # the window column where new story text begins: after the opening [SEP], then after the context
    while rows:
        last = None
        before = [len(run.tokens[r]) for r in rows]
        for last in frames_fn(db, replace(cfg, n=len(rows)), generator=generator, template=template, topk=topk):
            if on_frame is not None:
                last.block, last.story_rows, last.story_start, last.story_before = run.blocks, rows, start, before
                on_frame(last)
        run.nfe += last.nfe
        run.rows += last.rows
        run.flops += last.flops
        for i, r in enumerate(rows):
            run.tokens[r].extend(story_of(last.ids[i], end, start))
            run.ended[r] = end in last.ids[i, start:].tolist()
        run.blocks += 1
        rows = [r for r in rows if not run.ended[r] and len(run.tokens[r]) < cfg.length]
        if not rows:
            break
        room = min(window(db) - ctx, cfg.length - min(len(run.tokens[r]) for r in rows))
        template = torch.full((len(rows), ctx + room), mask, dtype=torch.long)
        for i, r in enumerate(rows):  # the story's last ctx tokens, given (a window always filled them)
            given = ([end] + run.tokens[r])[-ctx:]
            template[i, ctx - len(given):ctx] = torch.tensor(given, dtype=torch.long)
        start = ctx
    for r in range(n):
        del run.tokens[r][cfg.length:]
    return run
