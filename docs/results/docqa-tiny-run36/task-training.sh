#!/bin/bash
# Run 36 (prepared 2026-12-07, not yet trained; one GPU): run 28's own mix (the shipped model's, no
# written questions) from run 28's int8 weights (.device-data/init28), with the reading tasks'
# passages among real text that fills their chunk (--filled-context-share 0.8, as in runs 34-35):
# whether full chunks alone move the PDFs without the cost the written questions had, in runs 33-35,
# to the held-out lookup families. One call: `MIN=8.5 TOTAL=8.5 bash task-training.sh` (533 s in all
# for run 35's), eval-gpu.sh in a second call on the same warm machine; `RESUME=1` continues
# .train-ckpt/ft36.pt there. Carry: .whl .device-data/tasks-corpus.pt.xz .device-data/init28
# .device-data/synonyms.json.xz (call 1), .whl .ruler-data/s61 .ruler-data/s67 (eval), with
# models/docqa-tiny/*.safetensors, docs/journal/2026-12-02-evidence.tar.xz and docs/results/ but
# this folder deleted from the working tree for the calls. The bf16 weights are left in /tmp/next36
# and copied to $OUT.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv
mkdir -p /tmp/data /tmp/next36 .train-ckpt
[ -f /tmp/data/corpus.pt ] || xz -T8 -dc .device-data/tasks-corpus.pt.xz > /tmp/data/corpus.pt
[ -f /tmp/data/synonyms.json.xz ] || cp .device-data/synonyms.json.xz /tmp/data/
INIT=${INIT:-.device-data/init28}  # the weights to start from
if [ "${RESUME:-0}" = 1 ]; then START="--resume .train-ckpt/ft36.pt"; else
  START="--init-from $INIT --start-stage 3"
  cp models/docqa-tiny/tokenizer.json $INIT/{tokenizer_config.json,generation_config.json,docqa.json} /tmp/next36/
  [ -f $INIT/tokenizer.json ] || cp models/docqa-tiny/tokenizer.json $INIT/
fi
python3 -m training.train --data /tmp/data --model-dir /tmp/next36 $START --minutes ${MIN:-9} \
  --total-minutes ${TOTAL:-14} --batch-size 96 --lr 2e-4 --seed 97 --workers 12 --near-miss-share 0.4 \
  --decoy-share 0.75 --reword-share 0.5 --synonyms /tmp/data/synonyms.json.xz \
  --filled-context-share 0.8 \
  --task-weights niah=6,kv_retrieval=1,hotpot=4,which_document=1,lookup=5,sentence_qa=3,parsed_qa=5,text_mdm=5 \
  --niah-variant-weights single=3,multikey=3,multivalue=8,multiquery=2,absent=2 \
  --checkpoint .train-ckpt/ft36.pt --log-file $OUT/ft36-log${RESUME:-0}.json 2>&1 | grep -v Warning | awk 'NR%5==1 || /done|model:|rror/' | tail -30
cp /tmp/next36/*.safetensors /tmp/next36/model.safetensors.index.json /tmp/next36/docqa.json $OUT/
