"""The same-budget autoregressive baseline of the default model (issue 23, item 4).

    python scripts/studies/ar_baseline.py train runs/stories --out runs/ar-baseline [--micro-batch 32]    # resumable
    python scripts/studies/ar_baseline.py eval runs/ar-baseline --heldout runs/data/stories-heldout.txt
    python scripts/studies/ar_baseline.py eval runs/ar-stories --heldout runs/data/head-heldout.txt --unit story   # whole stories
    python scripts/studies/ar_baseline.py sample runs/ar-baseline --n 200 > runs/ar-baseline-samples.json
    python scripts/studies/ar_baseline.py sample runs/ar-stories --n 100 --top-k 0 --top-p 0.93 --lines ar.txt   # whole stories
    python scripts/studies/ar_baseline.py speed runs/stories     # both trainings' tokens/s, one run

A GPT-2-shaped causal LM (transformers' GPT2LMHeadModel: 6 layers, hidden 384, 6 heads, tied
embeddings; about the diffusion model's parameter count) trained on the diffusion checkpoint's
own data, windows and tokenizer: its training files (dbert.json's train_config), cut into the
same sentence-start windows (data.pack_sentences, [SEP] before a document's first sentence), the
same batch of 32 windows and the same token budget (the checkpoint's tokens_seen), AdamW with
the same warm-up and cosine. Each window is read left to right after a [SEP] (a window that
starts a document already begins with one).

Training takes a faster path than GPT2LMHeadModel's own forward and loss, with the same maths (for_training,
causal_loss; a test holds them to transformers' loss and gradient): attention written out with dbert's
dropout, the fused tanh GELU, and the 13,624-word head and its cross-entropy one block of rows at a time
with the gradient made in the forward (LinearCrossEntropy), so no (rows, V) array is made. On the 2-core
AMD EPYC (Zen 4, bf16) a step of 32 windows of 257 tokens took 3.4-4.0 s against 8.5-9.5 s (2.1-2.5x).

--micro-batch N runs each step's batch N windows at a time (the same gradient, a quarter of the memory
at N = batch / 4: the stories checkpoint's 128 windows of 257 tokens need about 17 GB at once on a CPU);
it may change between a run and its resumption. train saves every --save-every steps and on Ctrl-C / SIGTERM (weights, optimizer, step, the data
order's seed) into --out atomically and continues from there when run again. eval scores the
held-out sentences one by one, each after a [SEP] as the diffusion model's eval sees them alone:
the exact perplexity per WordPiece token (the diffusion model's figure is an upper bound on its
own perplexity: compare with that in mind), plus tokens/s of training. sample draws --n + --n
windows of the diffusion model's length from a [SEP] (a sentence start, as the diffusion model's
unconditional samples begin), token by token at --temperature with --top-k (the diffusion CLI's
defaults; no repeat block and no quote touch-up, which are the diffusion sampler's own
heuristics), shows them with the diffusion checkpoint's detokenizer and truecasing, and reports
the figures the decoding study reports for the diffusion model: readability checks, BLEU-4
against the held-out sentences on the first set, Self-BLEU-4 on the second, distinct-n, unigram
entropy, and the sampling speed in tokens/s. speed times both trainings' optimizer steps in one
run, interleaved on the same windows (the diffusion trainer's own train_step beside this
script's GPT-2 step), which is the only ratio of the two quoted.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import random
import shutil
import signal
import sys
import time
from pathlib import Path

import torch

from dbert_core.storage import checkpoint
from dbert_core.text.data import (document_sentences, document_windows, encode, read_documents, read_examples,
                                  story_texts)
from dbert_core.hardware import cpu_name, native_bf16
from dbert_core.heap import HeapCeiling, resident_mb
from dbert_core.evaluation.judge import causal_batch


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def windows(db, files: list[str], seq_len: int) -> list[list[int]]:
    """The diffusion run's training windows, built as its trainer builds them: sentence-start
    windows, or for a story checkpoint (`--unit story`) whole stories, each `[SEP] story [SEP]`
    (its start and end, as the diffusion model reads them), cut into windows of seq_len + 1 tokens
    that overlap by one (a window's first token is the context of its second)."""
    if db.meta.get("unit") != "story":
        return document_windows(document_sentences(read_documents(files)), db.tokenizer, seq_len)
    sep = db.tokenizer.sep_token_id
    sep_kind = (db.meta.get("train_config") or {}).get("doc_sep", "auto")
    streams = [[sep, *ids, sep] for ids in encode(story_texts(read_documents(files, sep_kind)), db.tokenizer) if ids]
    return [st[i:i + seq_len + 1] for st in streams for i in range(0, len(st) - 1, seq_len)]


def build(db, seq_len: int, layers: int = 6, hidden: int = 384, heads: int = 6):
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = db.tokenizer
    config = GPT2Config(vocab_size=len(tok), n_positions=seq_len + 1, n_embd=hidden, n_layer=layers, n_head=heads,
                        bos_token_id=tok.sep_token_id, eos_token_id=tok.sep_token_id)
    return for_training(GPT2LMHeadModel(config))


def for_training(model):
    """The model's CPU training path made fast without changing what it computes: attention
    through `causal_attention` (registered with transformers as "dbert_cpu") and every dropout
    through dbert's (dbert_core.maths.model.dropout: the same p, to 2^-16, and expectation; four
    mask elements per random integer, where F.dropout's bernoulli_ draws a double per element), and
    GPT-2's tanh GELU ("gelu_new", written out in six elementwise passes) as torch's fused one (the
    same function: within 2e-7). The saved config is unchanged. Returns the model."""
    from transformers import AttentionInterface
    from transformers.activations import GELUTanh, NewGELUActivation
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    from dbert_core.maths.model import Dropout

    AttentionInterface.register("dbert_cpu", causal_attention)
    AttentionMaskInterface.register("dbert_cpu", functools.partial(sdpa_mask, allow_is_causal_skip=False))
    model.config._attn_implementation = "dbert_cpu"
    for module in list(model.modules()):
        for name, child in module.named_children():
            if type(child) is torch.nn.Dropout:
                setattr(module, name, Dropout(child.p))
            elif type(child) is NewGELUActivation:  # the same tanh GELU, one fused op instead of six passes
                setattr(module, name, GELUTanh())
    return model


def causal_attention(module, q, k, v, mask, scaling=None, dropout=0.0, **kwargs):
    """dbert's explicit_attention (dbert_core.maths.model: two matmuls, a softmax and dbert's
    dropout) as a transformers attention function: q, k, v (B, h, N, d); mask (B, 1, N, K) bool,
    True where a query may read a key, or None (causal). transformers' eager GPT-2 attention in
    effect, with no float32 detour under bf16 autocast (its additive float32 mask widened the
    (B, h, N, N) scores and weights to float32 and back). Returns (B, N, h, d) and no weights."""
    from dbert_core.maths.model import explicit_attention

    if scaling is not None and scaling != q.shape[-1] ** -0.5:
        raise ValueError("causal_attention scales by 1/sqrt(head size) only")
    if mask is None:
        N, K = q.shape[-2], k.shape[-2]
        mask = torch.ones(N, K, dtype=torch.bool, device=q.device).tril(K - N)
    return explicit_attention(q, k, v, mask, dropout).transpose(1, 2), None


CE_ROWS = 256  # rows of logits per block of LinearCrossEntropy: (256, V) float32 stays a few MB


class LinearCrossEntropy(torch.autograd.Function):
    """sum_i -log softmax(h_i W^T)[t_i] over the rows of h (N, H), one block of CE_ROWS rows at a
    time, in `dtype` for the products (bf16 under autocast, like the model's own lm_head) and
    float32 for the softmax (like transformers' loss). The gradients are computed in the forward,
    block by block (softmax minus the one-hot, times W and h), so no (N, V) logits, log-softmax or
    gradient array is ever made: at 32 windows of 257 tokens and 13,624 words those were four
    arrays of 224-448 MB whose pages were faulted in fresh at every step, and about half the
    step's time (the same idea as Liger-Kernel's fused linear cross-entropy)."""

    @staticmethod
    def forward(ctx, h, W, targets, dtype):
        hb, Wb = h.detach().to(dtype), W.detach().to(dtype)
        N, rows = len(h), min(len(h), CE_ROWS)
        grad_h = torch.empty(h.shape, dtype=torch.float32, device=h.device)
        grad_W = torch.zeros(W.shape, dtype=torch.float32, device=W.device)
        loss = torch.zeros((), dtype=torch.float64, device=h.device)
        # arrays made once per call and reused by every block (fresh ones fault their pages in each time)
        zd = torch.empty(rows, W.shape[0], dtype=dtype, device=h.device)  # logits / gradient in dtype
        z = torch.empty(rows, W.shape[0], dtype=torch.float32, device=h.device)
        gw = torch.empty(W.shape, dtype=dtype, device=W.device)  # one block's share of grad_W
        gwf = torch.empty(W.shape, dtype=torch.float32, device=W.device) if dtype != torch.float32 else gw
        for lo in range(0, N, rows):
            hi = min(N, lo + rows)
            b, t = hi - lo, targets[lo:hi]
            torch.mm(hb[lo:hi], Wb.t(), out=zd[:b])
            zf = z[:b].copy_(zd[:b])  # (b, V) float32 logits
            zt = zf.gather(1, t[:, None]).squeeze(1)
            top = zf.amax(dim=-1, keepdim=True)
            total = zf.sub_(top).exp_().sum(dim=-1, keepdim=True)  # in place: logsumexp's own temporaries
            loss += (top + total.log()).squeeze(1).sub_(zt).double().sum()  # were fresh 14 MB arrays a block
            zf.div_(total)  # the softmax
            zf[torch.arange(b, device=zf.device), t] -= 1.0  # minus the one-hot: d loss / d logits
            g = zd[:b].copy_(zf)
            grad_h[lo:hi] = g @ Wb
            torch.mm(g.t(), hb[lo:hi], out=gw)
            grad_W += gwf.copy_(gw) if gwf is not gw else gw  # widened in a kept array, not a fresh one
        ctx.save_for_backward(grad_h, grad_W)
        ctx.dtypes = (h.dtype, W.dtype)
        return loss.float()

    @staticmethod
    def backward(ctx, grad):
        grad_h, grad_W = ctx.saved_tensors
        return (grad_h * grad).to(ctx.dtypes[0]), (grad_W * grad).to(ctx.dtypes[1]), None, None


def causal_loss(model, ids: torch.Tensor, labels: torch.Tensor, pad: int, bf16: bool) -> torch.Tensor:
    """transformers' GPT2LMHeadModel loss (the mean over targets of -log p(next token)), the
    hidden states under autocast and the head and loss through LinearCrossEntropy, on the
    positions that have a target only."""
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=bf16):
        h = model.transformer(input_ids=ids, attention_mask=(ids != pad).long()).last_hidden_state
    t = labels[:, 1:].reshape(-1)
    keep = t != -100
    h = h[:, :-1].reshape(-1, h.shape[-1])[keep]
    dtype = torch.bfloat16 if bf16 else torch.float32
    return LinearCrossEntropy.apply(h, model.lm_head.weight, t[keep], dtype) / keep.sum().clamp_min(1)


