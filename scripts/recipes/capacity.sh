#!/usr/bin/env bash
# Capacity (issue 58, item 4): the shipped 6-layer story model grown to 12 layers (each layer repeated in place,
# scripts/recipes/grow_layers.py), then trained on the stories with the shipped model's recipe (curriculum.sh's
# `stories` stage: batch 16 x 256-token story windows, seed 58, resumable, saving every 50 steps, held-out bound
# every 250). Read blind beside the shipped model in docs/models.md ("A deeper model").
# Usage: scripts/recipes/capacity.sh          (from the repository root; run it again to resume)
# Env: GROWN (runs/grown12), OUT (runs/cap12), STEPS (2000), LR (1e-4), TIMES (2: 6 -> 12 layers), THREADS (2).
# In the background, as it ran here:  nohup nice -n 19 bash scripts/recipes/capacity.sh >> runs/cap12.log 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/../.."
GROWN=${GROWN:-runs/grown12}
[ -d "$GROWN" ] || python scripts/recipes/grow_layers.py assets/dbert-minilm-stories "$GROWN" --times "${TIMES:-2}"
OUT_E=$GROWN OUT_S=${OUT:-runs/cap12} STEPS_S=${STEPS:-2000} LR_S=${LR:-1e-4} bash scripts/recipes/curriculum.sh stories
