"""Static decoding on the GPU fast path: split-KV attention over the document's chunk pages, the
answer's KV written in place, and one captured CUDA graph per question for the block forward.

It computes what `engine.decode.static.StaticDecoder` computes (the same attention structure, see
that module), but nothing is gathered or concatenated per step: every layer attends to
- the selected chunks, read in place from the document's cache (`engine.attention.split_kv`), and
- a preallocated tail [prefix | question | answer slots], where each block forward writes the
  active block's KV into its own slots; a finished block's refresh writes its final KV there once.
Tensor shapes never change within an answer, so one block forward is captured as a CUDA graph and
replayed at every step (inputs copied into static buffers; no host synchronisation inside). The
layers' halves around attention may run compiled (`engine.model.compiled_layers`), which fuses their
elementwise work.

The question's own pass runs over the same pages and tail (`QueryPass`): its rows, padded to a
multiple of QUERY_ROUND, write their KV into the tail after the prefix (whose KV does not depend on
the question and is computed once per prefix) and attend to the pages and to each other; the BOS
anchors come from the kernel's log-sum-exp. So nothing is placed or concatenated per question, and
that pass too replays a captured graph.

The runner keeps what one question leaves for the next (`paged_decoder`): the context's buffers,
the block forward and the question passes with their graphs, and the prefix's KV. A question of
the same layout refills the buffers and replays the graphs: no allocation and no capture, which
otherwise cost several decode steps.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from engine.attention import full_mask
from engine.attention.split_kv import (
    PagedKV,
    SplitPlan,
    bos_attention_mass,
    make_split_plan,
    page_addresses,
    page_bos_keys,
    split_kv_attention,
    split_kv_reference,
)
from engine.cuda_graphs import GraphedCall
from engine.decode.loop import slot_logits_from_rows
from engine.decode.sampling import prediction_rows
from engine.decode.static import SelectedChunks, kept_prefix_kv
from engine.method.kv_cache import DocumentKV
from engine.method.prompting import QuestionPrompt
from engine.model.rope import shift_cos_sin
from engine.model.transformer import AttendingCache, LayerKV
from engine.runner import Runner


def _write_and_attend(kv: PagedKV, plan: SplitPlan, slots: torch.Tensor, use_kernel: bool, q: torch.Tensor,
                      k_new: torch.Tensor, v_new: torch.Tensor, scale: float,
                      lse_out: torch.Tensor | None = None) -> torch.Tensor:
    """q [1, Hq, T, D]; k_new, v_new [1, Hkv, T, D] written to the tail rows `slots` first."""
    kv.k_tail.index_copy_(1, slots, k_new[0])
    kv.v_tail.index_copy_(1, slots, v_new[0])
    if use_kernel:
        return split_kv_attention(q[0], kv, scale, plan, lse_out=lse_out)[None]
    return split_kv_reference(q[0], kv, scale, lse_out=lse_out)[None]


class PagedLayerCache:
    """One layer's static context; the model calls `attend` in place of concatenating a past."""

    def __init__(self, kv: PagedKV, plan: SplitPlan, slots: torch.Tensor, use_kernel: bool) -> None:
        self.kv, self.plan, self.slots, self.use_kernel = kv, plan, slots, use_kernel

    def attend(self, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, scale: float) -> torch.Tensor:
        return _write_and_attend(self.kv, self.plan, self.slots, self.use_kernel, q, k_new, v_new, scale)


class _QueryPassLayer:
    """A layer's context for the question's pass: the same pages and tail as `base` (read at call
    time, so a refilled context is seen), its own rows and plan, and the BOS anchors recorded."""

    def __init__(self, base: PagedLayerCache, plan: SplitPlan, slots: torch.Tensor, row_weights: torch.Tensor,
                 bos_mass: torch.Tensor, lse: torch.Tensor) -> None:
        self.base, self.plan, self.slots = base, plan, slots
        self.row_weights, self.bos_mass, self.lse = row_weights, bos_mass, lse

    def attend(self, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, scale: float) -> torch.Tensor:
        kv = self.base.kv
        out = _write_and_attend(kv, self.plan, self.slots, self.base.use_kernel, q, k_new, v_new, scale, self.lse)
        self.bos_mass.copy_(bos_attention_mass(q[0], kv, scale, self.lse, self.row_weights))
        return out


