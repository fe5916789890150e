"""dbert's own BERT against transformers' BertForMaskedLM, measured in one run (ratios hold on a busy machine).

    python scripts/studies/vs_transformers.py [--checkpoint DIR] [--reps 7] [--threads 1,2]
        [--batch 32] [--length 64] [--no-startup]

1. Start-up: a fresh interpreter imports and loads the checkpoint (default: the shipped one)
   the dbert way (checkpoint.load: own BERT and tokenizer) and the transformers way
   (BertForMaskedLM + AutoTokenizer.from_pretrained, what checkpoint.load did before);
   `import torch` alone is timed too. Runs alternate; medians.
2. Forward: the MiniLM sizes (the shipped checkpoint's), B=32, N=66 ([CLS] + 64 + [SEP], no
   padding, as the sampler calls it), fp32, logits at about half the positions (the masked
   ones); transformers' path is the one dbert used: encoder, then the MLM head on the selected
   hidden states. Calls alternate; medians. --batch and --length set B and N - 2 (e.g. 8 x 128,
   the sampler's shapes at the shipped model's length). Each side's GFLOP/s (model FLOPs,
   model.forward_flops) is given as a fraction of F.linear's rate at the same shapes, measured in
   the same process with the same threads (evaluation.bench.shape_rates), on the CPU named.
"""

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

STARTUP = {
    "torch only": "import torch",
    "dbert": "from dbert_core import checkpoint; checkpoint.load({path!r})",
    "transformers": ("from transformers import AutoTokenizer, BertForMaskedLM; "
                     "BertForMaskedLM.from_pretrained({path!r}, dtype='float32'); AutoTokenizer.from_pretrained({path!r})"),
}


def startup(path: Path, reps: int) -> dict:
    times = {name: [] for name in STARTUP}
    for _ in range(reps):
        for name, code in STARTUP.items():
            timed = f"import time; t = time.perf_counter(); {code.format(path=str(path))}; print(time.perf_counter() - t)"
            out = subprocess.run([sys.executable, "-c", timed], capture_output=True, text=True, check=True).stdout
            times[name].append(float(out.split()[-1]))
    return {name: statistics.median(v) for name, v in times.items()}


def forward(path: Path, reps: int, threads: int, B: int = 32, N: int = 66) -> dict:
    from transformers import BertForMaskedLM

    from dbert_core.storage import checkpoint

    torch.set_num_threads(threads)
    db = checkpoint.load(path)
    ours = db.model.eval()
    theirs = BertForMaskedLM.from_pretrained(path, dtype=torch.float32).eval()
    forbidden = torch.tensor(ours.forbidden)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, ours.config.vocab_size, (B, N), generator=g)
    ids[:, 0], ids[:, -1] = db.tokenizer.cls_token_id, db.tokenizer.sep_token_id
    select = torch.rand(B, N, generator=g) < 0.5
    select[:, 0] = select[:, -1] = False
    ids[select] = ours.mask_id
    attention = torch.ones(B, N, dtype=torch.bool)

    def hf():
        h = theirs.bert(input_ids=ids, attention_mask=attention.long()).last_hidden_state
        return theirs.cls(h[select]).index_fill_(-1, forbidden, float("-inf"))

    calls = {"dbert": lambda: ours(ids, attention, select), "transformers": hf}
    times = {name: [] for name in calls}
    with torch.inference_mode():
        a, b = calls["dbert"](), calls["transformers"]()
        ok = torch.isfinite(a)
        diff = (a[ok] - b[ok]).abs().max().item()
        for _ in range(reps):
            for name, call in calls.items():
                t = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - t)
    from dbert_core.evaluation.bench import shape_rates
    from dbert_core.maths.model import forward_flops

    M = int(select.sum())
    rate = shape_rates(ours.config, B, N, M, torch.float32, torch.device("cpu"), reps=3)["model"]
    return {"max_abs_diff": diff, "selected": M, "gflop": forward_flops(ours.config, B, N, M) / 1e9,
            "matmul_rate": rate, **{name: statistics.median(v) for name, v in times.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", help="checkpoint directory (default: the shipped one)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--length", type=int, default=64, help="content tokens ([CLS] and [SEP] added)")
    ap.add_argument("--no-startup", action="store_true", help="skip the start-up comparison")
    args = ap.parse_args()
    from dbert_core.hardware import cpu_name
    from dbert_core.storage import store

    path = Path(args.checkpoint) if args.checkpoint else store.default_checkpoint()
    print(f"CPU: {cpu_name()}, torch {torch.__version__}")
    if not args.no_startup:
        s = startup(path, args.reps)
        print(f"start-up (import + load {path.name}), median of {args.reps} fresh interpreters:")
        for name, sec in s.items():
            print(f"  {name:>12}: {sec:6.2f} s")
        print(f"  transformers / dbert: {s['transformers'] / s['dbert']:.2f}x; beyond `import torch`: "
              f"{(s['transformers'] - s['torch only']) / (s['dbert'] - s['torch only']):.1f}x")
    for n in (int(x) for x in args.threads.split(",")):
        B, N = args.batch, args.length + 2
        f = forward(path, args.reps * 3, n, B, N)
        print(f"forward B={B} N={N} fp32, {f['selected']} positions projected, {n} thread(s), median of {args.reps * 3}: "
              f"dbert {f['dbert'] * 1e3:.1f} ms, transformers {f['transformers'] * 1e3:.1f} ms, "
              f"ratio {f['transformers'] / f['dbert']:.2f}x (max |logit diff| {f['max_abs_diff']:.1e}); "
              f"{f['gflop']:.2f} GFLOP: dbert {f['gflop'] / f['dbert']:.1f} GFLOP/s "
              f"({100 * f['gflop'] / f['dbert'] / f['matmul_rate']:.0f}%), transformers "
              f"{f['gflop'] / f['transformers']:.1f} GFLOP/s ({100 * f['gflop'] / f['transformers'] / f['matmul_rate']:.0f}%) "
              f"of F.linear's {f['matmul_rate']:.1f} GFLOP/s at these shapes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
