"""Story-level measures of sample files, beside the held-out stories' own (docs/stories.md).

    dbert sample --n 100 --seed 0 > runs/story-samples.txt
    python scripts/studies/stories.py runs/story-samples.txt [more.txt ...] --heldout runs/data/head-heldout.txt

Each file holds one sample a line (what `dbert sample` prints). For each file and for the held-out
stories (documents of --heldout, read as `dbert train --unit story` reads them): the share that is
one complete story, its three parts (a story start, a sentence end, no second story), length in
words (quartiles), doubled and changed names (dbert_core.evaluation.story_metrics), and the reader's
checks of `dbert eval` (repeats, quotes, contractions). With --judge (a causal LM folder, e.g. the
small story judge `scripts/studies/ar_baseline.py train ... --out runs/story-judge` trains here), also
each set's gen-PPL under it (whole stories, from the judge's start token) and the unigram entropy
over its tokens (dbert_core.evaluation.judge). Prints one JSON object per file on stdout and a
Markdown table on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys

from dbert_core.evaluation.metrics import readability, unigram_entropy
from dbert_core.evaluation.story_metrics import story_report
from dbert_core.errors import DbertError
from dbert_core.text.data import read_documents, story_texts

COLUMNS = (("one story", "frac_one_story", "{:.0%}"), ("story start", "frac_story_start", "{:.0%}"),
           ("ends a sentence", "frac_story_end", "{:.0%}"), ("no second story", "frac_single_story", "{:.0%}"),
           ("words q1 / median / q3", None, None), ("doubled name", "frac_doubled_name", "{:.1%}"),
           ("changed name", "frac_changed_name", "{:.1%}"), ("repeats a word", "frac_repeat", "{:.1%}"),
           ("quotes balanced", "frac_quotes_balanced", "{:.0%}"), ("unigram entropy", "unigram_entropy", "{:.2f}"))


def measure(texts: list[str]) -> dict:
    return {"n": len(texts), **story_report(texts), **readability(texts), "unigram_entropy": unigram_entropy(texts)}


def row(name: str, m: dict, columns=COLUMNS) -> str:
    cells = []
    for _, key, fmt in columns:
        cells.append(f"{m['words_q1']:.0f} / {m['words_median']:.0f} / {m['words_q3']:.0f}" if key is None
                     else fmt.format(m[key]))
    return f"| {name} ({m['n']}) | " + " | ".join(cells) + " |"


def measure_sets(args) -> dict:
    """{set name: its measures} for the held-out stories and each sample file (DbertError for a
    file that cannot be read)."""
    judge = None
    if args.judge:
        from dbert_core.evaluation.judge import Judge, check_judge

        check_judge(args.judge)
        judge = Judge(args.judge)
    sets = {"held-out stories": story_texts(read_documents([args.heldout]))}
    for path in args.files:
        try:
            with open(path, encoding="utf-8") as f:
                sets[path] = [ln.rstrip("\n") for ln in f if ln.strip()]
        except UnicodeDecodeError as e:
            raise DbertError(f"sample file is not UTF-8 text: {path} (byte {e.start})") from None
        except OSError as e:
            raise DbertError(f"cannot read sample file {path}: {e.strerror}") from None
    results = {}
    for name, texts in sets.items():
        results[name] = measure(texts)
        if judge is not None:
            scored = judge.score(texts)
            results[name].update({"judge": args.judge, "gen_ppl": scored["gen_ppl"],
                                  "log_gen_ppl_se": scored["log_gen_ppl_se"], "judge_entropy": scored["entropy"],
                                  "judge_tokens_per_text": scored["judge_tokens_per_text"]})
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="sample files, one sample a line")
    ap.add_argument("--heldout", required=True, help="held-out stories (a file dbert train --unit story reads)")
    ap.add_argument("--judge", default=None, help="a causal LM folder: gen-PPL and judge-token entropy per set")
    args = ap.parse_args()
    try:
        results = measure_sets(args)
    except DbertError as e:  # a missing or unreadable file, a judge that cannot judge: one line
        from dbert_core.settings import flag  # a setting named by the script's option, as dbert does

        print(f"stories: error: {e.said(flag)}", file=sys.stderr)
        return 2
    for name, m in results.items():
        print(json.dumps({"file": name, **m}))
    columns = COLUMNS + ((("judge gen-PPL", "gen_ppl", "{:.2f}"), ("judge entropy", "judge_entropy", "{:.2f}"))
                         if args.judge else ())
    print("| samples | " + " | ".join(c for c, _, _ in columns) + " |", file=sys.stderr)
    print("|---|" + "---:|" * len(columns), file=sys.stderr)
    for name, m in results.items():
        print(row(name, m, columns), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
