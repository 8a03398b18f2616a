#!/bin/bash
# Run 34 (int8, /tmp/run34-int8 from eval-gpu.sh on this warm machine) at 16K and 32K, seed 71,
# 10 a cell, as run 28 was measured (docs/results/docqa-tiny-eval/s71-run28-{16k,32k}-h200-*), the
# model's defaults, confirmation on. Carry .whl .ruler-data/s71-16k .ruler-data/s71-32k.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
MODEL=${MODEL:-/tmp/run34-int8}
mkdir -p /tmp/ev
LONG="lookup_family lookup_paraphrase niah_absent_key niah_single_1 niah_multivalue"
for L in 16 32; do
  start=$(date +%s)
  python3 -m tools.cli eval --model $MODEL --data .ruler-data/s71-${L}k --tasks $LONG --lengths $((L * 1024)) \
    --modes static --prefilter 64 --bm25-weight 10 --device cuda --out /tmp/ev/run34-s71-${L}k > /tmp/ev/run34-s71-${L}k.log 2>&1
  echo "${L}K rc=$? $(( $(date +%s) - start )) s"; grep "^| " /tmp/ev/run34-s71-${L}k/summary.md | head -8
  tar -C /tmp/ev -czf $OUT/evals-long.tar.gz run34-s71-16k run34-s71-32k 2>/dev/null
done
