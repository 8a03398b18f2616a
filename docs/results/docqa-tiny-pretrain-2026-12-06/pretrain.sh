#!/bin/bash
# Pretraining, part 1: a fresh 12 x 384 model (the shipped architecture), text_mdm only, on the
# rebuilt corpus (20 M characters a kind, long paragraphs split: 19.9 M tokens of real text).
# MIN: this call's minutes; TOTAL: the whole pretraining's (cosine schedule); RESUME=1 continues.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv | tee $OUT/gpu.txt
mkdir -p /tmp/data /tmp/pre .train-ckpt
[ -f /tmp/data/corpus.pt ] || xz -T8 -dc .device-data/corpus.pt.xz > /tmp/data/corpus.pt
cp models/docqa-tiny/{tokenizer.json,tokenizer_config.json,generation_config.json,docqa.json} /tmp/pre/
R=""; [ "${RESUME:-0}" = 1 ] && R="--resume .train-ckpt/pre.pt"
python3 -m training.train --data /tmp/data --model-dir /tmp/pre --layers 12 --hidden 384 --kv-heads 2 \
  --task-weights text_mdm=1 --minutes ${MIN:-8} --total-minutes ${TOTAL:-16} --batch-size 128 --lr 8e-4 \
  --seed 71 --workers 12 --checkpoint .train-ckpt/pre.pt $R --log-file $OUT/pre-log.json 2>&1 \
  | grep -v Warning | awk 'NR%5==1 || /done|model:|Error|error/' | tail -60
cp /tmp/pre/*.safetensors /tmp/pre/model.safetensors.index.json /tmp/pre/config.json /tmp/pre/docqa.json $OUT/ 2>/dev/null
ls -la $OUT
