"""Times a decode step's matrix multiplies alone, at the real shapes, in the weight layouts and BLAS
back ends PyTorch offers: how close to the memory bandwidth can a 32-row step read its weights?

    python scripts/bench_decode_gemms.py --out decode-gemms.json        # needs a CUDA GPU

A decode step multiplies a block of 32 rows by every layer's weights (fused q/k/v, o, fused
gate/up, down), then by the LM head. At 32 rows these products are bound by reading the weights,
so the number to watch is bytes of weights per second. Each layer gets its own weights (so nothing
is served from L2), and each variant is replayed inside a CUDA graph, as a decode step runs:

- `linear`: F.linear over weights stored [N, K], the engine's layout, with PyTorch's default BLAS;
- `linear_cublaslt`: the same with `preferred_blas_library("cublaslt")`;
- `mm_kn`: x @ W over weights stored transposed, [K, N] contiguous;
- `triton_skinny` (with `--skinny-sweep`): `scripts.skinny_linear`, the fastest of a sweep of its
  plans for each product (every plan is checked against the fp32 product first).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.model.config import KNOWN_CONFIGS
from scripts.skinny_linear import SkinnyPlan, skinny_linear, triton

SMEM_BYTES = 232_448  # an H200 block's shared memory: plans that need more are skipped


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


def skinny_plans(n: int, k: int, rows: int) -> list[SkinnyPlan]:
    """Plans worth timing for one product: tiles of 32-128 outputs and 128-256 of K, the K axis cut
    so that there are at least two waves of programs on 132 SMs (and twice that), 3 or 5 stages."""
    plans = []
    block_m = max(16, 1 << (rows - 1).bit_length())
    for block_n in (32, 64, 128):
        for block_k in (128, 256):
            tiles = -(-n // block_n)
            split = 1
            while tiles * split < 264 and split * 2 * block_k <= k:
                split *= 2
            for split_k in sorted({split, min(split * 2, max(1, k // block_k))}):
                for stages in (3, 5):
                    if (block_n + block_m) * block_k * 2 * stages <= SMEM_BYTES:
                        plans.append(SkinnyPlan(block_n, block_k, split_k, num_warps=4, num_stages=stages))
    return plans


def _sweep_skinny(name: str, gemm: str, x: torch.Tensor, weights: list[torch.Tensor], ref: torch.Tensor,
                  count: int) -> tuple[list[dict], dict | None]:
    """Times every plan (checked first); returns all rows and the fastest."""
    n, k = weights[0].shape
    rows, best = [], None
    for plan in skinny_plans(n, k, x.shape[0]):
        workspace = torch.empty(plan.split_k, x.shape[0], n, device="cuda", dtype=torch.float32)
        try:
            err = (skinny_linear(x, weights[-1], plan, workspace).float() - ref).abs().max().item()
            ms = _graph_ms(lambda plan=plan, workspace=workspace: [skinny_linear(x, w, plan, workspace)
                                                                   for w in weights])
        except triton.runtime.errors.OutOfResources as e:  # the tile needs more shared memory: skip it
            print(f"skip {gemm} {plan}: {type(e).__name__}", flush=True)
            continue
        row = {"shape": name, "gemm": gemm, "n": n, "k": k, "rows": x.shape[0], "per_step": count,
               "variant": "triton_skinny", "plan": dataclasses.asdict(plan),
               "us_each": 1000 * ms / count, "ms_per_step": ms, "tb_s": n * k * 2 * count / ms / 1e9,
               "max_abs_error": err}
        rows.append(row)
        if err < 0.05 * ref.abs().max().item() and (best is None or ms < best["ms_per_step"]):
            best = row
    if best is not None:
        print(json.dumps(best), flush=True)
    return rows, best


def _measure(name: str, rows: int, sweep: bool) -> tuple[list[dict], list[dict]]:
    """(each variant's row per product, the skinny kernel's whole sweep)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    out, swept = [], []
    for gemm, (n, k, count) in _gemm_shapes(name).items():
        out += _measure_gemm(name, gemm, n, k, count, rows, g)
        if sweep:
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16, generator=g)
            weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
                       for _ in range(count)]
            all_rows, best = _sweep_skinny(name, gemm, x, weights, F.linear(x.float(), weights[-1].float()), count)
            swept += all_rows
            if best is not None:
                out.append(best)
            del weights
        torch.cuda.empty_cache()
    return out, swept


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("decode-gemms.json"))
    ap.add_argument("--shapes", nargs="+", default=["dream-7b", "llada-8b"], choices=sorted(KNOWN_CONFIGS))
    ap.add_argument("--rows", type=int, default=32, help="rows a step multiplies (the active block)")
    ap.add_argument("--skinny-sweep", action="store_true", help="also time scripts.skinny_linear's plans")
    args = ap.parse_args()
    if args.skinny_sweep and triton is None:
        raise SystemExit("--skinny-sweep needs the triton package")
    rows, swept = [], []
    for name in args.shapes:
        measured, sweep = _measure(name, args.rows, args.skinny_sweep)
        rows += measured
        swept += sweep
    totals = {}
    for r in rows:
        key = f"{r['shape']} {r['variant']}"
        totals[key] = totals.get(key, 0.0) + r["ms_per_step"]
    for key, ms in totals.items():
        print(f"{key}: {ms:.3f} ms of matrix multiplies a step")
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                    "rows": rows, "ms_per_step": totals, "skinny_sweep": swept}, indent=1))


if __name__ == "__main__":
    main()
