#!/usr/bin/env bash
# One lent GPU's session (the `device` tool: one command, ~10 minutes, nothing reachable from the machine), run from
# the repository root: the stories model trained against the clock in bf16 (scripts/recipes/train_timed.py), then
# `dbert eval --unit story` of the new and the shipped weights, `dbert sample --n 10` and `dbert bench --device cuda`
# timed (the README's GPU table), tests/test_cuda.py, and (part `ar`, not in the default PARTS) the same-budget
# autoregressive baseline of scripts/studies/ar_baseline.py trained on the same files (OUT/ar.tar.NN, ar.log,
# ar-state.json; AR_SECONDS, AR_LR, AR_WARMUP, AR_TOKENS, AR_BATCH, AR_SEQ_LEN). Its budget, 99 M tokens, is ~25 h
# of a 2-core CPU: PARTS="ar" AR_SECONDS=480 for a session of its own.
#   Before: data in .devdata/ (ignored; carried): runs/data/head-{train,heldout}.txt, runs/data/lowercase-stories.txt
#   (scripts/stories_model.sh story-data), ../shared/data/fables/fables.txt; wheels the image lacks in .whl/.
#   After: OUT/best.tar.NN (the best held-out checkpoint, float16, split to fit the 16 MiB a file that comes back:
#   `cat best.tar.* | tar -x`), train.{log,json}, bench.json, eval.jsonl, info.log
#   (progress of the rest).
# Part `english` (issue 58's curriculum, scripts/recipes/curriculum.sh on a GPU): before `train`, the stories mixed with the
# children's books' slice (DATA_DIR/books-slice.txt) for ENGLISH_SECONDS (240); `train` then goes on from its best weights on
# the stories alone, and `eval` scores the english stage's best too: PARTS="english train eval sample" TRAIN_SECONDS=200.
# Env: OUT (results), PY (python), DATA_DIR (.devdata), INIT (the shipped model), WORK (/tmp/gpu-stories), PARTS
#   ("train eval sample bench tests"), TRAIN_SECONDS, BATCH, SEQ_LEN, LR, WARMUP, EVAL_EVERY, DEVICE (cuda; cpu: the dry run of
#   tests/test_gpu_recipe.py), EVAL_SECONDS, SAMPLE_SECONDS, BENCH_SECONDS, TESTS_SECONDS (each part's time limit).
#   Here, once: `scripts/recipes/gpu_stories.sh prepare`; there (the device tool's run, carry [".devdata", ".whl"]):
#   `OUT=$OUT TRAIN_SECONDS=240 bash scripts/recipes/gpu_stories.sh`. The tree that travels must stay under 64 MiB: the wiki
#   model's weights (45 MB) went as a symbolic link to a copy outside the checkout for the run.
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" = prepare ]; then
  set -e
  [ -s runs/data/head-train.txt ] || scripts/stories_model.sh story-data
  [ -s runs/data/books-slice.txt ] || awk -v n="${BOOK_LINES:-30000}" 'NR > n && /^$/ { exit } { print }' \
    ../shared/data/children/gutenberg_children.txt > runs/data/books-slice.txt  # as scripts/recipes/curriculum.sh cuts it
  mkdir -p .devdata .whl
  cp runs/data/head-train.txt runs/data/head-heldout.txt runs/data/lowercase-stories.txt runs/data/books-slice.txt \
    ../shared/data/fables/fables.txt .devdata/
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 -d .whl platformdirs==4.3.6  # the image has no platformdirs
  for d in /.devdata/ /.whl/; do grep -qxF "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude; done
  exit 0
fi
OUT=${OUT:?set OUT}
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
D=${DATA_DIR:-.devdata}
INIT=${INIT:-assets/dbert-minilm-stories}
WORK=${WORK:-/tmp/gpu-stories}
PARTS=${PARTS:-train eval sample bench tests}
mkdir -p "$WORK"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1; nproc
  $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} > "$OUT/info.log" 2>&1

has() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }

START=$INIT
if has english; then  # more English first: the stories and the books' slice, mixed as they come
  timeout "$(( ${ENGLISH_SECONDS:-240} + 40 ))" $PY scripts/recipes/train_timed.py --init "$INIT" \
    --data $D/head-train.txt --data $D/lowercase-stories.txt --data $D/fables.txt --data $D/books-slice.txt \
    --val-data $D/head-heldout.txt --out "$WORK/english" --seconds "${ENGLISH_SECONDS:-240}" --batch-size "${BATCH:-128}" \
    --seq-len "${SEQ_LEN:-256}" --lr "${LR:-2e-4}" --warmup "${WARMUP:-300}" --eval-every "${EVAL_EVERY:-250}" \
    --device "$DEVICE" > "$OUT/english.json" 2> "$OUT/english.log"
  echo "english exit $?" >> "$OUT/info.log"
  [ -d "$WORK/english/best" ] && START=$WORK/english/best
fi

