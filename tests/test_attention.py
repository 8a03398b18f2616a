"""Attention backends against the fp32 reference, masks, and log-sum-exp merging."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.attention import (
    BACKENDS,
    attention_probs,
    bos_probs,
    causal_mask,
    dense_mask,
    full_mask,
    materialize,
    merge_attention_states,
    merge_many,
    reference_attention,
    segment_mask,
    select_backend,
)

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=1.5e-2, rtol=1e-2),
       torch.float16: dict(atol=2e-3, rtol=2e-3)}


def _qkv(b, hq, hkv, tq, tk, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, tq, d, generator=g).to(dtype)
    k = torch.randn(b, hkv, tk, d, generator=g).to(dtype)
    v = torch.randn(b, hkv, tk, d, generator=g).to(dtype)
    return q, k, v


def _masks(b, tq, tk):
    g = torch.Generator().manual_seed(1)
    q_seg = torch.randint(0, 3, (b, tq), generator=g)
    k_seg = torch.randint(0, 3, (b, tk), generator=g)
    k_seg[:, :3] = torch.arange(3)  # every segment has a key: no fully masked rows
    valid = torch.ones(b, tk, dtype=torch.bool)
    valid[:, -2:] = False
    dense = torch.rand(b, 1, tq, tk, generator=g) > 0.4
    dense[..., 0] = True
    return {"full": full_mask(), "causal": causal_mask(), "segments": segment_mask(q_seg, k_seg),
            "dense": dense_mask(dense), "padded": full_mask(key_valid=valid)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 4, 4, 37, 37, 16), (2, 8, 2, 5, 129, 32),
                                   (1, 7, 1, 33, 61, 8)])
@pytest.mark.parametrize("mask_kind", ["full", "causal", "segments", "dense", "padded"])
def test_sdpa_matches_reference(dtype, shape, mask_kind):
    b, hq, hkv, tq, tk, d = shape
    q, k, v = _qkv(b, hq, hkv, tq, tk, d, dtype)
    mask = _masks(b, tq, tk)[mask_kind]
    ref, ref_lse = reference_attention(q.float(), k.float(), v.float(), mask, d ** -0.5, True)
    out, lse = BACKENDS["sdpa"](q, k, v, mask, d ** -0.5, return_lse=True)
    assert out.dtype == dtype
    diff = (out.float() - ref).abs()
    torch.testing.assert_close(out.float(), ref, **TOL[dtype],
                               msg=lambda m: f"{m} (max {diff.max():.2e}, mean {diff.mean():.2e})")
    torch.testing.assert_close(lse, ref_lse, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mask_shape", ["per-head", "per-key-per-head", "one-query-row"])
def test_sdpa_masked_gqa_matches_reference(dtype, mask_shape):
    """Masked GQA stacks each KV head's query group on the query axis: masks that differ by query
    head, by query, or by neither must land on the right group's rows."""
    b, hq, hkv, tq, tk, d = 2, 6, 2, 5, 23, 16
    q, k, v = _qkv(b, hq, hkv, tq, tk, d, dtype, seed=3)
    g = torch.Generator().manual_seed(4)
    shape = {"per-head": (b, hq, tq, tk), "per-key-per-head": (b, hq, 1, tk), "one-query-row": (1, 1, tq, tk)}
    dense = torch.rand(shape[mask_shape], generator=g) > 0.5
    dense[..., 0] = True
    mask = dense_mask(dense)
    ref, _ = reference_attention(q.float(), k.float(), v.float(), mask, d ** -0.5)
    out, _ = BACKENDS["sdpa"](q, k, v, mask, d ** -0.5)
    torch.testing.assert_close(out.float(), ref, **TOL[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1, 4, 4, 37, 37, 16), (2, 8, 2, 5, 129, 32), (3, 28, 4, 33, 2091, 128)])
