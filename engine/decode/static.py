"""Decoding over static KV: the selected chunks' cached KV, the question's KV computed once, and
only the active answer block recomputed per step.

Attention structure (what a full recompute would need as its mask, see tests/test_static_decode.py):
the prefix sees itself; each chunk sees itself (its cached KV, encoded alone); the query sees
prefix, chunks and query; a finished block sees everything before it and itself (its KV is
refreshed once, when it is complete); the active block sees everything before it and itself.
For a shifted-logit model (Dream) the first slot of a block is predicted by the row before the
block, whose logits were computed when that row's KV was (query pass or block refresh).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.attention import bos_probs, full_mask
from engine.cuda_graphs import ANSWER_GRAPHS, GraphedCall, kept_pool
from engine.decode.loop import (
    BlockDone,
    BlockRefreshed,
    DecidedStep,
    LogitsRequest,
    block_logits,
    decide_together,
    slot_logits_from_rows,
)
from engine.decode.sampling import prediction_rows
from engine.method.kv_cache import flatten_chunks, gather_kept_tokens, place_chunks
from engine.method.prompting import QuestionPrompt
from engine.model.transformer import AttentionCapture, LayerKV
from engine.runner import Runner


@dataclass(frozen=True)
class SelectedChunks:
    """The chosen chunks, in placement order, ready to be placed at their positions."""

    # [L, K, Hkv, T, D] local-position keys and values (T = C, or B after token selection); None on
    # the paged route, which reads them in place from the document's cache.
    keys: torch.Tensor | None
    values: torch.Tensor | None
    valid: torch.Tensor  # [K, T] bool
    starts: torch.Tensor  # [K] long, position of each chunk's BOS
    tokens: torch.Tensor  # [K, C] long, full chunk tokens (for joint re-encoding)
    lengths: torch.Tensor  # [K] long
    kept: torch.Tensor | None  # [K, L, Hkv, T] long offsets kept per head, None = all

    @property
    def num_chunks(self) -> int:
        return self.tokens.shape[0]


@dataclass
class FixedContext:
    kv: list[LayerKV]  # per layer [1, Hkv, T_fixed, D]
    key_valid: torch.Tensor  # [1, T_fixed] bool
    answer_start: int  # position of answer slot 0
    anchor_logits: torch.Tensor | None  # [V] logits of the row before the answer (shifted models)
    first_step_logits: torch.Tensor | None = None  # [block, V] for block 0's first step (joint)
    anchors: torch.Tensor | None = None  # [K, L] query attention mass on each chunk's BOS
    forward_passes: int = 0


def _bos_anchor_mass(attention: dict[int, torch.Tensor], bos_keys: torch.Tensor,
                     num_layers: int) -> torch.Tensor:
    """Mean over heads and query rows of the attention on each chunk's BOS key: [K, L]."""
    per_layer = [attention[layer][0][..., bos_keys].mean(dim=(0, 1)) for layer in range(num_layers)]
    return torch.stack(per_layer, dim=1).float().cpu()


def _cat_kv(a: list[LayerKV], b: list[LayerKV]) -> list[LayerKV]:
    return [(torch.cat((ka, kb), 2), torch.cat((va, vb), 2)) for (ka, va), (kb, vb) in zip(a, b, strict=True)]


def kept_prefix_kv(runner: Runner, prefix_ids: list[int]) -> list[LayerKV]:
    """The prompt prefix's KV (per layer [1, Hkv, P, D]), kept by the runner per prefix: the prefix
    attends only to itself, so it is the same for every question and document (never modified:
    contexts are built from copies)."""
    def prefix_pass() -> list[LayerKV]:
        ids = torch.tensor(prefix_ids, device=runner.device)[None]
        return runner.forward(ids, torch.arange(len(prefix_ids), device=runner.device)[None], full_mask()).kv

    return runner.kept("prefix kv", tuple(prefix_ids), 1, prefix_pass)


@dataclass(frozen=True)
class QuestionContextRequest:
    """One question's static context to build: its prompt, its selected chunks (their KV stacked)
    and where its query starts; `extra_ids` are appended to the query (re-selecting with a partial
    answer)."""

    prompt: QuestionPrompt
    chunks: SelectedChunks
    query_start: int
    extra_ids: tuple[int, ...] = ()

    @property
    def query_ids(self) -> list[int]:
        return list(self.prompt.query_ids) + list(self.extra_ids)