def _batch(rows: list[list[int]], sep: int, pad: int, story: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Each window read after a [SEP] (one that starts a document has it already); a story
    checkpoint's windows as they are (a story's first opens with its [SEP], a later one with the
    last token of the one before: context, not a target)."""
    return causal_batch([r if story or r[:1] == [sep] else [sep] + r for r in rows], pad)


def _save(model, opt, state: dict, out: Path, tokenizer=None) -> None:
    """Weights, optimizer and state into out, swapped in whole; the tokenizer beside them, so the
    folder is a causal LM `dbert eval --judge` can load."""
    tmp = out.with_name(out.name + ".saving")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
        for name in ("tokenizer_config.json", "special_tokens_map.json"):  # every window is read after a
            meta = json.loads((tmp / name).read_text())                   # [SEP]: a judge starts there
            (tmp / name).write_text(json.dumps({**meta, "bos_token": tokenizer.sep_token}, indent=2) + "\n")
    if opt is not None:  # the best weights (<out>.best) are for eval and sample only
        torch.save(opt.state_dict(), tmp / "optimizer.pt")
    (tmp / "state.json").write_text(json.dumps(state, indent=1))
    old = out.with_name(out.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def _step(model, opt, ids, labels, pad: int, bf16: bool, micro: int = 0) -> torch.Tensor:
    """One optimizer step of the causal LM on a batch (bf16 autocast where native, clipping at 1).

    micro > 0: the batch goes through the model `micro` rows at a time, each part's mean loss
    weighted by its share of the batch's targets, so the gradient is the whole batch's (the same
    step, up to rounding) in a fraction of the memory: 128 windows of 257 tokens need about 17 GB
    at once on a CPU, 32 at a time about 4 GB.

    The parts take the rows longest first, each cut to its own longest row: a story window holds 186
    tokens on average and a batch is padded to 257, so parts of random rows spent about a quarter of
    the network's positions on padding (the rows are right-padded and read causally, so no row's
    result depends on its part's width)."""
    opt.zero_grad()
    lengths = (labels != -100).sum(1)
    order = lengths.argsort(descending=True, stable=True)
    ids, labels, lengths = ids[order], labels[order], lengths[order]
    targets = (labels[:, 1:] != -100).sum()
    total = torch.zeros((), device=ids.device)
    size = micro or len(ids)
    for lo in range(0, len(ids), size):
        width = max(1, int(lengths[lo]))  # the part's longest row (sorted: its first)
        part, lab = ids[lo:lo + size, :width], labels[lo:lo + size, :width]
        share = (lab[:, 1:] != -100).sum() / targets.clamp_min(1)
        loss = causal_loss(model, part, lab, pad, bf16)
        (loss * share).backward()
        total += loss.detach().float() * share
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return total


