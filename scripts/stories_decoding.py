"""Choose the default decoding settings of a checkpoint by measurement.

    python scripts/stories_decoding.py runs/stories --n 200 --out runs/decoding.json

Draws --n samples (seed 0, the checkpoint's own length, 128 steps, first-hitting) at each setting of
a small grid (temperature, top-k, top-p, the repeat block) and reports for each the reader's checks
(metrics.readability: starts a sentence with a capital, repeats, balanced quotes, [MASK]/[UNK]), the
diversity (distinct-2, Self-BLEU-4, unigram entropy) and the seconds. Writes the JSON (one entry per
setting, with the first five samples) and prints a Markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from dbert_core import checkpoint
from dbert_core.config import SampleConfig
from dbert_core.detok import STORY_BREAK
from dbert_core.hardware import cpu_name
from dbert_core.metrics import distinct_n, readability, self_bleu, unigram_entropy
from dbert_core.sample import generate

GRID = [  # (temperature, top_k, top_p, block_repeats)
    (1.0, 30, 1.0, True),   # the defaults before this study
    (1.0, 0, 1.0, True),
    (1.0, 0, 0.9, True),
    (0.9, 30, 1.0, True),
    (0.8, 30, 1.0, True),
    (1.0, 30, 1.0, False),
]


def run(db, n: int, temperature: float, top_k: int, top_p: float, block: bool) -> dict:
    cfg = SampleConfig(n=n, seed=0, temperature=temperature, top_k=top_k, top_p=top_p, block_repeats=block)
    start = time.perf_counter()
    texts, stats = generate(db, cfg)
    seconds = time.perf_counter() - start
    flat = [t.replace(STORY_BREAK, " ") for t in texts]  # for the diversity measures
    return {"temperature": temperature, "top_k": top_k, "top_p": top_p, "block_repeats": block, "n": n,
            **readability(texts), "distinct2": distinct_n(flat, 2), "self_bleu4": self_bleu(flat),
            "unigram_entropy": unigram_entropy(flat), "seconds": round(seconds, 1), "nfe": stats["nfe"],
            "examples": texts[:5]}


def human(path: str, n: int, words: float) -> dict:
    """The same figures for held-out text cut into n pieces of the samples' mean length."""
    from dbert_core.data import read_lines
    from dbert_core.judge import human_chunks

    texts = human_chunks(read_lines([path]), n, words)
    return {"temperature": "held-out text", "top_k": "", "top_p": "", "block_repeats": None, "n": len(texts),
            **readability(texts), "distinct2": distinct_n(texts, 2), "self_bleu4": self_bleu(texts),
            "unigram_entropy": unigram_entropy(texts), "seconds": "", "nfe": 0, "examples": texts[:2]}


def table(rows: list[dict]) -> str:
    head = ("| temperature | top-k | top-p | repeat block | sentence start | repeats | quotes balanced | "
            "[MASK]/[UNK] | ends a sentence | distinct-2 | Self-BLEU-4 | entropy | seconds |")
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        block = "" if r["block_repeats"] is None else ("on" if r["block_repeats"] else "off")
        out.append(f"| {r['temperature']} | {r['top_k'] if r['top_k'] != 0 else 'off'} | {r['top_p']} | {block} | "
                   f"{r['frac_sentence_start']:.1%} | {r['frac_repeat']:.1%} | {r['frac_quotes_balanced']:.1%} | "
                   f"{r['frac_mask_or_unk']:.1%} | {r['frac_ends_sentence']:.1%} | {r['distinct2']:.3f} | "
                   f"{r['self_bleu4']:.3f} | {r['unigram_entropy']:.2f} | {r['seconds']} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--out", default="runs/decoding.json")
    ap.add_argument("--heldout", default="runs/data/stories-heldout.txt", help="held-out text for the reference row")
    a = ap.parse_args()
    db = checkpoint.load(a.checkpoint)
    rows = []
    for setting in GRID:
        rows.append(run(db, a.n, *setting))
        print(f"done {setting}: {rows[-1]['seconds']} s", file=sys.stderr)
    rows.append(human(a.heldout, a.n, rows[0]["words_per_sample"]))
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump({"checkpoint": a.checkpoint, "cpu": cpu_name(), "rows": rows}, f, indent=1, ensure_ascii=False)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
