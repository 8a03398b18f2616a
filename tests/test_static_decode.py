"""Decoding over static KV equals a full recompute under the mask it implies (engine/decode/static.py)."""

from __future__ import annotations

import pytest
import torch

from engine import AnswerParams, SamplingParams, ScoringParams
from engine.attention import BACKENDS, dense_mask
from engine.decode.baselines import DenseDecoder
from engine.decode.loop import DecodeStep
from engine.decode.sampling import prediction_rows
from engine.decode.static import SelectedChunks, build_joint_context
from engine.method.kv_cache import chunk_deltas
from engine.method.prompting import build_question_prompt
from tests.tiny_inputs import doc_ids


def _reference_static_steps(model, prompt, doc, refs, starts, query_start, gen, block, rule, tau):
    """Full recompute every step under the mask that static decoding implies (see static_decode)."""
    cfg = model.cfg
    segs = [("prefix", torch.tensor(prompt.prefix_ids), torch.arange(len(prompt.prefix_ids)))]
    for j, ref in enumerate(refs):
        n = int(doc.lengths[ref.chunk])
        segs.append((f"chunk{j}", doc.tokens[ref.chunk, :n], starts[j] + torch.arange(n)))
    nq = len(prompt.query_ids)
    segs.append(("query", torch.tensor(prompt.query_ids), query_start + torch.arange(nq)))
    answer_start = query_start + nq
    answer = torch.full((gen,), cfg.mask_token_id)
    steps = []
    for b in range(gen // block):
        while (answer[b * block:(b + 1) * block] == cfg.mask_token_id).any():
            parts = segs + [(f"block{i}", answer[i * block:(i + 1) * block],
                             answer_start + i * block + torch.arange(block)) for i in range(b + 1)]
            names = [name for name, ids, _ in parts for _ in range(len(ids))]
            ids = torch.cat([p[1] for p in parts])
            pos = torch.cat([p[2] for p in parts])
            t = len(names)
            allowed = torch.zeros(t, t, dtype=torch.bool)
            order = {name: i for i, (name, _, _) in enumerate(parts)}
            for r, rn in enumerate(names):
                for k, kn in enumerate(names):
                    if rn == "prefix" or rn.startswith("chunk"):
                        allowed[r, k] = kn == rn
                    elif rn == "query":
                        allowed[r, k] = not kn.startswith("block")
                    else:
                        allowed[r, k] = order[kn] <= order[rn]
            lo = t - block
            masked = lo + torch.nonzero(answer[b * block:(b + 1) * block] == cfg.mask_token_id)[:, 0]
            rows = prediction_rows(masked, cfg.logits_shifted)
            with torch.no_grad():
                logits = model(ids[None], pos[None], dense_mask(allowed[None, None]), BACKENDS["reference"],
                               logits_rows=rows).logits[0]
            probs = torch.softmax(logits, -1)
            conf, tok = probs.max(-1)
            pick = conf >= tau if rule == "threshold" else torch.zeros_like(conf, dtype=torch.bool)
            pick[conf.argmax()] = True
            slots = masked[pick] - lo + b * block
            answer[slots] = tok[pick]
            steps.append((tuple(slots.tolist()), tuple(tok[pick].tolist())))
    return steps


@pytest.mark.parametrize("family", ["dream", "llada"])
@pytest.mark.parametrize("rule,tau,position_mode,top_k", [("one", 1.0, "continuous", 3),
                                                          ("threshold", 0.004, "continuous", 2),
                                                          ("one", 1.0, "absolute", 2)])
def test_static_decoding_equals_full_recompute(engines, family, rule, tau, position_mode, top_k):
    engine = engines[family]
    doc = engine.prefill(doc_ids(40, 300, seed=2), chunk_size=16)  # 3 chunks, the last one short
    gen, block = 16, 8
    sampling = (SamplingParams(decoder="low_confidence", gen_length=gen, block_length=block, stop_at_eos=False)
                if rule == "one" else
                SamplingParams(decoder="threshold", threshold=tau, gen_length=gen, block_length=block,
                               stop_at_eos=False))
    params = AnswerParams(top_k=top_k, kv_mode="static", position_mode=position_mode,
                          scoring=ScoringParams(scorer="none"), sampling=sampling)
    events = list(engine.stream_answer(doc, "Which river is it?", params))
    result = events[-1]
    got = [(e.positions, e.tokens) for e in events if isinstance(e, DecodeStep)]
    prompt = build_question_prompt(engine.tokenizer, "Which river is it?", engine.config.bos_token_id)
    ordinals = torch.tensor([r.chunk for r in result.trace.selected])
    assert ordinals.tolist() == list(range(top_k))  # scorer "none": the first K chunks
    starts, q_start = chunk_deltas(position_mode, len(prompt.prefix_ids), 16, ordinals, doc.num_chunks)
    expected = _reference_static_steps(engine.model, prompt, doc, result.trace.selected, starts, q_start,
                                       gen, block, rule, tau)
    assert got == expected
    if rule == "threshold":
        assert any(len(p) > 1 for p, _ in got)


@pytest.mark.parametrize("family", ["dream", "llada"])
def test_joint_equals_dense_with_one_chunk_covering_the_context(engines, family):
    engine = engines[family]
    content = doc_ids(30, 300, seed=3)
    doc = engine.prefill(content, chunk_size=31)  # [BOS] + 30 tokens: one full chunk
    assert doc.num_chunks == 1
    gen = block = 8
    question = "Who wrote it?"
    prompt = build_question_prompt(engine.tokenizer, question, engine.config.bos_token_id)
    starts, q_start = chunk_deltas("continuous", len(prompt.prefix_ids), 31, torch.tensor([0]), 1)
    chunks = SelectedChunks(keys=doc.keys, values=doc.values, valid=torch.ones(1, 31, dtype=torch.bool),
                            starts=starts, tokens=doc.tokens, lengths=doc.lengths, kept=None)
    with torch.no_grad():
        ctx = build_joint_context(engine.runner, prompt, chunks, q_start, gen, block)
        dense_prompt = torch.cat((torch.tensor(prompt.prefix_ids), doc.tokens[0], torch.tensor(prompt.query_ids)))
        dense = DenseDecoder(engine.runner, dense_prompt)
        masks = torch.full((gen,), engine.config.mask_token_id)
        dense_logits = dense.slot_logits(0, masks, torch.arange(gen))
    torch.testing.assert_close(ctx.first_step_logits, dense_logits, atol=1e-5, rtol=1e-5)
    sampling = SamplingParams(decoder="threshold", threshold=1e-6, gen_length=gen, block_length=block,
                              stop_at_eos=False)
    joint = engine.answer(doc, question, AnswerParams(top_k=1, kv_mode="joint", sampling=sampling))
    dense_ans = engine.answer(doc, question, AnswerParams(kv_mode="dense", sampling=sampling))
    assert joint.answer_ids == dense_ans.answer_ids
    assert joint.trace.steps == dense_ans.trace.steps == 1


@pytest.mark.parametrize("family", ["dream", "llada"])
@pytest.mark.parametrize("token_budget,extra", [(0, None), (6, [5, 9, 13])])
def test_the_kept_question_pass_equals_the_eager_one(engines, family, token_budget, extra):
    """The static context from the runner's StaticQueryPass (fixed buffers, padded question rows)
    is the eager pass's: the same KV, valid keys, anchor logits and BOS anchors."""
    from engine.decode.static import build_static_context
    from engine.method.answer import ChunkRef, gather_selected
    from engine.method.chunk_scorer import scoring_rows

    engine = engines[family]
    runner = engine.runner
    doc = engine.prefill(doc_ids(41, 300, seed=4), chunk_size=16)  # 3 chunks, the last one short
    prompt = build_question_prompt(engine.tokenizer, "Where does the ferry from pier seven go?",
                                   engine.config.bos_token_id)
    rows = scoring_rows(prompt.query_ids, prompt.question_span, None, 4, runner.cfg.logits_shifted)
    params = AnswerParams(top_k=2, token_budget=token_budget)
    refs = [ChunkRef(0, 2), ChunkRef(0, 0)]
    chunks, _, query_start = gather_selected(runner, [doc], refs, rows, params, len(prompt.prefix_ids))
    eager = build_static_context(runner, prompt, chunks, query_start, extra, kept_pass=False)
    for _ in range(2):  # the second call reuses the kept pass's buffers
        _assert_same_context(build_static_context(runner, prompt, chunks, query_start, extra), eager)
    assert len(runner.kept_items("static question pass")) >= 1


@pytest.mark.parametrize("family", ["dream", "llada"])
def test_question_passes_shared_by_several_questions_equal_each_alone(engines, family):
    """Five questions' contexts from shared question passes (2 or 3 chunks, a token budget, extra
    ids, two padded question sizes: two shapes of one question, one of three that share a pass
    of four rows with a spare) equal each eager pass alone: the same KV, valid keys, anchor logits
    and BOS anchors."""
    from engine.decode.static import QuestionContextRequest, build_static_context, build_static_contexts
    from engine.method.answer import ChunkRef, gather_selected
    from engine.method.chunk_scorer import scoring_rows

    engine = engines[family]
    runner = engine.runner
    runner.kept_items("static question pass").clear()  # passes other tests' questions left (the engines are shared)
    docs = [engine.prefill(doc_ids(41 + 9 * i, 300, seed=4 + i), chunk_size=16) for i in range(3)]
    asks = [("Where to?", [ChunkRef(0, 2), ChunkRef(0, 0)], 0, ()),
            ("Who?", [ChunkRef(0, 1), ChunkRef(0, 0)], 0, ()),
            ("Which of the three harbour cranes was repaired last, and by which crew of the night shift?",
             [ChunkRef(0, 0), ChunkRef(0, 1), ChunkRef(0, 2)], 0, ()),
            ("When did it open?", [ChunkRef(0, 2), ChunkRef(0, 1)], 6, (5, 9, 13)),
            ("Why?", [ChunkRef(0, 0), ChunkRef(0, 2)], 0, ())]
    requests = []
    for i, (question, refs, budget, extra) in enumerate(asks):
        prompt = build_question_prompt(engine.tokenizer, question, engine.config.bos_token_id)
        rows = scoring_rows(prompt.query_ids, prompt.question_span, None, 4, runner.cfg.logits_shifted)
        chunks, _, query_start = gather_selected(runner, [docs[i % 3]], refs, rows, AnswerParams(token_budget=budget),
                                                 len(prompt.prefix_ids))
        requests.append(QuestionContextRequest(prompt, chunks, query_start, extra))
    for _ in range(2):  # the second round reuses the kept passes' buffers
        for r, shared in zip(requests, build_static_contexts(runner, requests), strict=True):
            _assert_same_context(shared, build_static_context(runner, r.prompt, r.chunks, r.query_start,
                                                              list(r.extra_ids), kept_pass=False))
    # (prefix, chunks, chunk keys, padded question rows, batch rows, dtype): three questions share a pass
    # of four rows (one spare), the others have passes of their own.
    assert sum(key[-2] == 4 for key in runner.kept_items("static question pass")) == 1


def _assert_same_context(got, want) -> None:
    """Two FixedContexts agree: answer start, valid keys, KV, BOS anchors, anchor logits (fp32 CPU)."""
    assert got.answer_start == want.answer_start
    assert torch.equal(got.key_valid, want.key_valid)
    for (k1, v1), (k2, v2) in zip(got.kv, want.kv, strict=True):
        torch.testing.assert_close(k1, k2, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(v1, v2, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(got.anchors, want.anchors, atol=1e-5, rtol=1e-4)
    if want.anchor_logits is not None:
        torch.testing.assert_close(got.anchor_logits, want.anchor_logits, atol=2e-5, rtol=1e-4)