def train(a) -> int:
    from transformers import GPT2LMHeadModel

    db = checkpoint.load(a.checkpoint)
    meta = db.meta
    tc = meta["train_config"]
    seq_len, batch = a.seq_len or meta["seq_len"], a.batch or tc["batch_size"]
    tc = {**tc, "lr": a.lr or tc["lr"], "warmup": a.warmup or tc["warmup"]}
    budget = a.tokens or meta["tokens_seen"]
    out = Path(a.out)
    rows = windows(db, a.data or tc["data"], seq_len)
    per_step = sum(len(r) for r in rows) / len(rows) * batch
    steps = max(1, round(budget / per_step))
    torch.manual_seed(0)
    device = torch.device(a.device)
    if (out / "state.json").is_file():
        state = json.loads((out / "state.json").read_text())
        model = for_training(GPT2LMHeadModel.from_pretrained(out).to(device))
        opt = torch.optim.AdamW(model.parameters(), lr=tc["lr"], weight_decay=0.01)
        opt.load_state_dict(torch.load(out / "optimizer.pt", weights_only=True, map_location=device))
        say(f"resumed at step {state['step']} of {state['steps']}")
    else:
        model = build(db, seq_len, a.layers, a.hidden, a.heads).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=tc["lr"], weight_decay=0.01)
        state = {"step": 0, "steps": steps, "tokens_seen": 0, "seconds": 0.0, "checkpoint": str(a.checkpoint),
                 "budget_tokens": budget, "params": sum(p.numel() for p in model.parameters()), "cpu": cpu_name(),
                 "device": str(device),
                 "windows": len(rows), "seq_len": seq_len, "batch": batch, "lr": tc["lr"], "history": []}
    steps = state["steps"]
    stop = {"now": False}

    def on_signal(signum, frame):
        stop["now"] = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    bf16 = native_bf16(device) and not a.fp32
    warmup, lr, floor = tc["warmup"], tc["lr"], tc["lr"] * tc.get("min_lr_ratio", 0.1)
    tok = db.tokenizer
    model.train()
    start, seen0, t0 = time.perf_counter(), state["tokens_seen"], state["seconds"]
    heap = HeapCeiling()
    while state["step"] < steps and not stop["now"]:
        step = state["step"]
        epoch, k = divmod(step * batch, len(rows))
        order = list(range(len(rows)))
        random.Random(epoch).shuffle(order)  # the same order whenever a run resumes
        pick = [rows[order[(k + j) % len(rows)]] for j in range(batch)]
        ids, labels = _batch(pick, tok.sep_token_id, tok.pad_token_id, story=meta.get("unit") == "story")
        ids, labels = ids.to(device), labels.to(device)
        progress = min(1.0, step / max(1, steps - 1))
        rate = lr * (step + 1) / warmup if step < warmup else floor + (lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))
        for g in opt.param_groups:
            g["lr"] = rate
        loss = _step(model, opt, ids, labels, tok.pad_token_id, bf16, a.micro_batch)
        state["step"] += 1
        state["tokens_seen"] += int((ids != tok.pad_token_id).sum())
        state["seconds"] = t0 + time.perf_counter() - start
        heap.after_step()  # the windows' sizes change from step to step: see dbert_core/heap.py
        if state["step"] % a.log_every == 0 or state["step"] == steps:
            tps = (state["tokens_seen"] - seen0) / max(1e-9, time.perf_counter() - start)
            state["history"].append({"step": state["step"], "loss": round(loss.item(), 4), "tokens_per_s": round(tps)})
            say(f"step {state['step']}/{steps} loss {loss.item():.3f} lr {rate:.2e} {tps:.0f} tok/s "
                f"{resident_mb() / 1024:.1f} GB resident")
        if a.heldout and a.eval_every and state["step"] % a.eval_every == 0:
            _heldout(a, db, model, state, out)
            if a.patience and _evaluations_since_best(state) >= a.patience:
                best = state["best"]
                say(f"held-out stories no better than step {best['step']}'s {best['heldout_ppl']:.2f} for "
                    f"{a.patience} evaluations: stopping (its weights are in {out.name}.best)")
                stop["now"] = True
        if state["step"] % a.save_every == 0:
            _save(model, opt, state, out, tok)
    _save(model, opt, state, out, tok)
    say(("stopped" if state["step"] < steps else "finished") + f" at step {state['step']} of {steps}; saved in {out}")
    return 0


