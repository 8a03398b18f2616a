"""The split-KV kernel against its fp32 reference, and the paged static runner against the contiguous one.

Without a GPU the Triton kernel runs under Triton's interpreter (tests/conftest.py), which checks its
indexing, masking and merging; the bf16 tensor-core path is checked on CUDA (marker gpu).
"""

from __future__ import annotations

import dataclasses
import functools
import os

import pytest
import torch

from engine import KNOWN_CONFIGS, AnswerParams, SamplingParams, ScoringParams
from engine.attention import select_backend
from engine.attention.split_kv import (
    PagedKV,
    bos_attention_mass,
    kernel_usable,
    make_split_plan,
    page_addresses,
    page_bos_keys,
    split_kv_attention,
    split_kv_reference,
    triton,
)
from engine.decode.paged import MAX_QUERY_PASSES, query_rows
from engine.method.answer import AnswerResult, stream_answer
from engine.method.kv_cache import place_chunks
from engine.method.prefill import prefill_document
from engine.method.prompting import QuestionPrompt
from engine.model.rope import shift_cos_sin
from engine.model.weights import random_model
from engine.runner import Runner

# The kernel runs on CPU tensors only under Triton's interpreter, which conftest.py turns on where
# there is no CUDA device; on a GPU machine these cases run on "cuda" instead.
INTERPRETED = triton is not None and os.environ.get("TRITON_INTERPRET") == "1"
DEVICES = [pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRETED, reason="needs Triton's interpreter "
                                                        "(on when there is no CUDA device; tests/conftest.py)")),
           pytest.param("cuda", marks=pytest.mark.gpu)]
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


