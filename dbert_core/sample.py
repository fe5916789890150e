"""Reverse diffusion: fill [MASK]s in, one frame per reverse step.

The reverse step (METHOD.md section 2), for a masked position at step t jumping to s < t:
    reveal token v with probability p(v) r(v),  stay masked with 1 - sum_v p(v) r(v),
    r(v) = (a_s(v) - a_t(v)) / (1 - a_t(v)),  p = p_theta(x_0 | x_t).
Revealed tokens are never masked again ("carry-over"). Temperature, top-k and top-p reshape
the token choice only: whether a position is revealed is decided from the model's raw p, and
which token from the reshaped p' weighted by r. Categorical draws use float64.

Samplers:
    ancestral  one network call per step.
    cached     a time-agnostic model's prediction depends on x_t only, so when no token was
               revealed since the last call the previous prediction is reused; for a schedule
               whose r does not depend on the token, the network is not even called until a
               reveal happens. Same random draws, same samples as ancestral, fewer calls.
"""

from __future__ import annotations

import time as _time
from dataclasses import dataclass
from typing import Iterator

import torch

from .errors import DbertError
from .schedule import step_grid

SAMPLERS = ("ancestral", "cached")


@dataclass
class Frame:
    """The state after one reverse step of a batch of samples.

    ids         (B, L) content token ids; [MASK] where still masked
    masked      (B, L) bool, still masked after this step
    revealed    (B, L) bool, revealed at this step
    confidence  (B, L) float, p'(chosen token) when it was revealed (nan if masked or given)
    step        1..steps, the number of reverse steps done
    steps       the step budget S
    t           the diffusion time reached (T ... 0)
    nfe         network calls so far
    """

    ids: torch.Tensor
    masked: torch.Tensor
    revealed: torch.Tensor
    confidence: torch.Tensor
    step: int
    steps: int
    t: int
    nfe: int

    @property
    def done(self) -> bool:
        return self.step == self.steps


def shape_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """p' = softmax(logits / temperature) restricted to top-k / nucleus top-p, float64 (M, V)."""
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
    return torch.searchsorted(cdf, x).squeeze(-1).clamp_max(p.shape[-1] - 1)


def validate(db, steps: int, temperature: float, top_k: int, top_p: float, length: int, sampler: str) -> None:
    T = db.schedule.T
    if not 1 <= steps <= T:
        raise DbertError(f"--steps must be between 1 and T={T}, got {steps}")
    if not temperature > 0:
        raise DbertError(f"--temperature must be > 0, got {temperature}")
    if top_k < 0:
        raise DbertError(f"--top-k must be >= 1 (or 0 for off), got {top_k}")
    if not 0 < top_p <= 1:
        raise DbertError(f"--top-p must be in (0, 1], got {top_p}")
    if not 1 <= length <= db.model.max_length:
        raise DbertError(f"--length must be between 1 and {db.model.max_length} for this model, got {length}")
    if sampler not in SAMPLERS:
        raise DbertError(f"unknown sampler {sampler!r}; choose one of: {', '.join(SAMPLERS)}")
    if sampler == "cached" and db.model.time != "none":
        raise DbertError(f"the cached sampler needs a time-agnostic model; this one uses time={db.model.time!r}")


def parse_prompt(db, template: str, length: int) -> torch.Tensor:
    """Token ids (length,) of a template with [MASK] slots, masks appended up to length."""
    tok = db.tokenizer
    ids = tok(template, add_special_tokens=False)["input_ids"]
    bad = {tok.cls_token_id, tok.sep_token_id, tok.pad_token_id}
    ids = [tok.unk_token_id if i in bad else i for i in ids]
    if len(ids) > length:
        raise DbertError(f"the prompt is {len(ids)} tokens, longer than --length {length}")
    return torch.tensor(ids + [tok.mask_token_id] * (length - len(ids)), dtype=torch.long)


