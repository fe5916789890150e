"""Reverse diffusion: fill [MASK]s in, one frame per reverse step (or per reveal event).

frames() runs the reverse process of one batch and yields a Frame after each step; generate()
runs cfg.n samples in batches, side by side on a CPU's cores (parallel.py), and returns their
texts. A run's settings are resolved once (settings.py); the sampler family that cfg.sampler's
strategy declares (strategies.py, the registry) does the steps on one base.State (base.py says what a
family is):

    exact, drawing from the reverse process's own law (docs/method.md section 2):
        ancestral, cached   ancestral.py   one step at a time: the reverse step
        first-hitting       first_hitting.py   one network call per reveal event
    heuristic, changing that law (docs/decoding.md measures them):
        confidence, margin, entropy, threshold, entropy-bounded   ordered.py
        remdm               remdm.py   ancestral with remasking
The token choice (temperature, top-k, top-p, the repeat block) is draw.py's, the same for all;
prompts are prompt.py's. After the last step the touch-up's rounds may follow (touchup.py). The
network (base.Net) may keep decided positions' keys and values between calls (cfg.cache_refresh,
maths/decided_cache.py: an approximation, so a run's stats then say exact: false).
A story checkpoint (blocks.py) opens each row with [SEP], ends a row at its end mark, and goes
on block by block past one window (story_stream).
"""

from __future__ import annotations

import importlib
import time as _time
from dataclasses import replace
from functools import partial
from typing import Iterator

import torch

from .. import strategies
from ..config import SampleConfig
from ..errors import DbertError
from . import parallel, settings
from .blocks import (is_story_model, prompt_end, story_canvas, story_frames, story_of, story_rules, story_template,
                     with_end_rule)
from .base import Frame, Kernel, Net, Sampler, Shaping, State, kernel, last_frame, masked_curve
from .draw import RepeatBlock, categorical, neighbours, repeat_block, shape_probs
from .ordered import position_scores
from .prompt import expand_template, parse_prompt, prompt_ids, prompt_notes, prompt_words
from .remdm import remdm_kernel, remdm_path
from .settings import MAX_STORY, default_length, default_sampler, resolve, validate
from .touchup import touch_up

__all__ = [  # a run, and the names library users import from sample (they live in the modules above)
    "frames", "generate", "Frame", "SampleConfig", "DbertError", "resolve", "validate", "default_length",
    "default_sampler", "parse_prompt", "prompt_words", "prompt_notes", "expand_template", "masked_curve", "kernel",
    "Kernel", "shape_probs", "categorical", "neighbours", "RepeatBlock", "position_scores", "remdm_path",
    "remdm_kernel", "story_stream", "prompt_ids", "MAX_STORY",
]


@torch.inference_mode()
def frames(db, cfg: SampleConfig | None = None, generator: torch.Generator | None = None,
           template: torch.Tensor | None = None, topk: int = 0, forbid: tuple[int, ...] | list[int] = (),
           offset: int = 0, prefix: int = 0, **overrides) -> Iterator[Frame]:
    """Run the reverse process for cfg.n samples in one batch, yielding a Frame per step (event).

    cfg holds the settings (SampleConfig's defaults where None); keyword overrides replace
    single fields (frames(db, n=2, steps=16)). template: token ids (length,) with [MASK] slots,
    instead of cfg.prompt's text, or (n, length): one template per row (a server batching
    requests of different prompts into one call). topk > 0: each Frame carries the topk most
    likely candidates of p' (and their p') at each position's reveal (top_ids, top_probs); the
    draws are the same either way. forbid: more ids never drawn. offset: a story window's place on
    its story's canvas (column 0 of the window is canvas column offset; cfg.min_length counts
    there); prefix: its first columns that are given context (a continuation window's), whose keys
    and values the network keeps from the first call when cfg.prefix_cache. With cfg.pair_quotes or
    cfg.fix_contractions (both on by default) the touch-up's frames follow the last step (touchup.py).
    """
    from .inspector import TopK

    cfg = settings.config(db, cfg, overrides)
    length = cfg.length
    assert length is not None  # resolved (settings.config)
    gen = generator or torch.Generator().manual_seed(cfg.seed if cfg.seed is not None else torch.seed() % 2**63)
    mask_id = db.model.mask_id
    if template is None and is_story_model(db):  # [SEP] opens the story, then the prompt's tokens and masks
        template = story_template(db, prompt_ids(db, cfg.prompt) if cfg.prompt else None, length)
    elif template is None:
        template = parse_prompt(db, cfg.prompt, length) if cfg.prompt else \
            torch.full((length,), mask_id, dtype=torch.long)
    x = template.unsqueeze(0).repeat(cfg.n, 1) if template.dim() == 1 else template.clone()  # (B, L)
    if x.shape[1] > db.model.max_length:  # the network has no position for the rest (refill.py goes in windows)
        raise DbertError(f"a template of {x.shape[1]} tokens is longer than the model's {db.model.max_length} positions")
    free = x == mask_id  # the positions the sampler fills (a prompt's own tokens are not among them)
    top = TopK((x.shape[0], x.shape[1]), topk) if topk > 0 else None

    def tagged(f: Frame) -> Frame:
        if top is not None:
            f.top_ids, f.top_probs = top.ids.clone(), top.probs.clone()
        return f

    reverse = partial(_reverse, offset=offset, prefix=prefix if cfg.prefix_cache else 0)
    if not (cfg.pair_quotes or cfg.fix_contractions or cfg.known_words):
        for f in reverse(db, cfg, gen, x, forbid, top):
            yield tagged(f)
        return
    final = None
    for final in reverse(db, cfg, gen, x, forbid, top):
        if final.done:
            break
        yield tagged(final)
    for f in touch_up(reverse, db, cfg, gen, final, free, forbid, top):
        yield tagged(f)


