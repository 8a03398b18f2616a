"""Static decoding on the GPU fast path: split-KV attention over the document's chunk pages, the
answer's KV written in place, and one captured CUDA graph per question for the block forward.

It computes what `engine.static_decode.StaticRunner` computes (the same attention structure, see
that module), but nothing is gathered or concatenated per step: every layer attends to
- the selected chunks, read in place from the document's cache (`engine.attention.split_kv`), and
- a preallocated tail [prefix | question | answer slots], where each block forward writes the
  active block's KV into its own slots; a finished block's refresh writes its final KV there once.
Tensor shapes never change within an answer, so one block forward is captured as a CUDA graph and
replayed at every step (inputs copied into static buffers; no host synchronisation inside). The
layers' halves around attention may run compiled (`engine.compiled_layers`), which fuses their
elementwise work.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch

from engine.attention import AttentionBackend, full_mask
from engine.attention.split_kv import (
    PagedKV,
    SplitPlan,
    make_split_plan,
    split_kv_attention,
    split_kv_reference,
)
from engine.decode import slot_logits_from_rows
from engine.kv_cache import DocumentKV
from engine.model import DiffusionLM, LayerFunctions
from engine.rope import shift_cos_sin
from engine.sampling import prediction_rows
from engine.static_decode import FixedContext, SelectedChunks

logger = logging.getLogger(__name__)


class PagedLayerCache:
    """One layer's static context; the model calls `attend` in place of concatenating a past."""

    def __init__(self, kv: PagedKV, plan: SplitPlan, slots: torch.Tensor, use_kernel: bool) -> None:
        self.kv, self.plan, self.slots, self.use_kernel = kv, plan, slots, use_kernel

    def attend(self, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, scale: float) -> torch.Tensor:
        """q [1, Hq, T, D]; k_new, v_new [1, Hkv, T, D] written to the tail rows `slots` first."""
        self.kv.k_tail.index_copy_(1, self.slots, k_new[0])
        self.kv.v_tail.index_copy_(1, self.slots, v_new[0])
        if self.use_kernel:
            return split_kv_attention(q[0], self.kv, scale, self.plan)[None]
        return split_kv_reference(q[0], self.kv, scale)[None]


TAIL_ROUND = 128  # tail capacity is rounded up to this, so questions of similar length share a layout


@dataclass
class PagedContext:
    layers: list[PagedLayerCache]
    slots: torch.Tensor  # [block] long: tail rows the next forward writes (shared by all layers)
    tail_len: torch.Tensor  # [1] int32: tail rows attended (shared by all layers)
    answer_row: int  # tail row of answer slot 0
    answer_start: int  # position of answer slot 0
    anchor_logits: torch.Tensor | None  # [V] the row before the answer (shifted models)
    layout: tuple  # what must match for another question to reuse these buffers (and a captured graph)


