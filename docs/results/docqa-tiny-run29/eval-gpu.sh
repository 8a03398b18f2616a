#!/bin/bash
# Held-out sets for run 29 (int8, quantized here from the bf16 weights task-training.sh left in
# /tmp/next29 on this warm machine), on one GPU, the model's defaults, static mode, BM25 prefilter 64:
# 4K on seeds 61 and 67 (15 a cell), 16K and 32K on seed 71 (10 a cell), and seed 73's 20 a cell at
# 16K and 32K for run 29 and run 28 (the shipped models/docqa-tiny) on the same card (S73=0 skips those).
# Carry .whl .ruler-data/s61 .ruler-data/s67 .ruler-data/s71-16k .ruler-data/s71-32k .ruler-data/s73.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv
mkdir -p /tmp/run29 /tmp/ev
cp models/docqa-tiny/{config.json,tokenizer_config.json,generation_config.json,tokenizer.json} /tmp/run29/
cp /tmp/next29/*.safetensors /tmp/next29/model.safetensors.index.json /tmp/next29/docqa.json /tmp/run29/
rm -rf /tmp/run29-int8; python3 scripts/quantize_weights.py /tmp/run29 /tmp/run29-int8 || exit
run() {  # name model data tasks length
  local start=$(date +%s)
  python3 -m tools.cli eval --model $2 --data $3 --tasks $4 --lengths $5 --modes static \
    --prefilter 64 --bm25-weight 10 --device cuda --out /tmp/ev/$1 > /tmp/ev/$1.log 2>&1
  echo "$1 rc=$? $(( $(date +%s) - start )) s"; grep "^| " /tmp/ev/$1/summary.md | head -14
  tar -C /tmp/ev -czf $OUT/evals.tar.gz .
}
HELD="lookup_family lookup_paraphrase lookup_framing no_answer niah_absent_key niah_single_1 niah_multivalue"
run run29-s61-4k /tmp/run29-int8 .ruler-data/s61 "$HELD qa_1 qa_2" 4096
run run29-s67-4k /tmp/run29-int8 .ruler-data/s67 "$HELD" 4096
LONG="lookup_family lookup_paraphrase niah_absent_key niah_single_1 niah_multivalue"
run run29-s71-16k /tmp/run29-int8 .ruler-data/s71-16k "$LONG" 16384
run run29-s71-32k /tmp/run29-int8 .ruler-data/s71-32k "$LONG" 32768
[ "${S73:-1}" = 1 ] || exit 0  # S73=0: the 4K and seed-71 sets only
for L in 16384 32768; do for m in run29:/tmp/run29-int8 run28:models/docqa-tiny; do
  run ${m%%:*}-s73-$L ${m#*:} .ruler-data/s73 "lookup_family lookup_paraphrase no_answer" $L
done; done
