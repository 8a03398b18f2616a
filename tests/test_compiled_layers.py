"""The compiled layer halves (engine.model.compiled_layers) against the eager Block methods they compile.

On the CPU, Inductor generates C++; on CUDA (marker gpu) Triton. The fused code keeps fp32
intermediates where eager rounds after every op, so bf16 is compared with a bf16 tolerance.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine import KNOWN_CONFIGS
from engine.model.compiled_layers import compiled_layer_functions
from engine.model.rope import rope_cos_sin
from engine.model.weights import random_model

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 3e-2}  # relative to the largest magnitude
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _close(fast: torch.Tensor, slow: torch.Tensor, dtype) -> bool:
    scale = slow.float().abs().max().clamp_min(1.0)
    return bool((fast.float() - slow.float()).abs().max() <= TOLERANCE[dtype] * scale)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", ["llada-8b", "dream-7b"])  # RoPE in fp32 / in bf16 with q/k/v bias
def test_compiled_halves_match_eager(device, dtype, family):
    # Odd sizes: 7 rows, 5 query heads on 1 KV head, 203 MLP units; 3 layers share one graph.
    cfg = dataclasses.replace(KNOWN_CONFIGS[family], vocab_size=300, hidden_size=80, intermediate_size=203,
                              num_layers=3, num_heads=5, num_kv_heads=1, head_dim=16, mask_token_id=3,
                              bos_token_id=0, eos_token_id=1, eot_token_id=2, pad_token_id=1)
    torch.manual_seed(0)
    model = random_model(cfg, torch.device(device), dtype)
    fns = compiled_layer_functions()
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    with torch.inference_mode():  # as in decoding (inference tensors are guarded on)
        h = torch.randn(1, 7, cfg.hidden_size, device=device).to(dtype)
        cos, sin = rope_cos_sin(torch.arange(1000, 1007, device=device)[None], cfg.head_dim, cfg.rope_theta)
        for layer in model.layers:
            for fast, slow in zip(fns.attention_inputs(layer, h, cos, sin), layer.attention_inputs(h, cos, sin),
                                  strict=True):
                assert fast.shape == slow.shape and fast.dtype == slow.dtype
                assert _close(fast, slow, dtype)
            attn = torch.randn(1, cfg.num_heads, 7, cfg.head_dim, device=device).to(dtype)
            assert _close(fns.finish(layer, h, attn), layer.finish(h, attn), dtype)
            h = layer.finish(h, attn)
    # At most one graph per half for this config: the layers reuse it (parameters are inputs).
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - before <= 2


@pytest.mark.parametrize("device", DEVICES)
def test_dynamic_halves_serve_varying_shapes(device):
    """The dynamic variant (prefill, scoring) matches eager across batch and row counts, without a
    new graph per shape once the sizes are symbolic."""
    cfg = dataclasses.replace(KNOWN_CONFIGS["dream-7b"], vocab_size=300, hidden_size=64, intermediate_size=96,
                              num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, mask_token_id=3,
                              bos_token_id=0, eos_token_id=1, eot_token_id=2, pad_token_id=1)
    torch.manual_seed(0)
    model = random_model(cfg, torch.device(device), torch.float32)
    fns = compiled_layer_functions(dynamic=True)
    layer = model.layers[0]
    counts = []
    with torch.inference_mode():
        for b, t in ((2, 7), (3, 5), (5, 9), (4, 13)):
            h = torch.randn(b, t, cfg.hidden_size, device=device)
            cos, sin = rope_cos_sin(torch.arange(t, device=device).expand(b, t), cfg.head_dim, cfg.rope_theta)
            for fast, slow in zip(fns.attention_inputs(layer, h, cos, sin), layer.attention_inputs(h, cos, sin),
                                  strict=True):
                assert _close(fast, slow, torch.float32)
            attn = torch.randn(b, cfg.num_heads, t, cfg.head_dim, device=device)
            assert _close(fns.finish(layer, h, attn), layer.finish(h, attn), torch.float32)
            counts.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    assert counts[-1] == counts[1]  # the last two shapes compiled nothing new


def test_a_compiler_failure_falls_back_to_eager_but_out_of_memory_does_not(caplog):
    from engine.model.compiled_layers import EagerOnFailure

    def broken_compiler(x):
        raise RuntimeError("inductor: no C++ compiler")

    def out_of_memory(x):
        raise torch.OutOfMemoryError("CUDA out of memory")

    fallback = EagerOnFailure(broken_compiler, lambda x: x + 1)
    assert fallback(1) == 2 and fallback.failed and "running them eagerly" in caplog.text
    strict = EagerOnFailure(out_of_memory, lambda x: x + 1)
    with pytest.raises(torch.OutOfMemoryError):
        strict(1)
    assert not strict.failed  # the next call tries the compiled halves again