@pytest.mark.parametrize("mask_kind", ["full", "causal", "segments", "dense", "padded"])
def test_sdpa_native_lse_on_cuda_matches_reference(dtype, shape, mask_kind):
    """On CUDA the log-sum-exp comes from the memory-efficient kernel (its additive bias padded to
    an aligned row stride, queries grouped per KV head): output and lse equal the fp32 reference
    at odd sizes, Dream-7B's heads included."""
    b, hq, hkv, tq, tk, d = shape
    q, k, v = (t.cuda() for t in _qkv(b, hq, hkv, tq, tk, d, dtype))
    mask = _masks(b, tq, tk)[mask_kind]
    fields = ("q_segments", "k_segments", "dense", "key_valid")
    mask = dataclasses.replace(mask, **{f: getattr(mask, f).cuda() for f in fields if getattr(mask, f) is not None})
    ref, ref_lse = reference_attention(q.float(), k.float(), v.float(), mask, d ** -0.5, True)
    out, lse = BACKENDS["sdpa"](q, k, v, mask, d ** -0.5, return_lse=True)
    assert out.dtype == dtype and lse.dtype == torch.float32 and lse.shape == (b, hq, tq)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else TOL[dtype]  # a GPU's fp32 sums in another order
    torch.testing.assert_close(out.float(), ref, **tol)
    torch.testing.assert_close(lse, ref_lse, **tol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_native_lse_on_cuda_reads_keys_sliced_from_longer_buffers(dtype):
    """Keys and values as the staged scoring passes give them: views of the first C + R slots of
    longer buffers ([b, Hkv, C + room, D], Dream-7B's heads), under a dense mask per row: output
    and lse equal the fp32 reference."""
    b, hq, hkv, tq, tk, d, room = 5, 28, 4, 37, 37 + 515, 128, 12
    q, _, _ = _qkv(b, hq, hkv, tq, tk, d, dtype, seed=9)
    g = torch.Generator().manual_seed(10)
    k = torch.randn(b, hkv, tk + room, d, generator=g).to(dtype).cuda()[:, :, :tk]
    v = torch.randn(b, hkv, tk + room, d, generator=g).to(dtype).cuda()[:, :, :tk]
    dense = torch.rand(b, 1, tq, tk, generator=g) > 0.3
    dense[..., 0] = True
    mask, q = dense_mask(dense.cuda()), q.cuda()
    ref, ref_lse = reference_attention(q.float(), k.float(), v.float(), mask, d ** -0.5, True)
    out, lse = BACKENDS["sdpa"](q, k, v, mask, d ** -0.5, return_lse=True)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else TOL[dtype]
    torch.testing.assert_close(out.float(), ref, **tol)
    torch.testing.assert_close(lse, ref_lse, **tol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mask_shape", ["per-head", "per-key-per-head", "one-query-row", "batch-one", "none"])
def test_sdpa_native_lse_on_cuda_takes_the_kernel_with_any_mask(dtype, mask_shape, monkeypatch):
    """Masks that differ by query head, by query, by neither, or are shared by the batch (batch 1
    over b = 3) reach the memory-efficient kernel's grouped rows right; the kernel's path is the
    one taken (counted), and a full mask passes no bias."""
    from engine.attention import sdpa

    calls = []
    kernel = sdpa._efficient_attention_with_lse
    monkeypatch.setattr(sdpa, "_efficient_attention_with_lse", lambda *a: calls.append(a[3]) or kernel(*a))
    b, hq, hkv, tq, tk, d = 3, 6, 2, 5, 23, 16
    q, k, v = (t.cuda() for t in _qkv(b, hq, hkv, tq, tk, d, dtype, seed=3))
    g = torch.Generator().manual_seed(4)
    shape = {"per-head": (b, hq, tq, tk), "per-key-per-head": (b, hq, 1, tk), "one-query-row": (b, 1, 1, tk),
             "batch-one": (1, 1, tq, tk), "none": None}[mask_shape]
    if shape is None:
        mask = full_mask()
    else:
        dense = torch.rand(shape, generator=g) > 0.5
        dense[..., 0] = True
        mask = dense_mask(dense.cuda())
    ref, ref_lse = reference_attention(q.float(), k.float(), v.float(), mask, d ** -0.5, True)
    out, lse = BACKENDS["sdpa"](q, k, v, mask, d ** -0.5, return_lse=True)
    assert len(calls) == 1 and (calls[0] is None) == (mask_shape == "none")
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else TOL[dtype]
    torch.testing.assert_close(out.float(), ref, **tol)
    torch.testing.assert_close(lse, ref_lse, **tol)


def test_bos_probs_equal_the_softmax_columns():
    """Probabilities on a few keys from the lse equal those columns of the full softmax (GQA order)."""
    q, k, v = _qkv(2, 6, 2, 5, 19, 8, torch.float32, seed=6)
    _, lse = reference_attention(q, k, v, full_mask(), 0.3, True)
    keys = torch.tensor([0, 7, 18])
    want = attention_probs(q, k, full_mask(), 0.3)[..., keys]
    torch.testing.assert_close(bos_probs(q, k[:, :, keys], lse, 0.3), want, atol=1e-6, rtol=1e-5)


def test_reference_matches_explicit_softmax_and_gqa_order():
    q, k, v = _qkv(1, 6, 2, 9, 11, 4, torch.float32)
    out, _ = reference_attention(q, k, v, full_mask(), 0.5)
    for h in range(6):
        kv_head = h // 3  # head-major: KV head j serves query heads 3j..3j+2
        p = torch.softmax(q[0, h] @ k[0, kv_head].T * 0.5, dim=-1)
        torch.testing.assert_close(out[0, h], p @ v[0, kv_head])


def test_causal_mask_is_bottom_right_aligned():
    m = materialize(causal_mask(), 1, 2, 5, torch.device("cpu"))[0, 0]
    assert m.tolist() == [[True, True, True, True, False], [True] * 5]


def test_fully_masked_row_is_neutral():
    q, k, v = _qkv(1, 2, 2, 3, 4, 8, torch.float32)
    none = dense_mask(torch.zeros(1, 1, 3, 4, dtype=torch.bool))
    out, lse = reference_attention(q, k, v, none, 1.0, return_lse=True)
    assert torch.all(out == 0) and torch.all(torch.isneginf(lse))


@pytest.mark.parametrize("splits", [[5, 12], [1, 3, 13], [17]])
def test_merge_equals_attention_over_union(splits):
    q, k, v = _qkv(2, 4, 2, 7, sum(splits), 16, torch.float32)
    whole, whole_lse = reference_attention(q, k, v, full_mask(), 0.25, True)
    outs, lses, start = [], [], 0
    for n in splits:
        o, s = reference_attention(q, k[:, :, start:start + n], v[:, :, start:start + n],
                                   full_mask(), 0.25, True)
        outs.append(o)
        lses.append(s)
        start += n
    out, lse = merge_many(outs, lses)
    torch.testing.assert_close(out, whole, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, whole_lse, atol=1e-5, rtol=1e-5)


def test_merge_with_empty_side():
    q, k, v = _qkv(1, 2, 2, 3, 5, 8, torch.float32)
    o, s = reference_attention(q, k, v, full_mask(), 1.0, True)
    empty_o, empty_s = torch.zeros_like(o), torch.full_like(s, float("-inf"))
    out, lse = merge_attention_states(o, s, empty_o, empty_s)
    torch.testing.assert_close(out, o)
    torch.testing.assert_close(lse, s)
    both, both_lse = merge_attention_states(empty_o, empty_s, empty_o, empty_s)
    assert torch.all(both == 0) and torch.all(torch.isneginf(both_lse))


def test_select_backend():
    assert select_backend("cpu", torch.float32).name == "sdpa"
    assert select_backend("cpu", torch.float32, needs_lse=True).name == "reference"
    assert select_backend("cpu", torch.float32, override="reference").name == "reference"
    with pytest.raises(ValueError, match="unknown attention backend"):
        select_backend("cpu", torch.float32, override="flash9")
