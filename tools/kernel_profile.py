"""GPU kernels of a torch.profiler run grouped by kind (the profiling scripts' tables)."""

from __future__ import annotations

import re

# First match wins: attention before gemm, since cuDNN's attention kernels carry "sm90" in their names.
KINDS = [("attention", r"flash|fmha|attention|efficient|sdpa"), ("gemm", r"gemm|gemv|cutlass|sm90|matmul|splitK|nvjet"),
         ("split_kv", r"split_kv|_merge_kernel"), ("inductor", r"^triton_"),
         ("softmax/reduce", r"softmax|reduce|argmax|max_|topk|sort"), ("copy/index", r"copy|index|gather|scatter|cat")]


def kernel_summary(prof, steps: int) -> dict[str, dict[str, float]]:
    """GPU kernels grouped by kind (`KINDS`, else "other"): count and ms, per step."""
    out: dict[str, dict[str, float]] = {}
    for evt in prof.key_averages():
        if evt.cpu_time_total > 0 or evt.self_device_time_total <= 0:  # an operator, not a kernel
            continue
        kind = next((k for k, pat in KINDS if re.search(pat, evt.key, re.IGNORECASE)), "other")
        slot = out.setdefault(kind, {"kernels_per_step": 0.0, "ms_per_step": 0.0})
        slot["kernels_per_step"] += evt.count / steps
        slot["ms_per_step"] += evt.self_device_time_total / 1000 / steps
    return out
