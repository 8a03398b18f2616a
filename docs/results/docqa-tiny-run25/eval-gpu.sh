#!/bin/bash
# Held-out sets at 4K (seeds 61 and 67, .ruler-data carried) for run 25 (int8, quantized here from
# the bf16 weights run 25's training left in /tmp/next25 on this warm machine), run 24
# (.device-data/init24, left by the training calls) and run 13 (the shipped models/docqa-tiny), on
# one GPU, the model's defaults, static mode, BM25 prefilter 64 (as the CPU evaluations). Ran
# 2026-12-06 on the H100 80GB that trained run 25, as `MODELS=run25:/tmp/run25-int8`, then
# `MODELS=run13:models/docqa-tiny` (carry .whl .device-jobs .ruler-data: the 4K sets of seeds 61
# and 67 from `docqa-tools eval-data ... --lengths 4096 --samples 15`).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv
mkdir -p /tmp/run25 /tmp/ev
cp .device-data/init24/{config.json,tokenizer.json,tokenizer_config.json,generation_config.json} /tmp/run25/
cp /tmp/next25/*.safetensors /tmp/next25/model.safetensors.index.json /tmp/next25/docqa.json /tmp/run25/
[ -d /tmp/run25-int8 ] || python3 scripts/quantize_weights.py /tmp/run25 /tmp/run25-int8 || exit
T61="lookup_family lookup_paraphrase lookup_framing no_answer niah_absent_key niah_single_1 niah_multivalue qa_1 qa_2"
T67="lookup_family lookup_paraphrase lookup_framing no_answer niah_absent_key niah_single_1 niah_multivalue"
for m in ${MODELS:-run25:/tmp/run25-int8 run13:models/docqa-tiny run24:.device-data/init24}; do
  for s in s61 s67; do
    T=$T61; [ $s = s67 ] && T=$T67
    start=$(date +%s)
    python3 -m tools.cli eval --model ${m#*:} --data .ruler-data/$s --tasks $T --lengths 4096 --modes static \
      --prefilter 64 --bm25-weight 10 --device cuda --out /tmp/ev/${m%%:*}-$s > /tmp/ev/${m%%:*}-$s.log 2>&1
    echo "${m%%:*} $s rc=$? $(( $(date +%s) - start )) s"
    grep "^| " /tmp/ev/${m%%:*}-$s/summary.md | head -14
    tar -C /tmp/ev -czf $OUT/evals.tar.gz .
  done
done
