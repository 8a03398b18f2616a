#!/bin/bash
# Run 36's evaluation, in a call after task-training.sh's on the same warm machine: the held-out
# sets at 4K (seeds 61, 67) and the written questions, on the int8 weights
# (scripts/device_eval_run.sh). Carry .whl .ruler-data/s61 .ruler-data/s67.
exec bash scripts/device_eval_run.sh 36
