"""Compiled layer halves for the GPU (regional torch.compile).

A decode step at Dream-7B shape runs 32 rows through 28 layers. Eager, a step ran ~1,500 kernels
(~50 a layer, profiled), most of them tiny elementwise ones (fp32 RMSNorm, RoPE, bias, SwiGLU, residual adds) that cost
more in launches and memory round trips than in arithmetic. Inductor fuses each half of a layer
(`Block.attention_inputs`: norm + q/k/v + RoPE; `Block.finish`: o_proj + residual + norm + MLP +
residual) into a few kernels around the matmuls. Attention stays outside, in the backend or the
cache's own kernel, so the model still does not know which attention runs.

The halves are compiled as functions that take the Block as an argument, so one compiled graph
serves all layers (parameters are graph inputs, not constants). The decode step's shapes never
change (`dynamic=False`); prefill and scoring, whose batch and row counts vary, take the dynamic
variant (sizes symbolic, no recompilation per shape). The eager methods are the reference:
`tests/test_compiled_layers.py` compares both.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch

from engine.model.transformer import Block, LayerFunctions

logger = logging.getLogger(__name__)


class EagerOnFailure:
    """Calls the compiled function; if compiling or running it raises, warns once and calls the
    eager one from then on (the halves are pure, so the eager rerun gives the same result)."""

    def __init__(self, compiled: Callable, eager: Callable) -> None:
        self.compiled, self.eager, self.failed = compiled, eager, False

    def __call__(self, *args):
        if not self.failed:
            try:
                return self.compiled(*args)
            except torch.OutOfMemoryError:
                raise  # the eager halves need the memory too: not a compiler failure
            except Exception as e:  # torch.compile raises backend-specific types; eager is slower, not wrong
                logger.warning("compiling the layers failed (%s: %s); running them eagerly",
                               type(e).__name__, str(e).splitlines()[0] if str(e) else "")
                self.failed = True
        return self.eager(*args)


# Separate functions per variant: dynamo keeps its compiled code (and its recompile limit) per code
# object, so the decode step's fixed-shape graphs and the dynamic ones do not evict each other.
def _inputs_fixed(block: Block, h, cos, sin):
    return block.attention_inputs(h, cos, sin)


def _finish_fixed(block: Block, h, attn):
    return block.finish(h, attn)


def _inputs_dynamic(block: Block, h, cos, sin):
    return block.attention_inputs(h, cos, sin)


def _finish_dynamic(block: Block, h, attn):
    return block.finish(h, attn)


@functools.cache
def compiled_layer_functions(dynamic: bool = False) -> LayerFunctions:
    """The compiled halves, created once per process and variant (compiled code is cached per
    wrapper: a new wrapper per question would recompile)."""
    inputs, finish = (_inputs_dynamic, _finish_dynamic) if dynamic else (_inputs_fixed, _finish_fixed)
    return LayerFunctions(
        EagerOnFailure(torch.compile(inputs, dynamic=dynamic, fullgraph=True), Block.attention_inputs),
        EagerOnFailure(torch.compile(finish, dynamic=dynamic, fullgraph=True), Block.finish))

