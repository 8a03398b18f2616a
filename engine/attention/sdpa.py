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


def sdpa_attention(q, k, v, mask: MaskSpec, scale: float, return_lse: bool = False):
    """Same contract as `reference_attention`.

    SDPA does not expose its log-sum-exp, so with `return_lse` the lse comes from a second,
    fp32 score pass; callers that need lse on a hot path select a backend that returns it natively.
    Fully masked query rows are the caller's to avoid (SDPA returns NaN there).
    """
    assert q.dim() == 4 and k.dim() == 4 and v.dim() == 4, "layout is [B, H, T, D]"
    b, hq, tq, d = q.shape
    hkv = k.shape[1]
    dense = materialize(mask, b, tq, k.shape[2], q.device)
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
