"""A past in buffers with room for the new tokens (engine.model.transformer.KVWithRoom) against the
reference, the past concatenated with the new tokens' KV in every layer."""

from __future__ import annotations

import copy

import pytest
import torch

from engine.attention import BACKENDS, dense_mask
from engine.model.transformer import AttentionCapture, KVWithRoom

TOLERANCES = {torch.float32: {"atol": 1e-5, "rtol": 1e-5}, torch.bfloat16: {"atol": 1.5e-2, "rtol": 1e-2}}


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    diff = (got.float() - want.float()).abs()
    torch.testing.assert_close(got, want, **TOLERANCES[dtype],
                               msg=lambda m: f"{what}: max {diff.max():.3g}, mean {diff.mean():.3g}\n{m}")


@pytest.mark.parametrize("family", ["dream", "llada"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("backend", ["sdpa", "reference"])
@pytest.mark.parametrize("spare", [0, 3])
def test_a_past_with_room_attends_as_the_concatenated_past(engines, family, dtype, backend, spare):
    """B = 3 rows of T = 5 new tokens over Tp = 13 past keys under a random mask (every row keeps
    one visible key), attention captured on two rows: the logits, the new KV and the captured
    probabilities equal the concatenating forward's; the buffers' last T slots hold the new KV.
    `spare`: the buffers are a slice of longer ones (as a staging with room for longer questions)."""
    model = copy.deepcopy(engines[family].model).to(dtype)  # (the session's model stays as it is)
    cfg = model.cfg
    gen = torch.Generator().manual_seed(11)
    b, tp, t = 3, 13, 5
    hkv, d, layers = cfg.num_kv_heads, cfg.head_dim, cfg.num_layers
    past = [(torch.randn(b, hkv, tp, d, generator=gen).to(dtype), torch.randn(b, hkv, tp, d, generator=gen).to(dtype))
            for _ in range(layers)]
    ids = torch.randint(8, cfg.vocab_size - 8, (b, t), generator=gen)
    positions = tp + torch.arange(t)[None].expand(b, t)
    mask = torch.rand(b, 1, t, tp + t, generator=gen) < 0.6
    mask[..., tp:] |= torch.eye(t, dtype=torch.bool)  # each row sees itself
    capture = AttentionCapture(tuple(range(layers)), torch.tensor([1, 4]))
    attention = BACKENDS[backend]
    with torch.no_grad():
        want = model(ids, positions, dense_mask(mask), attention, past=past, logits_rows="all", capture=capture)
        roomy = []
        for k, v in past:
            keys = torch.full((b, hkv, tp + t + spare, d), float("nan"), dtype=dtype)
            values = torch.full_like(keys, float("nan"))
            keys[:, :, :tp], values[:, :, :tp] = k, v
            roomy.append(KVWithRoom(keys[:, :, :tp + t], values[:, :, :tp + t]))
        got = model(ids, positions, dense_mask(mask), attention, past=roomy, logits_rows="all", capture=capture)
    _close(got.logits, want.logits, dtype, "logits")
    for layer in range(layers):
        for g, w in zip(got.kv[layer], want.kv[layer], strict=True):
            assert torch.equal(g, w), f"layer {layer}: the new tokens' KV differs"
        assert torch.equal(roomy[layer].keys[:, :, tp:], want.kv[layer][0])
        assert torch.equal(roomy[layer].values[:, :, tp:], want.kv[layer][1])
        _close(got.attention[layer], want.attention[layer], torch.float32, f"layer {layer}'s captured probs")