def build_paged_context(model: DiffusionLM, ctx: FixedContext, document: DocumentKV, chunk_ids: list[int],
                        chunks: SelectedChunks, prefix_len: int, gen_length: int, block_length: int,
                        use_kernel: bool, reuse: PagedContext | None = None) -> PagedContext:
    """Turns a static FixedContext (prefix | placed chunks | question, contiguous) into pages + tail.

    The placed chunk section of `ctx` is dropped: the pages are read from `document` (on the
    model's device) and moved to `chunks.starts` by the kernel's per-page query rotation. With
    `reuse` of the same layout (same document, K, kept tokens, tail capacity, block), its buffers
    are refilled in place and returned, so a graph captured over them replays for this question.
    """
    cfg, device = model.cfg, model.embed_tokens.weight.device
    k, c = chunks.tokens.shape
    chunk_len = chunks.keys.shape[3]  # C, or B after token selection
    question = slice(prefix_len + k * chunk_len, None)
    cos, sin = shift_cos_sin(chunks.starts, cfg.head_dim, cfg.rope_theta, cfg.rope_scaling_factor)
    cos, sin = cos.to(device), sin.to(device)  # [K, D/2], the same for every layer
    page_ids = torch.tensor(chunk_ids, dtype=torch.int32, device=device)
    tail_rows = ctx.kv[0][0].shape[2] - k * chunk_len
    cap = -(-(tail_rows + gen_length) // TAIL_ROUND) * TAIL_ROUND
    if chunks.kept is None:  # every valid token of every page, the same for every layer and head
        valid = torch.arange(c)[None, :] < chunks.lengths[:, None]  # [K, C]
        all_tokens = torch.where(valid, torch.arange(c), -1)[:, None].expand(k, cfg.num_kv_heads, c)
        all_tokens = all_tokens.to(torch.int32).contiguous().to(device)

    def token_ids(layer: int) -> torch.Tensor:  # [K, Hkv, B] int32
        if chunks.kept is None:
            return all_tokens
        return torch.where(chunks.valid[:, None, :], chunks.kept[:, layer], -1).to(torch.int32).to(device)

    def fill_tail(tail: torch.Tensor, src: torch.Tensor) -> None:  # [Hkv, cap, D] <- [1, Hkv, T, D]
        tail[:, :prefix_len] = src[0, :, :prefix_len]
        tail[:, prefix_len:tail_rows] = src[0, :, question]

    layout = (document.keys.data_ptr(), tuple(document.keys.shape), k, chunk_len, chunks.kept is None, cap,
              block_length, use_kernel)
    # Only pages read in place can be reused: a document elsewhere is copied to the device anew
    # for every question, at a new address.
    in_place = document.keys.device == device
    if reuse is not None and in_place and reuse.layout == layout:
        shared = reuse.layers[0].kv
        shared.page_ids.copy_(page_ids)
        shared.rot_cos.copy_(cos)
        shared.rot_sin.copy_(sin)
        for layer, (cache, (kk, vv)) in enumerate(zip(reuse.layers, ctx.kv, strict=True)):
            # The same addresses (the layout checks it), so a graph captured over the old views
            # reads these pages; the views are set for the eager paths.
            cache.kv = replace(cache.kv, k_pages=document.keys[layer], v_pages=document.values[layer])
            if layer == 0 or chunks.kept is not None:
                cache.kv.token_ids.copy_(token_ids(layer))
            fill_tail(cache.kv.k_tail, kk)
            fill_tail(cache.kv.v_tail, vv)
        reuse.answer_row, reuse.answer_start, reuse.anchor_logits = tail_rows, ctx.answer_start, ctx.anchor_logits
        return reuse
    slots = torch.zeros(block_length, dtype=torch.long, device=device)
    tail_len = torch.tensor([tail_rows], dtype=torch.int32, device=device)
    plan = None
    layers = []
    for layer, (kk, vv) in enumerate(ctx.kv):
        k_tail = kk.new_zeros(cfg.num_kv_heads, cap, cfg.head_dim)
        v_tail = torch.zeros_like(k_tail)
        fill_tail(k_tail, kk)
        fill_tail(v_tail, vv)
        paged = PagedKV(document.keys[layer].to(device), document.values[layer].to(device), page_ids,
                        token_ids(layer), cos, sin, k_tail, v_tail, tail_len)
        if plan is None:  # shapes are the same in every layer
            plan = make_split_plan(paged, cfg.num_heads // cfg.num_kv_heads * block_length)
        layers.append(PagedLayerCache(paged, plan, slots, use_kernel))
    return PagedContext(layers, slots, tail_len, tail_rows, ctx.answer_start, ctx.anchor_logits, layout)


class _BlockForward:
    """Logits for every row of the active block ([T, V]); eager, or one captured CUDA graph."""

    def __init__(self, model: DiffusionLM, attention: AttentionBackend, ctx: PagedContext, block_length: int,
                 rows: torch.Tensor, use_graph: bool, layer_fns: LayerFunctions | None) -> None:
        self.model, self.attention, self.ctx, self.rows = model, attention, ctx, rows
        self.layer_fns = layer_fns
        device = rows.device
        self.ids = torch.zeros(1, block_length, dtype=torch.long, device=device)
        self.positions = torch.zeros(1, block_length, dtype=torch.long, device=device)
        self.use_graph = use_graph
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: torch.Tensor | None = None

    def _run(self, layer_fns: LayerFunctions | None) -> torch.Tensor:
        return self.model(self.ids, self.positions, full_mask(), self.attention, past=self.ctx.layers,
                          logits_rows=self.rows, return_kv=False, layer_fns=layer_fns).logits[0]

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.ids.copy_(ids)
        self.positions.copy_(positions)
        if self.use_graph and self.graph is None:
            self._capture()
        if self.graph is not None:
            self.graph.replay()
            return self.out
        return self._run(self.layer_fns)

    def _capture(self) -> None:
        # Warm-up on a side stream (compiles the layers and the Triton kernels, sets up cuBLAS),
        # then capture. Both run the real inputs, so the KV they write into the active slots is the
        # step's own.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._run(self.layer_fns)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                self.out = self._run(self.layer_fns)
        except RuntimeError as e:  # e.g. an allocator or driver limit: eager is slower, not wrong
            logger.warning("CUDA graph capture failed (%s); decoding eagerly", e)
            self.use_graph = False
            return
        self.graph = graph


class PagedDecodeCache:
    """The last question's paged context and block forward (with its captured CUDA graph), kept by
    the caller (one per engine) for the next question. A question with the same layout (same
    document, K, kept tokens, tail capacity and block) refills the buffers and replays the graph:
    no allocation and no capture, which otherwise costs several decode steps per question."""

    def __init__(self) -> None:
        self.context: PagedContext | None = None
        self.step: _BlockForward | None = None

    def release_pages(self) -> None:
        """Drops the kept context's references to the document's KV once an answer is done, so
        the cache never keeps a document alive (the KV pool decides that). A later question with
        the same layout sets the pages again."""
        if self.context is None:
            return
        for cache in self.context.layers:
            empty = cache.kv.k_pages.new_empty((0, *cache.kv.k_pages.shape[1:]))
            cache.kv = replace(cache.kv, k_pages=empty, v_pages=empty)


class PagedStaticRunner:
    """A StepRunner (see engine.decode) over a PagedContext."""

    def __init__(self, model: DiffusionLM, attention: AttentionBackend, ctx: PagedContext, block_length: int,
                 use_graph: bool, layer_fns: LayerFunctions | None = None,
                 cache: PagedDecodeCache | None = None) -> None:
        self.model, self.ctx, self.block_length = model, ctx, block_length
        device = ctx.slots.device
        shifted = model.cfg.logits_shifted
        # Rows whose logits predict block slots 0..T-1 (slot 0 of a shifted model: the anchor).
        step_rows = (prediction_rows(torch.arange(1, block_length + 1), shifted) - 1).clamp_min(0).to(device)
        cached = cache.step if cache is not None else None
        if (cached is not None and cached.ctx is ctx and cached.model is model and cached.use_graph == use_graph
                and cached.layer_fns is layer_fns):
            self._step = cached  # the same buffers: its graph (if captured) replays for this question
        else:
            self._step = _BlockForward(model, attention, ctx, block_length, step_rows, use_graph, layer_fns)
        if cache is not None:
            cache.context, cache.step = ctx, self._step
        # The refresh of a finished block needs only its last row (the next block's anchor).
        last = torch.tensor([block_length - 1], device=device)
        self._refresh = _BlockForward(model, attention, ctx, block_length, last, use_graph=False,
                                      layer_fns=layer_fns)
        self.anchor = ctx.anchor_logits
        self.forward_passes = 2  # the prefix and question passes of the static context
        self._offsets = torch.arange(block_length, device=device)
        self._positions = torch.zeros(1, block_length, dtype=torch.long, device=device)

    def block_start(self, block: int, answer: torch.Tensor) -> None:
        """Points every layer's KV writes and attention span at this block's tail rows (once a block)."""
        lo = block * self.block_length
        row = self.ctx.answer_row + lo
        self.ctx.slots.copy_(self._offsets + row)
        self.ctx.tail_len.fill_(row + self.block_length)
        self._positions = (self.ctx.answer_start + lo + self._offsets)[None]

    def _block_ids(self, block: int, answer: torch.Tensor) -> torch.Tensor:
        lo = block * self.block_length
        return answer[None, lo:lo + self.block_length]

    def slot_logits(self, block: int, answer: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        self.forward_passes += 1
        block_rows = self._step(self._block_ids(block, answer), self._positions)  # [T, V]
        local = slots - block * self.block_length
        return slot_logits_from_rows(block_rows[local], local, self.anchor, self.model.cfg.logits_shifted)

    def block_done(self, block: int, answer: torch.Tensor) -> None:
        self.forward_passes += 1
        last = self._refresh(self._block_ids(block, answer), self._positions)
        if self.model.cfg.logits_shifted:
            self.anchor = last[0].clone()

