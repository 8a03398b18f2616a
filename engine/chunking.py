"""Cutting a document's tokens into BOS-prefixed chunks (pure)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ChunkedTokens:
    """N chunks of at most C tokens, each `[BOS] + content`; the last one may be shorter."""

    tokens: torch.Tensor  # [N, C] long; slots past a chunk's length hold `pad_id`
    lengths: torch.Tensor  # [N] long, valid tokens per chunk, BOS included
    content_starts: torch.Tensor  # [N] long, offset in the document of each chunk's first content token

    @property
    def num_chunks(self) -> int:
        return self.tokens.shape[0]

    @property
    def chunk_size(self) -> int:
        return self.tokens.shape[1]


def chunk_tokens(token_ids: torch.Tensor | list[int], chunk_size: int, bos_id: int,
                 pad_id: int) -> ChunkedTokens:
    """Splits content tokens into spans of C - 1 and prepends BOS to each, dropping nothing.

    (The authors' code truncates `[BOS] + C content tokens` to C, silently dropping every C-th
    token; spans of C - 1 keep the same geometry without losing text.) An empty document gives
    zero chunks.
    """
    if chunk_size < 2:
        raise ValueError(f"chunk size must be at least 2 (BOS + one token), got {chunk_size}")
    ids = torch.as_tensor(token_ids, dtype=torch.long).flatten()
    span = chunk_size - 1
    n = (ids.numel() + span - 1) // span
    padded = torch.full((n * span,), pad_id, dtype=torch.long)
    padded[:ids.numel()] = ids
    bos = torch.full((n, 1), bos_id, dtype=torch.long)
    tokens = torch.cat((bos, padded.view(n, span)), dim=1)  # [N, C]
    starts = torch.arange(n, dtype=torch.long) * span
    lengths = 1 + (ids.numel() - starts).clamp(max=span)
    return ChunkedTokens(tokens=tokens, lengths=lengths, content_starts=starts)
