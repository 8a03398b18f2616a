"""The skinny (few-row) matrix multiply kernel against its fp32 reference.

Without a GPU the kernel runs under Triton's interpreter (tests/conftest.py), which checks its
indexing, masking and split-K sums; the tensor-core path is checked on CUDA (marker gpu).
"""

from __future__ import annotations

import os

import pytest
import torch

from scripts.skinny_linear import SkinnyPlan, kernel_usable, skinny_linear, skinny_linear_reference, triton

INTERPRETED = triton is not None and os.environ.get("TRITON_INTERPRET") == "1"
DEVICES = [pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRETED, reason="needs Triton's interpreter "
                                                        "(on when there is no CUDA device; tests/conftest.py)")),
           pytest.param("cuda", marks=pytest.mark.gpu)]
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3}  # relative to the output's scale


def _operands(m, n, k, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(device, dtype)
    w = (torch.randn(n, k, generator=g) * 0.05).to(device, dtype)
    return x, w


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("m", "n", "k", "plan"), [
    (32, 128, 256, SkinnyPlan(block_n=64, block_k=64)),  # even: no masks
    (32, 128, 256, SkinnyPlan(block_n=32, block_k=32, split_k=4)),  # even, split
    (5, 37, 96, SkinnyPlan(block_n=16, block_k=32)),  # odd rows and outputs
    (33, 200, 130, SkinnyPlan(block_n=64, block_k=32, split_k=3)),  # K not a multiple of split * block
    (1, 50, 70, SkinnyPlan(block_n=32, block_k=16, split_k=8)),  # a split past the end of K
    (64, 48, 48, SkinnyPlan(block_n=16, block_k=16, split_k=2, num_stages=2)),
])
def test_matches_reference(device, dtype, m, n, k, plan):
    x, w = _operands(m, n, k, dtype, device)
    out = skinny_linear(x, w, plan)
    ref = skinny_linear_reference(x, w)
    assert out.shape == (m, n) and out.dtype == dtype
    err = (out.float() - ref).abs().max().item() / ref.abs().max().item()
    assert err < TOLERANCE[dtype], f"relative error {err:.2e}"


@pytest.mark.parametrize("device", DEVICES)
def test_split_sums_are_deterministic_and_use_the_given_workspace(device):
    x, w = _operands(7, 96, 160, torch.bfloat16, device, seed=1)
    plan = SkinnyPlan(block_n=32, block_k=32, split_k=5)
    workspace = torch.full((5, 7, 96), float("nan"), device=device)
    first = skinny_linear(x, w, plan, workspace)
    assert torch.isfinite(workspace).all(), "every split writes its whole partial sum"
    assert torch.equal(first, skinny_linear(x, w, plan)), "the same bits on every run"
    single = skinny_linear(x, w, SkinnyPlan(block_n=32, block_k=32))
    assert (first.float() - single.float()).abs().max() < 2e-2 * single.float().abs().max()


def test_plan_and_operand_checks():
    with pytest.raises(ValueError, match="power of two"):
        SkinnyPlan(block_n=48)
    with pytest.raises(ValueError, match=">= 1"):
        SkinnyPlan(split_k=0)
    x, w = torch.zeros(65, 8, dtype=torch.bfloat16), torch.zeros(4, 8, dtype=torch.bfloat16)
    assert not kernel_usable(x, w), "more rows than a skinny product"
    assert not kernel_usable(x[:4].float(), w.float()), "fp32 would run at TF32 in tl.dot"
    assert not kernel_usable(x[:4], w[:, :4]), "K differs"
