"""y = x W^T for a few rows (a decode step's 32-row block): a Triton kernel and its fp32 reference.

At 32 rows a decode step's matrix multiplies are bound by reading the weights; cuBLAS reads them
at 2.1-3.8 TB/s on an H200 (`scripts/bench_decode_gemms.py`), against about 4.8 TB/s of memory
bandwidth. This kernel streams W [N, K] (the engine's layout, K contiguous) in [BLOCK_N, BLOCK_K]
tiles, each program owning BLOCK_N outputs and 1/SPLIT_K of the K axis, with all M rows in one
tile, so every weight byte is read once. With SPLIT_K > 1 the partial sums go to an fp32
workspace [SPLIT_K, M, N] and a second kernel adds them in a fixed order: no atomics, so the
result is the same on every run (a diffusion decoder commits tokens by confidence thresholds;
run-to-run noise would change answers).

`skinny_linear_reference` is the fp32 oracle; `tests/test_skinny_linear.py` compares the two.

Measured, not adopted (docs/PERFORMANCE.md): the best of 18 plans per product
reads the weights at 2.2-4.2 TB/s, like cuBLAS (4.07 against 4.10 ms a Dream-7B step), so the
engine keeps F.linear. It lives beside its benchmark, off the engine's path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

try:  # Triton is optional: the CPU path never needs it.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on machines without triton
    triton = None


@dataclass(frozen=True)
class SkinnyPlan:
    """How one product is cut into programs (launch settings included)."""

    block_n: int = 64
    block_k: int = 128
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4

    def __post_init__(self) -> None:
        for name in ("block_n", "block_k"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two >= 16, got {value}")
        if self.split_k < 1 or self.num_warps < 1 or self.num_stages < 1:
            raise ValueError("split_k, num_warps and num_stages must be >= 1")


def skinny_linear_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """fp32 oracle: x [M, K] @ weight [N, K]^T -> [M, N] fp32."""
    return x.float() @ weight.float().t()


def k_steps(k: int, plan: SkinnyPlan) -> int:
    """BLOCK_K steps each split walks (the last split may run past K: masked)."""
    return -(-k // (plan.split_k * plan.block_k))


if triton is not None:

    @triton.jit
    def _skinny_kernel(X, W, OUT, M, N, K, stride_xm, stride_wn, stride_os, stride_om, STEPS: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN: tl.constexpr,
                       DOT_FP32: tl.constexpr):
        pid_n = tl.program_id(0)
        split = tl.program_id(1)
        offs_m = tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = split * STEPS * BLOCK_K + tl.arange(0, BLOCK_K)
        x_ptr = X + offs_m[:, None] * stride_xm + offs_k[None, :]  # [BLOCK_M, BLOCK_K]
        w_ptr = W + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]  # [BLOCK_N, BLOCK_K]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for _ in range(0, STEPS):
            if EVEN:  # N and K cut evenly: no masks in the hot loop
                w = tl.load(w_ptr)
                x = tl.load(x_ptr, mask=offs_m[:, None] < M, other=0.0)
            else:
                k_ok = offs_k[None, :] < K
                w = tl.load(w_ptr, mask=(offs_n[:, None] < N) & k_ok, other=0.0)
                x = tl.load(x_ptr, mask=(offs_m[:, None] < M) & k_ok, other=0.0)
            if DOT_FP32:  # Triton's interpreter multiplies raw bits in a bf16 dot: the CPU tests go through fp32
                acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
            else:
                acc = tl.dot(x, tl.trans(w), acc)
            offs_k += BLOCK_K
            x_ptr += BLOCK_K
            w_ptr += BLOCK_K
        out = OUT + split * stride_os + offs_m[:, None] * stride_om + offs_n[None, :]
        tl.store(out, acc.to(OUT.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))

    @triton.jit
    def _sum_splits_kernel(PART, OUT, MN, stride_ps, S: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < MN
        total = tl.zeros((BLOCK,), dtype=tl.float32)
        for s in tl.static_range(S):  # a fixed order: the same sum on every run
            total += tl.load(PART + s * stride_ps + offs, mask=ok, other=0.0)
        tl.store(OUT + offs, total.to(OUT.dtype.element_ty), mask=ok)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def kernel_usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `skinny_linear` can run these operands (else use F.linear)."""
    return (triton is not None and x.dim() == 2 and weight.dim() == 2 and x.shape[1] == weight.shape[1]
            and x.dtype == weight.dtype and x.dtype in (torch.bfloat16, torch.float16)
            and x.device == weight.device and x.stride(-1) == 1 and weight.stride(-1) == 1
            and x.shape[0] <= 64)


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, plan: SkinnyPlan = SkinnyPlan(),
                  workspace: torch.Tensor | None = None) -> torch.Tensor:
    """x [M <= 64, K] @ weight [N, K]^T -> [M, N] in x's dtype, accumulated in fp32.

    `workspace`: fp32 [split_k, M, N] for the partial sums when split_k > 1 (allocated if None;
    a caller capturing CUDA graphs passes its own)."""
    assert kernel_usable(x, weight), "operands the kernel cannot run: check kernel_usable first"
    if not x.is_cuda and not _interpreting():
        raise ValueError("skinny_linear needs CUDA tensors, or Triton's interpreter for CPU ones (TRITON_INTERPRET=1)")
    m, k = x.shape
    n = weight.shape[0]
    block_m = max(16, triton.next_power_of_2(m))
    steps = k_steps(k, plan)
    even = n % plan.block_n == 0 and k == plan.split_k * steps * plan.block_k
    out = torch.empty(m, n, device=x.device, dtype=x.dtype)
    if plan.split_k == 1:
        part, stride_os = out, 0
    else:
        part = workspace if workspace is not None else torch.empty(plan.split_k, m, n, device=x.device,
                                                                    dtype=torch.float32)
        assert part.shape == (plan.split_k, m, n) and part.dtype == torch.float32 and part.is_contiguous()
        stride_os = part.stride(0)
    grid = (triton.cdiv(n, plan.block_n), plan.split_k)
    _skinny_kernel[grid](x, weight, part, m, n, k, x.stride(0), weight.stride(0), stride_os, part.stride(-2),
                         STEPS=steps, BLOCK_M=block_m, BLOCK_N=plan.block_n, BLOCK_K=plan.block_k,
                         EVEN=even, DOT_FP32=_interpreting(), num_warps=plan.num_warps, num_stages=plan.num_stages)
    if plan.split_k > 1:
        block = 1024
        _sum_splits_kernel[(triton.cdiv(m * n, block),)](part, out, m * n, part.stride(0), S=plan.split_k,
                                                          BLOCK=block, num_warps=4)
    return out
