#!/bin/bash
# Run 26: run 25's weights (int8, .device-data/init25: models/docqa-tiny-run25 at commit feffbf5) trained
# on with run 25's mix but NIAH multi-value weighted up (4 -> 6 of 16), from the last curriculum stage.
# TOTAL minutes in all, MIN this call. Carry: .whl .device-jobs .device-data/tasks-corpus.pt.xz
# .device-data/init25, with models/docqa-tiny/*.safetensors deleted from the working tree for the calls.
# RESUME=1 continues .train-ckpt/ft26.pt on the same warm machine. Ran 2026-12-06 on one H100 80GB as one
# call, `MIN=8.5 TOTAL=8.5` (6,251 steps; train-log.json). EVAL=1 then quantizes the result to
# int8 and runs it on the 4K held-out sets (.ruler-data, seeds 61 and 67) as ../docqa-tiny-run25/eval-gpu.sh
# does; on 2026-12-06 those same commands ran as a call of their own on the warm machine.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv
mkdir -p /tmp/data /tmp/next26 .train-ckpt
[ -f /tmp/data/corpus.pt ] || xz -T8 -dc .device-data/tasks-corpus.pt.xz > /tmp/data/corpus.pt
cp models/docqa-tiny/tokenizer.json .device-data/init25/{tokenizer_config.json,generation_config.json,docqa.json} /tmp/next26/
[ -f .device-data/init25/tokenizer.json ] || cp models/docqa-tiny/tokenizer.json .device-data/init25/
if [ "${RESUME:-0}" = 1 ]; then START="--resume .train-ckpt/ft26.pt"; else START="--init-from .device-data/init25 --start-stage 3"; fi
python3 -m training.train --data /tmp/data --model-dir /tmp/next26 $START --minutes ${MIN:-8} \
  --total-minutes ${TOTAL:-15} --batch-size 96 --lr 2e-4 --seed 75 --workers 12 --near-miss-share 0.25 \
  --task-weights niah=6,kv_retrieval=1,hotpot=4,which_document=1,lookup=5,sentence_qa=3,parsed_qa=5,text_mdm=5 \
  --niah-variant-weights single=3,multikey=3,multivalue=6,multiquery=2,absent=2 \
  --checkpoint .train-ckpt/ft26.pt --log-file $OUT/ft26-log${RESUME:-0}.json 2>&1 | grep -v Warning | awk 'NR%5==1 || /done|model:|rror/' | tail -30
cp /tmp/next26/*.safetensors /tmp/next26/model.safetensors.index.json /tmp/next26/docqa.json $OUT/
[ "${EVAL:-0}" = 1 ] || exit 0
mkdir -p /tmp/run26 /tmp/ev
cp .device-data/init25/{config.json,tokenizer.json,tokenizer_config.json,generation_config.json} /tmp/run26/
cp /tmp/next26/*.safetensors /tmp/next26/model.safetensors.index.json /tmp/next26/docqa.json /tmp/run26/
rm -rf /tmp/run26-int8; python3 scripts/quantize_weights.py /tmp/run26 /tmp/run26-int8 || exit
T61="lookup_family lookup_paraphrase lookup_framing no_answer niah_absent_key niah_single_1 niah_multivalue qa_1 qa_2"
T67="lookup_family lookup_paraphrase lookup_framing no_answer niah_absent_key niah_single_1 niah_multivalue"
for s in s61 s67; do
  T=$T61; [ $s = s67 ] && T=$T67
  start=$(date +%s)
  python3 -m tools.cli eval --model /tmp/run26-int8 --data .ruler-data/$s --tasks $T --lengths 4096 --modes static \
    --prefilter 64 --bm25-weight 10 --device cuda --out /tmp/ev/run26-$s > /tmp/ev/run26-$s.log 2>&1
  echo "run26 $s rc=$? $(( $(date +%s) - start )) s"
  grep "^| " /tmp/ev/run26-$s/summary.md | head -14
  tar -C /tmp/ev -czf $OUT/evals.tar.gz .
done
