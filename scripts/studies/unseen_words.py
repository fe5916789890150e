"""Words a checkpoint's samples write that its training text never does: made-up words
("onceious"), broken pieces and broken contractions ("you't"), the check behind the card's choice
of top-k over nucleus sampling and the contraction touch-up.

    dbert sample --n 200 --seed 0 > a.txt
    dbert sample --n 200 --seed 0 --top-k 0 --top-p 0.9 > b.txt
    python scripts/studies/unseen_words.py a.txt b.txt [--checkpoint DIR] [--json]

A word is a run of letters with at most one apostrophe inside ("don't", "lily's"), compared lower
case against every word of the checkpoint's training files (dbert.json's train_config data: the
files must be where that run read them). For each file: samples (lines), words, unseen words, the
samples holding one, and the most frequent of them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

from dbert_core.disk.layout import read_meta

WORD = re.compile(r"[A-Za-z]+(?:['\u2019][A-Za-z]+)?")


def words(text: str) -> list[str]:
    return [w.lower().replace("\u2019", "'") for w in WORD.findall(text)]


def known_words(files: list[str]) -> set[str]:
    out: set[str] = set()
    for f in files:
        with open(f, encoding="utf-8") as fh:
            for line in fh:
                out.update(words(line))
    return out


def report(path: str, known: set[str], top: int = 10) -> dict:
    lines = [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    unseen, holding, total = Counter(), 0, 0
    for line in lines:
        ws = words(line)
        total += len(ws)
        new = [w for w in ws if w not in known]
        unseen.update(new)
        holding += bool(new)
    return {"file": path, "samples": len(lines), "words": total, "unseen": sum(unseen.values()),
            "samples_with_unseen": holding, "most_common": unseen.most_common(top)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("samples", nargs="+", help="text files, one sample per line (dbert sample's stdout)")
    ap.add_argument("--checkpoint", default="assets/dbert-minilm-stories", help="whose training files to read")
    ap.add_argument("--json", action="store_true", help="one JSON object per file instead of the table")
    a = ap.parse_args()
    meta = read_meta(a.checkpoint)
    files = meta.get("train_config", {}).get("data") or meta.get("data_files") or []
    missing = [f for f in files if not Path(f).is_file()]
    if not files or missing:
        print(f"unseen_words: the checkpoint's training files are not here: {missing[0] if missing else 'none named'}",
              file=sys.stderr)
        return 1
    known = known_words(files)
    for path in a.samples:
        r = report(path, known)
        if a.json:
            print(json.dumps(r, ensure_ascii=False))
        else:
            print(f"{path}: {r['unseen']} unseen words of {r['words']}, in {r['samples_with_unseen']} of "
                  f"{r['samples']} samples; " + ", ".join(f"{w} ({n})" for w, n in r["most_common"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
