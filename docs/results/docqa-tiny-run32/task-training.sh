#!/bin/bash
# Run 32, run on 2026-12-07 (one H200): run 31's weights (int8, .device-data/run31-int8: run 30's
# plus 1.4 minutes with written_qa's unanswerable share at 0.35; docs/results/docqa-tiny-run31/)
# trained on with run 31's mix. Two calls on the same warm machine:
# - `MIN=7.5 TOTAL=7.5 bash task-training.sh`: run 32, 6,251 steps (train-log-call1.json);
# - `RESUME=1 MIN=6.3 TOTAL=13.8 bash task-training.sh`: run 32b, the checkpoint continued to 11,494
#   steps (train-log-call2.json). TOTAL was raised after the first call ended, so the cosine schedule
#   went back up from 2e-5 to 8.4e-5 at the resume and decayed again.
# Run 31's 1.4 minutes moved refusals the right way (PDFs' wrong answers shown 86 -> 66) at a quarter
# of run 30's reading; this asks whether a longer run keeps both. Judge it on eval-pdfs' wrong
# answers first. Carry: .whl .device-data/tasks-corpus.pt.xz .device-data/run31-int8
# .device-data/synonyms.json.xz, with models/docqa-tiny/*.safetensors,
# docs/journal/2026-12-02-evidence.tar.xz and docs/results/ but this folder deleted from the working
# tree for the call. The bf16 weights are left in /tmp/next32 and copied to $OUT after each call.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv
mkdir -p /tmp/data /tmp/next32 .train-ckpt
[ -f /tmp/data/corpus.pt ] || xz -T8 -dc .device-data/tasks-corpus.pt.xz > /tmp/data/corpus.pt
INIT=${INIT:-.device-data/run31-int8}  # the weights to start from
cp models/docqa-tiny/tokenizer.json $INIT/{tokenizer_config.json,generation_config.json,docqa.json} /tmp/next32/
[ -f $INIT/tokenizer.json ] || cp models/docqa-tiny/tokenizer.json $INIT/
if [ "${RESUME:-0}" = 1 ]; then START="--resume .train-ckpt/ft32.pt"; else START="--init-from $INIT --start-stage 3"; fi
python3 -m training.train --data /tmp/data --model-dir /tmp/next32 $START --minutes ${MIN:-7.5} \
  --total-minutes ${TOTAL:-7.5} --batch-size 96 --lr 2e-4 --seed 83 --workers 12 --near-miss-share 0.4 \
  --decoy-share 0.75 --reword-share 0.5 --synonyms .device-data/synonyms.json.xz --written-not-found-share 0.35 \
  --task-weights niah=6,kv_retrieval=1,hotpot=4,which_document=1,lookup=5,sentence_qa=3,parsed_qa=5,text_mdm=5,written_qa=1.5 \
  --niah-variant-weights single=3,multikey=3,multivalue=8,multiquery=2,absent=2 \
  --checkpoint .train-ckpt/ft32.pt --log-file $OUT/ft32-log${RESUME:-0}.json 2>&1 | grep -v Warning | awk 'NR%5==1 || /done|model:|rror/' | tail -30
cp /tmp/next32/*.safetensors /tmp/next32/model.safetensors.index.json /tmp/next32/docqa.json $OUT/
