"""GPU checks (skipped without CUDA): bf16 against fp32, backends on the device, at odd sizes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine import Engine
from engine.attention import BACKENDS, causal_mask, full_mask, reference_attention, segment_mask
from engine.model.config import KNOWN_CONFIGS
from engine.model.rope import rope_cos_sin
from engine.model.transformer import Block
from engine.model.weights import random_state_dict
from scripts.gpu_foundation_check import bf16_error

pytestmark = pytest.mark.gpu
BF16 = dict(atol=1.5e-2, rtol=1e-2)


@pytest.mark.parametrize("family", ["dream", "llada"])
def test_tiny_checkpoint_bf16_matches_fp32(family, dream_dir, llada_dir):
    folder = dream_dir if family == "dream" else llada_dir
    fp32 = Engine.from_pretrained(folder, device="cuda", dtype=torch.float32)
    bf16 = Engine.from_pretrained(folder, device="cuda")
    assert bf16.dtype == torch.bfloat16
    ids = torch.randint(0, fp32.config.vocab_size, (129,), generator=torch.Generator().manual_seed(0))
    a, b = fp32.logits(ids), bf16.logits(ids).float()
    torch.testing.assert_close(b, a, **BF16)
    cpu = Engine.from_pretrained(folder, device="cpu").logits(ids)
    torch.testing.assert_close(a.cpu(), cpu, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 28, 4, 37, 577, 128), (2, 8, 8, 129, 129, 64)])
@pytest.mark.parametrize("mask_kind", ["full", "causal", "padded", "segments"])
def test_sdpa_on_gpu_matches_reference(dtype, shape, mask_kind):
    """Masked GQA (a batched decode step's padded keys, a scoring pass's per-query mask) runs with
    the query groups stacked, unmasked GQA through SDPA's own; both against the fp32 reference."""
    b, hq, hkv, tq, tk, d = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, hq, tq, d, device="cuda", generator=g).to(dtype)
    k = torch.randn(b, hkv, tk, d, device="cuda", generator=g).to(dtype)
    v = torch.randn(b, hkv, tk, d, device="cuda", generator=g).to(dtype)
    valid = torch.rand(b, tk, device="cuda", generator=g) > 0.3
    valid[:, 0] = True  # no fully masked row
    segments = torch.randint(0, 3, (b, tk), device="cuda", generator=g)
    segments[:, :3] = torch.arange(3, device="cuda")
    mask = {"full": full_mask(), "causal": causal_mask(), "padded": full_mask(key_valid=valid),
            "segments": segment_mask(segments[:, -tq:], segments)}[mask_kind]
    ref, _ = reference_attention(q.float(), k.float(), v.float(), mask, d ** -0.5)
    out, _ = BACKENDS["sdpa"](q, k, v, mask, d ** -0.5)
    tol = BF16 if dtype == torch.bfloat16 else dict(atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out.float(), ref, **tol)


def test_full_size_dream_layer_bf16_matches_fp32():
    """One Dream-7B layer (random weights, real shapes) in bf16 against the same layer in fp32."""
    cfg = KNOWN_CONFIGS["dream-7b"]
    state = random_state_dict(cfg, seed=0, std=0.02, device="cuda")
    prefix = "layers.0."
    layer = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    del state
    block32 = Block(cfg).to("cuda")
    block32.load_state_dict(layer)
    block16 = Block(cfg).to("cuda", torch.bfloat16)
    block16.load_state_dict(layer)
    g = torch.Generator(device="cuda").manual_seed(1)
    h = torch.randn(1, 1023, cfg.hidden_size, device="cuda", generator=g).to(torch.bfloat16)
    cos, sin = rope_cos_sin(torch.arange(1023, device="cuda")[None], cfg.head_dim, cfg.rope_theta)
    attn = BACKENDS["sdpa"]
    with torch.no_grad():
        out32, _, _ = block32(h.float(), cos, sin, full_mask(), attn, None, None)
        out16, _, _ = block16(h, cos, sin, full_mask(), attn, None, None)
    # Relative to the output's scale: values reach ~14 here, where bf16's own resolution (half an
    # ulp, 0.03) is already coarser than an absolute 1.5e-2 (see scripts/gpu_foundation_check.py).
    err = bf16_error(out16, out32)
    assert err["rel_max"] <= 1.5e-2 and err["rel_rms"] <= 1.5e-2, err


