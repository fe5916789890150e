#!/bin/bash
# Ten stories end to end, the previous defaults (A) against the shipped model's blockwise decoding (B),
# alternating A B A B A in one run (docs/stories.md#decoding-chosen-by-readers). Nothing else should run.
#   bash scripts/studies/decoding_time.sh            # from the repository root, dbert on PATH
set -euo pipefail
OLD="--sampler first-hitting --steps 64 --temperature 0.5 --top-k 0 --top-p 0.93 --cache-refresh 4 --cache-masked"
NEW="--sampler blockwise --param block=32 --steps 255 --temperature 0.5 --top-k 0 --top-p 0.93 --cache-refresh 32 --cache-masked"
echo "cpu: $(python -c 'from dbert_core.hardware import cpu_name; print(cpu_name())' 2>/dev/null || uname -m)" >&2
for r in A B A B A; do
  if [ "$r" = A ]; then flags=$OLD; else flags=$NEW; fi
  start=$(date +%s.%N)
  dbert sample --n 10 --seed 0 $flags > /dev/null 2>&1
  python -c "import sys; print('$r', round(float(sys.argv[2]) - float(sys.argv[1]), 2), 's')" "$start" "$(date +%s.%N)"
done
