"""Times a decode step's matrix multiplies alone, at the real shapes, in the weight layouts and BLAS
back ends PyTorch offers: how close to the memory bandwidth can a 32-row step read its weights?

    python scripts/bench_decode_gemms.py --out decode-gemms.json        # needs a CUDA GPU

A decode step multiplies a block of 32 rows by every layer's weights (fused q/k/v, o, fused
gate/up, down), then by the LM head. At 32 rows these products are bound by reading the weights,
so the number to watch is bytes of weights per second. Each layer gets its own weights (so nothing
is served from L2), and each variant is replayed inside a CUDA graph, as a decode step runs:

- `linear`: F.linear over weights stored [N, K], the engine's layout, with PyTorch's default BLAS;
- `linear_cublaslt`: the same with `preferred_blas_library("cublaslt")`;
- `mm_kn`: x @ W over weights stored transposed, [K, N] contiguous.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.config import KNOWN_CONFIGS


def _gemm_shapes(name: str) -> dict[str, tuple[int, int, int]]:
    """{gemm: (N, K, count per step)} for one model shape."""
    cfg = KNOWN_CONFIGS[name]
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    return {"qkv": (q + 2 * kv, cfg.hidden_size, cfg.num_layers), "o": (cfg.hidden_size, q, cfg.num_layers),
            "gate_up": (2 * cfg.intermediate_size, cfg.hidden_size, cfg.num_layers),
            "down": (cfg.hidden_size, cfg.intermediate_size, cfg.num_layers),
            "lm_head": (cfg.vocab_size, cfg.hidden_size, 1)}


def _graph_ms(fn, replays: int = 20) -> float:
    """GPU ms of one `fn()` captured in a CUDA graph, median over replays."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(replays + 3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times[3:])[len(times[3:]) // 2]


def _products(x: torch.Tensor, weights: list[torch.Tensor], transposed: bool) -> list[torch.Tensor]:
    return [x @ w for w in weights] if transposed else [F.linear(x, w) for w in weights]


def _measure_gemm(name: str, gemm: str, n: int, k: int, count: int, rows: int, g: torch.Generator) -> list[dict]:
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16, generator=g)
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02 for _ in range(count)]
    kn = [w.t().contiguous() for w in weights]
    ref = F.linear(x.float(), weights[-1].float())
    variants = {"linear": ("cublas", weights, False), "linear_cublaslt": ("cublaslt", weights, False),
                "mm_kn": ("cublas", kn, True)}
    out = []
    for variant, (blas, ws, kn_layout) in variants.items():
        previous = torch.backends.cuda.preferred_blas_library()
        torch.backends.cuda.preferred_blas_library(blas)
        try:
            err = (_products(x, ws, kn_layout)[-1].float() - ref).abs().max().item()
            ms = _graph_ms(lambda ws=ws, kn_layout=kn_layout: _products(x, ws, kn_layout))
        finally:
            torch.backends.cuda.preferred_blas_library(previous)
        out.append({"shape": name, "gemm": gemm, "n": n, "k": k, "rows": rows, "per_step": count,
                    "variant": variant, "us_each": 1000 * ms / count, "ms_per_step": ms,
                    "tb_s": n * k * 2 * count / ms / 1e9, "max_abs_error": err})
        print(json.dumps(out[-1]), flush=True)
    return out


def _measure(name: str, rows: int) -> list[dict]:
    g = torch.Generator(device="cuda").manual_seed(0)
    out = []
    for gemm, (n, k, count) in _gemm_shapes(name).items():
        out += _measure_gemm(name, gemm, n, k, count, rows, g)
        torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("decode-gemms.json"))
    ap.add_argument("--shapes", nargs="+", default=["dream-7b", "llada-8b"], choices=sorted(KNOWN_CONFIGS))
    ap.add_argument("--rows", type=int, default=32, help="rows a step multiplies (the active block)")
    args = ap.parse_args()
    rows = [r for name in args.shapes for r in _measure(name, args.rows)]
    totals = {}
    for r in rows:
        key = f"{r['shape']} {r['variant']}"
        totals[key] = totals.get(key, 0.0) + r["ms_per_step"]
    for key, ms in totals.items():
        print(f"{key}: {ms:.3f} ms of matrix multiplies a step")
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                    "rows": rows, "ms_per_step": totals}, indent=1))


if __name__ == "__main__":
    main()
