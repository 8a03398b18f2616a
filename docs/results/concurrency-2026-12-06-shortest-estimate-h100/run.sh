#!/bin/bash
# GraphPool fix on a GPU; c8 / c16 gathered with the shortest-run estimate; c16 prepared at once.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
{ nvidia-smi --query-gpu=name,memory.total --format=csv; git log --oneline -1; git status --short; } 2>&1 | tee $OUT/gpu.txt
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py tests/test_cuda_graphs.py -k "captured or graph or pool" 2>&1 | tail -15 | tee $OUT/gpu-tests.txt
B="--shape dream-7b --contexts 32768 --answers 32 --prefilter 8 --tokens-per-step 2 --rounds 2 --block-length 32"
timeout 80 python3 -m tools.cli bench $B --concurrency 8 2>&1 | grep -v USDT | tee $OUT/c8.txt
timeout 90 python3 -m tools.cli bench $B --concurrency 16 2>&1 | grep -v USDT | tee $OUT/c16.txt
timeout 90 python3 -m tools.cli bench $B --concurrency 16 --prepare-at-once 2>&1 | grep -v USDT | tee $OUT/c16-at-once.txt
true
