"""Rotary position embeddings, rotate-half (NeoX / HF-Llama) layout, and exact re-rotation.

Keys are cached *after* RoPE. Because RoPE is a rotation by an angle proportional to the position,
moving a cached key by `delta` positions is one more rotation by the angle of `delta`
(`rerotate`), never a re-encode.
"""

from __future__ import annotations

import torch


def inverse_frequencies(head_dim: int, theta: float, device: torch.device | None = None) -> torch.Tensor:
    """[head_dim / 2] fp32, computed as HF Qwen2 / Llama do (so fp32 parity is exact)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    return 1.0 / (theta ** exponents)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float,
                 scaling_factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin fp32 of shape [*positions.shape, head_dim] for integer or float positions."""
    inv_freq = inverse_frequencies(head_dim, theta, positions.device)
    pos = positions.float() / scaling_factor
    freqs = pos[..., None] * inv_freq  # [..., D/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # duplicated halves: rotate-half layout
    return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, in_fp32: bool) -> torch.Tensor:
    """x [B, H, T, D]; cos/sin [B, T, D] fp32. Returns x rotated, in x's dtype.

    in_fp32=True upcasts x (LLaDA); False applies in x's dtype with cos/sin cast to it (Dream, HF).
    """
    cos, sin = cos[:, None], sin[:, None]  # broadcast over heads
    if in_fp32:
        x32 = x.float()
        return (x32 * cos + rotate_half(x32) * sin).to(x.dtype)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + rotate_half(x) * sin


def shift_cos_sin(delta: torch.Tensor, head_dim: int, theta: float,
                  scaling_factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [*delta.shape, head_dim / 2] fp32 of a shift by `delta` positions.

    The angles are computed in float64: an fp32 angle at a shift of 1e5 positions is off by up to
    4e-3 rad (half an ulp of 1e5), which would show in the moved keys.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=delta.device) / head_dim))
    freqs = (delta.to(torch.float64) / scaling_factor)[..., None] * inv_freq
    return freqs.cos().float(), freqs.sin().float()


def rerotate(keys: torch.Tensor, delta: torch.Tensor | int, theta: float,
             scaling_factor: float = 1.0) -> torch.Tensor:
    """Moves post-RoPE keys by `delta` positions: keys at p become keys at p + delta.

    keys: [..., T, D]; delta: an int or a tensor broadcastable to keys.shape[:-1] (per token or per
    chunk). Angles in float64 (`shift_cos_sin`); the rotation runs in fp32 and the result is
    returned in keys' dtype.
    """
    if not torch.is_tensor(delta):
        delta = torch.tensor(delta)
    cos, sin = shift_cos_sin(delta.to(keys.device), keys.shape[-1], theta, scaling_factor)
    cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
    k32 = keys.float()
    return (k32 * cos + rotate_half(k32) * sin).to(keys.dtype)
