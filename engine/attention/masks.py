"""Attention mask specifications and their dense (boolean) form.

A `MaskSpec` says which keys each query may attend to, without committing to a representation:
backends that can exploit structure (full, causal, per-chunk segments) read the kind; the others call
`materialize`. Keys are the concatenation [past keys | new keys]; query i is the key at index
`Tk - Tq + i` (bottom-right alignment), which is what "causal" means with a cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MASK_KINDS = ("full", "causal", "segments", "dense")


@dataclass(frozen=True)
class MaskSpec:
    kind: str
    # "segments": a query attends to a key iff their segment ids are equal.
    q_segments: torch.Tensor | None = None  # [B, Tq] int
    k_segments: torch.Tensor | None = None  # [B, Tk] int
    # "dense": explicit boolean mask, True = may attend.
    dense: torch.Tensor | None = None  # [B or 1, 1 or H, Tq, Tk] bool
    # Optional key padding applied on top of any kind: False keys are never attended.
    key_valid: torch.Tensor | None = None  # [B, Tk] bool

    def __post_init__(self) -> None:
        if self.kind not in MASK_KINDS:
            raise ValueError(f"unknown mask kind {self.kind!r}; expected one of {MASK_KINDS}")
        if self.kind == "segments" and (self.q_segments is None or self.k_segments is None):
            raise ValueError("a segments mask needs q_segments and k_segments")
        if self.kind == "dense" and (self.dense is None or self.dense.dtype != torch.bool):
            raise ValueError("a dense mask needs a boolean tensor")


def full_mask(key_valid: torch.Tensor | None = None) -> MaskSpec:
    """Bidirectional attention to every (valid) key."""
    return MaskSpec("full", key_valid=key_valid)


def causal_mask(key_valid: torch.Tensor | None = None) -> MaskSpec:
    return MaskSpec("causal", key_valid=key_valid)


def segment_mask(q_segments: torch.Tensor, k_segments: torch.Tensor,
                 key_valid: torch.Tensor | None = None) -> MaskSpec:
    """Block-diagonal attention: queries see only keys of their own segment (e.g. chunk id)."""
    return MaskSpec("segments", q_segments=q_segments, k_segments=k_segments, key_valid=key_valid)


def dense_mask(mask: torch.Tensor) -> MaskSpec:
    if mask.dim() != 4:
        raise ValueError(f"a dense mask must be 4-D [B, 1|H, Tq, Tk], got shape {tuple(mask.shape)}")
    return MaskSpec("dense", dense=mask)


def materialize(spec: MaskSpec, batch: int, tq: int, tk: int,
                device: torch.device) -> torch.Tensor | None:
    """Returns a bool mask broadcastable to [B, H, Tq, Tk] (True = attend), or None for no mask."""
    mask: torch.Tensor | None
    if spec.kind == "full":
        mask = None
    elif spec.kind == "causal":
        q_at = torch.arange(tq, device=device) + (tk - tq)  # [Tq] key index of each query
        mask = (torch.arange(tk, device=device)[None, :] <= q_at[:, None])[None, None]
    elif spec.kind == "segments":
        mask = (spec.q_segments[:, :, None] == spec.k_segments[:, None, :])[:, None]
    else:
        mask = spec.dense
    if spec.key_valid is not None:
        kv = spec.key_valid[:, None, None, :]
        mask = kv if mask is None else mask & kv
    if mask is not None:
        mask = mask.to(device)
        if mask.shape[-2:] != (tq, tk) and mask.shape[-2] != 1:
            raise ValueError(f"mask of shape {tuple(mask.shape)} does not fit Tq={tq}, Tk={tk}")
    return mask


def select_query_rows(spec: MaskSpec, rows: torch.Tensor, tq: int, tk: int) -> MaskSpec:
    """The same mask restricted to some query rows ([R] indices into the Tq queries)."""
    if spec.kind == "full":
        return spec
    if spec.kind == "segments":
        return segment_mask(spec.q_segments[:, rows], spec.k_segments, spec.key_valid)
    dense = materialize(spec, 1, tq, tk, rows.device)
    dense = dense.expand(dense.shape[0], dense.shape[1], tq, tk)[:, :, rows]
    return dense_mask(dense)
