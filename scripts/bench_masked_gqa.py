"""Masked grouped-query attention at a batched decode step's shapes: SDPA given `enable_gqa` and a
mask (its math fallback, which copies each KV head per query head) against the backend's grouped
queries (`engine.attention.sdpa`), and their difference from the fp32 reference.

    python scripts/bench_masked_gqa.py --rows 1 8 16 --context 2304 --block 32    # CUDA

Prints one line a row count: milliseconds a layer's attention for each route, and a decode step's
(all layers) difference.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from engine.attention import BACKENDS, full_mask, materialize, reference_attention
from engine.model.config import KNOWN_CONFIGS


def _time_ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def _compare(cfg, rows: int, context: int, block: int, repeats: int, gen: torch.Generator) -> None:
    device, dtype = gen.device, torch.bfloat16
    hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    tk = context + block
    q = torch.randn(rows, hq, block, d, device=device, generator=gen, dtype=dtype)
    k = torch.randn(rows, hkv, tk, d, device=device, generator=gen, dtype=dtype)
    v = torch.randn(rows, hkv, tk, d, device=device, generator=gen, dtype=dtype)
    valid = torch.rand(rows, tk, device=device, generator=gen) > 0.2  # padded contexts
    valid[:, -block:] = True
    mask = full_mask(key_valid=valid)
    dense = materialize(mask, rows, block, tk, device)
    scale = d ** -0.5

    def math_fallback():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=dense, scale=scale, enable_gqa=True)

    def grouped():
        return BACKENDS["sdpa"](q, k, v, mask, scale)[0]

    ref, _ = reference_attention(q.float(), k.float(), v.float(), mask, scale)
    errors = [(fn().float() - ref).abs().max().item() for fn in (math_fallback, grouped)]
    times = [_time_ms(fn, repeats) for fn in (math_fallback, grouped)]
    print(f"rows {rows:3d}: enable_gqa + mask {times[0]:.3f} ms, grouped queries {times[1]:.3f} ms a layer "
          f"({cfg.num_layers} layers: {times[0] * cfg.num_layers:.2f} against {times[1] * cfg.num_layers:.2f} "
          f"ms a step); max error against fp32 {errors[0]:.2e} / {errors[1]:.2e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="dream-7b", choices=sorted(KNOWN_CONFIGS))
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16])
    parser.add_argument("--context", type=int, default=2304, help="keys a row (its context padded), before its block")
    parser.add_argument("--block", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_masked_gqa: needs a CUDA device (it times SDPA's GPU kernels)")
    cfg = KNOWN_CONFIGS[args.shape]
    gen = torch.Generator(device="cuda").manual_seed(0)
    print(f"{args.shape}: {cfg.num_heads} query heads, {cfg.num_kv_heads} KV heads, head dim {cfg.head_dim}; "
          f"{args.context + args.block} keys a row, {args.block} queries")
    for rows in args.rows:
        _compare(cfg, rows, args.context, args.block, args.repeats, gen)


if __name__ == "__main__":
    main()
