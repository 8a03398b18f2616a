#!/bin/bash
# Run 36 in a call after task-training.sh's, on one GPU (int8, quantized here from the bf16
# weights task-training.sh left in /tmp/next36 on this warm machine), the model's defaults
# (confirmation on), static mode, BM25 prefilter 64: the held-out
# sets at 4K on seeds 61 and 67 (15 a cell), then the written questions of the held-out
# collection, their unanswered ones and the held-out wordings over their page (`probe-reading --written`).
# Results: evals.tar.gz into $OUT. Carry .whl .ruler-data/s61 .ruler-data/s67.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv
mkdir -p /tmp/run36 /tmp/ev
cp models/docqa-tiny/{config.json,tokenizer_config.json,generation_config.json,tokenizer.json} /tmp/run36/
cp /tmp/next36/*.safetensors /tmp/next36/model.safetensors.index.json /tmp/next36/docqa.json /tmp/run36/
rm -rf /tmp/run36-int8; python3 scripts/quantize_weights.py /tmp/run36 /tmp/run36-int8 || exit
cp /tmp/run36-int8/*.safetensors /tmp/run36-int8/model.safetensors.index.json $OUT/ 2>/dev/null
run() {  # name model data tasks length
  local start=$(date +%s)
  python3 -m tools.cli eval --model $2 --data $3 --tasks $4 --lengths $5 --modes static \
    --prefilter 64 --bm25-weight 10 --device cuda --out /tmp/ev/$1 > /tmp/ev/$1.log 2>&1
  echo "$1 rc=$? $(( $(date +%s) - start )) s"; grep "^| " /tmp/ev/$1/summary.md | head -14
  tar -C /tmp/ev -czf $OUT/evals.tar.gz .
}
written() {  # name model
  local start=$(date +%s)
  python3 -m tools.cli probe-reading --written --per-kind 25 --model $2 --device cuda --out /tmp/ev/$1 \
    > /tmp/ev/$1.log 2>&1
  echo "$1 rc=$? $(( $(date +%s) - start )) s"; cat /tmp/ev/$1/summary.md
  tar -C /tmp/ev -czf $OUT/evals.tar.gz .
}
HELD="lookup_family lookup_paraphrase lookup_framing no_answer niah_absent_key niah_single_1 niah_multivalue"
run run36-s61-4k /tmp/run36-int8 .ruler-data/s61 "$HELD qa_1 qa_2" 4096
run run36-s67-4k /tmp/run36-int8 .ruler-data/s67 "$HELD" 4096
written run36-written /tmp/run36-int8
