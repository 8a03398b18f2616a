"""PyTorch scaled_dot_product_attention backend (CPU and GPU)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.attention.masks import MaskSpec, materialize
from engine.attention.reference import attention_scores


def sdpa_attention(q, k, v, mask: MaskSpec, scale: float, return_lse: bool = False):
    """Same contract as `reference_attention`.

    SDPA does not expose its log-sum-exp, so with `return_lse` the lse comes from a second,
    fp32 score pass; callers that need lse on a hot path select a backend that returns it natively.
    Fully masked query rows are the caller's to avoid (SDPA returns NaN there).
    """
    assert q.dim() == 4 and k.dim() == 4 and v.dim() == 4, "layout is [B, H, T, D]"
    dense = materialize(mask, q.shape[0], q.shape[2], k.shape[2], q.device)
    gqa = q.shape[1] != k.shape[1]  # SDPA's enable_gqa repeats KV heads head-major, as we do
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=dense, scale=scale, enable_gqa=gqa)
    lse = None
    if return_lse:
        lse = torch.logsumexp(attention_scores(q, k, mask, scale), dim=-1)
    return out, lse
