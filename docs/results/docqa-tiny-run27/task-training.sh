#!/bin/bash
# Run 27: run 26's weights (int8, .device-data/init26: models/docqa-tiny at commit 60ced0e, its
# tokenizer.json left out to stay within the 64 MiB a call carries) trained on with run 26's mix,
# half of sentence_qa's and parsed_qa's questions reworded as people ask
# (training.reworded_questions, WordNet synonyms from `python -m training.synonyms --out
# .device-data/synonyms.json.xz`), from the last curriculum stage. TOTAL minutes in all, MIN this
# call. Carry: .whl .device-data/tasks-corpus.pt.xz .device-data/init26 .device-data/synonyms.json.xz,
# with models/docqa-tiny/*.safetensors and docs/journal/2026-12-02-evidence.tar.xz deleted from the
# working tree for the call. RESUME=1 continues .train-ckpt/ft27.pt on the same warm machine.
# The bf16 weights are left in /tmp/next27 for eval-gpu.sh (a call of its own on the warm machine).
# Ran 2026-12-07 as `MIN=6 TOTAL=6 bash docs/results/docqa-tiny-run27/task-training.sh` on one H100
# (4,133 steps, 6.0 min; log: train-log.json beside this script).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv
mkdir -p /tmp/data /tmp/next27 .train-ckpt
[ -f /tmp/data/corpus.pt ] || xz -T8 -dc .device-data/tasks-corpus.pt.xz > /tmp/data/corpus.pt
INIT=${INIT:-.device-data/init26}  # the weights to start from (run 27 started from run 26's)
cp models/docqa-tiny/tokenizer.json $INIT/{tokenizer_config.json,generation_config.json,docqa.json} /tmp/next27/
[ -f $INIT/tokenizer.json ] || cp models/docqa-tiny/tokenizer.json $INIT/
if [ "${RESUME:-0}" = 1 ]; then START="--resume .train-ckpt/ft27.pt"; else START="--init-from $INIT --start-stage 3"; fi
python3 -m training.train --data /tmp/data --model-dir /tmp/next27 $START --minutes ${MIN:-8} \
  --total-minutes ${TOTAL:-15} --batch-size 96 --lr 2e-4 --seed 76 --workers 12 --near-miss-share 0.25 \
  --reword-share 0.5 --synonyms .device-data/synonyms.json.xz \
  --task-weights niah=6,kv_retrieval=1,hotpot=4,which_document=1,lookup=5,sentence_qa=3,parsed_qa=5,text_mdm=5 \
  --niah-variant-weights single=3,multikey=3,multivalue=6,multiquery=2,absent=2 \
  --checkpoint .train-ckpt/ft27.pt --log-file $OUT/ft27-log${RESUME:-0}.json 2>&1 | grep -v Warning | awk 'NR%5==1 || /done|model:|rror/' | tail -30
cp /tmp/next27/*.safetensors /tmp/next27/model.safetensors.index.json /tmp/next27/docqa.json $OUT/
