"""Prefill: every chunk encoded on its own (engine/method/prefill.py)."""

from __future__ import annotations

import pytest
import torch

from engine.attention import BACKENDS, segment_mask
from engine.method.prefill import prefill_document
from engine.runner import Runner
from tests.tiny_inputs import doc_ids

ATTN = BACKENDS["sdpa"]


@pytest.mark.parametrize("family", ["dream", "llada"])
def test_prefill_equals_one_forward_under_block_diagonal_mask(engines, family):
    engine = engines[family]
    model = engine.model
    ids = doc_ids(45, 300)
    seen = []
    doc = prefill_document(Runner(model, ATTN), ids, chunk_size=16, token_budget=32,
                           progress=lambda done, total: seen.append((done, total)))
    assert doc.keys.shape == (2, 3, model.cfg.num_kv_heads, 16, model.cfg.head_dim)
    assert seen == [(2, 3), (3, 3)]  # two chunks per forward under a 32-token budget
    lengths = doc.lengths.tolist()
    seq = torch.cat([doc.tokens[j, :n] for j, n in enumerate(lengths)])
    pos = torch.cat([torch.arange(n) for n in lengths])
    seg = torch.cat([torch.full((n,), j) for j, n in enumerate(lengths)])
    with torch.no_grad():
        out = model(seq[None], pos[None], segment_mask(seg[None], seg[None]), BACKENDS["reference"])
    offset = 0
    for j, n in enumerate(lengths):
        for layer, (k, v) in enumerate(out.kv):
            torch.testing.assert_close(doc.keys[layer, j, :, :n], k[0, :, offset:offset + n], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(doc.values[layer, j, :, :n], v[0, :, offset:offset + n], atol=1e-5, rtol=1e-5)
        offset += n