def _paged(device, dtype, *, n=6, hkv=2, c=37, d=64, k=3, b=21, cap=45, tail=40, rotate=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=g).to(device, dtype)  # noqa: E731
    page_ids = torch.randperm(n, generator=g)[:k].int()
    tok = torch.stack([torch.stack([torch.randperm(c, generator=g)[:b].sort().values for _ in range(hkv)])
                       for _ in range(k)]).int()
    tok[0, 0, -3:] = -1  # one head keeps fewer tokens
    if k > 1:
        tok[1, :, 5:] = -1  # a short page
    cos = sin = None
    if rotate:
        cos, sin = shift_cos_sin(torch.tensor([100, 7, 3000, 70000, 12, 5])[:k], d, 1e4)
        cos, sin = cos.to(device), sin.to(device)
    return PagedKV(rand(n, hkv, c, d), rand(n, hkv, c, d), page_ids.to(device), tok.to(device), cos, sin,
                   rand(hkv, cap, d), rand(hkv, cap, d), torch.tensor([tail], dtype=torch.int32, device=device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", [
    dict(),  # GQA 3, rotation, padding, a short page
    dict(rotate=False, k=1, b=37),  # no eviction, one page, no move
    dict(hkv=3, k=5, b=9, tail=1, cap=33),  # tail of one row
    dict(d=128, hkv=1, k=2, b=30, tail=45),  # MHA-like single KV head, full tail
])
@pytest.mark.parametrize("hq_per_kv,tq", [(3, 7), (1, 32)])
def test_split_kv_matches_reference(device, dtype, case, hq_per_kv, tq):
    kv = _paged(device, dtype, **case)
    q = torch.randn(kv.num_kv_heads * hq_per_kv, tq, kv.k_pages.shape[-1]).to(device, dtype)
    ref_lse = torch.empty(q.shape[:2], dtype=torch.float32, device=device)
    ref = split_kv_reference(q, kv, 0.1, lse_out=ref_lse)
    rows = hq_per_kv * tq
    # All pages in one split; one split per page; pages cut in parts of 16 tokens; the default cut.
    for programs, tail_split, min_keys in ((1, 16, 256), (10_000, 16, 256), (10_000, 16, 16), (264, 512, 256)):
        plan = make_split_plan(kv, rows, target_programs=programs, tail_split=tail_split, block_n=16,
                               min_split_keys=min_keys)
        lse = torch.full_like(ref_lse, float("nan"))
        out = split_kv_attention(q, kv, 0.1, plan, lse_out=lse)
        assert out.dtype == q.dtype and out.shape == q.shape
        torch.testing.assert_close(out.float(), ref.float(), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
        # The merged log-sum-exp (what the BOS anchors are computed from) and the output without it.
        torch.testing.assert_close(lse, ref_lse, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
        torch.testing.assert_close(split_kv_attention(q, kv, 0.1, plan), out, atol=0, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_split_kv_reads_pages_through_their_addresses(device):
    """With `page_base`, the kernel reads the pages at those addresses, not k_pages' own (here
    zeros), which is what lets one captured graph serve another document."""
    kv = _paged(device, torch.float32)
    q = torch.randn(6, 7, kv.k_pages.shape[-1]).to(device)
    ref_lse = torch.empty(q.shape[:2], dtype=torch.float32, device=device)
    ref = split_kv_reference(q, kv, 0.1, lse_out=ref_lse)
    real_k, real_v = kv.k_pages.clone(), kv.v_pages.clone()
    decoy = dataclasses.replace(kv, k_pages=torch.zeros_like(real_k), v_pages=torch.zeros_like(real_v),
                                page_base=page_addresses(real_k, real_v, kv.k_tail).to(device),
                                bos_keys=page_bos_keys(real_k, kv.page_ids))
    plan = make_split_plan(decoy, 21, block_n=16)
    lse = torch.empty_like(ref_lse)
    torch.testing.assert_close(split_kv_attention(q, decoy, 0.1, plan, lse_out=lse), ref, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse, ref_lse, atol=2e-5, rtol=2e-5)
    # Without the addresses it reads the zeros: the check above is not vacuous.
    zeros = dataclasses.replace(decoy, page_base=None)
    assert not torch.allclose(split_kv_attention(q, zeros, 0.1, plan), ref, atol=1e-3)
    # The BOS anchors read the kept BOS keys, not the pages.
    weights = torch.full((7,), 1 / 7, device=device)
    torch.testing.assert_close(bos_attention_mass(q, decoy, 0.1, ref_lse, weights),
                               bos_attention_mass(q, kv, 0.1, ref_lse, weights))


def test_reference_moves_pages_like_place_chunks():
    """The reference's page move (keys re-rotated by each page's start) is place_chunks' re-rotation."""
    kv = _paged("cpu", torch.float32, rotate=True, b=37, c=37)
    kv = dataclasses.replace(kv, token_ids=torch.arange(37).expand(3, 2, 37).int().contiguous(),
                             tail_len=torch.tensor([0], dtype=torch.int32))
    starts = torch.tensor([100, 7, 3000])
    keys = place_chunks(kv.k_pages[kv.page_ids.long()][None], starts, 1e4)[0]  # [K, Hkv, C, D]
    values = kv.v_pages[kv.page_ids.long()]
    q = torch.randn(4, 5, 64)
    flat = lambda t: t.permute(1, 0, 2, 3).reshape(2, -1, 64)  # noqa: E731
    scores = torch.einsum("hqd,hkd->hqk", q, flat(keys).repeat_interleave(2, 0)) * 0.1
    expected = torch.einsum("hqk,hkd->hqd", scores.softmax(-1), flat(values).repeat_interleave(2, 0))
    torch.testing.assert_close(split_kv_reference(q, kv, 0.1), expected, atol=1e-5, rtol=1e-5)


def test_split_plan_sizes():
    kv = _paged("cpu", torch.float32, k=5, b=21, cap=45)
    one_split = make_split_plan(kv, 21, target_programs=1)
    assert (one_split.pages_per_split, one_split.num_page_splits) == (5, 1)
    per_page = make_split_plan(kv, 21, target_programs=10_000)
    assert (per_page.pages_per_split, per_page.page_parts, per_page.num_page_splits) == (1, 1, 5)
    assert per_page.block_m == 32 and per_page.num_tail_splits == 1 and per_page.tail_split == 64
    parts = make_split_plan(kv, 21, target_programs=10_000, block_n=16, min_split_keys=16)  # 21 kept: 2 tiles
    assert (parts.page_parts, parts.part_len, parts.num_page_splits) == (2, 16, 10)
    assert make_split_plan(kv, 224).block_m == 64
    assert make_split_plan(kv, 7, tail_split=16).num_tail_splits == 3  # 45 rows of capacity


def _tiny(family: str, dtype, device, compile_layers: bool = False) -> Runner:
    """A tiny random model at work (eager layer halves unless `compile_layers`, which takes effect on CUDA)."""
    cfg = dataclasses.replace(KNOWN_CONFIGS[family], vocab_size=512, hidden_size=64, intermediate_size=128,
                              num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32, mask_token_id=3,
                              bos_token_id=0, eos_token_id=1, eot_token_id=2, pad_token_id=1)
    return Runner.for_model(random_model(cfg, device, dtype), select_backend(device, dtype), compile_layers)


def _fresh(runner: Runner) -> Runner:
    """The same weights and halves with nothing kept: a question on it reuses no earlier buffers."""
    return Runner(runner.model, runner.attention, runner.fixed_layers, runner.dynamic_layers)


def _paged_context(runner: Runner):
    return runner.kept_items("paged buffers")[None].context


def _answer(runner: Runner, doc, prompt, gen_length: int = 16, **params):
    sampling = SamplingParams(decoder="low_confidence", gen_length=gen_length, block_length=8, steps=gen_length,
                              stop_at_eos=False)
    p = AnswerParams(top_k=3, scoring=ScoringParams(scorer="self_information"), sampling=sampling, **params)
    steps, result = [], None
    for event in stream_answer(runner, None, [doc], prompt, p):
        if isinstance(event, AnswerResult):
            result = event
        else:
            steps.append(event)
    return result, steps


@pytest.mark.parametrize("family", ["llada-8b", "dream-7b"])
@pytest.mark.parametrize("token_budget", [0, 9])
@pytest.mark.parametrize("position_mode", ["continuous", "absolute"])
def test_paged_decoder_decodes_like_contiguous_decoder(family, token_budget, position_mode):
    """Same model, same question: every step commits the same tokens in the same slots.

    Runs the Triton kernel under the interpreter where it is on (no CUDA device), else the fp32
    reference route; both must reproduce the contiguous decoder (gathered, re-rotated, concatenated KV).
    """
    torch.manual_seed(0)
    runner = _tiny(family, torch.float32, "cpu")
    g = torch.Generator().manual_seed(1)
    doc = prefill_document(runner, torch.randint(8, 512, (300,), generator=g), 37)
    prompt = QuestionPrompt(prefix_ids=[0, 9, 10], query_ids=list(range(20, 45)), question_span=(2, 20))
    kw = dict(token_budget=token_budget, position_mode=position_mode)
    contiguous, c_steps = _answer(runner, doc, prompt, static_layout="contiguous", **kw)
    paged, p_steps = _answer(runner, doc, prompt, static_layout="paged", **kw)
    assert paged.trace.static_layout == "paged" and contiguous.trace.static_layout == "contiguous"
    assert [(s.positions, s.tokens) for s in p_steps] == [(s.positions, s.tokens) for s in c_steps]
    assert paged.trace.forward_passes == contiguous.trace.forward_passes
    # The question's pass over the pages records the same BOS anchors as the contiguous one
    # (from the kernel's log-sum-exp there, from explicit probabilities here).
    torch.testing.assert_close(paged.trace.anchors_decode, contiguous.trace.anchors_decode, atol=1e-5, rtol=1e-4)
    assert paged.trace.kept_tokens == contiguous.trace.kept_tokens
    assert kernel_usable("cpu", 32) == INTERPRETED


# On the CPU one family: the kernel runs interpreted there (~40 s a family), and the reuse does
# not depend on the family (test_paged_decoder_decodes_like_contiguous_decoder decodes both).
# Each answer is one block of 8: the reuse is between questions, and the interpreted kernel's
# steps are what the test's time goes to.
@pytest.mark.parametrize("family, device", [
    ("llada-8b", "cpu"),
    pytest.param("llada-8b", "cuda", marks=pytest.mark.gpu),
    pytest.param("dream-7b", "cuda", marks=pytest.mark.gpu),
])
def test_second_question_reuses_the_paged_buffers(family, device):
    """A runner hands the first question's buffers (and, on CUDA, its captured graph) to the next
    question of the same layout, on the same document or (through the kernel) another; that
    question decodes exactly as on a runner that kept nothing, and no document's KV is kept alive
    by the runner between questions."""
    torch.manual_seed(0)
    runner = _tiny(family, torch.float32, device)
    g = torch.Generator().manual_seed(1)
    doc = prefill_document(runner, torch.randint(8, 512, (700,), generator=g).to(device), 37)
    first = QuestionPrompt(prefix_ids=[0, 9, 10], query_ids=list(range(20, 45)), question_span=(2, 20))
    second = QuestionPrompt(prefix_ids=[0, 9, 10], query_ids=list(range(100, 127)), question_span=(2, 22))
    query_passes = runner.kept_items("paged query pass")
    answer = functools.partial(_answer, gen_length=8)
    for budget in (0, 9):
        answer(runner, doc, first, static_layout="paged", token_budget=budget)
        context = _paged_context(runner)
        assert context is not None and context.layers[0].kv.k_pages.numel() == 0  # released
        query_pass = query_passes[32]  # 25 question rows, padded to 32
        reused, r_steps = answer(runner, doc, second, static_layout="paged", token_budget=budget)
        assert _paged_context(runner) is context  # same layout (the tail rounds up to 128 rows): buffers reused
        assert query_passes[32] is query_pass  # 27 rows: the same padded pass (and graph)
        fresh, f_steps = answer(_fresh(runner), doc, second, static_layout="contiguous", token_budget=budget)
        assert [(s.positions, s.tokens) for s in r_steps] == [(s.positions, s.tokens) for s in f_steps]
        torch.testing.assert_close(reused.trace.anchors_decode, fresh.trace.anchors_decode, atol=1e-5, rtol=1e-4)
    # Another document, then the first again: the kernel reads pages through the addresses the
    # context holds (PagedKV.page_base), so its buffers and graph serve both; the reference path
    # reads the pages' tensors, so there another document gets new buffers.
    other = prefill_document(runner, torch.randint(8, 512, (400,), generator=g).to(device), 37)
    for d in (other, doc):
        reused, r_steps = answer(runner, d, second, static_layout="paged", token_budget=9)
        assert (_paged_context(runner) is context) == kernel_usable(device, runner.cfg.head_dim)
        fresh, f_steps = answer(_fresh(runner), d, second, static_layout="contiguous", token_budget=9)
        assert [(s.positions, s.tokens) for s in r_steps] == [(s.positions, s.tokens) for s in f_steps]
        torch.testing.assert_close(reused.trace.anchors_decode, fresh.trace.anchors_decode, atol=1e-5, rtol=1e-4)


def test_question_pass_sizes_on_one_context():
    """Questions of several lengths over one context: each padded size gets its own pass (the
    least recently used dropped past MAX_QUERY_PASSES), and each answers as the contiguous route
    does, also when the padding rows reach past the answer's rows (a short answer)."""
    torch.manual_seed(0)
    runner = _tiny("dream-7b", torch.float32, "cpu")
    g = torch.Generator().manual_seed(1)
    doc = prefill_document(runner, torch.randint(8, 512, (500,), generator=g), 37)
    sampling = SamplingParams(decoder="low_confidence", gen_length=8, block_length=8, steps=8, stop_at_eos=False)
    query_passes = runner.kept_items("paged query pass")
    sizes = [33, 17, 60, 5, 33, 90]  # padded to 48, 32, 64, 16, 48, 96
    for n in sizes:
        prompt = QuestionPrompt(prefix_ids=[0, 9, 10], query_ids=list(range(20, 20 + n)), question_span=(0, n))
        runs = {}
        for layout, on in (("paged", runner), ("contiguous", _fresh(runner))):
            p = AnswerParams(top_k=3, scoring=ScoringParams(scorer="self_information"), sampling=sampling,
                             static_layout=layout)
            events = list(stream_answer(on, None, [doc], prompt, p))
            runs[layout] = ([(e.positions, e.tokens) for e in events[:-1]], events[-1])
        assert runs["paged"][0] == runs["contiguous"][0], n
        torch.testing.assert_close(runs["paged"][1].trace.anchors_decode, runs["contiguous"][1].trace.anchors_decode,
                                   atol=1e-5, rtol=1e-4)
        assert query_rows(n) in query_passes
    assert len(query_passes) <= MAX_QUERY_PASSES
    assert list(query_passes)[-2:] == [48, 96]  # most recently used last


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["llada-8b", "dream-7b"])
@pytest.mark.parametrize("compile_layers", [False, True])
def test_paged_decoder_with_cuda_graph_on_gpu(family, compile_layers):
    """On CUDA, "auto" takes the paged route (native kernel, captured CUDA graph, compiled layer
    halves or eager ones) and, in fp32, commits exactly what the contiguous eager route commits. (bf16 kernel accuracy:
    test_split_kv_matches_reference; bf16 random tiny models have near-tied logits.)"""
    torch.manual_seed(0)
    runner = _tiny(family, torch.float32, "cuda", compile_layers)
    eager = Runner(runner.model, runner.attention)
    g = torch.Generator().manual_seed(1)
    doc = prefill_document(eager, torch.randint(8, 512, (3000,), generator=g).cuda(), 128)
    prompt = QuestionPrompt(prefix_ids=[0, 9, 10], query_ids=list(range(20, 45)), question_span=(2, 20))
    for budget in (0, 40):
        auto, a_steps = _answer(runner, doc, prompt, static_layout="auto", token_budget=budget)
        contiguous, c_steps = _answer(eager, doc, prompt, static_layout="contiguous", token_budget=budget)
        assert auto.trace.static_layout == "paged"
        assert [(s.positions, s.tokens) for s in a_steps] == [(s.positions, s.tokens) for s in c_steps]
        torch.testing.assert_close(auto.trace.anchors_decode, contiguous.trace.anchors_decode, atol=1e-4, rtol=1e-3)


@pytest.mark.skipif(triton is None, reason="needs the triton package")
def test_kernel_refuses_cpu_tensors_without_the_interpreter(monkeypatch):
    """Without Triton's interpreter, CPU tensors get a clear error, not the CUDA driver's."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    kv = _paged("cpu", torch.float32)
    q = torch.randn(kv.num_kv_heads * 3, 7, kv.k_pages.shape[-1])
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        split_kv_attention(q, kv, 0.1, make_split_plan(kv, 21))