@torch.inference_mode()
def _trained(out: Path):
    """A saved baseline: its state, the diffusion checkpoint it matches, and the model for inference."""
    from transformers import GPT2LMHeadModel

    state = json.loads((out / "state.json").read_text())
    # float: weights brought back from a GPU in float16 (scripts/recipes/gpu_stories.sh, part ar) run here in fp32
    return state, checkpoint.load(state["checkpoint"]), GPT2LMHeadModel.from_pretrained(out).float().eval()


def evaluate(a) -> int:
    out = Path(a.out)
    state, db, model = _trained(out)
    tok = db.tokenizer
    if a.unit == "story":
        return _evaluate_stories(a, out, state, db, model)
    sentences = read_examples([a.heldout], "sentence")[: a.limit]
    nll = count = 0.0
    for i in range(0, len(sentences), 32):
        rows = [tok.encode(s, add_special_tokens=False)[: model.config.n_positions - 1] for s in sentences[i:i + 32]]
        ids, labels = _batch([r for r in rows if r], tok.sep_token_id, tok.pad_token_id)
        logits = model(input_ids=ids, attention_mask=(ids != tok.pad_token_id).long()).logits.float()
        lp = torch.log_softmax(logits[:, :-1], -1)
        target = labels[:, 1:]
        keep = target != -100
        nll -= lp.gather(-1, target.clamp_min(0).unsqueeze(-1)).squeeze(-1)[keep].sum().item()
        count += int(keep.sum())
    result = {"ppl_token": math.exp(nll / count), "nats_per_token": nll / count, "tokens": int(count),
              "sentences": len(sentences), "step": state["step"], "steps": state["steps"],
              "tokens_seen": state["tokens_seen"], "params": state["params"], "cpu": state["cpu"],
              "train_tokens_per_s": round(state["tokens_seen"] / max(1e-9, state["seconds"])),
              "heldout": str(a.heldout), "train_seconds": state["seconds"]}
    _keep(out / "eval.json", result)
    print(json.dumps(result))
    return 0


