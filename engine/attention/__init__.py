"""Attention backends behind one interface.

Every backend is a function
    attend(q [B, Hq, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, D], mask: MaskSpec, scale: float,
           return_lse: bool) -> (out [B, Hq, Tq, D], lse [B, Hq, Tq] fp32 | None)
with GQA by head-major repeat (KV head j serves query heads j*g .. j*g+g-1). The model calls
whichever backend it was given and never asks which one it is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType

import torch

from engine.attention.masks import (
    MaskSpec,
    causal_mask,
    dense_mask,
    full_mask,
    materialize,
    segment_mask,
)
from engine.attention.merge import merge_attention_states, merge_many
from engine.attention.reference import attention_probs, bos_probs, reference_attention
from engine.attention.sdpa import native_lse, sdpa_attention

logger = logging.getLogger(__name__)

AttendFn = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


@dataclass(frozen=True)
class AttentionBackend:
    name: str
    attend: AttendFn

    def __call__(self, q, k, v, mask: MaskSpec, scale: float, return_lse: bool = False):
        return self.attend(q, k, v, mask, scale, return_lse)


BACKENDS = MappingProxyType({
    "reference": AttentionBackend("reference", reference_attention),
    "sdpa": AttentionBackend("sdpa", sdpa_attention),
})


def select_backend(device: torch.device | str, dtype: torch.dtype, needs_lse: bool = False,
                   override: str | None = None) -> AttentionBackend:
    """Picks the attention backend for a device; logs why when it falls back."""
    if override is not None:
        if override not in BACKENDS:
            raise ValueError(f"unknown attention backend {override!r}; choose from {sorted(BACKENDS)}")
        return BACKENDS[override]
    if needs_lse and not native_lse(device, dtype):
        logger.info("attention: 'reference' chosen because the caller needs log-sum-exp and SDPA "
                    "gives it natively only on CUDA, not on %s", device)
        return BACKENDS["reference"]
    return BACKENDS["sdpa"]


__all__ = [
    "AttentionBackend", "BACKENDS", "MaskSpec", "attention_probs", "bos_probs", "causal_mask", "dense_mask",
    "full_mask", "materialize", "merge_attention_states", "merge_many", "reference_attention",
    "sdpa_attention", "segment_mask", "select_backend",
]
