#!/bin/bash
# Run 30: run 28's weights (int8, .device-data/init28: models/docqa-tiny at commit 7f86c86 without
# its tokenizer.json, to stay within the 64 MiB a call carries) trained on with run 28's mix plus
# questions written as people ask them over manuals' passages (written_qa: training.written_questions,
# the held-out collection left out), so that the reader meets people's wordings over real pages.
# From the last curriculum stage; TOTAL minutes in all, MIN this call; RESUME=1 continues
# .train-ckpt/ft30.pt on the same warm machine. Carry: .whl .device-data/tasks-corpus.pt.xz
# .device-data/init28 .device-data/synonyms.json.xz, with models/docqa-tiny/*.safetensors,
# docs/journal/2026-12-02-evidence.tar.xz and docs/results/ but this folder deleted from the working
# tree for the call. The bf16 weights are left in /tmp/next30 for eval-gpu.sh (a call of its own on
# the warm machine).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv
mkdir -p /tmp/data /tmp/next30 .train-ckpt
[ -f /tmp/data/corpus.pt ] || xz -T8 -dc .device-data/tasks-corpus.pt.xz > /tmp/data/corpus.pt
INIT=${INIT:-.device-data/init28}  # the weights to start from
cp models/docqa-tiny/tokenizer.json $INIT/{tokenizer_config.json,generation_config.json,docqa.json} /tmp/next30/
[ -f $INIT/tokenizer.json ] || cp models/docqa-tiny/tokenizer.json $INIT/
if [ "${RESUME:-0}" = 1 ]; then START="--resume .train-ckpt/ft30.pt"; else START="--init-from $INIT --start-stage 3"; fi
python3 -m training.train --data /tmp/data --model-dir /tmp/next30 $START --minutes ${MIN:-7.5} \
  --total-minutes ${TOTAL:-7.5} --batch-size 96 --lr 2e-4 --seed 80 --workers 12 --near-miss-share 0.4 \
  --decoy-share 0.75 --reword-share 0.5 --synonyms .device-data/synonyms.json.xz \
  --task-weights niah=6,kv_retrieval=1,hotpot=4,which_document=1,lookup=5,sentence_qa=3,parsed_qa=5,text_mdm=5,written_qa=1.5 \
  --niah-variant-weights single=3,multikey=3,multivalue=8,multiquery=2,absent=2 \
  --checkpoint .train-ckpt/ft30.pt --log-file $OUT/ft30-log${RESUME:-0}.json 2>&1 | grep -v Warning | awk 'NR%5==1 || /done|model:|rror/' | tail -30
cp /tmp/next30/*.safetensors /tmp/next30/model.safetensors.index.json /tmp/next30/docqa.json $OUT/
