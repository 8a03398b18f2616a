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
from engine.model.config import KNOWN_CONFIGS
from engine.model.rope import rope_cos_sin
from engine.model.transformer import Block
from engine.model.weights import random_model, random_state_dict


def bf16_error(out: torch.Tensor, ref: torch.Tensor) -> dict:
    """Error of a bf16 result against fp32, absolute and relative to the output's scale.

    An absolute bound is below bf16's resolution once values pass 4 (half an ulp there is 2^-7 *
    4 = 0.0156), so the pass criterion is relative: max and RMS error over the output's max and RMS.
    `rounding_floor` is the error of merely storing the fp32 result in bf16.
    """
    diff = (out.float() - ref).abs()
    rms = lambda t: t.pow(2).mean().sqrt().item()  # noqa: E731
    rel_max = diff.max().item() / ref.abs().max().item()
    rel_rms = rms(diff) / rms(ref)
    return {"max_abs_diff": diff.max().item(), "mean_abs_diff": diff.mean().item(),
            "max_abs_ref": ref.abs().max().item(), "rms_ref": rms(ref),
            "rounding_floor_max": (ref.bfloat16().float() - ref).abs().max().item(),
            "rel_max": rel_max, "rel_rms": rel_rms,
            "passes_1.5e-2_relative": rel_max <= 1.5e-2 and rel_rms <= 1.5e-2}


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
    record = {"tokens": tokens, **bf16_error(o16, o32)}
    del b32, b16
    torch.cuda.empty_cache()
    return record


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
    ap.add_argument("--lengths", type=int, nargs="*", default=[8192, 16384, 32768],
                    help="dense forward lengths to time (none: accuracy only)")
    args = ap.parse_args()
    cfg = KNOWN_CONFIGS["dream-7b"]
    record = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "bf16_matmul_tflops": matmul_rate(),
              "dream7b_layer_bf16_vs_fp32": layer_accuracy(cfg, 1023)}
    print(json.dumps(record, indent=1), flush=True)
    if args.lengths:
        record |= time_dense_forwards(cfg, args.lengths)
        print(json.dumps(record, indent=1), flush=True)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)


def time_dense_forwards(cfg, lengths: list[int]) -> dict:
    t = time.perf_counter()
    model = random_model(cfg, "cuda", torch.bfloat16)
    built = time.perf_counter() - t
    return {"random_model_build_s": built,
            "dense_forward_dream7b_bf16": [time_dense_forward(model, n, 32, 5) for n in lengths]}


if __name__ == "__main__":
    main()
