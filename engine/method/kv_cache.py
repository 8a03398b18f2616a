"""Per-chunk KV of a prefilled document, and the pure operations that place it for decoding.

Layout: keys and values are `[layers, N, kv_heads, C, head_dim]`; keys are stored **after RoPE at
local positions 0..C-1**, so moving chunk j to start at position p is an exact rotation by p
(`place_chunks`), never a re-encode.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from engine.model.rope import rerotate

POSITION_MODES = ("continuous", "reuse", "absolute")


@dataclass(frozen=True)
class DocumentKV:
    keys: torch.Tensor  # [L, N, Hkv, C, D], post-RoPE at local positions
    values: torch.Tensor  # [L, N, Hkv, C, D]
    lengths: torch.Tensor  # [N] long, valid tokens per chunk (BOS included)
    tokens: torch.Tensor  # [N, C] long, the chunk tokens (BOS first)
    content_starts: torch.Tensor  # [N] long, document offset of each chunk's first content token

    def __post_init__(self) -> None:
        assert self.keys.shape == self.values.shape and self.keys.dim() == 5, "[L, N, Hkv, C, D]"
        assert self.tokens.shape == self.keys.shape[1:2] + self.keys.shape[3:4], "tokens [N, C]"

    @property
    def num_chunks(self) -> int:
        return self.keys.shape[1]

    @property
    def chunk_size(self) -> int:
        return self.keys.shape[3]

    @property
    def num_layers(self) -> int:
        return self.keys.shape[0]

    @property
    def nbytes(self) -> int:
        return 2 * self.keys.numel() * self.keys.element_size()

    @property
    def device(self) -> torch.device:
        return self.keys.device

    def to(self, device: torch.device | str, non_blocking: bool = False) -> DocumentKV:
        return replace(self, keys=self.keys.to(device, non_blocking=non_blocking),
                       values=self.values.to(device, non_blocking=non_blocking))

    def content_ids(self) -> torch.Tensor:
        """The document's tokens without the chunk BOS tokens (what was prefilled)."""
        parts = [self.tokens[i, 1:int(n)] for i, n in enumerate(self.lengths.tolist())]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


def take_chunks(doc: DocumentKV, ordinals: list[int], pin: bool = False) -> DocumentKV:
    """The document's KV restricted to some chunks (in the order given): what a question scores
    when a prefilter keeps M of N chunks. content_starts keep their document offsets.

    `pin`: a document in host memory is gathered into page-locked memory (where CUDA is), because a
    GPU is to read the result next: a pinned copy runs asynchronously at the link's speed, a
    pageable one is staged through the driver's buffers on the copying thread."""
    idx = torch.tensor(ordinals, dtype=torch.long)
    on_device = idx.to(doc.keys.device)

    def gather(kv: torch.Tensor) -> torch.Tensor:  # [L, N, Hkv, C, D] -> [L, M, Hkv, C, D]
        if not (pin and kv.device.type == "cpu" and torch.cuda.is_available()):
            return kv.index_select(1, on_device)
        out = torch.empty((kv.shape[0], len(ordinals), *kv.shape[2:]), dtype=kv.dtype, pin_memory=True)
        return torch.index_select(kv, 1, on_device, out=out)
    return DocumentKV(keys=gather(doc.keys), values=gather(doc.values),
                      lengths=doc.lengths[idx], tokens=doc.tokens[idx], content_starts=doc.content_starts[idx])


def chunk_deltas(mode: str, prefix_len: int, chunk_size: int, ranks_ordinals: torch.Tensor,
                 total_chunks: int) -> tuple[torch.Tensor, int]:
    """Where selected chunks start, and where the question starts (positions).

    ranks_ordinals: [K] long, each selected chunk's ordinal in the pooled documents, in the
    document order in which the chunks are placed. Returns (start position per selected chunk
    [K], question start). Modes:
    - continuous: chunk j (0-based, in order) at P + j*C; the question at P + K*C;
    - reuse: every chunk at P (they share positions); the question at P + C;
    - absolute: each chunk at P + ordinal*C, as if the whole pool were there; question at P + N*C.
    A short chunk leaves a position gap before the next one, as in the authors' code.
    """
    k = ranks_ordinals.numel()
    if mode == "continuous":
        return prefix_len + torch.arange(k) * chunk_size, prefix_len + k * chunk_size
    if mode == "reuse":
        return torch.full((k,), prefix_len, dtype=torch.long), prefix_len + chunk_size
    if mode == "absolute":
        return prefix_len + ranks_ordinals.cpu() * chunk_size, prefix_len + total_chunks * chunk_size
    raise ValueError(f"unknown position mode {mode!r}; choose from {POSITION_MODES}")


def place_chunks(keys: torch.Tensor, starts: torch.Tensor, theta: float,
                 scaling_factor: float = 1.0) -> torch.Tensor:
    """Re-rotates chunk keys [L, K, Hkv, T, D] from local positions to start at `starts` [K]."""
    delta = starts.to(keys.device).view(1, -1, 1, 1)  # broadcast over layers, heads, tokens
    return rerotate(keys, delta, theta, scaling_factor)


def gather_kept_tokens(kv: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """Per layer and KV head token selection: kv [L, K, Hkv, C, D], kept [K, L, Hkv, B] -> [L, K, Hkv, B, D]."""
    index = kept.permute(1, 0, 2, 3).to(kv.device)  # [L, K, Hkv, B]
    return torch.gather(kv, 3, index[..., None].expand(*index.shape, kv.shape[-1]))


def flatten_chunks(kv: torch.Tensor) -> torch.Tensor:
    """[L, K, Hkv, T, D] -> [L, 1, Hkv, K*T, D]: chunks laid one after another on the key axis."""
    layers, k, hkv, t, d = kv.shape
    return kv.permute(0, 2, 1, 3, 4).reshape(layers, 1, hkv, k * t, d)