def shaping(db, cfg: SampleConfig) -> Shaping:
    """The token shaping every family hands to draw.shape_probs: temperature, top-k, top-p, and the id
    whose unshaped chance is kept (a story model's end mark with cfg.natural_length; -1: none)."""
    end = db.tokenizer.sep_token_id if is_story_model(db) and cfg.natural_length else -1
    assert cfg.temperature is not None and cfg.top_k is not None and cfg.top_p is not None  # cfg is resolved
    return Shaping(cfg.temperature, cfg.top_k, cfg.top_p, end)


def _reverse(db, cfg: SampleConfig, gen: torch.Generator, x: torch.Tensor, forbid=(), top=None,
             offset: int = 0, prefix: int = 0) -> Iterator[Frame]:
    """The reverse process of cfg.sampler from x (B, L), [MASK] where it fills in (x is written
    in); top: an inspector.TopK recorder of the candidates at each reveal, or None; offset: the
    story canvas column of x's column 0 (blocks.story_rules); prefix: x's first columns kept in the
    network's PrefixCache (0: none, the exact forward)."""
    rules = story_rules(db, x.shape[1], offset, cfg) if is_story_model(db) else None
    assert cfg.sampler is not None and cfg.steps is not None  # cfg is resolved
    strategy = strategies.get(cfg.sampler)
    state = State(
        x=x, masked=x == db.model.mask_id, confidence=torch.full(x.shape, float("nan"), dtype=torch.float64),
        kern=kernel(db.schedule, cfg.steps),
        net=Net(db, cfg.dtype, rules, prefix, cfg.cache_refresh or 0, bool(cfg.cache_masked)), gen=gen,
        shaping=shaping(db, cfg),
        no_draw=sorted(set(db.model.forbidden) | {db.tokenizer.unk_token_id} | set(forbid)),  # never sampled
        block_repeats=repeat_block(db, cfg.block_repeats, cfg.no_repeat_ngram or 0),
        db=db, steps=cfg.steps, params=strategy.resolve(cfg.params), top=top)
    stream = family(strategy)(state, **strategy.options)
    if is_story_model(db):  # after a story's end, the rest of its row is end padding, decided at once
        stream = with_end_rule(stream, x, state.masked, db.tokenizer.sep_token_id)
    yield from stream


def family(strategy: strategies.Strategy) -> Sampler:
    """The sampler family a strategy declares: its function, or the one its "module:function" names."""
    if callable(strategy.family):
        return strategy.family
    module, _, name = strategy.family.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise DbertError(f"the {strategy.name} strategy's sampler family {strategy.family!r} cannot be loaded "
                         f"({type(e).__name__}: {e})") from None


def decided_cache(db, cfg: SampleConfig) -> bool:
    """Whether a run keeps decided positions' keys and values between calls (cfg.cache_refresh on a
    time-agnostic model: maths.decided_cache), so that its draws are not from the model's exact p."""
    return bool(cfg.cache_refresh) and db.model.time == "none"


