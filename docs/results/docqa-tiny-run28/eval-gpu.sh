#!/bin/bash
# Held-out sets at 4K (seeds 61 and 67; carry .ruler-data/s61 .ruler-data/s67) for run 28 (int8,
# quantized here from the bf16 weights task-training.sh left in /tmp/next28 on this warm machine),
# on one GPU, the model's defaults, static mode, BM25 prefilter 64, as run 27 was measured.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv
mkdir -p /tmp/run28 /tmp/ev
cp .device-data/init27/{config.json,tokenizer_config.json,generation_config.json} models/docqa-tiny/tokenizer.json /tmp/run28/
cp /tmp/next28/*.safetensors /tmp/next28/model.safetensors.index.json /tmp/next28/docqa.json /tmp/run28/
rm -rf /tmp/run28-int8; python3 scripts/quantize_weights.py /tmp/run28 /tmp/run28-int8 || exit
T61="lookup_family lookup_paraphrase lookup_framing no_answer niah_absent_key niah_single_1 niah_multivalue qa_1 qa_2"
T67="lookup_family lookup_paraphrase lookup_framing no_answer niah_absent_key niah_single_1 niah_multivalue"
for s in s61 s67; do
  T=$T61; [ $s = s67 ] && T=$T67
  start=$(date +%s)
  python3 -m tools.cli eval --model /tmp/run28-int8 --data .ruler-data/$s --tasks $T --lengths 4096 --modes static \
    --prefilter 64 --bm25-weight 10 --device cuda --out /tmp/ev/run28-$s > /tmp/ev/run28-$s.log 2>&1
  echo "run28 $s rc=$? $(( $(date +%s) - start )) s"
  grep "^| " /tmp/ev/run28-$s/summary.md | head -14
  tar -C /tmp/ev -czf $OUT/evals.tar.gz .
done
