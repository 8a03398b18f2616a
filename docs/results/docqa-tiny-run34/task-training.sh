#!/bin/bash
# Run 34 (2026-12-07, one GPU): run 33's mix and seed (10 min of 10, run 33's 10 of 10.5) from
# run 28's weights (int8, the shipped model, in .device-data/init28), with the reading tasks'
# passages (sentence_qa, parsed_qa, written_qa: the answering passage, a near miss's, an unanswered
# question's) placed among real text that fills their chunk 80% of the time
# (--filled-context-share 0.8). Before this run such a passage stood alone in a chunk of its own length (median 50-64 of 127 tokens), where at inference every
# chunk but a document's last is full: run 33 learned to read people's questions over a passage
# alone (held-out written 2 -> 12%) but made up 25 answers on the PDFs' full, number-dense chunks.
# Two calls on the same warm machine: `MIN=7.5 TOTAL=10 bash task-training.sh`, then
# `RESUME=1 MIN=2.5 TOTAL=10 bash task-training.sh && bash eval-gpu.sh`.
# Carry: .whl .device-data/tasks-corpus.pt.xz .device-data/init28 .device-data/synonyms.json.xz
# (call 1), .whl .ruler-data/s61 .ruler-data/s67 (call 2), with models/docqa-tiny/*.safetensors,
# docs/journal/2026-12-02-evidence.tar.xz and docs/results/ but this folder deleted from the working
# tree for the calls. The bf16 weights are left in /tmp/next34 and copied to $OUT after each call.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv
mkdir -p /tmp/data /tmp/next34 .train-ckpt
[ -f /tmp/data/corpus.pt ] || xz -T8 -dc .device-data/tasks-corpus.pt.xz > /tmp/data/corpus.pt
INIT=${INIT:-.device-data/init28}  # the weights to start from
cp models/docqa-tiny/tokenizer.json $INIT/{tokenizer_config.json,generation_config.json,docqa.json} /tmp/next34/
[ -f $INIT/tokenizer.json ] || cp models/docqa-tiny/tokenizer.json $INIT/
if [ "${RESUME:-0}" = 1 ]; then START="--resume .train-ckpt/ft34.pt"; else START="--init-from $INIT --start-stage 3"; fi
python3 -m training.train --data /tmp/data --model-dir /tmp/next34 $START --minutes ${MIN:-7.5} \
  --total-minutes ${TOTAL:-10} --batch-size 96 --lr 2e-4 --seed 87 --workers 12 --near-miss-share 0.4 \
  --decoy-share 0.75 --reword-share 0.5 --synonyms .device-data/synonyms.json.xz --written-not-found-share 0.15 \
  --written-unanswered-share 0.3 --filled-context-share 0.8 \
  --task-weights niah=6,kv_retrieval=1,hotpot=4,which_document=1,lookup=5,sentence_qa=3,parsed_qa=5,text_mdm=5,written_qa=1.5 \
  --niah-variant-weights single=3,multikey=3,multivalue=8,multiquery=2,absent=2 \
  --checkpoint .train-ckpt/ft34.pt --log-file $OUT/ft34-log${RESUME:-0}.json 2>&1 | grep -v Warning | awk 'NR%5==1 || /done|model:|rror/' | tail -30
cp /tmp/next34/*.safetensors /tmp/next34/model.safetensors.index.json /tmp/next34/docqa.json $OUT/
