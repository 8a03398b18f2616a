#!/bin/bash
# Run 25: run 24's weights (int8, .device-data/init24: models/docqa-tiny at commit a69012c) trained on
# with run 24's mix plus NIAH's "absent" variant (a needle question whose key the document lacks:
# "not found"), from the last curriculum stage. TOTAL minutes in all, MIN this call.
# Carry: .whl .device-jobs .device-data/tasks-corpus.pt.xz .device-data/init24, with
# models/docqa-tiny/*.safetensors deleted from the working tree for the calls. RESUME=1 continues
# .train-ckpt/ft25.pt on the same warm machine. Ran 2026-12-06 on one H100 80GB as one call,
# `MIN=7 TOTAL=7` (4,960 steps; train-log.json). The task corpus: training.corpus --kinds man info
# readme html licences --max-chars-per-kind 20000000, then training.prepare --keep-tokenizer
# --max-text-paragraphs 2000000 --split-long-paragraphs --parsed-questions (21 min on 2 cores), xz -6.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv
mkdir -p /tmp/data /tmp/next25 .train-ckpt
[ -f /tmp/data/corpus.pt ] || xz -T8 -dc .device-data/tasks-corpus.pt.xz > /tmp/data/corpus.pt
cp .device-data/init24/{tokenizer.json,tokenizer_config.json,generation_config.json,docqa.json} /tmp/next25/
if [ "${RESUME:-0}" = 1 ]; then START="--resume .train-ckpt/ft25.pt"; else START="--init-from .device-data/init24 --start-stage 3"; fi
python3 -m training.train --data /tmp/data --model-dir /tmp/next25 $START --minutes ${MIN:-8} \
  --total-minutes ${TOTAL:-15} --batch-size 96 --lr 2e-4 --seed 74 --workers 12 --near-miss-share 0.25 \
  --task-weights niah=6,kv_retrieval=1,hotpot=4,which_document=1,lookup=5,sentence_qa=3,parsed_qa=5,text_mdm=5 \
  --niah-variant-weights single=3,multikey=3,multivalue=4,multiquery=2,absent=2 \
  --checkpoint .train-ckpt/ft25.pt --log-file $OUT/ft25-log.json 2>&1 | grep -v Warning | awk 'NR%5==1 || /done|model:|rror/' | tail -40
cp /tmp/next25/*.safetensors /tmp/next25/model.safetensors.index.json /tmp/next25/docqa.json $OUT/
