#!/bin/bash
# Run 31, run on 2026-12-07 (one H100) as `MIN=1.4 TOTAL=1.4 bash task-training.sh`: the 1.4 minutes
# that were left of the device budget, not the 7.5 planned (train-log.json). Run 30's weights (int8,
# .device-data/run30-int8: run 30's bf16 weights from its call quantized by
# scripts/quantize_weights.py, with models/docqa-tiny's config and docqa.json; reproducible from
# docs/results/docqa-tiny-run30/task-training.sh) trained on with run 30's mix (written_qa no longer
# reworded by rule), where a third of written_qa's questions are asked with the passage that answers
# left out (--written-not-found-share 0.35), 40% of those near misses: the passage's other
# sentences, or half the time another passage of the same document (TaskSampler.written_qa). Run 30
# answered the PDFs' questions that the manuals do not answer with made-up values (5 of 23 held-out
# "not found"); this is to bring the refusals back while keeping its reading. Judge it on eval-pdfs'
# wrong answers first. From the last curriculum stage; TOTAL minutes in all, MIN this call; RESUME=1
# continues .train-ckpt/ft31.pt on the same warm machine. Carry: .whl
# .device-data/tasks-corpus.pt.xz .device-data/run30-int8 (its tokenizer.json removed)
# .device-data/synonyms.json.xz, with models/docqa-tiny/*.safetensors,
# docs/journal/2026-12-02-evidence.tar.xz and docs/results/ but this folder deleted from the working
# tree for the call. The bf16 weights are left in /tmp/next31.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv
mkdir -p /tmp/data /tmp/next31 .train-ckpt
[ -f /tmp/data/corpus.pt ] || xz -T8 -dc .device-data/tasks-corpus.pt.xz > /tmp/data/corpus.pt
INIT=${INIT:-.device-data/run30-int8}  # the weights to start from
cp models/docqa-tiny/tokenizer.json $INIT/{tokenizer_config.json,generation_config.json,docqa.json} /tmp/next31/
[ -f $INIT/tokenizer.json ] || cp models/docqa-tiny/tokenizer.json $INIT/
if [ "${RESUME:-0}" = 1 ]; then START="--resume .train-ckpt/ft31.pt"; else START="--init-from $INIT --start-stage 3"; fi
python3 -m training.train --data /tmp/data --model-dir /tmp/next31 $START --minutes ${MIN:-7.5} \
  --total-minutes ${TOTAL:-7.5} --batch-size 96 --lr 2e-4 --seed 81 --workers 12 --near-miss-share 0.4 \
  --decoy-share 0.75 --reword-share 0.5 --synonyms .device-data/synonyms.json.xz --written-not-found-share 0.35 \
  --task-weights niah=6,kv_retrieval=1,hotpot=4,which_document=1,lookup=5,sentence_qa=3,parsed_qa=5,text_mdm=5,written_qa=1.5 \
  --niah-variant-weights single=3,multikey=3,multivalue=8,multiquery=2,absent=2 \
  --checkpoint .train-ckpt/ft31.pt --log-file $OUT/ft31-log${RESUME:-0}.json 2>&1 | grep -v Warning | awk 'NR%5==1 || /done|model:|rror/' | tail -30
cp /tmp/next31/*.safetensors /tmp/next31/model.safetensors.index.json /tmp/next31/docqa.json $OUT/
