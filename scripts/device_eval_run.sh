#!/bin/bash
# A trained run's evaluation in a `device` call on the warm machine that trained it:
# `bash scripts/device_eval_run.sh N` quantizes the bf16 weights the run's task-training.sh left in
# /tmp/nextN to int8 (the form the model ships in) and evaluates them with the model's defaults
# (confirmation on), static mode, BM25 prefilter 64: the held-out sets at 4K on seeds 61 and 67 (15 a
# cell), then the written questions of the held-out collection, their unanswered ones and the
# held-out wordings over their page (`probe-reading --written`). Into $OUT: the int8 weights and
# evals.tar.gz (rewritten after each set, so a call cut short keeps what finished).
# Carry .whl .ruler-data/s61 .ruler-data/s67.
set -o pipefail
RUN=${1:?usage: device_eval_run.sh RUN_NUMBER}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv
BF16=/tmp/run$RUN INT8=/tmp/run$RUN-int8
mkdir -p $BF16 /tmp/ev
cp models/docqa-tiny/{config.json,tokenizer_config.json,generation_config.json,tokenizer.json} $BF16/
cp /tmp/next$RUN/*.safetensors /tmp/next$RUN/model.safetensors.index.json /tmp/next$RUN/docqa.json $BF16/ || exit
rm -rf $INT8; python3 scripts/quantize_weights.py $BF16 $INT8 || exit
cp $INT8/*.safetensors $INT8/model.safetensors.index.json $OUT/ 2>/dev/null
run() {  # name data tasks length
  local start=$(date +%s)
  python3 -m tools.cli eval --model $INT8 --data $2 --tasks $3 --lengths $4 --modes static \
    --prefilter 64 --bm25-weight 10 --device cuda --out /tmp/ev/$1 > /tmp/ev/$1.log 2>&1
  echo "$1 rc=$? $(( $(date +%s) - start )) s"; grep "^| " /tmp/ev/$1/summary.md | head -14
  tar -C /tmp/ev -czf $OUT/evals.tar.gz .
}
HELD="lookup_family lookup_paraphrase lookup_framing no_answer niah_absent_key niah_single_1 niah_multivalue"
run run$RUN-s61-4k .ruler-data/s61 "$HELD qa_1 qa_2" 4096
run run$RUN-s67-4k .ruler-data/s67 "$HELD" 4096
start=$(date +%s)
python3 -m tools.cli probe-reading --written --per-kind 25 --model $INT8 --device cuda --out /tmp/ev/run$RUN-written \
  > /tmp/ev/run$RUN-written.log 2>&1
echo "run$RUN-written rc=$? $(( $(date +%s) - start )) s"; cat /tmp/ev/run$RUN-written/summary.md
tar -C /tmp/ev -czf $OUT/evals.tar.gz .
