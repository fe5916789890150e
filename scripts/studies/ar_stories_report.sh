#!/usr/bin/env bash
# The same-budget GPT-2 beside the diffusion model on whole stories (issue 38; docs/stories.md).
#
#     bash scripts/studies/ar_stories_report.sh            # after runs/ar-stories has trained
#     AR=runs/ar-stories OUT=runs/ar-report bash scripts/studies/ar_stories_report.sh
#
# Needs: the GPT-2 that `scripts/studies/ar_baseline.py train assets/dbert-minilm-stories --out
# runs/ar-stories ...` trains (docs/stories.md gives the command; it may still be part way: the
# report says at which step), the story judge runs/story-judge (same page), and the held-out stories
# runs/data/head-heldout.txt (the last 200 of TinyStories-train-head.txt, made by the stories study).
# Writes into OUT:
#   ar-eval.json     the GPT-2's exact NLL per token over the held-out stories, in the diffusion
#                    model's story windows (`ar_baseline.py eval --unit story`)
#   ar.txt           100 GPT-2 stories, nucleus 0.93 (the diffusion model's default), one a line
#   dbert.txt        100 stories of `dbert sample --n 100 --seed 0` at the shipped defaults
#   stories.json     scripts/studies/stories.py's measures of both and of the held-out stories
#   stories.md       the same as a Markdown table
# and prints the table, then the GPT-2's held-out figure (its JSON names the step it was trained to).
set -euo pipefail
AR=${AR:-runs/ar-stories}
JUDGE=${JUDGE:-runs/story-judge}
HELDOUT=${HELDOUT:-runs/data/head-heldout.txt}
OUT=${OUT:-runs/ar-report}
PY=${PY:-python}
for need in "$AR" "$JUDGE" "$HELDOUT"; do
  [ -e "$need" ] || { echo "ar_stories_report: $need is missing (docs/stories.md says how to make it)" >&2; exit 2; }
done
mkdir -p "$OUT"
"$PY" scripts/studies/ar_baseline.py eval "$AR" --heldout "$HELDOUT" --unit story > "$OUT/ar-eval.json"
"$PY" scripts/studies/ar_baseline.py sample "$AR" --n 100 --top-k 0 --top-p 0.93 --lines "$OUT/ar.txt" > /dev/null
"$PY" -m dbert_core.cli sample --n 100 --seed 0 > "$OUT/dbert.txt"
"$PY" scripts/studies/stories.py "$OUT/dbert.txt" "$OUT/ar.txt" --heldout "$HELDOUT" --judge "$JUDGE" \
  > "$OUT/stories.json" 2> "$OUT/stories.md"
cat "$OUT/stories.md"
tail -n 1 "$OUT/ar-eval.json"
