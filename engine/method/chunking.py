"""Cutting a document's tokens into BOS-prefixed chunks (pure)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
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


def chunk_starts(num_tokens: int, span: int, breaks: Sequence[int] | None = None,
                 min_fill: int = 1) -> list[int]:
    """Where each chunk's content begins: every `span` tokens, or with `breaks` (token indices where
    a sentence begins) at the last break that leaves the chunk at least `min_fill` tokens, so a
    sentence of at most `span - min_fill` tokens never straddles two chunks (a needle cut in two
    is found by its key in one chunk while its value sits in the next: no chunk holds the answer).
    A longer sentence is cut where the span ends."""
    if num_tokens <= 0:
        return []
    cuts = sorted({b for b in breaks if 0 < b < num_tokens}) if breaks is not None else []
    starts = [0]
    while starts[-1] + span < num_tokens:
        start = starts[-1]
        j = bisect.bisect_right(cuts, start + span) - 1  # the last break within this chunk's span
        starts.append(cuts[j] if j >= 0 and cuts[j] >= start + min_fill else start + span)
    return starts


def token_breaks(char_starts: Sequence[int], offsets: Sequence[tuple[int, int]]) -> list[int]:
    """Token indices for character offsets (e.g. sentence starts): for each, the first token that
    ends past it, the token holding it (a byte-level BPE token may carry the space before it)."""
    ends = [end for _, end in offsets]
    out = [bisect.bisect_right(ends, c) for c in char_starts]
    return [t for t in out if t < len(ends)]


CONTENT_OFFSET = 1  # token slot 0 of every chunk holds its BOS; the chunk's own text starts at slot 1


def chunk_tokens(token_ids: torch.Tensor | list[int], chunk_size: int, bos_id: int, pad_id: int,
                 breaks: Sequence[int] | None = None, min_fill: float = 0.5) -> ChunkedTokens:
    """Splits content tokens into spans of at most C - 1 and prepends BOS to each, dropping nothing.

    Without `breaks`, every span is C - 1 tokens (the method's fixed cut). With `breaks` (token
    indices where sentences begin), a chunk ends at the last sentence start that leaves it at
    least `min_fill` full, and the rest of its slots are padding (see `chunk_starts`).
    (The authors' code truncates `[BOS] + C content tokens` to C, silently dropping every C-th
    token; spans of C - 1 keep the same geometry without losing text.) An empty document gives
    zero chunks.
    """
    if chunk_size < 2:
        raise ValueError(f"chunk size must be at least 2 (BOS + one token), got {chunk_size}")
    if not 0.0 < min_fill <= 1.0:
        raise ValueError(f"min_fill must be in (0, 1], got {min_fill}")
    ids = torch.as_tensor(token_ids, dtype=torch.long).flatten().cpu()  # the layout lives on the host
    span = chunk_size - 1
    starts = torch.tensor(chunk_starts(ids.numel(), span, breaks, max(1, int(span * min_fill))), dtype=torch.long)
    n = starts.numel()
    content = torch.diff(starts, append=torch.tensor([ids.numel()])).clamp(max=span)  # [N]
    tokens = torch.full((n, chunk_size), pad_id, dtype=torch.long)  # [N, C]
    tokens[:, 0] = bos_id
    offsets = torch.arange(span)
    inside = offsets[None, :] < content[:, None]  # [N, C - 1]
    tokens[:, 1:][inside] = ids[(starts[:, None] + offsets[None, :])[inside]]
    return ChunkedTokens(tokens=tokens, lengths=1 + content, content_starts=starts)