@pytest.mark.parametrize("family", ["dream", "llada"])
def test_method_on_gpu_matches_cpu(family, dream_dir, llada_dir):
    """The whole method (prefill, scoring, selection, static decoding) on CUDA, fp32, equals CPU."""
    from engine import AnswerParams, SamplingParams

    folder = dream_dir if family == "dream" else llada_dir
    ids = torch.randint(5, 300, (200,), generator=torch.Generator().manual_seed(0)).tolist()
    params = AnswerParams(top_k=3, token_budget=8,
                          sampling=SamplingParams(gen_length=16, block_length=8, stop_at_eos=False))
    results = []
    for device in ("cpu", "cuda"):
        engine = Engine.from_pretrained(folder, device=device, dtype=torch.float32)
        doc = engine.prefill(ids, chunk_size=32)
        results.append(engine.answer(doc, "Which river?", params))
    cpu, gpu = results
    assert cpu.trace.selected == gpu.trace.selected
    assert cpu.answer_ids == gpu.answer_ids
    torch.testing.assert_close(torch.tensor(gpu.trace.scores), torch.tensor(cpu.trace.scores), atol=1e-4, rtol=1e-4)
    bf16 = Engine.from_pretrained(folder, device="cuda")
    res = bf16.answer(bf16.prefill(ids, chunk_size=32), "Which river?", params)
    assert res.trace.steps >= 2 and all(torch.isfinite(torch.tensor(res.trace.scores)))


def test_pool_warm_tier_uses_pinned_memory():
    from storage import TieredKVPool

    pool = TieredKVPool("cuda", hot_bytes=2 * 4000, warm_bytes=2 * 4000)
    for i in range(3):
        out = pool.put(i, {"keys": torch.full((1000,), float(i))}, source="disk")
        assert out["keys"].is_cuda
    assert pool.tier_of(0) == "warm"
    assert pool._warm[0]["keys"].is_pinned()
    got = pool.get(0)
    assert got["keys"].is_cuda and float(got["keys"][0]) == 0.0
    assert pool.counters.hits_warm == 1 and pool.counters.evictions_hot >= 1


def test_pool_peek_leaves_a_warm_entry_in_pinned_host_memory():
    """A question that takes a few chunks of a warm document peeks: the entry stays warm (no whole
    copy to the device, nothing hot evicted) and the chunks are gathered pinned for the copy."""
    from engine.method.kv_cache import DocumentKV, take_chunks
    from storage import TieredKVPool

    pool = TieredKVPool("cuda", hot_bytes=2 * 4000, warm_bytes=2 * 4000)
    for i in range(3):
        pool.put(i, {"keys": torch.full((1000,), float(i))}, source="disk")
    assert pool.tier_of(0) == "warm" and pool.tier_of(2) == "hot"
    hot_before, copied_before = pool.usage()["hot_entries"], pool.counters.bytes_to_hot
    got = pool.peek(0)
    assert not got["keys"].is_cuda and got["keys"].is_pinned()
    assert pool.tier_of(0) == "warm" and pool.usage()["hot_entries"] == hot_before
    assert pool.counters.hits_warm == 1 and pool.counters.bytes_to_hot == copied_before  # nothing copied
    kv = torch.arange(2 * 5 * 3, dtype=torch.float32).view(1, 5, 1, 3, 2)
    doc = DocumentKV(keys=kv, values=-kv, lengths=torch.full((5,), 3), tokens=torch.zeros(5, 3, dtype=torch.long),
                     content_starts=torch.arange(5) * 2)
    chunks = take_chunks(doc, [4, 1], pin=True)
    assert chunks.keys.is_pinned() and torch.equal(chunks.keys, kv[:, [4, 1]])


