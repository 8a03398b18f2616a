#!/bin/bash
# Run 33 (2026-12-07, one GPU): run 28's weights (int8, the shipped model, copied to
# .device-data/init28) trained on with run 28's mix plus written_qa (weight 1.5, as run 30) over the
# written questions with their unanswered ones (training/data/written_questions.jsonl: 2 questions
# on each passage's topic that it does not answer; two new collections, written-debref and
# written-sqlite): of written_qa's examples, 30% ask an unanswered question over the item's whole
# passage ("not found", --written-unanswered-share 0.3), and of the rest 15% leave the passage out
# or show a near miss (--written-not-found-share 0.15, run 30's). Run 30 learned to read people's
# questions (held-out written 2 -> 22%) and to answer every one; this asks whether a passage on the
# question's subject that does not state the value teaches the refusal back.
# Two calls on the same warm machine: `MIN=8 TOTAL=11 bash task-training.sh`, then
# `RESUME=1 MIN=3 TOTAL=11 bash task-training.sh && bash eval-gpu.sh`.
# Carry: .whl .device-data/tasks-corpus.pt.xz .device-data/init28 .device-data/synonyms.json.xz
# (call 1), .whl .ruler-data/s61 .ruler-data/s67 (call 2), with models/docqa-tiny/*.safetensors,
# docs/journal/2026-12-02-evidence.tar.xz and docs/results/ but this folder deleted from the working
# tree for the calls. The bf16 weights are left in /tmp/next33 and copied to $OUT after each call.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv
mkdir -p /tmp/data /tmp/next33 .train-ckpt
[ -f /tmp/data/corpus.pt ] || xz -T8 -dc .device-data/tasks-corpus.pt.xz > /tmp/data/corpus.pt
INIT=${INIT:-.device-data/init28}  # the weights to start from
cp models/docqa-tiny/tokenizer.json $INIT/{tokenizer_config.json,generation_config.json,docqa.json} /tmp/next33/
[ -f $INIT/tokenizer.json ] || cp models/docqa-tiny/tokenizer.json $INIT/
if [ "${RESUME:-0}" = 1 ]; then START="--resume .train-ckpt/ft33.pt"; else START="--init-from $INIT --start-stage 3"; fi
python3 -m training.train --data /tmp/data --model-dir /tmp/next33 $START --minutes ${MIN:-8} \
  --total-minutes ${TOTAL:-11} --batch-size 96 --lr 2e-4 --seed 87 --workers 12 --near-miss-share 0.4 \
  --decoy-share 0.75 --reword-share 0.5 --synonyms .device-data/synonyms.json.xz --written-not-found-share 0.15 \
  --written-unanswered-share 0.3 \
  --task-weights niah=6,kv_retrieval=1,hotpot=4,which_document=1,lookup=5,sentence_qa=3,parsed_qa=5,text_mdm=5,written_qa=1.5 \
  --niah-variant-weights single=3,multikey=3,multivalue=8,multiquery=2,absent=2 \
  --checkpoint .train-ckpt/ft33.pt --log-file $OUT/ft33-log${RESUME:-0}.json 2>&1 | grep -v Warning | awk 'NR%5==1 || /done|model:|rror/' | tail -30
cp /tmp/next33/*.safetensors /tmp/next33/model.safetensors.index.json /tmp/next33/docqa.json $OUT/
