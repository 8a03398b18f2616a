"""Answering over prefilled documents: selection rules, pooled documents, modes (engine/method/answer.py)."""

from __future__ import annotations

import pytest
import torch

from engine import AnswerParams, SamplingParams, ScoringParams
from engine.attention import BACKENDS
from engine.method.answer import score_chunks, select_chunks
from engine.method.chunk_scorer import scoring_rows
from engine.method.prefill import prefill_document
from engine.runner import Runner
from tests.test_chunk_scorer import overlap_model, planted_doc
from tests.tiny_inputs import doc_ids

ATTN = BACKENDS["sdpa"]


def test_coverage_gain_in_answer_params(engines):
    with pytest.raises(ValueError, match="coverage_gain"):
        AnswerParams(coverage_gain=0.0)
    with pytest.raises(ValueError, match="likelihood scorer"):
        AnswerParams(coverage_gain=0.1, scoring=ScoringParams(scorer="attention"))
    engine = engines["llada"]
    doc = engine.prefill(doc_ids(60, 200, seed=8), chunk_size=16)
    sampling = SamplingParams(gen_length=8, block_length=8, stop_at_eos=False)
    res = engine.answer(doc, "What?", AnswerParams(top_k=3, coverage_gain=1e6, sampling=sampling,
                                                   scoring=ScoringParams(scorer="self_information")))
    best = max(range(len(res.trace.scores)), key=res.trace.scores.__getitem__)
    assert [r.chunk for r in res.trace.selected] == [res.trace.candidates[best].chunk]


def test_the_trace_keeps_the_fused_score_each_selected_chunk_was_ranked_by(engines):
    engine = engines["llada"]
    doc = engine.prefill(doc_ids(60, 200, seed=8), chunk_size=16)
    priors = [1.0 if i == doc.num_chunks - 2 else 0.0 for i in range(doc.num_chunks)]
    params = AnswerParams(top_k=3, prior_weight=50.0, sampling=SamplingParams(gen_length=8, block_length=8))
    trace = engine.answer(doc, "What?", params, chunk_priors=[priors]).trace
    by_chunk = {c.chunk: i for i, c in enumerate(trace.candidates)}
    for ref, own, fused in zip(trace.selected, trace.selected_scores, trace.selected_fused_scores, strict=True):
        i = by_chunk[ref.chunk]
        assert own == trace.scores[i] and fused == pytest.approx(own + 50.0 * priors[ref.chunk])
    assert doc.num_chunks - 2 in [r.chunk for r in trace.selected]  # 50 nats: the prior wins a place
    assert max(trace.selected_fused_scores) == trace.selected_fused_scores[
        [r.chunk for r in trace.selected].index(doc.num_chunks - 2)]
    assert engine.answer(doc, "What?", params).trace.selected_fused_scores == \
        engine.answer(doc, "What?", params).trace.selected_scores  # no priors: the scorer's own


def test_pooled_documents_and_k_larger_than_n(engines):
    engine = engines["llada"]
    small = engine.prefill(doc_ids(20, 300, seed=4), chunk_size=16)
    other = engine.prefill(doc_ids(50, 300, seed=5), chunk_size=16)
    sampling = SamplingParams(gen_length=8, block_length=8, stop_at_eos=False)
    res = engine.answer([small, other], "What?", AnswerParams(top_k=50, sampling=sampling))
    n = small.num_chunks + other.num_chunks
    assert len(res.trace.candidates) == n == len(res.trace.scores) == len(res.trace.selected)
    assert [(r.document, r.chunk) for r in res.trace.selected] == [(r.document, r.chunk)
                                                                   for r in res.trace.candidates]
    assert res.trace.anchors_scoring.shape == (n, engine.config.num_layers)
    assert res.trace.anchors_decode.shape == (n, engine.config.num_layers)
    assert len(res.trace.draft_ids) == 2  # D=4, R=1: two committed pseudo-label tokens