if has train; then
  timeout "$(( ${TRAIN_SECONDS:-320} + 40 ))" $PY scripts/recipes/train_timed.py --init "$START" \
    --data $D/head-train.txt --data $D/lowercase-stories.txt --data $D/fables.txt --val-data $D/head-heldout.txt \
    --out "$WORK/run" --seconds "${TRAIN_SECONDS:-320}" --batch-size "${BATCH:-128}" --seq-len "${SEQ_LEN:-256}" --lr "${LR:-2e-4}" \
    --warmup "${WARMUP:-300}" --eval-every "${EVAL_EVERY:-250}" --device "$DEVICE" > "$OUT/train.json" 2> "$OUT/train.log"
  echo "train exit $?" >> "$OUT/info.log"
  if [ -d "$WORK/run/best" ]; then  # what comes back: 8 files of 16 MiB at most
    tar -C "$WORK/run" -cf "$WORK/best.tar" best && split -b 15M -d -a 2 "$WORK/best.tar" "$OUT/best.tar."
  fi
fi

if has eval; then
  for ck in "$WORK/run/best" "$WORK/english/best" "$INIT"; do  # the held-out bound as the docs measure it (4 draws), both in one run
    [ -d "$ck" ] || continue
    echo "{\"checkpoint\": \"$ck\"}" >> "$OUT/eval.jsonl"
    timeout "${EVAL_SECONDS:-40}" $PY -m dbert_core.cli eval --checkpoint "$ck" --data "$D/head-heldout.txt" --unit story \
      --steps 128 --mc-samples 4 --json --device "$DEVICE" >> "$OUT/eval.jsonl" 2>> "$OUT/info.log"
    echo "eval $ck exit $?" >> "$OUT/info.log"
  done
fi

if has sample; then
  for i in 1 2; do  # end to end, as a user runs it (the second with the file cache and CUDA's kernels warm)
    TIMEFORMAT="sample --n 10 run $i: %R s wall"
    { time timeout "${SAMPLE_SECONDS:-30}" $PY -m dbert_core.cli sample --n 10 --seed 0 --device "$DEVICE" --stats \
        > "$WORK/sample$i.txt"; } 2>> "$OUT/info.log"
    echo "sample exit $?" >> "$OUT/info.log"
  done
  head -c 1500 "$WORK/sample2.txt" >> "$OUT/info.log"
fi

if has bench; then
  timeout "${BENCH_SECONDS:-110}" $PY -m dbert_core.cli bench --device "$DEVICE" --quick --length 256 --batch 1,16 \
    --out "$WORK/bench" > /dev/null 2>> "$OUT/info.log"
  echo "bench exit $?" >> "$OUT/info.log"
  cp "$WORK/bench/bench.json" "$OUT/" 2>/dev/null
fi

if has ar; then  # the same-budget autoregressive baseline (issue 38), trained here and measured on the CPU after:
  # `cat ar.tar.* | tar -x` gives ar-half/ (float16 weights); then ar_baseline.py sample ar-half --lines ... and stories.py
  timeout -k 60 "${AR_SECONDS:-420}" $PY scripts/studies/ar_baseline.py train "$INIT" --out "$WORK/ar" \
    --data $D/head-train.txt $D/lowercase-stories.txt $D/fables.txt --device "$DEVICE" --lr "${AR_LR:-1e-3}" \
    --warmup "${AR_WARMUP:-300}" --save-every 1000 ${AR_TOKENS:+--tokens "$AR_TOKENS"} ${AR_BATCH:+--batch "$AR_BATCH"} \
    ${AR_SEQ_LEN:+--seq-len "$AR_SEQ_LEN"} > /dev/null 2> "$OUT/ar.log"
  echo "ar exit $?" >> "$OUT/info.log"
  if [ -s "$WORK/ar/state.json" ]; then  # what comes back: the weights in float16, no optimizer, split to 15 MiB
    $PY - "$WORK/ar" "$WORK/ar-half" <<'PYEOF' >> "$OUT/info.log" 2>&1
import shutil, sys
from pathlib import Path
from safetensors.torch import load_file, save_file
src, dst = map(Path, sys.argv[1:])
shutil.copytree(src, dst, ignore=shutil.ignore_patterns("optimizer.pt"), dirs_exist_ok=True)
weights = load_file(src / "model.safetensors")
save_file({k: v.half().contiguous() for k, v in weights.items()}, dst / "model.safetensors", metadata={"format": "pt"})
PYEOF
    tar -C "$WORK" -cf "$WORK/ar.tar" ar-half && split -b 15M -d -a 2 "$WORK/ar.tar" "$OUT/ar.tar."
    cp "$WORK/ar/state.json" "$OUT/ar-state.json"
  fi
fi

if has tests; then  # CUDA logits against the CPU's, sampling and bf16 training on the GPU (skipped without CUDA)
  timeout "${TESTS_SECONDS:-90}" $PY -m pytest -q -p no:cacheprovider tests/test_cuda.py >> "$OUT/info.log" 2>&1
  echo "tests exit $?" >> "$OUT/info.log"
fi
