"""How keys and values are kept in KV files: 8-bit floats with scales, or 16-bit floats.

- `fp8`: float8 e4m3 with one float32 scale per (layer, chunk, KV head), the block's largest
  magnitude over 448 (e4m3's largest finite value). e4m3 keeps 3 mantissa bits whatever the
  magnitude, so one scale a block loses little: it only has to keep the block inside e4m3's range
  (normal numbers from 2^-6 to 448, a span of 2^15). Half of bf16's bytes; the scales add 4 bytes
  per `chunk_size x head_dim` values (0.05% at 128 x 64).
- `bf16`: the engine's dtype when it computes in 16 bits, else bf16.

Files say which one they hold (a `keys_scale` tensor is there or not), so a reader never needs to
be told. Pure functions: tensors in, tensors out.
"""

from __future__ import annotations

import torch

KV_ENCODINGS = ("fp8", "bf16")
DEFAULT_KV_ENCODING = "fp8"
FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
SCALE_NAMES = ("keys_scale", "values_scale")


def check_encoding(encoding: str) -> str:
    if encoding not in KV_ENCODINGS:
        raise ValueError(f"unknown KV encoding {encoding!r}; choose from {', '.join(KV_ENCODINGS)}")
    return encoding


def sixteen_bit(dtype: torch.dtype) -> torch.dtype:
    """The 16-bit dtype `bf16` files keep for an engine computing in `dtype`: its own when it is
    16-bit, else bf16 (an fp32 CPU engine's KV would take twice the disk for digits the GPU path
    never has)."""
    return dtype if torch.finfo(dtype).bits <= 16 else torch.bfloat16


def quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [L, N, H, C, D] -> (e4m3 values [L, N, H, C, D], float32 scales [L, N, H])."""
    amax = x.abs().amax(dim=(3, 4)).float()  # [L, N, H]
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (x.float() / scale[..., None, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(e4m3 [L, N, H, C, D], scales [L, N, H]) -> [L, N, H, C, D] in `dtype` (on q's device)."""
    return (q.to(torch.float32) * scale.to(q.device, torch.float32)[..., None, None]).to(dtype)


def encode_kv(keys: torch.Tensor, values: torch.Tensor, encoding: str) -> dict[str, torch.Tensor]:
    """Keys and values [L, N, H, C, D] as the tensors a file of `encoding` holds."""
    if check_encoding(encoding) == "fp8":
        qk, sk = quantize_fp8(keys)
        qv, sv = quantize_fp8(values)
        return {"keys": qk, "values": qv, "keys_scale": sk, "values_scale": sv}
    stored = sixteen_bit(keys.dtype)
    return {"keys": keys.to(stored), "values": values.to(stored)}


def decode_kv(tensors: dict[str, torch.Tensor], dtype: torch.dtype,
              device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values in `dtype` on `device` from a file's tensors (either encoding). The 8-bit
    bytes move to the device first, so a GPU load transfers half of bf16's."""
    out = []
    for name, scale_name in zip(("keys", "values"), SCALE_NAMES, strict=True):
        stored = tensors[name].to(device)
        scale = tensors.get(scale_name)
        out.append(dequantize_fp8(stored, scale, dtype) if scale is not None else stored.to(dtype))
    return out[0], out[1]


def round_trip(keys: torch.Tensor, values: torch.Tensor, encoding: str) -> tuple[torch.Tensor, torch.Tensor]:
    """What a question will read back from files of `encoding`, in the input's dtype and device."""
    if check_encoding(encoding) == "bf16" and sixteen_bit(keys.dtype) == keys.dtype:
        return keys, values
    return decode_kv(encode_kv(keys, values, encoding), keys.dtype, keys.device)
