import torch

from engine.model.rope import apply_rope, rerotate, rope_cos_sin, rotate_half


def _keys_at(positions, theta=1e4, d=32, seed=0):
    x = torch.randn(1, 2, positions.numel(), d, generator=torch.Generator().manual_seed(seed))
    cos, sin = rope_cos_sin(positions[None], d, theta)
    return x, apply_rope(x, cos, sin, in_fp32=True)


def _rope_float64(x, positions, theta, d=32):
    """Ground truth: RoPE with float64 angles and arithmetic."""
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = positions.double()[:, None] * inv
    emb = torch.cat((ang, ang), -1)
    x = x.double()
    return x * emb.cos() + rotate_half(x) * emb.sin()


def test_rerotation_equals_encoding_at_shifted_positions():
    local = torch.arange(37)
    x, k_local = _keys_at(local)
    for delta in (1, 37):  # small positions: the fp32 encoding is itself accurate
        _, k_shift = _keys_at(local + delta)
        torch.testing.assert_close(rerotate(k_local, delta, 1e4), k_shift, atol=1e-5, rtol=1e-5)
    # Far shifts: fp32 angles at position p are off by up to ulp(p) / 2, so compare with float64.
    for delta in (511, 70000, 1_000_003):
        truth = _rope_float64(x, local + delta, 1e4).float()
        torch.testing.assert_close(rerotate(k_local, delta, 1e4), truth, atol=1e-5, rtol=1e-5)


def test_per_token_deltas_and_back():
    pos = torch.tensor([0, 1, 2, 3, 4, 5])
    x, k = _keys_at(pos)
    delta = torch.tensor([10, 10, 10, 300, 300, 300])
    _, expected = _keys_at(pos + delta)
    moved = rerotate(k, delta, 1e4)
    torch.testing.assert_close(moved, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rerotate(moved, -delta, 1e4), k, atol=1e-5, rtol=1e-5)


def test_linear_scaling_divides_positions():
    c1, s1 = rope_cos_sin(torch.tensor([8]), 16, 1e4, scaling_factor=4.0)
    c2, s2 = rope_cos_sin(torch.tensor([2]), 16, 1e4)
    torch.testing.assert_close(c1, c2)
    torch.testing.assert_close(s1, s2)


def test_attention_scores_depend_only_on_relative_offset():
    q, qr = _keys_at(torch.tensor([5]), seed=1)
    k, kr = _keys_at(torch.tensor([2]), seed=2)
    _, qr2 = _keys_at(torch.tensor([1005]), seed=1)
    _, kr2 = _keys_at(torch.tensor([1002]), seed=2)
    torch.testing.assert_close((qr * kr).sum(), (qr2 * kr2).sum(), atol=1e-4, rtol=1e-5)
