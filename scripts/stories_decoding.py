"""Choose the default decoding settings of a checkpoint by measurement.

    python scripts/stories_decoding.py runs/stories --n 200 --out runs/decoding.json

Draws --n samples (seed 0, the checkpoint's own length, first-hitting) at each setting of a small
grid (temperature, top-k, top-p, the repeat block, the quote and contraction touch-ups, the default 96 steps,
128 or 64) and reports for each the reader's checks (metrics.readability: starts a sentence with a capital,
repeats, balanced quotes, broken contractions, [MASK]/[UNK]), the
diversity (distinct-2, Self-BLEU-4, unigram entropy) and the seconds. Writes the JSON (one entry per
setting, with the first five samples) and prints a Markdown table on stdout. Rows already in --out
or in a --from file are kept, not drawn again, and --only 0,2 runs some settings, so two
processes can share the grid (`--only 0,1,2 --out a.json`, `--only 3,4,5 --out b.json`) and a
last run gathers them (`--from a.json --from b.json`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from dbert_core.storage import checkpoint
from dbert_core.config import SampleConfig
from dbert_core.text.detok import STORY_BREAK
from dbert_core.hardware import cpu_name
from dbert_core.evaluation.metrics import distinct_n, readability, self_bleu, unigram_entropy
from dbert_core.sampling.sample import generate

_D = SampleConfig()
GRID = [  # (temperature, top_k, top_p, block_repeats, pair_quotes, fix_contractions, steps)
    (_D.temperature, _D.top_k, _D.top_p, _D.block_repeats, _D.pair_quotes, _D.fix_contractions, _D.steps),  # the CLI defaults
    (1.0, 0, 0.9, True, True, True, _D.steps),     # nucleus instead of top-k
    (0.8, 30, 1.0, True, True, True, _D.steps),    # colder
    (1.0, 30, 1.0, False, True, True, _D.steps),   # no repeat block
    (1.0, 30, 1.0, True, False, True, _D.steps),   # no quote touch-up: the model's own quotes
    (1.0, 30, 1.0, True, True, False, _D.steps),   # no contraction touch-up: the model's own contractions
    (1.0, 30, 1.0, True, True, True, 128),         # the budget the bound is measured at
    (1.0, 30, 1.0, True, True, True, 64),          # a smaller budget
]


def run(db, n: int, temperature: float, top_k: int, top_p: float, block: bool, pair: bool = True,
        contractions: bool = True, steps: int = 128) -> dict:
    cfg = SampleConfig(n=n, seed=0, temperature=temperature, top_k=top_k, top_p=top_p, block_repeats=block,
                       pair_quotes=pair, fix_contractions=contractions, steps=steps)
    start = time.perf_counter()
    texts, stats = generate(db, cfg)
    seconds = time.perf_counter() - start
    flat = [t.replace(STORY_BREAK, " ") for t in texts]  # for the diversity measures
    return {"temperature": temperature, "top_k": top_k, "top_p": top_p, "block_repeats": block, "pair_quotes": pair,
            "fix_contractions": contractions, "steps": steps, "n": n, **readability(texts), "distinct2": distinct_n(flat, 2), "self_bleu4": self_bleu(flat),
            "unigram_entropy": unigram_entropy(flat), "seconds": round(seconds, 1), "nfe": stats["nfe"],
            "threads": torch.get_num_threads(), "examples": texts[:5]}


def human(path: str, n: int, words: float) -> dict:
    """The same figures for held-out text cut into n pieces of the samples' mean length."""
    from dbert_core.text.data import read_lines
    from dbert_core.evaluation.judge import human_chunks

    texts = human_chunks(read_lines([path]), n, words)
    return {"temperature": "held-out text", "top_k": "", "top_p": "", "block_repeats": None, "pair_quotes": None,
            "fix_contractions": None, "steps": "", "n": len(texts),
            **readability(texts), "distinct2": distinct_n(texts, 2), "self_bleu4": self_bleu(texts),
            "unigram_entropy": unigram_entropy(texts), "seconds": "", "nfe": 0, "examples": texts[:2]}


def _on(flag) -> str:
    return "" if flag is None else ("on" if flag else "off")


def table(rows: list[dict]) -> str:
    head = ("| temperature | top-k | top-p | repeat block | quote touch-up | contraction touch-up | steps | "
            "sentence start | repeats | quotes balanced | broken contraction | [MASK]/[UNK] | ends a sentence | "
            "distinct-2 | Self-BLEU-4 | entropy | calls | seconds |")
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        out.append(f"| {r['temperature']} | {r['top_k'] if r['top_k'] != 0 else 'off'} | {r['top_p']} | "
                   f"{_on(r['block_repeats'])} | {_on(r.get('pair_quotes'))} | {_on(_contractions(r))} | "
                   f"{r.get('steps', '')} | "
                   f"{r['frac_sentence_start']:.1%} | {r['frac_repeat']:.1%} | {r['frac_quotes_balanced']:.1%} | "
                   f"{_pct(r.get('frac_broken_contraction'))} | "
                   f"{r['frac_mask_or_unk']:.1%} | {r['frac_ends_sentence']:.1%} | {r['distinct2']:.3f} | "
                   f"{r['self_bleu4']:.3f} | {r['unigram_entropy']:.2f} | {r.get('nfe', '') or ''} | {r['seconds']} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--out", default="runs/decoding.json")
    ap.add_argument("--heldout", default="runs/data/stories-heldout.txt", help="held-out text for the reference row")
    ap.add_argument("--only", help="comma-separated GRID indices to run (the others only if already measured)")
    ap.add_argument("--from", dest="sources", action="append", default=[], help="a JSON this script wrote: reuse its rows")
    a = ap.parse_args()
    db = checkpoint.load(a.checkpoint)
    done = {}
    for source in [a.out, *a.sources]:
        try:
            with open(source, encoding="utf-8") as f:
                done |= {json.dumps(_key(r)): r for r in json.load(f)["rows"] if r.get("steps")}
        except (OSError, ValueError, KeyError):
            pass
    want = range(len(GRID)) if not a.only else [int(i) for i in a.only.split(",")]
    rows = []
    for i, setting in enumerate(GRID):
        key = json.dumps(list(setting) + [a.n])
        if i in want and key not in done:
            done[key] = run(db, a.n, *setting)
            print(f"done {setting}: {done[key]['seconds']} s", file=sys.stderr)
        if key in done:
            rows.append(done[key])
    if rows:
        rows.append(human(a.heldout, a.n, rows[0]["words_per_sample"]))
    tmp = a.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"checkpoint": a.checkpoint, "cpu": cpu_name(), "rows": rows}, f, indent=1, ensure_ascii=False)
    os.replace(tmp, a.out)
    print(table(rows))
    return 0


def _contractions(r: dict):
    """A row's contraction touch-up: off in rows drawn before it existed (they have no such key)."""
    return r.get("fix_contractions", False)


def _pct(x) -> str:
    return "" if x is None else f"{x:.1%}"


def _key(r: dict) -> list:
    return [r["temperature"], r["top_k"], r["top_p"], r["block_repeats"], r["pair_quotes"], _contractions(r),
            r["steps"], r["n"]]


if __name__ == "__main__":
    sys.exit(main())
