"""Engine-foundation GPU run: bf16 vs fp32 accuracy and one dense forward at Dream-7B shape.

Usage: python scripts/gpu_foundation_check.py --out results.json [--lengths 8192 16384 32768]
Writes a JSON record; numbers go to docs/PERFORMANCE.md by hand, with the date and command.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from engine.attention import BACKENDS, full_mask
from engine.config import KNOWN_CONFIGS
from engine.model import Block
from engine.rope import rope_cos_sin
from engine.weights import random_model, random_state_dict


def layer_accuracy(cfg, tokens: int) -> dict:
    """Max/mean |bf16 - fp32| of one random full-size layer on the same bf16-rounded input."""
    state = random_state_dict(cfg, seed=0, std=0.02, device="cuda")
    layer = {k[len("layers.0."):]: v for k, v in state.items() if k.startswith("layers.0.")}
    del state
    b32 = Block(cfg).to("cuda")
    b32.load_state_dict(layer)
    b16 = Block(cfg).to("cuda", torch.bfloat16)
    b16.load_state_dict(layer)
    h = torch.randn(1, tokens, cfg.hidden_size, device="cuda").to(torch.bfloat16)
    cos, sin = rope_cos_sin(torch.arange(tokens, device="cuda")[None], cfg.head_dim, cfg.rope_theta)
    with torch.no_grad():
        o32 = b32(h.float(), cos, sin, full_mask(), BACKENDS["sdpa"], None, None)[0]
        o16 = b16(h, cos, sin, full_mask(), BACKENDS["sdpa"], None, None)[0].float()
    diff = (o16 - o32).abs()
    allowed = 1.5e-2 + 1e-2 * o32.abs()
    del b32, b16
    torch.cuda.empty_cache()
    return {"tokens": tokens, "max_abs_diff": diff.max().item(), "mean_abs_diff": diff.mean().item(),
            "max_abs_out": o32.abs().max().item(),
            "within_atol_1.5e-2_rtol_1e-2": bool((diff <= allowed).all())}


def time_dense_forward(model, length: int, logits_rows: int, repeats: int) -> dict:
    cfg = model.cfg
    ids = torch.randint(0, cfg.vocab_size, (1, length), device="cuda")
    pos = torch.arange(length, device="cuda")[None]
    rows = torch.arange(length - logits_rows, length, device="cuda")
    attn = BACKENDS["sdpa"]
    with torch.inference_mode():
        for _ in range(2):
            model(ids, pos, full_mask(), attn, logits_rows=rows, return_kv=False)
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            model(ids, pos, full_mask(), attn, logits_rows=rows, return_kv=False)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
    times.sort()
    ms = times[len(times) // 2]
    params = sum(p.numel() for n, p in model.named_parameters() if "embed" not in n and "lm_head" not in n)
    linear = 2 * params * length
    attention = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * length * length
    head = 2 * cfg.hidden_size * cfg.vocab_size * logits_rows
    flops = linear + attention + head
    return {"length": length, "logits_rows": logits_rows, "median_ms": ms, "min_ms": times[0],
            "repeats": repeats, "tflops": flops / (ms / 1e3) / 1e12,
            "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30}


def matmul_rate() -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    return 2 * 8192**3 * 10 / (time.perf_counter() - t) / 1e12


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384, 32768])
    args = ap.parse_args()
    cfg = KNOWN_CONFIGS["dream-7b"]
    record = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "bf16_matmul_tflops": matmul_rate(),
              "dream7b_layer_bf16_vs_fp32": layer_accuracy(cfg, 1023)}
    print(json.dumps(record, indent=1), flush=True)
    t = time.perf_counter()
    model = random_model(cfg, "cuda", torch.bfloat16)
    record["random_model_build_s"] = time.perf_counter() - t
    record["dense_forward_dream7b_bf16"] = [time_dense_forward(model, n, 32, 5) for n in args.lengths]
    print(json.dumps(record, indent=1), flush=True)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