@torch.inference_mode()
def _evaluate_stories(a, out: Path, state: dict, db, model) -> int:
    """--unit story: whole held-out stories in the diffusion checkpoint's own story windows
    (data.encode_stories: [SEP], the story, its end [SEP]; a longer one goes on in windows that carry
    its earlier text as given context), each scored token read left to right after everything before
    it in its window. The same tokens `dbert eval --unit story` scores, so the exact perplexity here
    sits beside the diffusion model's bound there."""
    nll, count, docs, windows = story_nats(db, model, a.heldout, a.limit)
    result = {"unit": "story", "ppl_token": math.exp(nll / count), "nats_per_token": nll / count, "tokens": count,
              "stories": len(docs), "windows": len(windows), "step": state["step"], "steps": state["steps"],
              "tokens_seen": state["tokens_seen"], "params": state["params"], "cpu": state["cpu"],
              "heldout": str(a.heldout)}
    _keep(out / "eval_story.json", result)
    print(json.dumps(result))
    return 0


def _heldout(a, db, model, state: dict, out: Path) -> None:
    """--eval-every: the held-out stories' exact perplexity now, in the run's history; the weights with
    the lowest so far kept in <out>.best (what the diffusion model's GPU stage did with its bound:
    on 6,207 stories a GPT-2 overfits long before the same-budget 4,182 steps, 64 passes)."""
    model.eval()
    nll, count, _, _ = story_nats(db, model, a.heldout)
    model.train()
    ppl = math.exp(nll / count)
    state["history"].append({"step": state["step"], "heldout_ppl": round(ppl, 3)})
    say(f"step {state['step']}: held-out stories {ppl:.2f} per token")
    best = state.get("best")
    if best is None or ppl < best["heldout_ppl"]:
        state["best"] = {"step": state["step"], "heldout_ppl": round(ppl, 3), "tokens_seen": state["tokens_seen"]}
        _save(model, None, {**state, "best_of": str(out)}, out.with_name(out.name + ".best"), db.tokenizer)


def _evaluations_since_best(state: dict) -> int:
    """How many held-out evaluations have come after the best one (--patience counts them)."""
    best = state.get("best")
    return 0 if best is None else sum(1 for h in state["history"] if "heldout_ppl" in h and h["step"] > best["step"])


@torch.inference_mode()
def story_nats(db, model, heldout: str, limit: int = 1000) -> tuple[float, int, list, list]:
    """The summed -log p and the count of the held-out stories' scored tokens (eval --unit story's),
    the stories and their windows. model is read as it is (train()'s caller switches it to eval)."""
    from dbert_core.sampling.settings import window_length
    from dbert_core.text.data import encode_stories, scored_tokens

    docs = read_documents([heldout])[:limit]
    context = (db.meta.get("train_config") or {}).get("story_context")
    windows = encode_stories(docs, db.tokenizer, window_length(db), context)
    nll, count = 0.0, 0
    for i in range(0, len(windows), 16):
        part = windows[i:i + 16]
        ids = torch.tensor([list(w) for w in part], device=next(model.parameters()).device)
        lp = torch.log_softmax(model(input_ids=ids).logits.float()[:, :-1], -1)
        got = lp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # log p of the token at each position 1..
        for r, w in enumerate(part):  # the window's scored tokens: after its given context
            nll -= float(got[r, w.context - 1:w.context - 1 + w.scored].sum())
            count += w.scored
    assert count == scored_tokens(windows)
    return nll, count, docs, windows


def _keep(path: Path, result: dict) -> None:
    """The figures beside the model, for the decoding study's doc (scripts/studies/decoding.py)."""
    from dbert_core.disk.atomic import atomic_write_text

    atomic_write_text(path, json.dumps(result, indent=1) + "\n")


