#!/usr/bin/env bash
# More English, then stories (issue 58, item 3): the shipped story model's weights trained further on the
# shared children's books and fables mixed with the stories (stage `english`), then on the stories alone
# (stage `stories`), as whole documents in 256-token story windows, the shipped model's own recipe. Each stage
# is resumable (Ctrl-C or SIGINT saves; run the same command again), saves every 50 steps, and keeps its
# held-out bound on the 200 held-out stories (runs/data/head-heldout.txt, never trained on) in its history.
# Usage: scripts/recipes/curriculum.sh english|stories|status      (from the repository root)
# Env: OUT_E (runs/cur-english), OUT_S (runs/cur-stories), INIT (the shipped model), BOOK_LINES (lines of the
#   children's books in the mix, 30000 of 111,943: ~2.4 M tokens, the stories' own size), STEPS_E, STEPS_S, LR_E,
#   LR_S, BATCH (16), SEED (58), THREADS (2).
# In the background, as the curriculum ran here:
#   nohup nice -n 19 bash scripts/recipes/curriculum.sh english >> runs/cur-english.log 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/../.."
SHARED=../shared/data
DATA=runs/data
THREADS=${THREADS:-2}
OUT_E=${OUT_E:-runs/cur-english}
OUT_S=${OUT_S:-runs/cur-stories}

mix_data() {  # the fixed held-out split of the stories (scripts/stories_model.sh) and the books' slice
  [ -s "$DATA/head-heldout.txt" ] && [ -s "$DATA/lowercase-stories.txt" ] || bash scripts/stories_model.sh story-data
  # whole chapters or tales: cut at the last blank line before BOOK_LINES, so no tale is cut in two
  awk -v n="${BOOK_LINES:-30000}" 'NR > n && /^$/ { exit } { print }' "$SHARED/children/gutenberg_children.txt" \
    > "$DATA/books-slice.txt"
}

run() {  # $1 = init, $2 = out, $3 = steps, $4 = lr, rest: --data flags
  local init=$1 out=$2 steps=$3 lr=$4; shift 4
  local resume=""; [ -f "$out/trainer_state/state.json" ] && resume="--resume"
  OMP_NUM_THREADS=$THREADS dbert train --init "$init" "$@" --val-data "$(realpath "$DATA/head-heldout.txt")" \
    --unit story --seq-len 256 --schedule spindle --time none --batch-size "${BATCH:-16}" \
    --lr "$lr" --warmup 50 --max-steps "$steps" --eval-every 250 --save-every 50 --log-every 10 \
    --seed "${SEED:-58}" --dtype auto --out "$out" $resume
}

stories_files() {
  echo --data "$(realpath "$DATA/head-train.txt")" --data "$(realpath "$DATA/lowercase-stories.txt")" \
    --data "$(realpath "$SHARED/fables/fables.txt")"
}

case "${1:-}" in
  english)
    mix_data
    # shellcheck disable=SC2046
    run "$(realpath "${INIT:-assets/dbert-minilm-stories}")" "$OUT_E" "${STEPS_E:-3000}" "${LR_E:-1e-4}" \
      $(stories_files) --data "$(realpath "$DATA/books-slice.txt")" ;;
  stories)
    mix_data
    # shellcheck disable=SC2046
    run "$(realpath "$OUT_E")" "$OUT_S" "${STEPS_S:-1000}" "${LR_S:-5e-5}" $(stories_files) ;;
  status)
    for d in "$OUT_E" "$OUT_S"; do
      [ -f "$d/trainer_state/state.json" ] && python -c "import json,sys; s=json.load(open(sys.argv[1])); \
print(sys.argv[2], 'step', s.get('step'), 'val', [h for h in s.get('history', []) if 'val_ppl' in str(h)][-3:])" \
        "$d/trainer_state/state.json" "$d"
    done ;;
  *) echo "usage: $0 english|stories|status" >&2; exit 2 ;;
esac