@pytest.mark.parametrize("family", ["dream", "llada"])
def test_captured_draft_and_scoring_replay_like_eager(family, dream_dir, llada_dir):
    """The draft and scoring graphs the engine's runner keeps, replayed for questions of several
    lengths (two padded sizes, one asked twice), give what passes made for the call and run
    eagerly give (the same layer halves)."""
    from engine import AnswerParams, SamplingParams, ScoringParams
    from engine.method.chunk_scorer import draft_pseudo_labels, score_document, scoring_rows
    from engine.method.kv_cache import take_chunks
    from engine.method.prompting import build_question_prompt
    from engine.runner import Runner

    folder = dream_dir if family == "dream" else llada_dir
    engine = Engine.from_pretrained(folder, device="cuda", dtype=torch.float32)
    runner, cfg = engine.runner, engine.config
    eager = Runner(runner.model, runner.attention, runner.fixed_layers, runner.dynamic_layers)
    doc = engine.prefill(torch.randint(5, 300, (300,), generator=torch.Generator().manual_seed(1)).tolist(), 32)
    for folds in (None, 3):
        params = AnswerParams(top_k=3, scoring=ScoringParams(llada_folds=folds, max_rows=200),
                              sampling=SamplingParams(gen_length=8, block_length=8, stop_at_eos=False))
        sp = params.scoring
        for question in ("Which river?", "Which river flows past the old mill, and when was it built?",
                         "Which river?", "Who?"):
            graphed = engine.answer(doc, question, params)
            prompt = build_question_prompt(engine.tokenizer, question, cfg.bos_token_id, params.instruction,
                                           params.use_chat_template)
            draft = draft_pseudo_labels(eager, prompt.prefix_ids + prompt.query_ids, sp.draft_slots, sp.draft_rounds)
            rows = scoring_rows(prompt.query_ids, prompt.question_span, draft, sp.window, cfg.logits_shifted)
            scored = score_document(eager, doc, rows, sp, keep_passes=False)
            assert graphed.trace.draft_ids == draft.tokens[draft.committed].tolist()
            torch.testing.assert_close(torch.tensor(graphed.trace.scores), scored.scores, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(graphed.trace.anchors_scoring, scored.anchors, atol=1e-4, rtol=1e-4)
    scoring, drafts = runner.kept_items("scoring"), runner.kept_items("draft")
    # Staged passes: captured on their first scoring, for any document's chunks.
    assert scoring and all(p._call.graph is not None for p in scoring.values())
    on_host = doc.to("cpu")
    on_host = dataclasses.replace(on_host, keys=on_host.keys.pin_memory(), values=on_host.values.pin_memory())
    for ordinals in ([3, 0, 5], [1, 2, 4, 6, 7]):  # prefiltered cuts: new tensors, the kept graphs replay
        cut = take_chunks(doc, ordinals)
        want = score_document(eager, cut, rows, sp, keep_passes=False).scores
        torch.testing.assert_close(score_document(runner, cut, rows, sp).scores, want, atol=1e-4, rtol=1e-4)
        # in pinned host memory (the pool's warm tier): staged a layer at a time
        host_cut = take_chunks(on_host, ordinals, pin=True)
        torch.testing.assert_close(score_document(runner, host_cut, rows, sp).scores, want, atol=1e-4, rtol=1e-4)
    assert drafts and all(p._call.graph is not None for p in drafts.values())


@pytest.mark.parametrize("family", ["dream", "llada"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shared_scoring_passes_match_each_question_alone_on_gpu(family, dtype, dream_dir, llada_dir):
    """Three questions' documents (odd lengths) scored in shared staged passes on the GPU (captured
    on the first call, replayed on the second; BOS and content mass from the attention's lse) give
    each question's scores and anchors from the runner's kept passes alone and from the eager
    reference passes (fp32 probabilities captured), within the dtype's tolerance."""
    from engine import ScoringParams
    from engine.method.chunk_scorer import ScoringJob, score_document, score_documents_together, scoring_rows

    folder = dream_dir if family == "dream" else llada_dir
    engine = Engine.from_pretrained(folder, device="cuda", dtype=dtype)
    runner, cfg = engine.runner, engine.config
    g = torch.Generator().manual_seed(3)
    docs = [engine.prefill(torch.randint(5, 300, (n,), generator=g).tolist(), 32) for n in (301, 97, 515)]
    jobs = []
    for doc, n in zip(docs, (13, 9, 21), strict=True):
        query = torch.randint(5, 300, (n,), generator=g).tolist()
        rows = scoring_rows(query, (1, n - 1), None, 8, cfg.logits_shifted)
        jobs.append(ScoringJob(doc, rows, ScoringParams(scorer="self_information", llada_folds=4, max_rows=700)))
    warm_up = score_documents_together(runner, jobs)  # a graphed call's first runs eagerly, then captures
    together = score_documents_together(runner, jobs)  # replayed
    assert all(p._call.graph is not None for p in runner.kept_items("scoring").values())
    tol = BF16 if dtype == torch.bfloat16 else dict(atol=1e-4, rtol=1e-4)
    for job, got, first in zip(jobs, together, warm_up, strict=True):
        torch.testing.assert_close(got.scores, first.scores, **tol)
        for _ in range(2):  # the second scoring replays the captured graphs
            alone = score_document(runner, job.document, job.rows, job.params)
        reference = score_document(runner, job.document, job.rows, job.params, keep_passes=False)  # eager, fp32 capture
        for want in (alone, reference):
            torch.testing.assert_close(got.scores, want.scores, **tol)
            torch.testing.assert_close(got.anchors, want.anchors, **tol)


@pytest.mark.parametrize("family", ["dream", "llada"])
def test_shared_question_passes_match_each_alone_on_gpu(family, dream_dir, llada_dir):
    """Three questions' static contexts from one captured question pass of four rows (bf16) equal
    each one's eager pass within bf16's tolerance."""
    from engine import AnswerParams
    from engine.decode.static import QuestionContextRequest, build_static_context, build_static_contexts
    from engine.method.answer import ChunkRef, gather_selected
    from engine.method.chunk_scorer import scoring_rows
    from engine.method.prompting import build_question_prompt

    folder = dream_dir if family == "dream" else llada_dir
    engine = Engine.from_pretrained(folder, device="cuda")
    runner, cfg = engine.runner, engine.config
    g = torch.Generator().manual_seed(5)
    docs = [engine.prefill(torch.randint(5, 300, (n,), generator=g).tolist(), 32) for n in (301, 97, 515)]
    requests = []
    for doc, question in zip(docs, ("Where to?", "Who?", "Why?"), strict=True):  # one padded size
        prompt = build_question_prompt(engine.tokenizer, question, cfg.bos_token_id)
        rows = scoring_rows(prompt.query_ids, prompt.question_span, None, 8, cfg.logits_shifted)
        chunks, _, start = gather_selected(runner, [doc], [ChunkRef(0, 2), ChunkRef(0, 0)], rows, AnswerParams(),
                                           len(prompt.prefix_ids))
        requests.append(QuestionContextRequest(prompt, chunks, start))
    for _ in range(2):  # captured, then replayed
        shared = build_static_contexts(runner, requests)
    assert [key[-2] for key in runner.kept_items("static question pass")] == [4]  # (..., batch rows, dtype)
    for r, ctx in zip(requests, shared, strict=True):
        alone = build_static_context(runner, r.prompt, r.chunks, r.query_start, kept_pass=False)
        assert torch.equal(ctx.key_valid, alone.key_valid)
        for (k1, v1), (k2, v2) in zip(ctx.kv, alone.kv, strict=True):
            torch.testing.assert_close(k1.float(), k2.float(), **BF16)
            torch.testing.assert_close(v1.float(), v2.float(), **BF16)
        torch.testing.assert_close(ctx.anchors, alone.anchors, **BF16)