@torch.inference_mode()
def frames(db, n: int = 1, length: int = 64, steps: int = 128, temperature: float = 1.0, top_k: int = 0,
           top_p: float = 1.0, sampler: str = "ancestral", generator: torch.Generator | None = None,
           prompt: torch.Tensor | None = None) -> Iterator[Frame]:
    """Run the reverse process for n samples in one batch, yielding a Frame per step."""
    validate(db, steps, temperature, top_k, top_p, length, sampler)
    model, schedule, device = db.model, db.schedule, db.device
    gen = generator or torch.Generator().manual_seed(torch.seed() % 2**63)
    tok = db.tokenizer
    mask_id = model.mask_id
    no_draw = sorted(set(model.forbidden) | {tok.unk_token_id})  # never sampled (prompt may hold them)

    template = prompt if prompt is not None else torch.full((length,), mask_id, dtype=torch.long)
    x = template.unsqueeze(0).repeat(n, 1)  # (B, L)
    masked = x == mask_id
    confidence = torch.full(x.shape, float("nan"), dtype=torch.float64)
    B, L = x.shape
    cls = torch.full((B, 1), tok.cls_token_id, dtype=torch.long)
    sep = torch.full((B, 1), tok.sep_token_id, dtype=torch.long)
    attention = torch.ones((B, L + 2), dtype=torch.bool, device=device)
    token_free = schedule.alpha_vocab(torch.tensor(0.0)).shape[-1] == 1  # r(v) the same for all v

    grid = step_grid(schedule.T, steps)
    nfe = 0
    cache = None  # logits (M, V) for the current masked set, valid while x is unchanged
    for k in range(steps):
        t, s = grid[k], grid[k + 1]
        u_reveal = torch.rand(x.shape, generator=gen, dtype=torch.float64)
        u_token = torch.rand(x.shape, generator=gen, dtype=torch.float64)
        rows_masked = masked.nonzero(as_tuple=True)  # the row-major order of cached logits

        def predict():
            nonlocal nfe
            inp = torch.cat([cls, x, sep], dim=1).to(device)
            select = torch.cat([torch.zeros_like(cls, dtype=torch.bool), masked,
                                torch.zeros_like(sep, dtype=torch.bool)], dim=1).to(device)
            tt = torch.full((B,), t, device=device)
            nfe += 1
            return model(inp, attention, select, t=tt).float().cpu()

        if not masked.any():  # a prompt without slots, or everything revealed early
            yield Frame(ids=x.clone(), masked=masked.clone(), revealed=torch.zeros_like(masked),
                        confidence=confidence.clone(), step=k + 1, steps=steps, t=s, nfe=nfe)
            continue
        r_v = schedule.reveal_prob(torch.tensor(float(t)), torch.tensor(float(s)))  # (V,) or (1,)
        if sampler == "ancestral" or cache is None and not token_free:
            cache = predict()
        if token_free:
            reveal = masked & (u_reveal < r_v.double().item())
        else:
            p = torch.softmax(cache, dim=-1)
            R = (p * r_v).sum(-1).double()  # probability each masked position is revealed
            reveal = torch.zeros_like(masked)
            reveal[rows_masked] = u_reveal[rows_masked] < R
        if reveal.any():
            if cache is None:
                cache = predict()
            sel = reveal[rows_masked]  # which cached rows are revealed now
            logits = cache[sel]
            logits[:, no_draw] = float("-inf")
            p_shaped = shape_probs(logits, temperature, top_k, top_p)
            weights = p_shaped if token_free else p_shaped * r_v.double()
            chosen = categorical(weights, u_token[reveal])
            x[reveal] = chosen
            confidence[reveal] = p_shaped.gather(-1, chosen.unsqueeze(-1)).squeeze(-1)
            masked = masked & ~reveal
            cache = None
        yield Frame(ids=x.clone(), masked=masked.clone(), revealed=reveal, confidence=confidence.clone(),
                    step=k + 1, steps=steps, t=s, nfe=nfe)


def generate(db, n: int = 1, batch_size: int = 32, seed: int | None = None, on_frame=None, **kwargs) -> tuple[list[str], dict]:
    """n texts (keeps each batch's last frame) and stats {nfe, seconds, samples, steps}."""
    gen = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % 2**63)
    texts: list[str] = []
    nfe = 0
    start = _time.perf_counter()
    for lo in range(0, n, batch_size):
        last = None
        for last in frames(db, n=min(batch_size, n - lo), generator=gen, **kwargs):
            if on_frame is not None:
                on_frame(last)
        nfe += last.nfe
        texts.extend(db.decode(row) for row in last.ids)
    stats = {"nfe": nfe, "seconds": round(time_since(start), 3), "samples": n, "steps": kwargs.get("steps", 128)}
    return texts, stats


def time_since(start: float) -> float:
    return _time.perf_counter() - start
