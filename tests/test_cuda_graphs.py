"""engine/cuda_graphs.py without a GPU: which pool each capture is given (the captures themselves:
tests/test_gpu.py)."""

from __future__ import annotations

import gc
import itertools

from engine.cuda_graphs import GraphPool


class _Graph:  # stands for a torch.cuda.CUDAGraph: only its lifetime matters here
    pass


def test_a_capture_takes_a_new_pool_once_no_graph_lives_in_the_current_one():
    """A pool lives only through its graphs: while one lives, captures share it; once all are
    freed, or the only capture failed, the next capture takes a new pool (a capture into the old
    one fails an allocator assert on the GPU and runs eagerly)."""
    handles = itertools.count()
    pool = GraphPool(new_handle=lambda: (0, next(handles)))
    first = pool.for_capture()
    a = _Graph()
    pool.captured(a)
    assert pool.for_capture() == first  # a lives: shared
    b = _Graph()
    pool.captured(b)
    del a
    gc.collect()
    assert pool.live == 1 and pool.for_capture() == first  # b still lives
    del b
    gc.collect()
    assert pool.live == 0
    second = pool.for_capture()  # every graph freed (a staging replaced dropped them all)
    assert second != first
    third = pool.for_capture()  # that capture failed: nothing was counted
    assert third != second
    c = _Graph()
    pool.captured(c)
    assert pool.for_capture() == third  # c lives in it: shared
