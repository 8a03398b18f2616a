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

from engine.attention import full_mask
from engine.decode.loop import block_logits, slot_logits_from_rows
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


@torch.inference_mode()
def build_static_context(runner: Runner, prompt: QuestionPrompt, chunks: SelectedChunks, query_start: int,
                         extra_ids: list[int] | None = None) -> FixedContext:
    """Prefix KV (alone), the placed chunk KV (re-rotated, no re-encode), then the query's KV once.

    `extra_ids` are appended to the query (used when re-selecting with a partial answer).
    """
    cfg, device = runner.cfg, runner.device
    p = len(prompt.prefix_ids)
    prefix = runner.forward(torch.tensor(prompt.prefix_ids, device=device)[None],
                            torch.arange(p, device=device)[None], full_mask())
    placed_k = flatten_chunks(place_chunks(chunks.keys.to(device), chunks.starts, cfg.rope_theta,
                                           cfg.rope_scaling_factor))
    placed_v = flatten_chunks(chunks.values.to(device))
    past = _cat_kv(prefix.kv, [(placed_k[layer], placed_v[layer]) for layer in range(cfg.num_layers)])
    valid = torch.cat((torch.ones(p, dtype=torch.bool), chunks.valid.flatten().cpu())).to(device)
    q_ids = list(prompt.query_ids) + list(extra_ids or [])
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
        self.ctx = FixedContext(
            kv=_cat_kv(self.ctx.kv, out.kv),
            key_valid=torch.cat((self.ctx.key_valid, torch.ones_like(ids, dtype=torch.bool)), 1),
            answer_start=self.ctx.answer_start, anchor_logits=out.logits[0, 0] if shifted else None,
            anchors=self.ctx.anchors)


class StaticBatch:
    """Several questions' StaticDecoders stepped as one batched forward.

    Each row attends to its own context (prefix, placed chunks, question, finished blocks),
    padded with masked-out keys to the longest ([N, Hkv, T_max, D] per layer), and to its own
    active block; positions are each row's own, so padding changes no rotation. The stacked
    contexts are kept while the batch's members and their contexts stay the same (a context
    changes only when a block finishes), so a step copies nothing but its block's ids.
    """

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self._members: tuple[FixedContext, ...] = ()  # held, so that no new context can take their ids
        self._past: list[LayerKV] = []
        self._valid: torch.Tensor | None = None  # [N, T_max + block] bool: each row's keys, then its block

    def clear(self) -> None:
        """Drops the stacked contexts (the batch's questions are done)."""
        self._members, self._past, self._valid = (), [], None

    @staticmethod
    def accepts(decoder: object) -> bool:
        """Whether `decoder` can step in a batch: a StaticDecoder past its first step's logits
        (a joint context brings that step's logits with it)."""
        return isinstance(decoder, StaticDecoder) and decoder._pending_first is None

    def _stack(self, decoders: list[StaticDecoder]) -> None:
        members = tuple(d.ctx for d in decoders)
        if len(members) == len(self._members) and all(a is b for a, b in zip(members, self._members, strict=True)):
            return
        self.clear()  # a failure below leaves no half-built batch behind under the old members
        lengths = [d.ctx.key_valid.shape[1] for d in decoders]
        t_max = max(lengths)
        self._past = []
        for layer in range(self.runner.cfg.num_layers):
            k0 = decoders[0].ctx.kv[layer][0]
            keys = k0.new_zeros((len(decoders), k0.shape[1], t_max, k0.shape[3]))
            values = torch.zeros_like(keys)
            for i, d in enumerate(decoders):
                keys[i, :, :lengths[i]] = d.ctx.kv[layer][0][0]
                values[i, :, :lengths[i]] = d.ctx.kv[layer][1][0]
            self._past.append((keys, values))
        self._valid = torch.zeros(len(decoders), t_max + decoders[0].block_length, dtype=torch.bool, device=k0.device)
        self._valid[:, t_max:] = True
        for i, d in enumerate(decoders):
            self._valid[i, :lengths[i]] = d.ctx.key_valid[0]
        self._members = members

    @torch.inference_mode()
    def slot_logits(self, requests: list) -> list[torch.Tensor]:
        """For each LogitsRequest (all of StaticDecoders with one block length that `accepts`), the
        logits [M, V] its decoder's `slot_logits` gives alone, from one forward of all of them."""
        decoders: list[StaticDecoder] = [r.decoder for r in requests]
        block_length = decoders[0].block_length
        if any(d.block_length != block_length for d in decoders):
            raise ValueError("a batch steps one block length")
        self._stack(decoders)
        device, shifted = self.runner.device, self.runner.cfg.logits_shifted
        steps = torch.arange(block_length, device=device)
        ids = torch.stack([r.answer[r.block * block_length:(r.block + 1) * block_length] for r in requests])
        positions = torch.stack([d.ctx.answer_start + r.block * block_length + steps
                                 for r, d in zip(requests, decoders, strict=True)])  # [N, block]
        # The rows predicting each request's slots (as block_logits picks them), padded to the
        # most slots with repeats of the last: [N, R].
        rows = [(prediction_rows(r.slots - r.block * block_length + 1, shifted) - 1).clamp_min(0) for r in requests]
        width = max(len(x) for x in rows)
        padded = torch.stack([torch.cat((x, x[-1:].expand(width - len(x)))) for x in rows])
        out = self.runner.forward(ids, positions, full_mask(key_valid=self._valid), past=self._past,
                                  logits_rows=padded, return_kv=False)
        logits = []
        for i, (r, d) in enumerate(zip(requests, decoders, strict=True)):
            d.forward_passes += 1
            logits.append(slot_logits_from_rows(out.logits[i, :len(rows[i])], r.slots - r.block * block_length,
                                                d.ctx.anchor_logits, shifted))
        return logits
