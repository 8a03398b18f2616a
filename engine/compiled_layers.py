"""Compiled layer halves for the GPU decode step (regional torch.compile).

A decode step at Dream-7B shape runs 32 rows through 28 layers. Eager, each layer is ~45 kernels,
most of them tiny elementwise ones (fp32 RMSNorm, RoPE, bias, SwiGLU, residual adds) that cost
more in launch and memory round trips than in arithmetic. Inductor fuses each half of a layer
(`Block.attention_inputs`: norm + q/k/v + RoPE; `Block.finish`: o_proj + residual + norm + MLP +
residual) into a few kernels around the matmuls. Attention stays outside, in the cache's own kernel.

The halves are compiled as functions that take the Block as an argument, so one compiled graph
serves all layers (parameters are graph inputs, not constants). Shapes are static (a decode step's
block length never changes within an answer, nor across questions); prefill and scoring, whose
batch and row counts vary, take the `dynamic` variant (sizes symbolic, no recompilation per
shape). The eager methods are the reference: `tests/test_compiled_layers.py` compares both.
"""

from __future__ import annotations

import functools

import torch

from engine.model import Block, LayerFunctions


@functools.cache
def compiled_layer_functions(dynamic: bool = False) -> LayerFunctions:
    """The compiled halves, created once per process and variant: compiled code is cached per
    wrapper, so a new wrapper per question would recompile."""
    return LayerFunctions(
        attention_inputs=torch.compile(Block.attention_inputs, dynamic=dynamic, fullgraph=True),
        finish=torch.compile(Block.finish, dynamic=dynamic, fullgraph=True),
    )
