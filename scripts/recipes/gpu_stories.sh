#!/usr/bin/env bash
# The stories model on one lent GPU (issue 21 item 7), in one device call of about 10 minutes.
#
# Here, before the call:   scripts/recipes/gpu_stories.sh prepare
#   copies the corpus files the stories model trains on into .gpu/shared (the shared folder's layout)
#   and a platformdirs wheel into .gpu/whl
#   (the device image has torch, transformers, tokenizers, safetensors and typer, not platformdirs),
#   and takes assets/dbert-minilm-wiki out of the index for the call: the tracked tree is about
#   78 MiB and a device call sends at most 64 MiB (`restore` puts it back; nothing is committed).
# The call (the device tool):  run(command="bash scripts/recipes/gpu_stories.sh device", carry=[".gpu"],
#                                  timeout_s=600)
#   there: nvidia-smi, a 30-step probe of training throughput, then a bf16 run from the shipped
#   checkpoint sized to TRAIN_S seconds (the cosine planned on the probe's rate), the held-out
#   bound on the GPU, the CUDA tests (tests/test_cuda.py), `dbert bench --device cuda`, and the
#   weights in float16 split into parts under 16 MiB (the device returns 8 files of 16 MiB at most).
# Here, after the call:   scripts/recipes/gpu_stories.sh collect DIR   (DIR: the call's files_at)
#   reassembles runs/stories-gpu (its logs, bench and test report in runs/stories-gpu-device), checks the weights load, puts the index back (restore), and scores
#   the new weights here on the same held-out sentences as the CPU release (scripts/stories_model.sh
#   eval), so the two bounds come from one machine. Ship with SRC=runs/stories-gpu
#   scripts/stories_model.sh export only if that bound is better.
#
# Env (device): TRAIN_S (default 300), PROBE_STEPS (30), BATCH (256), LR (2e-4), WARMUP (50),
# EVAL_LIMIT (1000), DEVICE (cuda; cpu for the dry run in tests/test_gpu_recipe.py), BENCH (more
# `dbert bench` flags), TESTS (1: run tests/test_cuda.py), EVAL_S / TESTS_S / BENCH_S (time limits of
# the stages after the weights are saved: 90 / 90 / 100 s), INIT (the checkpoint to continue), SHORT (the
# fraction of short windows, 0.5 as in the shipped stage 3; 0 for full windows only). Data: every TinyStories file and the fables, as
# scripts/stories_model.sh trains on; held out: the last 1,000 lines of tinystories/valid.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
SHARED=${SHARED:-../shared/data}
WIKI=assets/dbert-minilm-wiki
EXCLUDE=.git/info/exclude
GPU=${GPU_DIR:-.gpu}  # what the call carries (the dry run in tests/test_gpu_recipe.py points it elsewhere)

dbert() { python3 -c 'import sys; from dbert_core.cli import main; sys.argv[0] = "dbert"; main()' "$@"; }

prepare() {
  mkdir -p .gpu/shared/tinystories/more .gpu/shared/fables .gpu/whl
  grep -qx '/.gpu/' "$EXCLUDE" 2>/dev/null || echo '/.gpu/' >> "$EXCLUDE"
  local f  # the corpus files the stories model trains on, in the shared folder's layout (DBERT_DATA for the tests)
  for f in tinystories/train.txt tinystories/valid.txt tinystories/more/train_1001_2016.txt \
           tinystories/more/train_2317_5000_lowercase.txt fables/fables.txt; do
    cp "$SHARED/$f" ".gpu/shared/$f"
  done
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform any -d .gpu/whl "platformdirs>=4"
  if git ls-files --error-unmatch "$WIKI" >/dev/null 2>&1; then
    git rm -r -q --cached "$WIKI"
    grep -qx "/$WIKI/" "$EXCLUDE" || echo "/$WIKI/" >> "$EXCLUDE"
  fi
  echo "ready: $(du -sh .gpu | cut -f1) to carry; $WIKI is out of the index until 'restore'" >&2
}

restore() {
  git reset -q -- "$WIKI"
  sed -i "\#^/$WIKI/\$#d" "$EXCLUDE"
  git diff --quiet --cached -- "$WIKI" && echo "$WIKI is tracked again" >&2
}

