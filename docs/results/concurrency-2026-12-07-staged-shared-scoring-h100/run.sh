#!/bin/bash
# Issue 23, 8 at once: shared scoring passes staged and captured (KV copied once into a staging with
# room for the rows' KV, no per-layer concatenation; BOS/content mass from the attention's lse).
# Decisions made together queue behind the batched forward (no host sync for their inputs).
# GPU tests of the scoring paths and the scheduler, then c8 and c16 after, and c8 before in a
# worktree of the base commit 7f86c86, all on this one machine (~7-8 min on an H100).
# Carry: [".whl", ".device-jobs"]. Results under $OUT.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total --format=csv; git log --oneline -1; git status --short | head -20; } 2>&1 | tee $OUT/gpu.txt
export PYTHONPATH=/tmp/site:$PWD
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py tests/test_cuda_graphs.py \
    tests/test_scheduler.py tests/test_attention.py tests/test_decode.py -k "not full_size" 2>&1 | tail -25 | tee $OUT/gpu-tests.txt
B="--shape dream-7b --contexts 32768 --answers 32 --prefilter 8 --tokens-per-step 2 --rounds 2 --block-length 32"
timeout 110 python3 -m tools.cli bench $B --concurrency 8 2>&1 | grep -v USDT | tee $OUT/c8-after.txt
timeout 130 python3 -m tools.cli bench $B --concurrency 16 2>&1 | grep -v USDT | tee $OUT/c16-after.txt
# Before: the base commit's engine with this bench harness (its warm-up), same machine, same flags.
if git worktree add -f /tmp/before 7f86c86 >/dev/null 2>&1 && cp tools/load_bench.py /tmp/before/tools/; then
    (cd /tmp/before && PYTHONPATH=/tmp/site:/tmp/before timeout 110 python3 -m tools.cli bench $B --concurrency 8 2>&1 \
        | grep -v USDT) | tee $OUT/c8-before.txt
else
    echo "no worktree of 7f86c86 on this machine: no 'before' row" | tee $OUT/c8-before.txt
fi
true
