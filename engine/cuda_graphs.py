"""One captured CUDA graph around a function of static buffers, with an eager fallback.

The callers (the decode step, the question's pass, the draft, scoring) fill fixed-address input
buffers, then call; the first call on CUDA runs the function once on a side stream (which compiles
layers and Triton kernels and sets up cuBLAS) and returns that run's results, then captures the
graph; later calls replay it. The capture itself only records kernels, so the first call costs one
eager run plus the capture's host time, not an extra replay. The graph reads the buffers'
addresses, so everything the function reads must stay alive and in place while it is kept.
"""

from __future__ import annotations

import inspect
import logging
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger(__name__)

# The pool of the graphs a question's preparation and batched steps replay (the draft, the
# question's pass, the batched decode step): each one's outputs are read or copied before the
# next replays.
ANSWER_GRAPHS = "answer"


class GraphedCall:
    """`fn()` run eagerly, or captured once (when `use_graph`) and replayed; returns fn's outputs
    (with a graph: the same tensors on every replay, overwritten by each; the first call returns
    its eager run's own). Graphs given one `pool` (`kept_pool`) share memory: each one's outputs
    must be used before another of them replays."""

    def __init__(self, fn: Callable[[], Any], use_graph: bool, what: str, pool: GraphPool | None = None) -> None:
        # A bound method is held weakly: its object holds this call, and a strong reference back
        # would make a cycle that only the garbage collector frees, so a pass the runner drops
        # would keep its buffers and graph memory (gigabytes for a batched step) until then.
        self._fn = weakref.WeakMethod(fn) if inspect.ismethod(fn) else (lambda: fn)
        self.use_graph, self.what, self.pool = use_graph, what, pool
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: Any = None

    def fn(self) -> Any:
        return self._fn()()

    def __call__(self) -> Any:
        if self.graph is not None:
            self.graph.replay()
            return self.out
        if self.use_graph:
            return self._warm_up_and_capture()
        return self.fn()

    def _warm_up_and_capture(self) -> Any:
        """Runs fn on a side stream (the call's results), then captures it on the same stream.
        Capturing executes nothing, so buffers fn writes (e.g. the KV of the active slots) hold
        the warm-up's values, the same a replay would write.

        Not `torch.cuda.graph(...)`: on entry it synchronises the device and empties the caching
        allocator, so every capture would wait for the warm-up and the next large allocation (the
        next document's prefill) would go back to cudaMalloc."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            result = self.fn()
            try:
                start = time.perf_counter()
                # thread_local: the scheduler's loader threads allocate, copy and wait on their own
                # copy stream meanwhile; under the default ("global") their calls would void this
                # capture. This thread's own unsafe calls still fail the capture, as they should.
                graph.capture_begin(**({"pool": self.pool.for_capture()} if self.pool is not None else {}),
                                    capture_error_mode="thread_local")
                try:
                    out = self.fn()
                finally:
                    graph.capture_end()
                if self.pool is not None:
                    self.pool.captured(graph)
                # A capture costs its host time on the path of a question: worth seeing under load.
                logger.info("captured the %s in %.0f ms", self.what, 1000 * (time.perf_counter() - start))
            except RuntimeError as e:  # e.g. an allocator or driver limit: eager is slower, not wrong
                logger.warning("CUDA graph capture of the %s failed (%s); running it eagerly", self.what, e)
                self.use_graph = False
                out = None
        torch.cuda.current_stream().wait_stream(stream)
        if self.use_graph:
            self.graph, self.out = graph, out
        return result


class GraphPool:
    """The memory pool that graphs of one kind share, as the handle each capture is given.

    A pool (torch.cuda.graph_pool_handle()) lives only through the graphs captured into it: once
    all of them are freed (a scoring staging replaced drops every pass over it; the least
    recently used are dropped), or its only capture failed, the allocator keeps it with no user,
    and a capture into it fails an internal assert ("use_count > 0") and runs eagerly. So a
    capture takes a new pool whenever the current one holds no live graph. (A torch.cuda.MemPool,
    which holds a use of its own, is no way out on torch 2.11: a capture also records its pinned
    host allocations under the pool's id, where the MemPool is not counted, and fails there.)"""

    def __init__(self, new_handle: Callable[[], tuple] | None = None) -> None:
        self._new_handle = new_handle or torch.cuda.graph_pool_handle
        self.handle: tuple | None = None
        self.live = 0  # graphs captured into `handle` and not yet freed

    def for_capture(self) -> tuple:
        """The handle to capture into (a new pool if the current one holds no live graph)."""
        if self.handle is None or self.live == 0:
            self.handle = self._new_handle()
        return self.handle

    def captured(self, graph: object) -> None:
        """Counts a graph captured into the current handle until it is freed (a new handle is
        taken only with none alive, so every live graph is in the current one)."""
        self.live += 1
        weakref.finalize(graph, self._freed)

    def _freed(self) -> None:
        self.live -= 1


def kept_pool(runner, kind: str) -> GraphPool | None:
    """One memory pool for the runner's graphs of `kind` (None off CUDA): graphs that each read
    their outputs before another of them replays can share it, so what each adds is its outputs,
    not a pool of its own for its intermediates."""
    if not runner.uses_graphs:
        return None
    return runner.kept(f"{kind} graph pool", None, 1, GraphPool)
