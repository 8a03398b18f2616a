"""Placing cached chunk KV: re-rotation, positions, kept tokens (engine/method/kv_cache.py)."""

from __future__ import annotations

import pytest
import torch

from engine.attention import BACKENDS, segment_mask
from engine.method.kv_cache import DocumentKV, chunk_deltas, gather_kept_tokens, place_chunks, take_chunks
from engine.method.prefill import prefill_document
from engine.runner import Runner
from tests.tiny_inputs import doc_ids

ATTN = BACKENDS["sdpa"]


@pytest.mark.parametrize("family", ["dream", "llada"])
def test_placed_keys_equal_keys_encoded_at_shifted_positions(engines, family):
    model = engines[family].model
    doc = prefill_document(Runner(model, ATTN), doc_ids(40, 300, seed=1), chunk_size=16)
    starts = torch.tensor([1000, 37, 5000])
    placed = place_chunks(doc.keys, starts, model.cfg.rope_theta)
    lengths = doc.lengths.tolist()
    seq = torch.cat([doc.tokens[j, :n] for j, n in enumerate(lengths)])
    pos = torch.cat([starts[j] + torch.arange(n) for j, n in enumerate(lengths)])
    seg = torch.cat([torch.full((n,), j) for j, n in enumerate(lengths)])
    with torch.no_grad():
        out = model(seq[None], pos[None], segment_mask(seg[None], seg[None]), ATTN)
    offset = 0
    for j, n in enumerate(lengths):
        for layer, (k, _) in enumerate(out.kv):
            # fp32 RoPE angles at position ~5000 are themselves only good to ~2e-4 rad.
            torch.testing.assert_close(placed[layer, j, :, :n], k[0, :, offset:offset + n], atol=1e-3, rtol=1e-3)
        offset += n
def test_position_modes_and_short_chunk_gap():
    ordinals = torch.tensor([2, 5, 9])
    starts, q = chunk_deltas("continuous", 7, 16, ordinals, 10)
    assert starts.tolist() == [7, 23, 39] and q == 55  # a short chunk leaves a gap before the next
    starts, q = chunk_deltas("reuse", 7, 16, ordinals, 10)
    assert starts.tolist() == [7, 7, 7] and q == 23
    starts, q = chunk_deltas("absolute", 7, 16, ordinals, 10)
    assert starts.tolist() == [39, 87, 151] and q == 167
    with pytest.raises(ValueError):
        chunk_deltas("sideways", 7, 16, ordinals, 10)


def test_gather_kept_tokens_per_head():
    kv = torch.randn(2, 3, 4, 10, 5)
    kept = torch.randint(0, 10, (3, 2, 4, 6))
    out = gather_kept_tokens(kv, kept)
    assert out.shape == (2, 3, 4, 6, 5)
    assert torch.equal(out[1, 2, 3, 4], kv[1, 2, 3, kept[2, 1, 3, 4]])


def _document(chunks: int, seed: int = 0) -> DocumentKV:
    g = torch.Generator().manual_seed(seed)
    shape = (3, chunks, 2, 5, 4)  # [L, N, Hkv, C, D]
    return DocumentKV(keys=torch.randn(shape, generator=g), values=torch.randn(shape, generator=g),
                      lengths=torch.randint(1, 6, (chunks,), generator=g),
                      tokens=torch.randint(0, 50, (chunks, 5), generator=g),
                      content_starts=torch.arange(chunks) * 4)


def test_take_chunks_keeps_the_chunks_asked_in_their_order():
    doc = _document(7)
    taken = take_chunks(doc, [5, 0, 3])
    for i, chunk in enumerate([5, 0, 3]):
        assert torch.equal(taken.keys[:, i], doc.keys[:, chunk])
        assert torch.equal(taken.values[:, i], doc.values[:, chunk])
    assert taken.lengths.tolist() == doc.lengths[[5, 0, 3]].tolist()
    assert taken.content_starts.tolist() == [20, 0, 12]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_take_chunks_asked_to_pin_without_cuda_gathers_plainly():
    doc = _document(4)
    taken = take_chunks(doc, [3, 1], pin=True)  # nothing to pin for: no error, the same chunks
    assert torch.equal(taken.keys, doc.keys[:, [3, 1]])


@pytest.mark.gpu
def test_take_chunks_pinned_for_the_gpu_equals_pageable():
    doc = _document(9, seed=1)
    pinned, pageable = take_chunks(doc, [8, 2, 4], pin=True), take_chunks(doc, [8, 2, 4])
    assert pinned.keys.is_pinned() and pinned.values.is_pinned() and not pageable.keys.is_pinned()
    assert torch.equal(pinned.keys, pageable.keys) and torch.equal(pinned.values, pageable.values)
    on_gpu = pinned.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(on_gpu.keys.cpu(), pageable.keys)
