#!/bin/bash
# Issue 23: the same bench at answer blocks of 32, 16 and 8 tokens (32-token answers, two tokens a
# step), 8 and 16 users, on one machine. Shorter blocks recompute fewer rows a step: at 8 users a
# 32-token block is 256 rows a step, compute-bound; 16-token blocks are 128. Carry [".whl", ".device-jobs"].
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
{ nvidia-smi --query-gpu=name,memory.total --format=csv; git log --oneline -1; git status --short | head; } 2>&1 | tee $OUT/gpu.txt
B="--shape dream-7b --contexts 32768 --answers 32 --prefilter 8 --tokens-per-step 2 --rounds 2"
for L in 16 8; do
  for N in 8 16; do
    timeout 130 python3 -m tools.cli bench $B --block-length $L --concurrency $N 2>&1 | grep -v USDT | tee $OUT/c$N-block$L.txt
  done
done
true
