#!/bin/bash
# Run 23: task training from the pretrained weights (issue 20's second stage): run 13's mix plus
# text_mdm (keeps the language) and parsed_qa, the whole K curriculum over TOTAL minutes; MIN this call.
# Ran 2026-12-06 on one H100 80GB as three calls on one warm machine: `MIN=7.5 TOTAL=23`, then
# `RESUME=1 MIN=8 TOTAL=23`, then `RESUME=1 MIN=7.5 TOTAL=23` (18,897 steps; train-log.json holds the whole curve).
# Carry: .whl .device-jobs .device-data/tasks-corpus.pt.xz .device-data/init (the pretrained
# weights in int8, scripts/quantize_weights.py), with models/docqa-tiny/*.safetensors deleted from
# the working tree for the calls (`git checkout models/docqa-tiny` after): 64.7 MB in all.
# RESUME=1 continues .train-ckpt/ft.pt on the same warm machine.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv
mkdir -p /tmp/data /tmp/next .train-ckpt
[ -f /tmp/data/corpus.pt ] || xz -T8 -dc .device-data/tasks-corpus.pt.xz > /tmp/data/corpus.pt
cp models/docqa-tiny/{tokenizer.json,tokenizer_config.json,generation_config.json,docqa.json} /tmp/next/
if [ "${RESUME:-0}" = 1 ]; then START="--resume .train-ckpt/ft.pt"; else START="--init-from .device-data/init"; fi
python3 -m training.train --data /tmp/data --model-dir /tmp/next $START --minutes ${MIN:-8} \
  --total-minutes ${TOTAL:-45} --batch-size 96 --lr 4e-4 --seed 72 --workers 12 --near-miss-share 0.25 \
  --task-weights niah=6,kv_retrieval=1,hotpot=3,which_document=1,lookup=8,sentence_qa=2,parsed_qa=2,text_mdm=2 \
  --checkpoint .train-ckpt/ft.pt --log-file $OUT/ft-log.json 2>&1 | grep -v Warning | awk 'NR%5==1 || /done|model:|rror/' | tail -40
cp /tmp/next/*.safetensors /tmp/next/model.safetensors.index.json /tmp/next/config.json /tmp/next/docqa.json $OUT/
