"""Prefill: every chunk encoded on its own (bidirectional inside the chunk, local positions)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from engine.attention import full_mask
from engine.method.chunking import ChunkedTokens, chunk_tokens
from engine.method.kv_cache import DocumentKV
from engine.model.config import ModelConfig
from engine.runner import Runner

ProgressFn = Callable[[int, int], None]  # (chunks done, chunks total)
PREFILL_TOKEN_BUDGET = 16384  # tokens one prefill forward holds, by default
# On a CPU a forward of 4K tokens already keeps the cores busy, and the batch's activations and KV
# (freed after it, but kept by the allocator) are a quarter of 16K's: the process's peak is lower.
CPU_PREFILL_TOKEN_BUDGET = 4096


def default_token_budget(device: torch.device) -> int:
    return PREFILL_TOKEN_BUDGET if device.type == "cuda" else CPU_PREFILL_TOKEN_BUDGET


def chunks_per_batch(chunk_size: int, token_budget: int) -> int:
    """How many chunks one forward holds under a token budget (bounds activation memory)."""
    return max(1, token_budget // chunk_size)


@dataclass(frozen=True)
class PrefillBatch:
    """The KV of chunks [start, end) of a document, as one prefill forward made it."""

    start: int
    end: int
    keys: torch.Tensor  # [L, end - start, Hkv, C, D] on the model's device, post-RoPE at local positions
    values: torch.Tensor  # [L, end - start, Hkv, C, D]


@torch.inference_mode()
def prefill_batches(runner: Runner, chunks: ChunkedTokens, token_budget: int = PREFILL_TOKEN_BUDGET,
                    progress: ProgressFn | None = None) -> Iterator[PrefillBatch]:
    """Encodes the chunks a batch at a time, each chunk on its own (bidirectional inside it, local
    positions), one forward holding at most `token_budget` tokens. A consumer that writes each batch
    away (app.kv_service streams them to the KV files) holds one batch's KV, not the document's."""
    device = runner.device
    n, c = chunks.num_chunks, chunks.chunk_size
    step = chunks_per_batch(c, token_budget)
    positions = torch.arange(c, device=device)
    for start in range(0, n, step):
        end = min(n, start + step)
        ids = chunks.tokens[start:end].to(device)
        valid = torch.arange(c)[None, :] < chunks.lengths[start:end, None]  # [b, C]
        # A batch of whole chunks (all but a document's last, usually) needs no mask, and SDPA
        # runs its flash kernel only without one.
        mask = full_mask() if bool(valid.all()) else full_mask(key_valid=valid.to(device))
        out = runner.forward(ids, positions.expand(end - start, c), mask)
        yield PrefillBatch(start, end, torch.stack([k for k, _ in out.kv]), torch.stack([v for _, v in out.kv]))
        if progress is not None:
            progress(end, n)


def document_chunks(cfg: ModelConfig, token_ids: torch.Tensor | list[int], chunk_size: int,
                    breaks: Sequence[int] | None = None) -> ChunkedTokens:
    """The model's chunk layout of a document: `[BOS] + content`, padded with its pad token."""
    pad = cfg.pad_token_id if cfg.pad_token_id is not None else cfg.eos_token_id
    return chunk_tokens(token_ids, chunk_size, cfg.bos_token_id, pad, breaks)


@torch.inference_mode()
def prefill_document(runner: Runner, token_ids: torch.Tensor | list[int], chunk_size: int,
                     progress: ProgressFn | None = None, token_budget: int = PREFILL_TOKEN_BUDGET,
                     out_device: torch.device | str | None = None,
                     breaks: Sequence[int] | None = None) -> DocumentKV:
    """Encodes a document's content tokens into per-chunk KV, all of it in memory.

    Chunks are `[BOS] + at most C-1 content tokens` (cut at sentence starts when `breaks` gives
    them, see `engine.method.chunking.chunk_tokens`), batched by `prefill_batches`. The KV lands in one
    preallocated `[L, N, Hkv, C, D]` buffer on `out_device` (default: the model's device).
    """
    cfg, device, dtype = runner.cfg, runner.device, runner.dtype
    out_device = torch.device(out_device) if out_device is not None else device
    chunks = document_chunks(cfg, token_ids, chunk_size, breaks)
    shape = (cfg.num_layers, chunks.num_chunks, cfg.num_kv_heads, chunk_size, cfg.head_dim)
    pin = out_device.type == "cpu" and device.type == "cuda"
    keys = torch.empty(shape, dtype=dtype, device=out_device, pin_memory=pin)
    values = torch.empty(shape, dtype=dtype, device=out_device, pin_memory=pin)
    for batch in prefill_batches(runner, chunks, token_budget, progress):
        keys[:, batch.start:batch.end].copy_(batch.keys, non_blocking=True)
        values[:, batch.start:batch.end].copy_(batch.values, non_blocking=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return DocumentKV(keys=keys, values=values, lengths=chunks.lengths, tokens=chunks.tokens,
                      content_starts=chunks.content_starts)