def test_pooled_selection_finds_planted_chunk_in_second_document():
    model = overlap_model("dream")
    runner = Runner(model, ATTN)
    question = [10, 11, 12, 13, 14, 15, 16]
    unrelated = torch.randint(20, 60, (60,), generator=torch.Generator().manual_seed(1))
    docs = [prefill_document(runner, unrelated, chunk_size=16),
            planted_doc(model, planted_chunk=1, question=question, seed=2)]
    rows = scoring_rows([7] + question, (1, 1 + len(question)), None, 4, True)
    scored = score_chunks(runner, docs, rows, ScoringParams(scorer="self_information"))
    best = select_chunks(scored, None, AnswerParams(top_k=1))
    assert best.tolist() == [docs[0].num_chunks + 1]


def test_score_margin_in_answer_params(engines):
    with pytest.raises(ValueError, match="score_margin"):
        AnswerParams(score_margin=0.0)
    engine = engines["llada"]
    doc = engine.prefill(doc_ids(60, 200, seed=8), chunk_size=16)
    sampling = SamplingParams(gen_length=8, block_length=8, stop_at_eos=False)
    res = engine.answer(doc, "What?", AnswerParams(top_k=3, score_margin=1e-6, sampling=sampling))
    best = max(range(len(res.trace.scores)), key=res.trace.scores.__getitem__)
    assert [r.chunk for r in res.trace.selected] == [res.trace.candidates[best].chunk]


def test_token_budget_is_respected_and_reported(engines):
    engine = engines["dream"]
    doc = engine.prefill(doc_ids(60, 300, seed=6), chunk_size=16)
    sampling = SamplingParams(gen_length=8, block_length=8, stop_at_eos=False)
    res = engine.answer(doc, "What?", AnswerParams(top_k=2, token_budget=5, sampling=sampling))
    cfg = engine.config
    for counts in res.trace.kept_tokens:
        assert len(counts) == 16
        assert counts[0] == cfg.num_layers * cfg.num_kv_heads  # BOS kept by every layer and head
        assert sum(counts) == 5 * cfg.num_layers * cfg.num_kv_heads  # exactly B per layer and head


def test_empty_document_and_long_question(engines):
    engine = engines["llada"]
    empty = engine.prefill([], chunk_size=16)
    assert empty.num_chunks == 0
    sampling = SamplingParams(gen_length=8, block_length=8, stop_at_eos=False)
    with pytest.raises(ValueError, match="no chunk to answer from"):
        engine.answer(empty, "What?", AnswerParams(sampling=sampling))
    doc = engine.prefill(doc_ids(40, 300, seed=7), chunk_size=8)
    long_question = " ".join(["which river flows to the sea"] * 10)  # far longer than C = 8
    res = engine.answer(doc, long_question, AnswerParams(top_k=2, sampling=sampling))
    assert all(torch.isfinite(torch.tensor(res.trace.scores)))
    with pytest.raises(ValueError, match="question is empty"):
        engine.answer(doc, "   ", AnswerParams(sampling=sampling))


def test_reselection_after_each_block(engines):
    engine = engines["dream"]
    doc = engine.prefill(doc_ids(80, 300, seed=8), chunk_size=16)
    sampling = SamplingParams(gen_length=24, block_length=8, stop_at_eos=False)
    res = engine.answer(doc, "Where?", AnswerParams(top_k=2, reselect_every=1, sampling=sampling))
    assert len(res.trace.reselections) == 2  # after blocks 0 and 1, not after the last
    assert all(len(sel) == 2 for sel in res.trace.reselections)
    assert len(res.answer_ids) <= 24


@pytest.mark.parametrize("mode", ["static", "joint", "dense", "fastdllm"])
def test_all_kv_modes_run_with_every_decoder_family(engines, mode):
    engine = engines["dream"]
    doc = engine.prefill(doc_ids(50, 300, seed=9), chunk_size=16)
    for decoder, steps in (("threshold", None), ("low_confidence", 8), ("entropy", 8), ("origin", 8)):
        sampling = SamplingParams(decoder=decoder, gen_length=16, block_length=8, steps=steps, stop_at_eos=False)
        res = engine.answer(doc, "What?", AnswerParams(top_k=2, kv_mode=mode, sampling=sampling))
        assert res.trace.steps >= 2 and res.trace.forward_passes >= 1
        assert set(res.trace.timings) >= {"draft", "scoring", "selection", "kv_build", "decode"}
