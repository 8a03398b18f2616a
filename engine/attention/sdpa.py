"""PyTorch scaled_dot_product_attention backend (CPU and GPU)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.attention.masks import MaskSpec, materialize
from engine.attention.reference import attention_scores


def _grouped_queries(q: torch.Tensor, mask: torch.Tensor, hkv: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, Hq, Tq, D] and its mask (broadcastable to [B, Hq, Tq, Tk]) with each KV head's query
    group stacked on the query axis: q [B, Hkv, g * Tq, D], mask broadcastable to [B, Hkv, g * Tq, Tk].

    Why: SDPA's fused CUDA kernels (through torch 2.11 at least) take no mask with `enable_gqa`;
    it then falls back to its math path, which copies every KV head g times ([B, Hq, Tk, D], g = 7
    at Dream-7B's shape: a batched decode step masks its rows' padding). Grouped queries see the
    KV heads as they are and take the memory-efficient kernel.
    """
    b, hq, tq, d = q.shape
    g = hq // hkv
    grouped = q.reshape(b, hkv, g * tq, d)  # head-major GQA: KV head j serves query heads j*g .. j*g+g-1
    if mask.shape[1] == 1 and mask.shape[2] == 1:  # one row of keys (key padding): fits any query
        return grouped, mask
    mb, tk = mask.shape[0], mask.shape[-1]
    if mask.shape[1] == 1:  # one mask for every head: [mb, 1, Tq, Tk] -> [mb, 1, g * Tq, Tk], row r = query r % Tq
        return grouped, mask.expand(mb, 1, tq, tk).repeat(1, 1, g, 1)
    # a mask per query head: [mb, Hq, Tq or 1, Tk] -> [mb, Hkv, g, Tq, Tk] -> [mb, Hkv, g * Tq, Tk]
    return grouped, mask.expand(mb, hq, tq, tk).reshape(mb, hkv, g * tq, tk)


# The memory-efficient kernel reads its additive bias rows at a stride of a multiple of this many
# elements (F.scaled_dot_product_attention pads a mask the same way before calling it).
_BIAS_ALIGNMENT = 16


def _additive_bias(mask: torch.Tensor, shape: tuple[int, int, int, int], dtype: torch.dtype) -> torch.Tensor:
    """A bool mask broadcastable to `shape` [B, H, Tq, Tk] as the additive bias the memory-efficient
    kernel takes: 0 where attended, -inf elsewhere, in q's dtype, rows at an aligned stride (a view of
    a key-padded tensor) and broadcast dims kept at stride 0."""
    tk = shape[-1]
    padded = -(-tk // _BIAS_ALIGNMENT) * _BIAS_ALIGNMENT
    bias = torch.full((*mask.shape[:-1], padded), float("-inf"), dtype=dtype, device=mask.device)
    bias[..., :tk].masked_fill_(mask.expand(*mask.shape[:-1], tk), 0.0)
    return bias[..., :tk].expand(shape)


def _efficient_attention_with_lse(q, k, v, mask: torch.Tensor | None, scale: float):
    """CUDA: the memory-efficient kernel, which returns its log-sum-exp: out [B, Hq, Tq, D] and
    lse [B, Hq, Tq] fp32. GQA by grouped queries (q [B, Hkv, g * Tq, D]), as `sdpa_attention`."""
    b, hq, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    g = hq // hkv
    grouped, bias = q.reshape(b, hkv, g * tq, d), None  # head-major GQA, as `_grouped_queries`
    if mask is not None:
        grouped, grouped_mask = _grouped_queries(q, mask, hkv)
        bias = _additive_bias(grouped_mask, (b, hkv, g * tq, tk), q.dtype)
    out, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(
        grouped, k, v, bias, True, 0.0, False, scale=scale)
    # lse [B, Hkv, >= g * Tq] (rows padded by the kernel): grouped row gi * Tq + t is head j * g + gi
    return out.reshape(b, hq, tq, d), lse[..., :g * tq].reshape(b, hq, tq)


def native_lse(device: torch.device | str, dtype: torch.dtype) -> bool:
    """Whether `sdpa_attention` returns its log-sum-exp from the kernel (else a second fp32 pass)."""
    return torch.device(device).type == "cuda" and dtype in (torch.float16, torch.bfloat16, torch.float32)


def sdpa_attention(q, k, v, mask: MaskSpec, scale: float, return_lse: bool = False):
    """Same contract as `reference_attention`.

    With `return_lse`: on CUDA the memory-efficient kernel gives the log-sum-exp with the output;
    elsewhere SDPA does not expose it, so it comes from a second, fp32 score pass.
    Fully masked query rows are the caller's to avoid (SDPA returns NaN there).
    """
    assert q.dim() == 4 and k.dim() == 4 and v.dim() == 4, "layout is [B, H, T, D]"
    b, hq, tq, d = q.shape
    hkv = k.shape[1]
    dense = materialize(mask, b, tq, k.shape[2], q.device)
    if return_lse and native_lse(q.device, q.dtype):
        return _efficient_attention_with_lse(q, k, v, dense, scale)
    if hq != hkv and dense is not None:
        grouped, grouped_mask = _grouped_queries(q, dense, hkv)
        out = F.scaled_dot_product_attention(grouped, k, v, attn_mask=grouped_mask, scale=scale)
        out = out.reshape(b, hq, tq, d)
    else:  # no mask, or no GQA: SDPA's own kernels (its enable_gqa reads KV head j for query heads j*g .. j*g+g-1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=dense, scale=scale, enable_gqa=hq != hkv)
    lse = None
    if return_lse:
        lse = torch.logsumexp(attention_scores(q, k, mask, scale), dim=-1)
    return out, lse
