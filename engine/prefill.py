"""Prefill: every chunk encoded on its own (bidirectional inside the chunk, local positions)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from engine.attention import AttentionBackend, full_mask
from engine.chunking import chunk_tokens
from engine.kv_cache import DocumentKV
from engine.model import DiffusionLM, LayerFunctions

ProgressFn = Callable[[int, int], None]  # (chunks done, chunks total)
PREFILL_TOKEN_BUDGET = 16384  # tokens one prefill forward holds, by default


def chunks_per_batch(chunk_size: int, token_budget: int) -> int:
    """How many chunks one forward holds under a token budget (bounds activation memory)."""
    return max(1, token_budget // chunk_size)


@torch.inference_mode()
def prefill_document(model: DiffusionLM, attention: AttentionBackend,
                     token_ids: torch.Tensor | list[int], chunk_size: int,
                     progress: ProgressFn | None = None, token_budget: int = PREFILL_TOKEN_BUDGET,
                     out_device: torch.device | str | None = None,
                     layer_fns: LayerFunctions | None = None, breaks: Sequence[int] | None = None) -> DocumentKV:
    """Encodes a document's content tokens into per-chunk KV.

    Chunks are `[BOS] + at most C-1 content tokens` (cut at sentence starts when `breaks` gives
    them, see `engine.chunking.chunk_tokens`), batched so that one forward holds at most
    `token_budget` tokens: a 1M-token document never needs all activations at once. The KV lands
    in one preallocated `[L, N, Hkv, C, D]` buffer on `out_device` (default: the model's device).
    `layer_fns`: the layers' halves around attention (default eager; see engine.compiled_layers).
    """
    cfg = model.cfg
    device = model.embed_tokens.weight.device
    dtype = model.embed_tokens.weight.dtype
    out_device = torch.device(out_device) if out_device is not None else device
    pad = cfg.pad_token_id if cfg.pad_token_id is not None else cfg.eos_token_id
    chunks = chunk_tokens(token_ids, chunk_size, cfg.bos_token_id, pad, breaks)
    n, c = chunks.num_chunks, chunk_size
    shape = (cfg.num_layers, n, cfg.num_kv_heads, c, cfg.head_dim)
    pin = out_device.type == "cpu" and device.type == "cuda"
    keys = torch.empty(shape, dtype=dtype, device=out_device, pin_memory=pin)
    values = torch.empty(shape, dtype=dtype, device=out_device, pin_memory=pin)
    step = chunks_per_batch(c, token_budget)
    positions = torch.arange(c, device=device)
    for start in range(0, n, step):
        end = min(n, start + step)
        ids = chunks.tokens[start:end].to(device)
        valid = torch.arange(c)[None, :] < chunks.lengths[start:end, None]  # [b, C]
        # A batch of whole chunks (all but a document's last, usually) needs no mask, and SDPA
        # runs its flash kernel only without one.
        mask = full_mask() if bool(valid.all()) else full_mask(key_valid=valid.to(device))
        out = model(ids, positions.expand(end - start, c), mask, attention, return_kv=True, layer_fns=layer_fns)
        for layer, (k, v) in enumerate(out.kv):
            keys[layer, start:end].copy_(k, non_blocking=True)
            values[layer, start:end].copy_(v, non_blocking=True)
        if progress is not None:
            progress(end, n)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return DocumentKV(keys=keys, values=values, lengths=chunks.lengths, tokens=chunks.tokens,
                      content_starts=chunks.content_starts)