TAIL_ROUND = 128  # tail capacity is rounded up to this, so questions of similar length share a layout
QUERY_ROUND = 16  # the question's rows are padded to a multiple of this (one captured pass per size)
MAX_QUERY_PASSES = 4  # question passes (sizes) a runner keeps over its paged context, least recently used dropped


def query_rows(query_len: int) -> int:
    """Rows of the question's pass: the question's tokens padded to a multiple of QUERY_ROUND."""
    return -(-query_len // QUERY_ROUND) * QUERY_ROUND


@dataclass
class PagedContext:
    layers: list[PagedLayerCache]
    slots: torch.Tensor  # [block] long: tail rows the next forward writes (shared by all layers)
    tail_len: torch.Tensor  # [1] int32: tail rows attended (shared by all layers)
    answer_row: int  # tail row of answer slot 0
    answer_start: int  # position of answer slot 0
    anchor_logits: torch.Tensor | None  # [V] the row before the answer (shifted models), set by QueryPass
    layout: tuple  # what must match for another question to reuse these buffers (and a captured graph)
    prefix_len: int  # tail rows [0, prefix_len) hold the prefix; the question's rows follow, up to answer_row
    page_base: torch.Tensor  # [L, 2] int64: where each layer's pages are, for the kernel (PagedKV.page_base)
    bos_keys: torch.Tensor  # [L, K, Hkv, D]: each layer's page BOS keys (PagedKV.bos_keys)


def build_paged_context(runner: Runner, document: DocumentKV, chunk_ids: list[int], chunks: SelectedChunks,
                        prefix_kv: list[LayerKV], query_len: int, answer_start: int, gen_length: int,
                        block_length: int, use_kernel: bool, reuse: PagedContext | None = None) -> PagedContext:
    """Pages (the document's chunks, read in place) + a tail holding the prefix's KV, with rows left
    for the question's pass (`QueryPass`, which also sets `anchor_logits`) and the answer.

    The pages are moved to `chunks.starts` by the kernel's per-page query rotation. With `reuse` of
    the same layout (K, kept tokens, tail capacity, block, and the pages' strides; for the reference
    path, which reads pages by their tensors' addresses, the same document), its buffers are refilled
    in place and returned, so the graphs captured over them replay for this question, on this
    document or another.
    """
    cfg, device = runner.cfg, runner.device
    k, c = chunks.tokens.shape
    prefix_len = prefix_kv[0][0].shape[2]
    cos, sin = shift_cos_sin(chunks.starts, cfg.head_dim, cfg.rope_theta, cfg.rope_scaling_factor)
    cos, sin = cos.to(device), sin.to(device)  # [K, D/2], the same for every layer
    page_ids = torch.tensor(chunk_ids, dtype=torch.int32, device=device)
    tail_rows = prefix_len + query_len
    # Room for the padded question rows and for the answer after the real ones.
    cap = -(-(prefix_len + max(query_rows(query_len), query_len + gen_length)) // TAIL_ROUND) * TAIL_ROUND
    if chunks.kept is None:  # every valid token of every page, the same for every layer and head
        valid = torch.arange(c)[None, :] < chunks.lengths[:, None]  # [K, C]
        all_tokens = torch.where(valid, torch.arange(c), -1)[:, None].expand(k, cfg.num_kv_heads, c)
        all_tokens = all_tokens.to(torch.int32).contiguous().to(device)

    def token_ids(layer: int) -> torch.Tensor:  # [K, Hkv, B] int32
        if chunks.kept is None:
            return all_tokens
        return torch.where(chunks.valid[:, None, :], chunks.kept[:, layer], -1).to(torch.int32).to(device)

    k_pages, v_pages = document.keys.to(device), document.values.to(device)  # [L, N, Hkv, C, D]; in place if there
    # The kernel reads the pages through addresses kept in a buffer (PagedKV.page_base), so the
    # captured graphs serve any document whose pages have these strides. The reference path reads
    # them by the tensors' own addresses, so there the document itself must match.
    pages = tuple(k_pages[0].stride()) if use_kernel else (k_pages.data_ptr(), tuple(k_pages.shape))
    layout = (pages, k_pages.dtype, k, chunks.valid.shape[1], chunks.kept is None, cap, block_length, use_kernel)
    bos_keys = page_bos_keys(k_pages, page_ids)  # [L, K, Hkv, D]

    def addresses(tails: list[torch.Tensor]) -> torch.Tensor:  # [L, 2] int64, on the host
        return torch.stack([page_addresses(k_pages[layer], v_pages[layer], tail) for layer, tail in enumerate(tails)])

    if reuse is not None and reuse.layout == layout:
        shared = reuse.layers[0].kv
        shared.page_ids.copy_(page_ids)
        shared.rot_cos.copy_(cos)
        shared.rot_sin.copy_(sin)
        reuse.page_base.copy_(addresses([cache.kv.k_tail for cache in reuse.layers]))
        reuse.bos_keys.copy_(bos_keys)
        for layer, (cache, (kk, vv)) in enumerate(zip(reuse.layers, prefix_kv, strict=True)):
            # The kernel reads the pages through page_base; the views are set for the eager paths.
            cache.kv = replace(cache.kv, k_pages=k_pages[layer], v_pages=v_pages[layer])
            if layer == 0 or chunks.kept is not None:
                cache.kv.token_ids.copy_(token_ids(layer))
            cache.kv.k_tail[:, :prefix_len] = kk[0]
            cache.kv.v_tail[:, :prefix_len] = vv[0]
        reuse.answer_row, reuse.answer_start, reuse.anchor_logits = tail_rows, answer_start, None
        reuse.prefix_len = prefix_len
        return reuse
    slots = torch.zeros(block_length, dtype=torch.long, device=device)
    tail_len = torch.tensor([tail_rows], dtype=torch.int32, device=device)
    tails = [kk.new_zeros(2, cfg.num_kv_heads, cap, cfg.head_dim) for kk, _ in prefix_kv]  # per layer: k, v
    page_base = addresses([tail[0] for tail in tails]).to(device)  # [L, 2]
    bos_keys = bos_keys.contiguous()  # [L, K, Hkv, D], a buffer of its own
    plan = None
    layers = []
    for layer, ((kk, vv), (k_tail, v_tail)) in enumerate(zip(prefix_kv, tails, strict=True)):
        k_tail[:, :prefix_len] = kk[0]
        v_tail[:, :prefix_len] = vv[0]
        paged = PagedKV(k_pages[layer], v_pages[layer], page_ids, token_ids(layer), cos, sin, k_tail, v_tail,
                        tail_len, page_base[layer] if use_kernel else None, bos_keys[layer])
        if plan is None:  # shapes are the same in every layer
            plan = make_split_plan(paged, cfg.num_heads // cfg.num_kv_heads * block_length)
        layers.append(PagedLayerCache(paged, plan, slots, use_kernel))
    return PagedContext(layers, slots, tail_len, tail_rows, answer_start, None, layout, prefix_len, page_base,
                        bos_keys)


class _BlockForward:
    """One forward of `length` rows over a paged context's layers: logits of `rows` ([R, V], None
    without rows); eager, or one captured CUDA graph replayed with new inputs."""

    def __init__(self, runner: Runner, layers: list[AttendingCache], length: int, rows: torch.Tensor | None,
                 use_graph: bool, fixed_shape: bool) -> None:
        self.runner, self.layers, self.rows, self.fixed_shape = runner, layers, rows, fixed_shape
        self.ids = torch.zeros(1, length, dtype=torch.long, device=runner.device)
        self.positions = torch.zeros(1, length, dtype=torch.long, device=runner.device)
        self._call = GraphedCall(self._run, use_graph, "decode step")

    def _run(self) -> torch.Tensor | None:
        logits = self.runner.forward(self.ids, self.positions, full_mask(), past=self.layers, logits_rows=self.rows,
                                     return_kv=False, fixed_shape=self.fixed_shape).logits
        return None if logits is None else logits[0]

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor | None:
        # Warm-up and capture (first call) run the real inputs, so the KV they write into the
        # active slots is the step's own.
        self.ids.copy_(ids)
        self.positions.copy_(positions)
        return self._call()


class QueryPass:
    """The question's one forward over a PagedContext: its rows (padded to `rows`) write their KV
    into the tail after the prefix and attend to the pages, the prefix and each other (padding rows
    sit past `tail_len`, so no real row sees them, and the answer's rows overwrite them). Records
    each layer's attention mass on each page's BOS and, for a shifted model, the last row's logits
    (the anchor that predicts answer slot 0)."""

    def __init__(self, runner: Runner, ctx: PagedContext, rows: int, use_graph: bool) -> None:
        cfg, device = runner.cfg, ctx.slots.device
        self.runner, self.ctx, self.rows = runner, ctx, rows
        num_pages = ctx.layers[0].kv.page_ids.numel()
        self.slots = torch.zeros(rows, dtype=torch.long, device=device)
        self.row_weights = torch.zeros(rows, dtype=torch.float32, device=device)
        self.bos_mass = torch.zeros(cfg.num_layers, num_pages, dtype=torch.float32, device=device)
        lse = torch.zeros(cfg.num_heads, rows, dtype=torch.float32, device=device)  # scratch, shared by layers
        plan = make_split_plan(ctx.layers[0].kv, cfg.num_heads // cfg.num_kv_heads * rows)
        layers = [_QueryPassLayer(base, plan, self.slots, self.row_weights, self.bos_mass[i], lse)
                  for i, base in enumerate(ctx.layers)]
        self.last_row = torch.zeros(1, dtype=torch.long, device=device)
        self._forward = _BlockForward(runner, layers, rows, self.last_row if cfg.logits_shifted else None,
                                      use_graph, fixed_shape=False)

    def __call__(self, query_ids: list[int], query_start: int) -> torch.Tensor:
        """Runs the pass; sets `ctx.anchor_logits`; returns the BOS anchors [K, L] (on the host)."""
        ctx, n, device = self.ctx, len(query_ids), self.slots.device
        assert n <= self.rows and ctx.prefix_len + n == ctx.answer_row
        offsets = torch.arange(self.rows, device=device)
        self.slots.copy_(ctx.prefix_len + offsets)
        ctx.tail_len.fill_(ctx.answer_row)  # keys: prefix and the real question rows
        self.row_weights.copy_((offsets < n).float() / n)
        self.last_row.fill_(n - 1)
        ids = torch.full((1, self.rows), self.runner.cfg.mask_token_id, dtype=torch.long)
        ids[0, :n] = torch.tensor(query_ids)
        logits = self._forward(ids.to(device, non_blocking=True), (query_start + offsets)[None])
        ctx.anchor_logits = logits[0].clone() if logits is not None else None
        return self.bos_mass.T.cpu()


def block_step(runner: Runner, ctx: PagedContext, block_length: int, use_graph: bool) -> _BlockForward:
    """The answer block's forward over `ctx` (all of its rows' logits; slot 0 of a shifted model
    takes the anchor): fixed shapes, one captured graph on CUDA."""
    shifted = runner.cfg.logits_shifted
    # Rows whose logits predict block slots 0..T-1 (slot 0 of a shifted model: the anchor).
    rows = (prediction_rows(torch.arange(1, block_length + 1), shifted) - 1).clamp_min(0).to(runner.device)
    return _BlockForward(runner, ctx.layers, block_length, rows, use_graph, fixed_shape=True)


class PagedStaticDecoder:
    """A Decoder (see engine.decode.loop) over a PagedContext; `step` is `block_step`'s forward
    over the same context (kept by the caller, so its graph replays for the next question)."""

    def __init__(self, runner: Runner, ctx: PagedContext, block_length: int, step: _BlockForward) -> None:
        assert step.layers is ctx.layers
        self.runner, self.ctx, self.block_length, self._step = runner, ctx, block_length, step
        device = ctx.slots.device
        # The refresh of a finished block needs only its last row (the next block's anchor).
        last = torch.tensor([block_length - 1], device=device)
        self._refresh = _BlockForward(runner, ctx.layers, block_length, last, use_graph=False, fixed_shape=True)
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
        return slot_logits_from_rows(block_rows[local], local, self.anchor, self.runner.cfg.logits_shifted)

    def block_done(self, block: int, answer: torch.Tensor) -> None:
        self.forward_passes += 1
        last = self._refresh(self._block_ids(block, answer), self._positions)
        if self.runner.cfg.logits_shifted:
            self.anchor = last[0].clone()


@dataclass
class _PagedBuffers:
    """What the paged route leaves in the runner for the next question: the context's buffers and
    the block forward over them (with its captured graph)."""

    context: PagedContext | None = None
    step: _BlockForward | None = None


def paged_decoder(runner: Runner, document: DocumentKV, chunk_ids: list[int], chunks: SelectedChunks,
                  prompt: QuestionPrompt, query_start: int, gen_length: int,
                  block_length: int) -> tuple[PagedStaticDecoder, torch.Tensor]:
    """Static decoding over `document`'s pages `chunk_ids` in place: the prefix's KV (kept per
    prefix: it attends only to itself, so it is the same for every question and document), the
    question's pass over the pages, and a decoder for the answer's steps (captured graphs on CUDA).
    Reuses the runner's buffers and graphs when the layout matches (see `build_paged_context`).
    Returns the decoder and the BOS anchors of the question's pass ([K, L], on the host)."""
    use_graph = runner.uses_graphs
    prefix_kv = kept_prefix_kv(runner, prompt.prefix_ids)
    kept = runner.kept("paged buffers", None, 1, _PagedBuffers)
    nq = len(prompt.query_ids)
    ctx = build_paged_context(runner, document, chunk_ids, chunks, prefix_kv, nq, query_start + nq, gen_length,
                              block_length, use_kernel=runner.split_kv_usable, reuse=kept.context)
    if kept.context is not ctx:  # new buffers: the passes over the old ones go with them
        runner.kept_items("paged query pass").clear()
        kept.context, kept.step = ctx, None
    rows = query_rows(nq)
    query = runner.kept("paged query pass", rows, MAX_QUERY_PASSES, lambda: QueryPass(runner, ctx, rows, use_graph))
    anchors = query(prompt.query_ids, query_start)
    if kept.step is None:
        kept.step = block_step(runner, ctx, block_length, use_graph)
    return PagedStaticDecoder(runner, ctx, block_length, kept.step), anchors


def release_pages(runner: Runner) -> None:
    """Drops the kept context's references to the document's KV once an answer is done, so the
    runner never keeps a document alive (the KV pool decides that). A later question with the same
    layout sets the pages again."""
    kept = runner.kept_items("paged buffers").get(None)
    if kept is None or kept.context is None:
        return
    for cache in kept.context.layers:
        empty = cache.kv.k_pages.new_empty((0, *cache.kv.k_pages.shape[1:]))
        cache.kv = replace(cache.kv, k_pages=empty, v_pages=empty)