@torch.inference_mode()
def draw(model, sep: int, n: int, length: int, temperature: float, top_k: int, seed: int,
         batch_size: int = 32, forbidden: tuple[int, ...] = (), top_p: float = 1.0,
         stop: bool = False, no_repeat_ngram: int = 0) -> list[list[int]]:
    """n windows of length tokens after a [SEP], drawn left to right with the KV cache (top-k, then
    the nucleus top-p, as dbert's draw shapes p); once a row's window is full it goes on from its
    last half window, read afresh, and fills the window again from the cache (until 2026-12-06 it
    re-read the last half window at every token past the first window: less context, and each of
    those calls cost a 128-token forward). stop: each row ends at the first [SEP] it draws (a
    story's end; not kept), and a batch stops once every row has ended. no_repeat_ngram N: no token
    that ends an N-gram the row already holds (dbert's own rule, draw.no_repeat_ngram_ids, so the two
    models are read under the same block)."""
    import inspect

    from dbert_core.sampling.draw import no_repeat_ngram_ids, nucleus

    gen = torch.Generator().manual_seed(seed)
    # transformers 5.x renamed past_key_values to cache (argument and output): whichever this one has
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    rows: list[list[int]] = []
    limit = model.config.n_positions  # past it, the model goes on from the last half of its window afresh
    for lo in range(0, n, batch_size):
        b = min(batch_size, n - lo)
        ids = seqs = torch.full((b, 1), sep, dtype=torch.long)
        past, cached, out = None, 0, []
        for _ in range(length):
            if cached + ids.shape[1] > limit:  # as it was trained: windows that start inside a story
                past, cached, ids = None, 0, seqs[:, -(limit // 2):]
            res = model(input_ids=ids, use_cache=True, **{key: past})
            past, cached = getattr(res, key), cached + ids.shape[1]
            logits = res.logits[:, -1].float() / temperature
            if forbidden:
                logits[:, list(forbidden)] = float("-inf")
            if no_repeat_ngram:
                canvas = torch.cat([seqs, torch.zeros((b, 1), dtype=torch.long)], 1)
                nxt = torch.zeros_like(canvas, dtype=torch.bool)
                nxt[:, -1] = True  # the token being drawn; everything before it is written
                blocked = no_repeat_ngram_ids(canvas, nxt, nxt, no_repeat_ngram, torch.tensor([sep]))
                r, c = (blocked >= 0).nonzero(as_tuple=True)
                logits[r, blocked[r, c]] = float("-inf")
            if top_k:
                kth = logits.topk(min(top_k, logits.shape[-1]), -1).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            p = torch.softmax(logits.double(), -1)
            ids = torch.multinomial(nucleus(p, top_p) if top_p < 1.0 else p, 1, generator=gen)
            out.append(ids)
            seqs = torch.cat([seqs, ids], 1)
            if stop and bool(seqs[:, 1:].eq(sep).any(1).all()):  # every row has drawn its end
                break
        drawn = torch.cat(out, 1).tolist()
        rows.extend(r[:r.index(sep)] if stop and sep in r else r for r in drawn)
    return rows


def _never_drawn(tok) -> tuple[int, ...]:
    """The special ids a sample never holds ([PAD], [CLS], [MASK], [UNK])."""
    return tuple(i for i in (tok.pad_token_id, tok.cls_token_id, tok.mask_token_id, tok.unk_token_id) if i is not None)


def stories(a) -> int:
    """--stories: a story model's samples as `dbert sample` writes them, one whole story a line
    (from the [SEP] that opens it to the [SEP] that ends it, at most the diffusion sampler's
    default length), into --lines for scripts/studies/stories.py."""
    from dbert_core.sampling.settings import default_length

    out = Path(a.out)
    _, db, model = _trained(out)
    tok = db.tokenizer
    if a.threads:
        torch.set_num_threads(a.threads)
    forbidden = _never_drawn(tok)
    length = a.length or default_length(db)
    start = time.perf_counter()
    rows = draw(model, tok.sep_token_id, a.n, length, a.temperature, a.top_k, a.seed, a.batch_size, forbidden,
                a.top_p, stop=True, no_repeat_ngram=a.no_repeat_ngram)
    seconds = time.perf_counter() - start
    texts = [" ".join(db.decode(r).split()) for r in rows]
    lines = Path(a.lines)
    lines.write_text("".join(t + "\n" for t in texts))
    say(f"{len(texts)} stories ({sum(map(len, rows))} tokens, at most {length} each) in {seconds:.1f} s -> {lines}")
    return 0


def sample(a) -> int:
    if a.lines:
        return stories(a)
    from dbert_core.evaluation.metrics import bleu, distinct_n, readability, self_bleu, unigram_entropy

    out = Path(a.out)
    state, db, model = _trained(out)
    tok = db.tokenizer
    length = a.length or db.meta["seq_len"]
    if a.threads:
        torch.set_num_threads(a.threads)
    forbidden = _never_drawn(tok)
    start = time.perf_counter()
    sets = [draw(model, tok.sep_token_id, a.n, length, a.temperature, a.top_k, a.seed + k, a.batch_size, forbidden,
                 a.top_p) for k in range(2)]
    seconds = time.perf_counter() - start
    first, second = ([db.decode(r, paragraph=" ") for r in rows] for rows in sets)
    refs = read_examples([a.heldout], "sentence")
    result = {"model": str(out), "step": state["step"], "steps": state["steps"], "samples": a.n, "length": length,
              "temperature": a.temperature, "top_k": a.top_k, "top_p": a.top_p, "seed": a.seed,
              "bleu4": bleu(first, refs), "self_bleu4": self_bleu(second), "distinct1": distinct_n(first, 1),
              "distinct2": distinct_n(first, 2), "distinct3": distinct_n(first, 3),
              "unigram_entropy": unigram_entropy(first), **readability(first),
              "sample_tokens_per_s": round(2 * a.n * length / seconds), "seconds_per_sample": seconds / (2 * a.n),
              "batch_size": a.batch_size, "threads": torch.get_num_threads(), "cpu": cpu_name(),
              "examples": first[:10], "texts": {"first": first, "second": second}, "heldout": str(a.heldout)}
    _keep(out / "samples.json", result)
    print(json.dumps(result))
    return 0


def speed(a) -> int:
    """Training tokens/s of both models in one run, interleaved on the same windows: the diffusion
    trainer's own step (dbert_core.training.train.Trainer.train_step) and this script's GPT-2 step, each at
    the diffusion run's batch, length and autocast. Only a ratio measured this way is quoted."""
    import copy

    from dbert_core.config import TrainConfig
    from dbert_core.training.prepare import in_memory
    from dbert_core.training.train import Trainer

    db = checkpoint.load(a.checkpoint)
    tc, tok = db.meta["train_config"], db.tokenizer
    if a.threads:
        torch.set_num_threads(a.threads)
    rows = windows(db, a.data or tc["data"], db.meta["seq_len"])
    random.Random(0).shuffle(rows)
    batch = a.batch or tc["batch_size"]
    n = a.steps * a.rounds + 2
    pool = rows[: n * batch]
    cfg = TrainConfig(**{**tc, "batch_size": batch, "data": ["(speed)"], "out": "(speed)", "val_data": None, "resume": False,
                         "max_steps": n + 1, "warmup": 0, "device": "cpu"})
    diff = copy.copy(db)
    diff.model = copy.deepcopy(db.model).float()
    trainer = Trainer(cfg, prepared=in_memory(diff, cfg, pool))
    gpt = build(db, db.meta["seq_len"])
    opt = torch.optim.AdamW(gpt.parameters(), lr=tc["lr"], weight_decay=0.01)
    bf16 = native_bf16("cpu") and tc.get("dtype", "auto") != "fp32"

    story = db.meta.get("unit") == "story"

    def gpt_step(k: int) -> int:
        pick = pool[(k * batch) % len(pool):][:batch]
        _step(gpt, opt, *_batch(pick, tok.sep_token_id, tok.pad_token_id, story), tok.pad_token_id, bf16)
        return sum(len(r) for r in pick)

    per_window = sum(len(r) for r in pool) / len(pool)
    trainer.train_step()  # warm-up: allocates both optimizers' state
    gpt_step(0)
    times, tokens = {"diffusion": 0.0, "gpt2": 0.0}, {"diffusion": 0, "gpt2": 0}
    for r in range(a.rounds):  # interleaved, so a slower minute of the machine slows both
        t0 = time.perf_counter()
        for _ in range(a.steps):
            trainer.train_step()
        times["diffusion"] += time.perf_counter() - t0
        tokens["diffusion"] += round(a.steps * batch * per_window)
        t0 = time.perf_counter()
        for k in range(a.steps):
            tokens["gpt2"] += gpt_step(1 + r * a.steps + k)
        times["gpt2"] += time.perf_counter() - t0
        say(f"round {r + 1}/{a.rounds}: diffusion {tokens['diffusion'] / times['diffusion']:.0f} tok/s, "
            f"GPT-2 {tokens['gpt2'] / times['gpt2']:.0f} tok/s")
    tps = {k: round(tokens[k] / times[k]) for k in times}
    result = {"checkpoint": str(a.checkpoint), "batch_size": batch, "seq_len": db.meta["seq_len"],
              "steps_each": a.steps * a.rounds, "rounds": a.rounds, "bf16": bf16, "threads": torch.get_num_threads(),
              "cpu": cpu_name(), "diffusion_tokens_per_s": tps["diffusion"], "gpt2_tokens_per_s": tps["gpt2"],
              "ratio_gpt2_over_diffusion": round(tps["gpt2"] / tps["diffusion"], 2),
              "diffusion_params": sum(p.numel() for p in db.model.parameters()),
              "gpt2_params": sum(p.numel() for p in gpt.parameters()),
              "tokens": "window tokens (the sentences packed into each window), counted alike for both"}
    if a.out:
        _keep(Path(a.out) / "speed.json", result)
    print(json.dumps(result))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("checkpoint", help="the diffusion checkpoint whose data, windows, tokenizer and budget to match")
    t.add_argument("--out", default="runs/ar-baseline")
    t.add_argument("--tokens", type=int, default=0, help="token budget (default: the checkpoint's tokens_seen)")
    t.add_argument("--save-every", type=int, default=100)
    t.add_argument("--log-every", type=int, default=10)
    t.add_argument("--heldout", default="", help="whole held-out stories (eval --unit story's) to score every --eval-every "
                                                 "steps; the best weights go to <out>.best")
    t.add_argument("--eval-every", type=int, default=100)
    t.add_argument("--patience", type=int, default=0,
                   help="stop, saved, once this many held-out evaluations in a row are no better than the "
                        "best (early stopping; 0: train to the budget, the same-budget baseline)")
    t.add_argument("--fp32", action="store_true", help="no bf16 autocast even where the CPU has it")
    t.add_argument("--device", default="cpu", help="cpu or cuda (a lent GPU trains the stories baseline in minutes)")
    t.add_argument("--layers", type=int, default=6, help="GPT-2 layers (6 x 384: the diffusion model's size)")
    t.add_argument("--hidden", type=int, default=384)
    t.add_argument("--heads", type=int, default=6)
    t.add_argument("--seq-len", type=int, default=0, help="window tokens [the checkpoint's]")
    t.add_argument("--batch", type=int, default=0, help="windows per step [the checkpoint's]")
    t.add_argument("--data", nargs="+", default=None,
                   help="the training files, where the checkpoint's own paths (its train_config) are not on this machine")
    t.add_argument("--micro-batch", type=int, default=0,
                   help="windows per forward inside a step (the same step in less memory; 0: the whole batch at once)")
    t.add_argument("--lr", type=float, default=0.0, help="peak learning rate [the checkpoint's]")
    t.add_argument("--warmup", type=int, default=0, help="warm-up steps [the checkpoint's]")
    e = sub.add_parser("eval")
    e.add_argument("out")
    e.add_argument("--heldout", default="runs/data/stories-heldout.txt")
    e.add_argument("--limit", type=int, default=1000, help="sentences (or stories) scored at most")
    e.add_argument("--unit", choices=("sentence", "story"), default="sentence",
                   help="story: whole held-out stories in the diffusion model's story windows (dbert eval --unit story's tokens)")
    s = sub.add_parser("sample")
    s.add_argument("out")
    s.add_argument("--n", type=int, default=200, help="samples per set (two sets, as the decoding study draws)")
    s.add_argument("--length", type=int, default=0, help="tokens per sample [the diffusion model's length]")
    s.add_argument("--temperature", type=float, default=1.0)
    s.add_argument("--top-k", type=int, default=30, help="0: off")
    s.add_argument("--top-p", type=float, default=1.0, help="the nucleus after top-k (1: off)")
    s.add_argument("--lines", default="", help="whole stories instead, one a line, into this file (for "
                                               "scripts/studies/stories.py); --length then caps a story [the diffusion "
                                               "sampler's default length]")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--no-repeat-ngram", type=int, default=0, help="no token that ends an N-gram the story already "
                                                                  "holds (dbert sample --no-repeat-ngram's rule; 0: off)")
    s.add_argument("--batch-size", type=int, default=32)
    s.add_argument("--threads", type=int, default=0)
    s.add_argument("--heldout", default="runs/data/stories-heldout.txt", help="BLEU-4's references")
    v = sub.add_parser("speed", help="training tokens/s of the diffusion model and the baseline, in one run")
    v.add_argument("checkpoint", help="the diffusion checkpoint (its data, windows, batch, autocast)")
    v.add_argument("--out", default="runs/ar-baseline", help="keep speed.json here ('' for stdout only)")
    v.add_argument("--steps", type=int, default=5, help="optimizer steps of each model per round")
    v.add_argument("--rounds", type=int, default=4)
    v.add_argument("--threads", type=int, default=0)
    v.add_argument("--data", nargs="+", help="training files (default: the checkpoint's, which may name another machine's paths)")
    v.add_argument("--batch", type=int, default=0, help="windows a step (default: the checkpoint's)")
    a = ap.parse_args(argv)
    return {"train": train, "eval": evaluate, "sample": sample, "speed": speed}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
