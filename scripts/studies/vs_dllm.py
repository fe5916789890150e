"""dbert's samplers beside dLLM's MDLM sampler on the same weights, in one run (issue 39, item 5).

    git clone https://github.com/ZHZisZZ/dllm runs/dllm && git -C runs/dllm checkout ca176752
    (or only the code used: git -C DLLM_REPO archive ca176752 dllm/core/samplers dllm/core/schedulers | tar -x -C runs/dllm)
    python scripts/studies/vs_dllm.py --dllm runs/dllm [--checkpoint DIR] [--n 8] [--length 128]
        [--steps 128] [--threads 1] [--rounds 2] [--cache-refresh 8] [--cache-masked] > vs_dllm.json

dLLM (https://github.com/ZHZisZZ/dllm) is read from its source at a fixed commit (DLLM_COMMIT,
checked when --dllm is a git checkout); only its samplers and schedulers are imported (they need
torch and transformers alone), so dLLM is never a dependency of dbert. Its MDLM sampler (LLaDA's
generate: low-confidence remasking, temperature 0, one block, the linear schedule's token counts)
runs on the checkpoint loaded as transformers' BertForMaskedLM, as a dLLM user would load it: every
call projects every position to the vocabulary. dbert runs the same checkpoint its own way:
first-hitting (exact, the default) and confidence (the same rule as dLLM's, a heuristic), at the
same step budget, batch and canvas ([CLS] [SEP] then `--length` masks: a story model's opening).
dLLM's sampler fills every position; a story model in dbert ends its story and its row leaves the
batch, so both the calls a batch makes and the rows they carry (row-calls) are reported, and the
comparison that the issue asks for is seconds per row-call and per model GFLOP. Runs alternate
(A B C C B A ...), one process, one thread count; the CPU and load average are printed with them.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import torch

DLLM_COMMIT = "ca176752"  # the dLLM commit measured (2026-12): its MDLM sampler as in dllm/core/samplers/mdlm.py


def load_dllm(src: Path):
    """dLLM's MDLMSampler and MDLMSamplerConfig from a source checkout, without its package __init__
    (which imports its trainers, data and pipelines: accelerate, peft, datasets, deepspeed)."""
    if (src / ".git").exists():
        head = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
        if not head.startswith(DLLM_COMMIT):
            print(f"warning: {src} is at {head[:10]}, the study was written against {DLLM_COMMIT}", file=sys.stderr)
    root = src / "dllm"
    if not (root / "core" / "samplers" / "mdlm.py").is_file():
        sys.exit(f"error: {src} holds no dllm/core/samplers/mdlm.py (a dLLM checkout is needed)")
    for name, path in (("dllm", root), ("dllm.core", root / "core")):
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(path)]
        sys.modules[name] = pkg
    mdlm = importlib.import_module("dllm.core.samplers.mdlm")
    return mdlm.MDLMSampler, mdlm.MDLMSamplerConfig


class Counted(torch.nn.Module):
    """A model whose forward calls and rows are counted (dLLM's sampler calls model(x, attention_mask))."""

    def __init__(self, model):
        super().__init__()
        self.model, self.calls, self.rows = model, 0, 0

    @property
    def device(self):
        return self.model.device

    def forward(self, x, attention_mask=None):
        self.calls += 1
        self.rows += x.shape[0]
        return self.model(input_ids=x, attention_mask=attention_mask)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dllm", required=True, type=Path, help="a dLLM source checkout (at DLLM_COMMIT)")
    ap.add_argument("--checkpoint", default=None, help="default: the shipped model")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2, help="each sampler runs 2 x rounds times, A B C C B A")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                    help="both sides' network precision (transformers' model cast to it, dbert's --dtype)")
    ap.add_argument("--cache-refresh", type=int, default=0,
                    help="also run dbert's samplers with this decided-position cache (0: only the exact forward)")
    ap.add_argument("--cache-masked", action="store_true",
                    help="with --cache-refresh: also run first-hitting with the [MASK] positions' states kept (--cache-masked)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer, BertForMaskedLM

    from dbert_core.config import SampleConfig
    from dbert_core.hardware import cpu_name
    from dbert_core.maths.model import forward_flops
    from dbert_core.sampling.sample import generate
    from dbert_core.storage import checkpoint, store

    MDLMSampler, MDLMSamplerConfig = load_dllm(args.dllm)
    path = store.resolve(args.checkpoint)
    db = checkpoint.load(path)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    hf = Counted(BertForMaskedLM.from_pretrained(path, dtype=dtype).eval())
    tok = AutoTokenizer.from_pretrained(path)
    tok.bos_token, tok.eos_token = tok.cls_token, tok.sep_token  # dLLM fills the canvas tail with eos
    dllm = MDLMSampler(model=hf, tokenizer=tok)
    prompt = [tok.cls_token_id, tok.sep_token_id]  # a story model's opening ([SEP] opens the story)
    N = len(prompt) + args.length
    config = db.model.config

    def run_dllm(seed: int) -> dict:
        torch.manual_seed(seed)
        hf.calls = hf.rows = 0
        t = time.perf_counter()
        x = dllm.sample([prompt] * args.n, MDLMSamplerConfig(max_new_tokens=args.length, block_size=args.length,
                                                              steps=args.steps, temperature=0.0))
        sec = time.perf_counter() - t
        text = db.decode(x[0, len(prompt):])
        gflop = hf.calls * forward_flops(config, args.n, N, args.n * N) / 1e9  # every position projected
        return {"seconds": round(sec, 3), "calls": hf.calls, "row_calls": hf.rows, "gflop": gflop, "text": text[:200]}

    def run_dbert(sampler: str, seed: int, refresh: int = 0, masked: bool = False) -> dict:
        texts, st = generate(db, SampleConfig(n=args.n, batch_size=args.n, length=args.length, steps=args.steps,
                                              sampler=sampler, seed=seed, pair_quotes=False, dtype=args.dtype,
                                              fix_contractions=False, known_words=False, cache_refresh=refresh,
                                              cache_masked=masked))
        return {"seconds": st["seconds"], "calls": st["nfe"], "row_calls": st["rows"], "gflop": st["gflop"],
                "text": texts[0][:200]}

    runs = {"dLLM MDLM (low-confidence, T=0), transformers BertForMaskedLM": lambda s: run_dllm(s),
            "dbert first-hitting (exact, default)": lambda s: run_dbert("first-hitting", s),
            "dbert confidence (heuristic)": lambda s: run_dbert("confidence", s)}
    if args.cache_refresh:  # the decided-position cache (an approximation) beside the exact forward
        runs[f"dbert first-hitting, --cache-refresh {args.cache_refresh}"] = lambda s: run_dbert("first-hitting", s, args.cache_refresh)
        runs[f"dbert confidence, --cache-refresh {args.cache_refresh}"] = lambda s: run_dbert("confidence", s, args.cache_refresh)
    if args.cache_refresh and args.cache_masked:
        runs[f"dbert first-hitting, --cache-refresh {args.cache_refresh} --cache-masked"] = \
            lambda s: run_dbert("first-hitting", s, args.cache_refresh, True)
    run_dbert("first-hitting", 99)  # warm-up: allocator, oneDNN primitives
    got = {name: [] for name in runs}
    names = list(runs)
    for r in range(args.rounds):
        for name in names + names[::-1]:
            row = runs[name](r)
            row["load"] = round(os.getloadavg()[0], 2)
            got[name].append(row)
            print(json.dumps({"sampler": name, "round": r, **row}), flush=True)
    head = (f"CPU: {cpu_name()}, torch {torch.__version__}, {args.dtype}, {args.threads} thread(s), {args.n} x {args.length} tokens, "
            f"{args.steps}-step budget, dLLM {DLLM_COMMIT}, checkpoint {Path(path).name}")
    lines = [head, "", "| sampler | seconds (median) | calls | row-calls | ms per row-call | GFLOP | GFLOP/s | load |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    base = None
    for name, rows in got.items():
        sec = statistics.median(r["seconds"] for r in rows)
        calls, rc = rows[0]["calls"], statistics.median(r["row_calls"] for r in rows)
        gflop = statistics.median(r["gflop"] for r in rows)
        per = 1000 * sec / rc
        base = base or per
        lines.append(f"| {name} | {sec:.2f} | {calls} | {rc:.0f} | {per:.1f} ({base / per:.2f}x) | {gflop:.0f} | "
                     f"{gflop / sec:.1f} | {min(r['load'] for r in rows):.1f}-{max(r['load'] for r in rows):.1f} |")
    print("\n".join(lines), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