@torch.inference_mode()
def build_static_context(runner: Runner, prompt: QuestionPrompt, chunks: SelectedChunks, query_start: int,
                         extra_ids: list[int] | None = None, kept_pass: bool = True) -> FixedContext:
    """Prefix KV (alone), the placed chunk KV (re-rotated, no re-encode), then the query's KV once.

    `extra_ids` are appended to the query (used when re-selecting with a partial answer).
    `kept_pass`: the question's pass is the runner's `StaticQueryPass` of this shape (fixed
    buffers, a captured graph on CUDA); False runs it eagerly with attention capture (the reference).
    """
    request = QuestionContextRequest(prompt, chunks, query_start, tuple(extra_ids or ()))
    if kept_pass:
        return build_static_contexts(runner, [request])[0]
    cfg, device = runner.cfg, runner.device
    p = len(prompt.prefix_ids)
    placed_k, placed_v, valid = _placed_context(runner, request)
    placed = [(placed_k[layer], placed_v[layer]) for layer in range(cfg.num_layers)]
    past = _cat_kv(kept_prefix_kv(runner, prompt.prefix_ids), placed)
    q_ids = request.query_ids
    nq = len(q_ids)
    key_valid = torch.cat((valid, torch.ones(nq, dtype=torch.bool, device=device)))[None]
    bos_keys = p + torch.arange(chunks.num_chunks, device=device) * chunks.keys.shape[3]
    query = runner.forward(torch.tensor(q_ids, device=device)[None],
                           (query_start + torch.arange(nq, device=device))[None], full_mask(key_valid=key_valid),
                           past=past, logits_rows=torch.tensor([nq - 1], device=device) if cfg.logits_shifted else None,
                           capture=AttentionCapture(tuple(range(cfg.num_layers)), torch.arange(nq, device=device)))
    return FixedContext(
        kv=_cat_kv(past, query.kv), key_valid=key_valid, answer_start=query_start + nq,
        anchor_logits=query.logits[0, 0] if cfg.logits_shifted else None,
        anchors=_bos_anchor_mass(query.attention, bos_keys, cfg.num_layers), forward_passes=2)