def story_stream(db, cfg: SampleConfig, generator: torch.Generator, topk: int = 0) -> Iterator[Frame]:
    """A story model's cfg.n stories as frames of one canvas, block by block (blocks.story_frames):
    what generate() and the TUI run for a story checkpoint. A prompt is given text in every window
    it reaches (one longer than --length is a DbertError), and the story may not end before its
    last given word (a [MASK] slot inside the prompt is never its end)."""
    assert cfg.length is not None  # cfg is resolved
    canvas = story_canvas(db, prompt_ids(db, cfg.prompt) if cfg.prompt else None, cfg.length)
    least = prompt_end(canvas, db.model.mask_id)  # the story goes on past its prompt's last word
    if least > (cfg.min_length or 0):
        cfg = settings.mark(replace(cfg, min_length=least), db)
    return story_frames(db, cfg, frames, generator, canvas, topk)


def _is_done(frame: Frame) -> bool:
    return frame.done


def generate(db, cfg: SampleConfig | None = None, on_frame=None, *, cased: bool = True, paragraph: str | None = None,
             topk: int = 0, every_frame: bool = True, **overrides) -> tuple[list[str], dict]:
    """cfg.n texts and stats {nfe, rows, gflop, seconds, samples, batches, workers, at_once, steps,
    sampler, exact, params}. The samples run in batches of at most cfg.batch_size, their number a
    multiple of cfg.workers, side by side as the threads allow (parallel.py; at_once: how many ran
    together). Their frames reach on_frame one batch after another; nfe counts every batch's calls.
    every_frame=False: of a batch that runs side by side with an earlier one, on_frame sees the
    frames it makes once the earlier ones have ended, and its last (done) frame, not the ones it
    made while waiting (a progress line's needs; each waiting frame is a whole canvas, so a long
    story's later batch held them all: memory that grows with the length squared).
    Same settings (workers included: they set the split), same seed: same texts. Texts as
    DBert.decode writes them (cased, paragraph: its options); a prompt's words are printed as
    typed. topk: the frames handed to on_frame carry the candidates at each reveal (frames' topk)."""
    cfg = settings.config(db, cfg, overrides)
    assert cfg.workers is not None and cfg.sampler is not None  # resolved (settings.config)
    verbatim = prompt_words(db, cfg.prompt) if cfg.prompt else None
    seed = cfg.seed if cfg.seed is not None else torch.seed() % 2**63
    sizes = parallel.plan(cfg.n, cfg.batch_size, cfg.workers)
    batches = [settings.mark(replace(cfg, n=size), db) for size in sizes]  # fewer samples: still resolved

    def job(k: int):
        def run(emit) -> Frame:
            gen = torch.Generator().manual_seed(parallel.batch_seed(seed, k))
            stream = story_stream(db, batches[k], gen, topk) if is_story_model(db) else \
                frames(db, batches[k], generator=gen, topk=topk)
            last = None
            for last in stream:
                emit(last)
            return last_frame(last)
        return run

    start = _time.perf_counter()
    lasts = parallel.run([job(k) for k in range(len(batches))], parallel.concurrency(cfg.workers), on_frame,
                         None if every_frame else _is_done)
    texts: list[str] = []
    for last in lasts:
        rows_out = [story_of(row, db.tokenizer.sep_token_id) for row in last.ids] if is_story_model(db) else last.ids
        texts.extend(db.decode(row, cased=cased, paragraph=paragraph, verbatim=verbatim) for row in rows_out)
    nfe, rows, flops = sum(f.nfe for f in lasts), sum(f.rows for f in lasts), sum(f.flops for f in lasts)
    strategy = strategies.get(cfg.sampler)
    stats = {"nfe": nfe, "rows": rows, "gflop": float(f"{flops / 1e9:.4g}"), "seconds": round(_time.perf_counter() - start, 3),
             "samples": cfg.n, "batches": len(sizes),
             "workers": cfg.workers, "at_once": min(parallel.concurrency(cfg.workers), len(sizes)), "steps": cfg.steps, "sampler": cfg.sampler,
             "exact": strategy.exact and not (cfg.prefix_cache and is_story_model(db)) and not decided_cache(db, cfg),
             "params": strategy.resolve(cfg.params)}  # either cache approximates p
    if cfg.prefix_cache:
        stats["prefix_cache"] = True
    if decided_cache(db, cfg):
        stats["cache_refresh"] = cfg.cache_refresh
        if cfg.cache_masked and strategy.cache_masked:  # a family that reads fewer than every mask
            stats["cache_masked"] = True
    return texts, stats
