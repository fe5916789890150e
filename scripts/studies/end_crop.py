"""Issue 39: what keeping a story's end padding out of the forward would save, and what it would change.

A story checkpoint reads a window as `[SEP] story [SEP] [SEP] ...`: after a row's end is revealed
the rest of its row is end padding (blocks.end_fill), decided, yet every later network call still
runs it through all layers, and the text attends to it. This study samples stories at the CLI
defaults and, at every network call, also runs the same rows with the padding cropped to `keep`
[SEP]s after the batch's last revealed end (a row whose end is not revealed yet keeps the whole
window, so the batch does too), and reports:
  - the share of the forward's tokens (and FLOPs) the crop removes;
  - how far p moves: KL(p_full || p_cropped) in nats at the positions the sampler reads, mean and
    99th percentile, and how often the most likely token changes.
The samples themselves are drawn from p_full (the exact law), so the texts are the defaults'.
It also reports where the run's FLOPs go (encoder products, attention, vocabulary head), the share
of the tokens the forward reads that are padding after a row's revealed end, and the row-calls
per window width (first windows vs continuation windows).

    python scripts/studies/end_crop.py --n 4 --keep 0,4,16 --threads 1 > crop.json
    python scripts/studies/end_crop.py --n 10 --keep 16 --threads 1   # the FLOP shares of `dbert sample --n 10`
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from dbert_core.config import SampleConfig
from dbert_core.hardware import cpu_name
from dbert_core.maths.model import forward_flops
from dbert_core.sampling import base
from dbert_core.sampling.sample import generate, resolve
from dbert_core.storage import checkpoint, store


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default=None, help="a checkpoint folder (default: the store's default)")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", default="0,1,4,16", help="[SEP]s kept after the last revealed end")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    db = checkpoint.load(Path(args.checkpoint) if args.checkpoint else store.default_checkpoint())
    keeps = [int(k) for k in args.keep.split(",")]
    sep = db.tokenizer.sep_token_id
    cfgm = db.model.config
    stat = {k: {"tokens": 0, "kept": 0, "flops": 0.0, "flops_kept": 0.0, "kl": [], "flip": 0, "read": 0} for k in keeps}
    orig = base.Net.__call__

    def model_logits(net, x, select, t):
        R = x.shape[0]
        edge = torch.zeros(R, 1, dtype=torch.bool)
        inp = torch.cat([torch.full((R, 1), net.cls), x, torch.full((R, 1), net.sep)], dim=1)
        sel = torch.cat([edge, select, edge], dim=1)
        return net.model(inp, torch.ones(inp.shape, dtype=torch.bool), sel, t=t).float()

    split = {"body": 0.0, "attention": 0.0, "head": 0.0, "tokens": 0, "after_end": 0, "row_calls_by_width": {}}

    def call(net, x, select, t):
        out = orig(net, x, select, t)
        R, L = x.shape
        ended = (x == sep)
        ended[:, 0] = False
        has = ended.any(1)
        H, I, V, layers = cfgm.hidden_size, cfgm.intermediate_size, cfgm.vocab_size, cfgm.num_hidden_layers
        N, M = L + 2, int(select.sum())
        split["body"] += layers * 2 * R * N * (4 * H * H + 2 * H * I)  # as forward_flops counts them
        split["attention"] += layers * 4 * R * N * N * H
        split["head"] += 2 * M * (H * H + H * V)
        split["tokens"] += R * N
        end_at = torch.where(has, ended.to(torch.int8).argmax(1), torch.full((R,), L))
        split["after_end"] += int((L - 1 - end_at).clamp_min(0).sum())  # each row's own padding
        split["row_calls_by_width"][L] = split["row_calls_by_width"].get(L, 0) + R
        if not bool(has.all()) or not bool(select.any()):
            for k in keeps:  # a row without an end keeps the whole window: nothing cropped
                s = stat[k]
                s["tokens"] += R * (L + 2)
                s["kept"] += R * (L + 2)
                f = forward_flops(cfgm, R, L + 2, int(select.sum()))
                s["flops"] += f
                s["flops_kept"] += f
            return out
        first = ended.to(torch.int8).argmax(1)
        full = torch.log_softmax(model_logits(net, x, select, t), -1)
        for k in keeps:
            W = min(L, int(first.max()) + 1 + k)
            s = stat[k]
            s["tokens"] += R * (L + 2)
            s["kept"] += R * (W + 2)
            s["flops"] += forward_flops(cfgm, R, L + 2, int(select.sum()))
            s["flops_kept"] += forward_flops(cfgm, R, W + 2, int(select[:, :W].sum()))
            if W == L:
                s["kl"].extend([0.0] * int(select.sum()))
                s["read"] += int(select.sum())
                continue
            inside = select.clone()
            inside[:, W:] = False  # a masked position after an end is filled by the end rule, never read
            crop = torch.log_softmax(model_logits(net, x[:, :W], inside[:, :W], t), -1)
            f_in = full[inside[select]]
            p = f_in.exp()
            kl = torch.where(p > 0, p * (f_in - crop), torch.zeros_like(p)).sum(-1).clamp_min(0)  # 0 log 0 = 0
            s["kl"].extend(kl.tolist())
            s["flip"] += int((f_in.argmax(-1) != crop.argmax(-1)).sum())
            s["read"] += len(kl)
        return out

    base.Net.__call__ = call
    t0 = time.perf_counter()
    texts, st = generate(db, resolve(SampleConfig(n=args.n, seed=args.seed), db))
    report = {"cpu": cpu_name(), "threads": args.threads, "checkpoint": args.checkpoint, "n": args.n,
              "seed": args.seed, "calls": st["nfe"], "row_calls": st["rows"], "gflop": st["gflop"],
              "seconds": round(time.perf_counter() - t0, 1),
              "flop_share": {k: round(split[k] / (split["body"] + split["attention"] + split["head"]), 4)
                             for k in ("body", "attention", "head")},
              "after_end_share_of_tokens": round(split["after_end"] / split["tokens"], 4),
              "row_calls_by_width": split["row_calls_by_width"], "keep": {}}
    for k, s in stat.items():
        kl = torch.tensor(s["kl"] or [0.0], dtype=torch.float64)
        report["keep"][k] = {"tokens_cropped": round(1 - s["kept"] / s["tokens"], 4),
                             "flops_cropped": round(1 - s["flops_kept"] / s["flops"], 4),
                             "kl_mean_nats": float(f"{kl.mean():.3g}"),
                             "kl_p99_nats": float(f"{kl.quantile(0.99):.3g}"),
                             "kl_max_nats": float(f"{kl.max():.3g}"),
                             "top1_changed": round(s["flip"] / max(1, s["read"]), 5), "positions": s["read"]}
    json.dump(report, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
