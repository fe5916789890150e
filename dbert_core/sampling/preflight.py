"""Check before working: everything `dbert sample` can know is wrong before the first reverse
step, said in one DbertError line, not after minutes of sampling the prompts before it.

- every prompt (a prompt file's last line too) fits --length, its [MASK*N] runs counted before
  they are written out (prompt.count_slots);
- every length of every [MASK*A-B] span fits the model (infill.checked_variants);
- infill draws enough texts for --n (lengths x --candidates), and --candidates rows fit memory;
- a batch (--batch-size rows of --length tokens) fits the memory the device has free.
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import DbertError
from ..hardware import check_memory
from .blocks import is_story_model, window
from .infill import checked_variants, has_range
from .prompt import parse_prompt
from .settings import resolve

MAX_CANDIDATES = 100_000  # texts drawn per infill length at most (each is a row of one batch)


def row_bytes(db, length: int) -> float:
    """A floor on the bytes one row of `length` tokens needs in a forward pass: the hidden states
    and the feed-forward's activations (float32), the logits of every position (float32, all
    are masked at the first step) and the sampler's float64 state."""
    c = db.model.config
    L = length + 2
    return 4.0 * L * (c.intermediate_size + 4 * c.hidden_size + c.num_attention_heads * L) + \
        4.0 * length * c.vocab_size + 24.0 * length


def check_sample(db, cfg, prompts: list, candidates: int) -> None:
    """Everything about a `dbert sample` run that can be checked before it starts (the module's
    docstring lists it); cfg is the run's SampleConfig (prompt None), prompts its prompts."""
    run = resolve(replace(cfg, prompt=None), db)
    assert run.length is not None  # resolve fills it in
    infill_rows = 0
    for i, p in enumerate(prompts):
        if p is None:
            continue
        where = f" (prompt {i + 1} of {len(prompts)}: {p[:40]!r})" if len(prompts) > 1 else ""
        try:
            if has_range(p):
                if not 1 <= candidates <= MAX_CANDIDATES:
                    raise DbertError(f"must be in [1, {MAX_CANDIDATES:,}], got {candidates:,}", "candidates", candidates)
                found = checked_variants(db, p)
                drawn = len(found) * candidates
                if run.n > drawn:
                    need = -(-run.n // len(found))
                    raise DbertError(f"{run.n} asks for more texts than this infill draws: {len(found)} length(s) x "
                                     f"$candidates {candidates} = {drawn}; give $candidates {need} or more, or $n "
                                     f"{drawn} or less", "n", run.n, ("candidates", "n"))
                longest = max(L for _, _, L in found)
                check_memory(candidates * row_bytes(db, longest), db.device,
                             f"{candidates:,} (one batch of {longest} tokens each)", "$candidates", "candidates")
                infill_rows = max(infill_rows, candidates)
            else:  # a story model's prompt fits --length too: never cut
                parse_prompt(db, p, run.length)
        except DbertError as e:
            raise DbertError(e.message + where, e.setting, e.value, e.refs) from None
    rows = min(run.n, run.batch_size)
    length = min(run.length, window(db)) if is_story_model(db) else run.length
    check_memory(rows * row_bytes(db, length), db.device,
                 f"a batch of {rows:,} samples of {length} tokens", "$batch_size (or $length)",
                 refs=("batch_size", "length"))
