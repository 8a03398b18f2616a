"""Combining partial attention results by log-sum-exp (FlashInfer's merge_state math)."""

from __future__ import annotations

import torch


def merge_attention_states(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                           lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over keys A ∪ B from attention over A and over B separately.

    out_*: [B, H, T, D]; lse_*: [B, H, T] natural-log sums of exp(scores). A side with lse = -inf
    (no visible key) contributes nothing. Returns (out in out_a's dtype, lse fp32).
    """
    lse_a, lse_b = lse_a.float(), lse_b.float()
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)  # both empty: avoid inf - inf
    w_a = torch.exp(lse_a - m)
    w_b = torch.exp(lse_b - m)
    total = w_a + w_b
    out = (out_a.float() * w_a[..., None] + out_b.float() * w_b[..., None])
    out = out / total.clamp_min(torch.finfo(torch.float32).tiny)[..., None]
    lse = m + torch.log(total)
    return out.to(out_a.dtype), lse


def merge_many(outs: list[torch.Tensor], lses: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Folds `merge_attention_states` over several partial results (e.g. one per KV page)."""
    assert outs and len(outs) == len(lses)
    out, lse = outs[0], lses[0]
    for o, s in zip(outs[1:], lses[1:], strict=True):
        out, lse = merge_attention_states(out, lse, o, s)
    return out, lse
