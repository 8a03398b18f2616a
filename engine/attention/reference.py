"""The fp32 reference attention: einsum, explicit boolean mask, softmax in fp32. The test oracle."""

from __future__ import annotations

import torch

from engine.attention.masks import MaskSpec, materialize


def _check_layout(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    assert q.dim() == 4 and k.dim() == 4 and v.dim() == 4, "layout is [B, H, T, D]"
    assert k.shape == v.shape, f"k {tuple(k.shape)} and v {tuple(v.shape)} differ"
    assert q.shape[0] == k.shape[0] and q.shape[3] == k.shape[3], "batch or head_dim mismatch"
    assert q.shape[1] % k.shape[1] == 0, "query heads must be a multiple of KV heads"


def attention_scores(q: torch.Tensor, k: torch.Tensor, mask: MaskSpec, scale: float) -> torch.Tensor:
    """Masked fp32 scores [B, Hq, Tq, Tk]; masked entries are -inf. GQA by head-major repeat."""
    _check_layout(q, k, k)
    b, hq, tq, d = q.shape
    hkv = k.shape[1]
    # KV head j serves query heads j*g..j*g+g-1: group the queries rather than repeat the keys, so
    # no [B, Hq, Tk, D] fp32 copy is made (scoring captures these probs in every layer).
    q32 = q.float().view(b, hkv, hq // hkv, tq, d)
    scores = torch.einsum("bhgqd,bhkd->bhgqk", q32, k.float()).reshape(b, hq, tq, -1) * scale
    dense = materialize(mask, q.shape[0], q.shape[2], k.shape[2], q.device)
    if dense is not None:
        scores = scores.masked_fill(~dense, float("-inf"))
    return scores


def attention_probs(q: torch.Tensor, k: torch.Tensor, mask: MaskSpec, scale: float) -> torch.Tensor:
    """fp32 attention probabilities [B, Hq, Tq, Tk]; a row with no visible key is all zeros."""
    scores = attention_scores(q, k, mask, scale)
    probs = torch.softmax(scores, dim=-1)
    return torch.nan_to_num(probs, nan=0.0)


def reference_attention(q, k, v, mask: MaskSpec, scale: float, return_lse: bool = False):
    """out [B, Hq, Tq, D] in q's dtype, and lse [B, Hq, Tq] fp32 (natural log) if asked.

    Rows with no visible key give out = 0 and lse = -inf, the neutral element of
    `merge_attention_states`.
    """
    _check_layout(q, k, v)
    scores = attention_scores(q, k, mask, scale)
    lse = torch.logsumexp(scores, dim=-1)  # [B, Hq, Tq]
    probs = torch.exp(scores - lse[..., None])
    probs = torch.nan_to_num(probs, nan=0.0)
    b, hq, tq, tk = probs.shape
    hkv = v.shape[1]
    out = torch.einsum("bhgqk,bhkd->bhgqd", probs.view(b, hkv, hq // hkv, tq, tk), v.float())
    return out.reshape(b, hq, tq, -1).to(q.dtype), (lse if return_lse else None)


def bos_probs(q: torch.Tensor, bos_keys: torch.Tensor, lse: torch.Tensor, scale: float) -> torch.Tensor:
    """fp32 attention probabilities on a few keys from the rows' log-sum-exp over all their keys:
    q [B, Hq, Tq, D], bos_keys [B, Hkv, K, D], lse [B, Hq, Tq] -> [B, Hq, Tq, K] (GQA head-major).
    Why: a kernel that returns its lse spares the full [B, Hq, Tq, Tk] fp32 probabilities when only
    K keys' mass is wanted (each chunk's BOS: K scores a row, a tiny matmul). The keys must be
    visible to the rows (a masked key's probability is 0, which this does not know)."""
    b, hq, tq, d = q.shape
    hkv = bos_keys.shape[1]
    scores = torch.einsum("bhgqd,bhkd->bhgqk", q.float().view(b, hkv, hq // hkv, tq, d), bos_keys.float())
    return torch.exp(scores.reshape(b, hq, tq, -1) * scale - lse[..., None])