def _placed_context(runner: Runner, request: QuestionContextRequest
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The chunks' KV placed at their positions, [L, 1, Hkv, K*T, D] each, and the context's valid
    keys [P + K*T] bool (the prefix first)."""
    cfg, device, chunks = runner.cfg, runner.device, request.chunks
    placed_k = flatten_chunks(place_chunks(chunks.keys.to(device), chunks.starts, cfg.rope_theta,
                                           cfg.rope_scaling_factor))
    placed_v = flatten_chunks(chunks.values.to(device))
    prefix = torch.ones(len(request.prompt.prefix_ids), dtype=torch.bool)
    return placed_k, placed_v, torch.cat((prefix, chunks.valid.flatten().cpu())).to(device)


QUESTION_ROUND = 16  # the question's rows are padded to a multiple of this (one captured pass per size)
# Question passes (shapes x batch sizes) a runner keeps, least recently used dropped: a pass of 8
# questions over 4 chunks of 512 holds ~1 GB of buffers at Dream-7B's shape, ~9 GB at LLaDA-8B's
# (32 KV heads), so a pass's batch is capped by bytes too (MAX_QUESTION_PASS_BYTES).
MAX_QUESTION_PASSES = 8
MAX_QUESTION_PASS_BYTES = 2 << 30
MAX_QUESTION_BATCH = 8  # questions in one question pass at most


@torch.inference_mode()
def build_static_contexts(runner: Runner, requests: list[QuestionContextRequest]) -> list[FixedContext]:
    """`build_static_context` of several questions: those of one shape (prefix, chunk count and
    keys, padded question rows) in one batched pass of the runner's (`StaticQueryPass`, fixed
    buffers, a captured graph on CUDA), up to MAX_QUESTION_BATCH a pass (fewer where their buffers
    would pass MAX_QUESTION_PASS_BYTES), rows padded to a power of two so few batch sizes are
    captured."""
    contexts: list[FixedContext | None] = [None] * len(requests)
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(requests):
        rows = -(-len(r.query_ids) // QUESTION_ROUND) * QUESTION_ROUND
        shape = (len(r.prompt.prefix_ids), r.chunks.num_chunks, r.chunks.keys.shape[3], rows)
        groups.setdefault((shape, r.chunks.keys.dtype), []).append(i)
    cfg = runner.cfg
    for (shape, dtype), members in groups.items():
        p, k, t, rows = shape
        one = 2 * cfg.num_layers * cfg.num_kv_heads * (p + k * t + rows) * cfg.head_dim * dtype.itemsize  # bytes
        fits = max(1, min(MAX_QUESTION_BATCH, MAX_QUESTION_PASS_BYTES // one))
        most = 1 << (fits.bit_length() - 1)  # a power of two, as the passes' rows are
        for lo in range(0, len(members), most):
            part = members[lo:lo + most]
            batch = batch_rows(len(part))
            query_pass = runner.kept("static question pass", (*shape, batch, dtype), MAX_QUESTION_PASSES,
                                     lambda shape=shape, dtype=dtype, batch=batch: StaticQueryPass(runner, *shape,
                                                                                                   dtype, batch))
            for i, ctx in zip(part, query_pass([requests[i] for i in part]), strict=True):
                contexts[i] = ctx
    return contexts


class _QuestionLayerCache:
    """One layer of the question pass over B static contexts: keys and values [B, Hkv, Tc + R, D]
    (row b: [prefix | placed chunks | the question's R padded rows]); the rows write their KV in
    place, attend to the valid keys, and record the real rows' attention mass on each chunk's BOS."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, valid: torch.Tensor, runner: Runner,
                 bos_keys: torch.Tensor, row_weights: torch.Tensor, bos_mass: torch.Tensor) -> None:
        self.keys, self.values, self.runner = keys, values, runner
        self.valid = valid  # [B, Tc + R] bool, shared by the layers
        self.mask = full_mask(key_valid=valid)
        self.bos_keys, self.row_weights, self.bos_mass = bos_keys, row_weights, bos_mass  # [K], [B, R], [B, K]

    def attend(self, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, scale: float) -> torch.Tensor:
        rows = k_new.shape[2]
        self.keys[:, :, -rows:] = k_new
        self.values[:, :, -rows:] = v_new
        out, lse = self.runner.attention(q, self.keys, self.values, self.mask, scale, return_lse=True)
        bos = bos_probs(q, self.keys[:, :, self.bos_keys], lse, scale)  # [B, Hq, R, K] fp32
        bos = torch.where(self.valid[:, None, None, self.bos_keys], bos, 0.0)  # a spare row's context is masked
        # Mean over heads and real rows (padding rows weigh 0), as _bos_anchor_mass takes it.
        self.bos_mass.copy_(torch.einsum("bhrk,br->bk", bos, self.row_weights) / bos.shape[1])
        return out


class StaticQueryPass:
    """The question pass over `batch` static contexts of one shape (prefix of P tokens, K chunks of
    T keys, R question rows): fixed buffers each context is copied into (one copy for all layers),
    then one forward, a captured CUDA graph on CUDA. Returns each question's FixedContext (its own
    copy); rows without a question repeat the first one's question rows over no context, ignored."""

    def __init__(self, runner: Runner, prefix_len: int, num_chunks: int, chunk_keys: int, rows: int,
                 dtype: torch.dtype, batch: int = 1) -> None:
        cfg, device = runner.cfg, runner.device
        self.runner, self.rows, self.batch = runner, rows, batch
        self.context_len = prefix_len + num_chunks * chunk_keys
        shape = (cfg.num_layers, batch, cfg.num_kv_heads, self.context_len + rows, cfg.head_dim)
        # On the model's device, whatever the documents' (their chunks are copied in).
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.valid = torch.zeros(batch, self.context_len + rows, dtype=torch.bool, device=device)
        self.ids = torch.zeros(batch, rows, dtype=torch.long, device=device)
        self.positions = torch.zeros(batch, rows, dtype=torch.long, device=device)
        self.row_weights = torch.zeros(batch, rows, dtype=torch.float32, device=device)
        self.bos_mass = torch.zeros(cfg.num_layers, batch, num_chunks, dtype=torch.float32, device=device)
        self.last_row = torch.zeros(batch, 1, dtype=torch.long, device=device)
        bos_keys = prefix_len + torch.arange(num_chunks, device=device) * chunk_keys
        self.layers = [_QuestionLayerCache(self.keys[layer], self.values[layer], self.valid, runner, bos_keys,
                                           self.row_weights, self.bos_mass[layer]) for layer in range(cfg.num_layers)]
        self._call = GraphedCall(self._run, runner.uses_graphs, "question pass", kept_pool(runner, ANSWER_GRAPHS))

    def _run(self) -> torch.Tensor | None:
        shifted = self.runner.cfg.logits_shifted
        return self.runner.forward(self.ids, self.positions, full_mask(), past=self.layers,
                                   logits_rows=self.last_row if shifted else None, return_kv=False).logits

    def __call__(self, requests: list[QuestionContextRequest]) -> list[FixedContext]:
        assert 0 < len(requests) <= self.batch
        cfg, tc = self.runner.cfg, self.context_len
        padded = requests + [requests[0]] * (self.batch - len(requests))
        ids = torch.full((self.batch, self.rows), cfg.mask_token_id, dtype=torch.long)
        offsets = torch.arange(self.rows)
        lengths = torch.tensor([len(r.query_ids) for r in padded])  # [B]
        assert int(lengths.min()) > 0 and int(lengths.max()) <= self.rows
        for row, request in enumerate(padded):
            ids[row, :lengths[row]] = torch.tensor(request.query_ids)
            if row >= len(requests):  # a spare row: the first question's rows over no context
                self.valid[row, :tc] = False
                continue
            placed_k, placed_v, valid = _placed_context(self.runner, request)
            prefix_kv = kept_prefix_kv(self.runner, request.prompt.prefix_ids)
            p = prefix_kv[0][0].shape[2]
            assert valid.numel() == tc
            self.keys[:, row, :, :p] = torch.stack([k[0] for k, _ in prefix_kv])
            self.values[:, row, :, :p] = torch.stack([v[0] for _, v in prefix_kv])
            self.keys[:, row, :, p:tc] = placed_k[:, 0]
            self.values[:, row, :, p:tc] = placed_v[:, 0]
            self.valid[row, :tc] = valid
        device = self.ids.device
        self.valid[:, tc:] = (offsets[None] < lengths[:, None]).to(device)
        self.ids.copy_(ids)
        starts = torch.tensor([r.query_start for r in padded])
        self.positions.copy_(starts[:, None] + offsets[None])
        self.row_weights.copy_((offsets[None] < lengths[:, None]).float() / lengths[:, None])
        self.last_row.copy_(lengths[:, None] - 1)
        logits = self._call()
        anchors = self.bos_mass.permute(1, 2, 0).cpu()  # [B, K, L]
        contexts = []
        for row, request in enumerate(requests):
            n = int(lengths[row])
            keys = self.keys[:, row:row + 1, :, :tc + n].clone()  # [L, 1, Hkv, Tc + n, D]
            values = self.values[:, row:row + 1, :, :tc + n].clone()
            contexts.append(FixedContext(
                kv=[(keys[layer], values[layer]) for layer in range(cfg.num_layers)],
                key_valid=self.valid[row:row + 1, :tc + n].clone(), answer_start=request.query_start + n,
                anchor_logits=logits[row, 0].clone() if cfg.logits_shifted else None,
                anchors=anchors[row], forward_passes=2))
        return contexts


@torch.inference_mode()
def build_joint_context(runner: Runner, prompt: QuestionPrompt, chunks: SelectedChunks, query_start: int,
                        gen_length: int, block_length: int) -> FixedContext:
    """Re-encodes [prefix | chunks | query | answer masks] together once (full attention).

    The prompt part's KV becomes the fixed context (token selection, if any, applied per head
    afterwards); the mask rows' logits serve block 0's first step, as in the authors' best setting.
    """
    cfg, device = runner.cfg, runner.device
    p, nq = len(prompt.prefix_ids), len(prompt.query_ids)
    k, c = chunks.tokens.shape
    answer_start = query_start + nq
    ids = torch.cat((torch.tensor(prompt.prefix_ids), chunks.tokens.flatten(), torch.tensor(prompt.query_ids),
                     torch.full((gen_length,), cfg.mask_token_id)))
    positions = torch.cat((torch.arange(p), (chunks.starts[:, None] + torch.arange(c)).flatten(),
                           query_start + torch.arange(nq), answer_start + torch.arange(gen_length)))
    chunk_valid = torch.arange(c)[None, :] < chunks.lengths[:, None]
    valid = torch.cat((torch.ones(p, dtype=torch.bool), chunk_valid.flatten(),
                       torch.ones(nq + gen_length, dtype=torch.bool)))
    fixed_len = p + k * c + nq
    slots = fixed_len + torch.arange(block_length)
    rows = prediction_rows(slots, cfg.logits_shifted)
    q_rows = torch.arange(p + k * c, fixed_len)
    out = runner.forward(ids.to(device)[None], positions.to(device)[None], full_mask(key_valid=valid.to(device)[None]),
                         logits_rows=rows.to(device),
                         capture=AttentionCapture(tuple(range(cfg.num_layers)), q_rows.to(device)))
    kv = [(kk[:, :, :fixed_len], vv[:, :, :fixed_len]) for kk, vv in out.kv]
    valid = valid[:fixed_len]
    if chunks.kept is not None:
        kv, valid = _select_tokens_in_joint(kv, valid, chunks, p, nq)
    bos_keys = (p + torch.arange(k) * c).to(device)
    return FixedContext(
        kv=kv, key_valid=valid.to(device)[None], answer_start=answer_start,
        anchor_logits=out.logits[0, 0] if cfg.logits_shifted else None,
        first_step_logits=out.logits[0], anchors=_bos_anchor_mass(out.attention, bos_keys, cfg.num_layers),
        forward_passes=1)


def _select_tokens_in_joint(kv: list[LayerKV], valid: torch.Tensor, chunks: SelectedChunks, p: int,
                            nq: int) -> tuple[list[LayerKV], torch.Tensor]:
    """Applies per-head token selection to the chunk segment of jointly encoded KV."""
    k, c = chunks.tokens.shape
    keys = torch.stack([kk[0, :, p:p + k * c] for kk, _ in kv])  # [L, Hkv, K*C, D]
    values = torch.stack([vv[0, :, p:p + k * c] for _, vv in kv])
    layers, hkv, _, d = keys.shape
    as_chunks = lambda t: t.view(layers, hkv, k, c, d).permute(0, 2, 1, 3, 4)  # noqa: E731
    sel_k = flatten_chunks(gather_kept_tokens(as_chunks(keys), chunks.kept))  # [L, 1, Hkv, K*B, D]
    sel_v = flatten_chunks(gather_kept_tokens(as_chunks(values), chunks.kept))
    out = []
    for layer, (kk, vv) in enumerate(kv):
        out.append((torch.cat((kk[:, :, :p], sel_k[layer], kk[:, :, p + k * c:]), 2),
                    torch.cat((vv[:, :, :p], sel_v[layer], vv[:, :, p + k * c:]), 2)))
    new_valid = torch.cat((valid[:p], chunks.valid.flatten().cpu(), valid[p + k * c:]))
    return out, new_valid


class StaticDecoder:
    """Logits for the active block over a FixedContext; finished blocks join the context."""

    def __init__(self, runner: Runner, ctx: FixedContext, block_length: int,
                 on_block_done: Callable[[int, torch.Tensor], FixedContext | None] | None = None) -> None:
        self.runner, self.ctx = runner, ctx
        self.block_length = block_length
        self.on_block_done = on_block_done
        self.forward_passes = ctx.forward_passes
        self._pending_first = ctx.first_step_logits

    def _block_inputs(self, block: int, answer: torch.Tensor):
        lo = block * self.block_length
        device = answer.device
        ids = answer[None, lo:lo + self.block_length]
        positions = (self.ctx.answer_start + lo + torch.arange(self.block_length, device=device))[None]
        valid = torch.cat((self.ctx.key_valid, torch.ones(1, self.block_length, dtype=torch.bool, device=device)), 1)
        return ids, positions, full_mask(key_valid=valid)

    def block_start(self, block: int, answer: torch.Tensor) -> None:
        pass

    def slot_logits(self, block: int, answer: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        lo = block * self.block_length
        if self._pending_first is not None:
            first, self._pending_first = self._pending_first, None
            return first[slots - lo]
        ids, positions, mask = self._block_inputs(block, answer)
        self.forward_passes += 1
        return block_logits(self.runner, ids, positions, mask, self.ctx.kv, slots - lo, self.ctx.anchor_logits)

    def block_done(self, block: int, answer: torch.Tensor) -> None:
        if self.on_block_done is not None:
            new_ctx = self.on_block_done(block, answer)
            if new_ctx is not None:
                self.ctx = new_ctx
                self.forward_passes += new_ctx.forward_passes
                return
        ids, positions, mask = self._block_inputs(block, answer)
        shifted = self.runner.cfg.logits_shifted
        last = torch.tensor([self.block_length - 1], device=ids.device) if shifted else None
        out = self.runner.forward(ids, positions, mask, past=self.ctx.kv, logits_rows=last)
        self.forward_passes += 1
        self.take_block(out.kv, out.logits[0, 0] if shifted else None)

    def take_block(self, block_kv: list[LayerKV], anchor_logits: torch.Tensor | None) -> None:
        """The finished block's KV (per layer [1, Hkv, block, D], copied) joins the context; a shifted
        model's next block takes `anchor_logits` ([V], the block's last row's) for its slot 0."""
        self.ctx = FixedContext(
            kv=_cat_kv(self.ctx.kv, block_kv),
            key_valid=torch.cat((self.ctx.key_valid, self.ctx.key_valid.new_ones(1, self.block_length)), 1),
            answer_start=self.ctx.answer_start, anchor_logits=anchor_logits, anchors=self.ctx.anchors)


BATCH_CONTEXT_ROUND = 256  # a batch's padded context length is rounded up to this (fewer captured shapes)
MAX_BATCH_STEPS = 2  # batched steps (one a block length, each with its buffers and graphs) a runner keeps


def batch_rows(n: int) -> int:
    """Rows of the batched step serving `n` questions: the next power of two (one graph a size)."""
    return 1 << (n - 1).bit_length()


class _BatchedLayerCache:
    """One layer of a batch's static contexts, attending by itself (an AttendingCache): keys and
    values [N, Hkv, T + block, D], row i its question's context padded to T, then its active block,
    which each forward writes in place (no concatenation per step)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, valid: torch.Tensor, runner: Runner) -> None:
        self.keys, self.values, self.runner = keys, values, runner
        self.mask = full_mask(key_valid=valid)  # valid: [N, T + block] bool, shared by the layers

    def attend(self, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, scale: float) -> torch.Tensor:
        block = k_new.shape[2]
        self.keys[:, :, -block:] = k_new
        self.values[:, :, -block:] = v_new
        out, _ = self.runner.attention(q, self.keys, self.values, self.mask, scale, return_lse=False)
        return out


class _RowsForward:
    """The batched block forward over the first `rows` rows of a step's buffers (views of them),
    with its own captured graph on CUDA. Holds no reference to the step: the step holds it."""

    def __init__(self, step: _BatchedStep, rows: int) -> None:
        self.runner = step.runner
        self.layers = [_BatchedLayerCache(c.keys[:rows], c.values[:rows], step.valid[:rows], step.runner)
                       for c in step.layers]
        self.ids, self.positions, self.logit_rows = step.ids[:rows], step.positions[:rows], step.logit_rows
        self.call = GraphedCall(self._run, self.runner.uses_graphs, f"batched decode step ({rows} rows)",
                                kept_pool(self.runner, ANSWER_GRAPHS))

    def _run(self) -> torch.Tensor:
        return self.runner.forward(self.ids, self.positions, full_mask(), past=self.layers,
                                   logits_rows=self.logit_rows, return_kv=False).logits  # [rows, block (+1), V]


class _BatchedStep:
    """The batched block forward for up to `capacity` questions (a power of two), contexts padded
    to `context_len`, `block_length` slots each: fixed-address buffers and, on CUDA, one captured
    graph per row count (a power of two), each over the buffers' first rows. A batch that grows or
    shrinks within the capacity keeps its questions' rows and graphs: nothing is copied or captured
    again as questions come and go.

    Each context is copied into a row once, when its question joins (or its context changes at a
    block's end, or the batch shrinks past its row); a step then copies only the blocks' ids and
    positions. Rows without a question see only their own block (their keys are masked out) and
    their logits are ignored.
    """

    def __init__(self, runner: Runner, capacity: int, context_len: int, block_length: int,
                 like: torch.Tensor) -> None:
        if capacity != batch_rows(capacity):
            raise ValueError(f"a batched step's capacity is a power of two, got {capacity}")
        cfg, device = runner.cfg, runner.device
        self.runner, self.capacity, self.context_len, self.block_length = runner, capacity, context_len, block_length
        shape = (capacity, cfg.num_kv_heads, context_len + block_length, cfg.head_dim)
        self.valid = torch.zeros(capacity, context_len + block_length, dtype=torch.bool, device=device)
        self.valid[:, context_len:] = True
        self.layers = [_BatchedLayerCache(like.new_zeros(shape), like.new_zeros(shape), self.valid, runner)
                       for _ in range(cfg.num_layers)]
        self.ids = torch.full((capacity, block_length), cfg.mask_token_id, dtype=torch.long, device=device)
        self.positions = torch.zeros(capacity, block_length, dtype=torch.long, device=device)
        # Block row j's logits predict block slot j (for a shifted model slot 0 takes the anchor); a
        # shifted model's logits add the block's last row, the next block's anchor once it is settled
        # (computed at every step for every row, since a graph has one shape: one lm_head row more).
        rows_for_slots = (prediction_rows(torch.arange(1, block_length + 1), cfg.logits_shifted) - 1).clamp_min(0)
        if cfg.logits_shifted:
            rows_for_slots = torch.cat((rows_for_slots, torch.tensor([block_length - 1])))
        self.logit_rows = rows_for_slots.to(device)
        self.members: list[FixedContext | None] = [None] * capacity  # held: no new context can take their ids
        self._forwards: dict[int, _RowsForward] = {}  # by row count

    def release(self) -> None:
        """Forgets the members (their contexts' memory is the questions'; the buffers stay)."""
        self.members = [None] * self.capacity

    def place(self, contexts: list[FixedContext]) -> list[int]:
        """The row of each context, all below `batch_rows(len(contexts))` (the forward's rows): a
        context already in such a row keeps it; rows of contexts no longer asked for are freed; a
        context beyond them moves down, a new one is copied into the lowest free row."""
        within = batch_rows(len(contexts))
        if within > self.capacity:
            raise ValueError(f"{len(contexts)} contexts in a step of {self.capacity} rows")
        for row, member in enumerate(self.members):
            if member is not None and not any(member is c for c in contexts):
                self.let_go(row)
        for row in range(within, self.capacity):
            if self.members[row] is not None:
                self._move(row, self.members.index(None))
        rows = []
        for ctx in contexts:
            row = next((i for i, m in enumerate(self.members) if m is ctx), None)
            if row is None:
                row = self.members.index(None)
                self._fill(row, ctx)
            rows.append(row)
        return rows

    def _move(self, source: int, target: int) -> None:
        """The member of row `source` (context and active block's KV) into the free row `target`."""
        for layer in self.layers:
            layer.keys[target] = layer.keys[source]
            layer.values[target] = layer.values[source]
        self.valid[target] = self.valid[source]
        self.members[target] = self.members[source]
        self.let_go(source)

    def _fill(self, row: int, ctx: FixedContext) -> None:
        n = ctx.key_valid.shape[1]
        for cache, (keys, values) in zip(self.layers, ctx.kv, strict=True):
            cache.keys[row, :, :n] = keys[0]
            cache.values[row, :, :n] = values[0]
        self.valid[row, :n] = ctx.key_valid[0]
        self.valid[row, n:self.context_len] = False
        self.members[row] = ctx

    def let_go(self, row: int) -> None:
        """Frees `row`: no member, no valid context key."""
        self.members[row] = None
        self.valid[row, :self.context_len] = False

    def block_kv(self, row: int) -> list[LayerKV]:
        """The KV the last forward computed for `row`'s block: per layer views [1, Hkv, block, D]
        (overwritten by the next forward)."""
        return [(layer.keys[row:row + 1, :, -self.block_length:], layer.values[row:row + 1, :, -self.block_length:])
                for layer in self.layers]

    def grow(self, row: int, old: FixedContext, ctx: FixedContext) -> None:
        """`row`'s member `old` becomes `ctx`, `old` with the block the last forward computed
        appended: the block is copied after `old` in the row where the buffers have room, else the
        row is let go (the next `place` copies `ctx` whole, into a longer step if need be)."""
        n = old.key_valid.shape[1]
        if self.members[row] is not old or ctx.key_valid.shape[1] != n + self.block_length:
            raise ValueError("the row does not hold the context that grew by its block")
        if n + self.block_length > self.context_len:
            self.let_go(row)
            return
        for layer in self.layers:  # [rows, Hkv, context_len + block, D]: the active block is the last slots
            layer.keys[row, :, n:n + self.block_length] = layer.keys[row, :, -self.block_length:]
            layer.values[row, :, n:n + self.block_length] = layer.values[row, :, -self.block_length:]
        self.valid[row, n:n + self.block_length] = True
        self.members[row] = ctx

    def __call__(self, rows: list[int], ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits [R, block, V] (a shifted model's [R, block + 1, V]: the last, each block's last
        row's), R the power of two past the highest of `rows`, with `ids` and `positions` ([n,
        block]) in `rows`; the tensor is overwritten by the next call (read what is needed first)."""
        index = torch.tensor(rows, device=self.ids.device)
        self.ids.index_copy_(0, index, ids)
        self.positions.index_copy_(0, index, positions)
        count = batch_rows(max(rows) + 1)
        forward = self._forwards.get(count)
        if forward is None:
            forward = self._forwards[count] = _RowsForward(self, count)
        return forward.call()


class StaticBatch:
    """Several questions' StaticDecoders stepped as one batched forward.

    Each row attends to its own context (prefix, placed chunks, question, finished blocks), padded
    with masked-out keys to the batch's length, and to its own active block; positions are each
    row's own, so padding changes no rotation. The forward runs over fixed buffers (`_BatchedStep`,
    kept by the runner per block length; on CUDA a captured graph per batch size), into which a
    question's context is copied once when it joins.
    """

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self._step: _BatchedStep | None = None

    def clear(self) -> None:
        """Lets go of the questions' contexts (the batch is empty for now)."""
        if self._step is not None:
            self._step.release()
            self._step = None

    @staticmethod
    def accepts(decoder: object) -> bool:
        """Whether `decoder` can step in a batch: a StaticDecoder past its first step's logits
        (a joint context brings that step's logits with it)."""
        return isinstance(decoder, StaticDecoder) and decoder._pending_first is None

    @staticmethod
    def refreshes(decoder: object) -> bool:
        """Whether the batch can run `decoder`'s block refresh (BlockDone) as a row of its forward:
        one it accepts whose block's end does nothing else (no re-selection)."""
        return StaticBatch.accepts(decoder) and decoder.on_block_done is None

    def _step_for(self, requests: list) -> _BatchedStep:
        decoders: list[StaticDecoder] = [r.decoder for r in requests]
        rows, block = batch_rows(len(decoders)), decoders[0].block_length
        # A refresh's row grows by its block in place (`grow`): room for it now saves copying every
        # row into a longer step at the next one.
        need = max(r.decoder.ctx.key_valid.shape[1] + (block if isinstance(r, BlockDone) else 0) for r in requests)
        length = -(-need // BATCH_CONTEXT_ROUND) * BATCH_CONTEXT_ROUND
        like = decoders[0].ctx.kv[0][0]
        # A step made anew (more rows, longer contexts) keeps the old one's capacity: a batch that
        # shrank and grows again finds its rows and graphs.
        kept = self.runner.kept_items("batched static step").get(block)
        capacity = max(rows, kept.capacity if kept is not None else 1)
        step = self.runner.kept("batched static step", block, MAX_BATCH_STEPS,
                                lambda: _BatchedStep(self.runner, capacity, length, block, like),
                                fits=lambda s: s.capacity >= rows and s.context_len >= need
                                and s.layers[0].keys.dtype == like.dtype)
        if step is not self._step:
            self.clear()
            self._step = step
        return step

    def slot_logits(self, requests: list) -> list[torch.Tensor]:
        """For each LogitsRequest (all of StaticDecoders with one block length that `accepts`), the
        logits [M, V] its decoder's `slot_logits` gives alone, from one forward of all of them (a
        BlockDone among them is refreshed, its reply BlockRefreshed or its error)."""
        return self.step(requests, decide=False)

    @torch.inference_mode()
    def step(self, requests: list, decide: bool = True
             ) -> list[torch.Tensor | DecidedStep | BlockRefreshed | BaseException]:
        """The requests' step from one forward of all of them: each BlockDone's finished block (its
        final tokens) computed as a row, its KV and anchor joining the decoder's context
        (`_refresh`; an error there is that request's reply alone); where `decide`, the steps of the
        LogitsRequests `decided_together` decided and written at once (`decide_together`); logits
        for the others."""
        logits, rows = self._forward(requests)  # [rows, S (+1), V]
        shifted, block_length = self.runner.cfg.logits_shifted, requests[0].decoder.block_length
        out: dict[int, DecidedStep | BlockRefreshed | BaseException] = {}
        for i, (r, row) in enumerate(zip(requests, rows, strict=True)):
            if isinstance(r, BlockDone):
                out[i] = self._refresh(r, row, logits[row, block_length] if shifted else None)
        together = [i for i, r in enumerate(requests) if decide and isinstance(r, LogitsRequest) and r.decided_together]
        if together:
            decided = decide_together([requests[i] for i in together], logits[:, :block_length],
                                      [rows[i] for i in together],
                                      [requests[i].decoder.ctx.anchor_logits for i in together], shifted)
            out.update(zip(together, decided, strict=True))
        return [out[i] if i in out else slot_logits_from_rows(
                    logits[row, r.slots - r.block * block_length], r.slots - r.block * block_length,
                    r.decoder.ctx.anchor_logits, shifted)
                for i, (r, row) in enumerate(zip(requests, rows, strict=True))]

    def _refresh(self, done: BlockDone, row: int, anchor_logits: torch.Tensor | None) -> BlockRefreshed | BaseException:
        """The BlockDone's block, just computed in `row`, joins its decoder's context and the row.
        Growing the context allocates it anew, the likeliest place to run out of memory: an error
        is returned (the question's own, its row let go), not raised into the other questions'."""
        step, old = self._step, done.decoder.ctx
        try:
            done.decoder.take_block(step.block_kv(row), None if anchor_logits is None else anchor_logits.clone())
            step.grow(row, old, done.decoder.ctx)
            return BlockRefreshed()
        except Exception as exc:  # noqa: BLE001 - the question's error goes to its asker
            step.let_go(row)
            return exc

    def _forward(self, requests: list) -> tuple[torch.Tensor, list[int]]:
        """The batched block forward of the requests (LogitsRequests and BlockDones): logits
        [rows, block (+1 for a shifted model), V] (overwritten by the next forward) and each
        request's row."""
        decoders: list[StaticDecoder] = [r.decoder for r in requests]
        block_length = decoders[0].block_length
        if any(d.block_length != block_length for d in decoders):
            raise ValueError("a batch steps one block length")
        step = self._step_for(requests)
        try:
            rows = step.place([d.ctx for d in decoders])
        except BaseException:
            self.clear()  # a half-copied row must not pass for its context
            raise
        ids = torch.stack([r.answer[r.block * block_length:(r.block + 1) * block_length] for r in requests])
        starts = torch.tensor([d.ctx.answer_start + r.block * block_length for r, d in zip(requests, decoders,
                                                                                          strict=True)])
        positions = (starts[:, None] + torch.arange(block_length)).to(self.runner.device)  # [N, block]
        logits = step(rows, ids, positions)
        for d in decoders:
            d.forward_passes += 1
        return logits, rows
