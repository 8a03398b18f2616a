"""One captured CUDA graph around a function of static buffers, with an eager fallback.

The callers (the decode step, the question's pass, the draft, scoring) fill fixed-address input
buffers, then call; the first call on CUDA warms up on a side stream (compiles layers and Triton
kernels, sets up cuBLAS), then captures, and later calls replay. The graph reads the buffers'
addresses, so everything the function reads must stay alive and in place while it is kept.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger(__name__)


class GraphedCall:
    """`fn()` run eagerly, or captured once (when `use_graph`) and replayed; returns fn's outputs
    (with a graph: the same tensors every time, overwritten by each replay). Graphs given one
    `pool` (torch.cuda.graph_pool_handle()) share memory: each one's outputs must be used before
    another of them replays."""

    def __init__(self, fn: Callable[[], Any], use_graph: bool, what: str, pool: tuple | None = None) -> None:
        self.fn, self.use_graph, self.what, self.pool = fn, use_graph, what, pool
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: Any = None

    def __call__(self) -> Any:
        if self.use_graph and self.graph is None:
            self._capture()
        if self.graph is not None:
            self.graph.replay()
            return self.out
        return self.fn()

    def _capture(self) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                self.out = self.fn()
        except RuntimeError as e:  # e.g. an allocator or driver limit: eager is slower, not wrong
            logger.warning("CUDA graph capture of the %s failed (%s); running it eagerly", self.what, e)
            self.use_graph, self.out = False, None
            return
        self.graph = graph