device() {
  # $OUT: the weights' parts, rest.tar.gz, train.log and report.tar.gz (the device returns 8 files at most)
  local out=${OUT:?the device sets OUT} dev=${DEVICE:-cuda} work=${WORK:-/tmp/dbert-gpu}
  local rep=$work/report
  mkdir -p "$work" "$rep"
  if ls "$GPU"/whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$GPU"/whl/*.whl
    export PYTHONPATH=$PWD:/tmp/site
  else
    export PYTHONPATH=$PWD
  fi
  export PYTHONUNBUFFERED=1
  { nvidia-smi 2>&1 || echo "no nvidia-smi"; python3 -c "import torch; print(torch.__version__, torch.cuda.is_available())"; } \
    > "$rep/machine.txt"
  local src=$GPU/shared data=$GPU/data
  mkdir -p "$data"
  head -n -1000 "$src/tinystories/valid.txt" > "$data/stories-valid-rest.txt"  # the split of stories_model.sh
  tail -n 1000 "$src/tinystories/valid.txt" > "$data/heldout.txt"
  local files=(--data "$src/tinystories/train.txt" --data "$data/stories-valid-rest.txt"
               --data "$src/tinystories/more/train_1001_2016.txt"
               --data "$src/tinystories/more/train_2317_5000_lowercase.txt" --data "$src/fables/fables.txt")
  local common=(--init "${INIT:-assets/dbert-minilm-stories}" "${files[@]}" --val-data "$data/heldout.txt"
                --unit sentence --pack --short-windows "${SHORT:-0.5}" --seq-len "${SEQ_LEN:-128}"
                --schedule spindle --time none
                --batch-size "${BATCH:-256}" --device "$dev" --dtype "${DTYPE:-auto}" --log-every 10 --seed 0)
  # the probe: tokens per second of this machine, to size the run to TRAIN_S
  dbert train "${common[@]}" --max-steps "${PROBE_STEPS:-30}" --warmup 5 --eval-every 0 --save-every 0 \
    --out "$work/probe" > "$rep/probe.log" 2>&1
  local steps
  steps=$(python3 - "$work/probe" "${TRAIN_S:-300}" "${PROBE_STEPS:-30}" <<'EOF'
import json, sys
from pathlib import Path
state = json.loads((Path(sys.argv[1]) / "trainer_state" / "state.json").read_text())
rates = [h["tokens_per_s"] for h in state["history"] if "tokens_per_s" in h]
per_step = state["tokens_seen"] / max(1, state["step"])
rate = sorted(rates)[len(rates) // 2] if rates else per_step / max(state["elapsed"] / max(1, state["step"]), 1e-9)
print(max(int(sys.argv[3]), int(float(sys.argv[2]) * rate / per_step)))
EOF
)
  echo "steps: $steps" >> "$rep/machine.txt"
  local evals=$(( steps / 5 > 0 ? steps / 5 : 1 ))
  dbert train "${common[@]}" --max-steps "$steps" --lr "${LR:-2e-4}" --warmup "${WARMUP:-50}" \
    --eval-every "$evals" --save-every 0 --out "$work/stories-gpu" > "$out/train.log" 2>&1
  # first the weights (float16, cut into parts the device can return; the rest in one tar), so a
  # later stage that runs out of time loses nothing
  python3 scripts/export_default.py "$work/stories-gpu" "$work/export" 2>> "$out/train.log"
  cp "$work/stories-gpu/trainer_state/state.json" "$work/export/train_state.json"
  split -b 15M -d "$work/export/model.safetensors" "$out/model.part"
  tar -C "$work/export" --exclude model.safetensors -czf "$out/rest.tar.gz" .
  timeout "${EVAL_S:-90}" python3 -c 'import sys; from dbert_core.cli import main; sys.argv[0] = "dbert"; main()' \
    eval --checkpoint "$work/stories-gpu" --data "$data/heldout.txt" --unit sentence --steps 128 \
    --limit "${EVAL_LIMIT:-1000}" --device "$dev" --json > "$rep/eval.json" 2> "$rep/eval.log" || true
  if [ "${TESTS:-1}" = 1 ]; then
    DBERT_DATA=$src timeout "${TESTS_S:-90}" python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py \
      > "$rep/tests.log" 2>&1 || true
  fi
  timeout "${BENCH_S:-100}" python3 -c 'import sys; from dbert_core.cli import main; sys.argv[0] = "dbert"; main()' \
    bench --checkpoint "$work/stories-gpu" --device "$dev" ${BENCH:-} --out "$work/bench" > "$rep/bench.log" 2>&1 || true
  for f in bench.json bench.md; do [ -f "$work/bench/$f" ] && cp "$work/bench/$f" "$rep/$f"; done
  tar -C "$rep" -czf "$out/report.tar.gz" .
  ls -la "$out" >&2
}

collect() {
  local from=${1:?usage: collect DIR (the device call files_at)} to=${TO:-runs/stories-gpu}
  rm -rf "$to.tmp" && mkdir -p "$to.tmp"
  cat "$from"/model.part* > "$to.tmp/model.safetensors"
  tar -C "$to.tmp" -xzf "$from/rest.tar.gz"
  rm -rf "$to-device" && mkdir -p "$to-device" && cp "$from/train.log" "$to-device/"  # logs, eval, bench, tests
  if [ -f "$from/report.tar.gz" ]; then tar -C "$to-device" -xzf "$from/report.tar.gz"; fi
  python3 -c "import sys; from dbert_core import checkpoint; checkpoint.load(sys.argv[1])" "$to.tmp"
  rm -rf "$to" && mv "$to.tmp" "$to"
  git ls-files --error-unmatch "$WIKI" >/dev/null 2>&1 || restore
  [ "${EVAL:-1}" = 1 ] && scripts/stories_model.sh eval "$to" gpu
  echo "collected into $to" >&2
}

case "${1:-}" in
  prepare) prepare ;;
  restore) restore ;;
  device) device ;;
  collect) shift; collect "$@" ;;
  *) echo "usage: $0 prepare|device|collect DIR|restore" >&2; exit 2 ;;
esac
