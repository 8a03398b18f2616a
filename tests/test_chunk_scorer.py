"""Predictive chunk scoring: the draft, batched scoring passes, kept passes (engine/method/chunk_scorer.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine import ScoringParams
from engine.attention import BACKENDS, causal_mask, full_mask
from engine.method.chunk_scorer import (
    MAX_DRAFT_PASSES,
    ScoringJob,
    draft_pseudo_labels,
    draft_rows,
    kept_draft_pass,
    score_document,
    score_documents_together,
    scoring_layout,
    scoring_rows,
)
from engine.method.prefill import prefill_document
from engine.method.scoring import masking_folds
from engine.model.config import ModelConfig
from engine.model.transformer import AttentionCapture, DiffusionLM
from engine.runner import Runner
from tests.tiny_inputs import doc_ids

ATTN = BACKENDS["sdpa"]


def _draft_oracle(model, prompt_ids, slots, rounds):
    """The draft as the method's reference code runs it: the prompt's KV, then block forwards over
    the masked slots only, the pick read back to the host every round."""
    cfg = model.cfg
    n = len(prompt_ids)
    with torch.no_grad():
        ctx = model(torch.tensor([prompt_ids]), torch.arange(n)[None], full_mask(), ATTN, logits_rows="all")
        anchor = ctx.logits[0, n - 1]
        block = torch.full((1, slots), cfg.mask_token_id)
        committed = [False] * slots
        for _ in range(rounds + 1):
            masked = [i for i in range(slots) if not committed[i]]
            if cfg.logits_shifted and masked[0] == 0:
                block[0, 0], committed[0] = int(anchor.argmax()), True
                continue
            out = model(block, torch.arange(n, n + slots)[None], full_mask(), ATTN, past=ctx.kv, logits_rows="all")
            logits = out.logits[0]  # [D, V]; slot s of a shifted model is predicted by row s - 1
            rows = [(s - 1 if cfg.logits_shifted else s) for s in masked]
            probs = torch.softmax(logits[rows].float(), -1)
            conf, tok = probs.max(-1)
            best = int(conf.argmax())
            block[0, masked[best]], committed[masked[best]] = int(tok[best]), True
    return block[0].tolist(), committed


@pytest.mark.parametrize("family", ["dream", "llada"])
@pytest.mark.parametrize("extra_rows", [0, 5, None])
def test_draft_matches_the_reference_loop_with_any_padding(engines, family, extra_rows):
    """The fixed-shape draft (device-side picks, padded prompt, as captured on CUDA) commits what
    the host-side loop commits."""
    model = engines[family].model
    prompt = doc_ids(13, 60, seed=3).tolist()
    rows = draft_rows(len(prompt)) if extra_rows is None else len(prompt) + extra_rows
    for slots, rounds in ((4, 1), (3, 2), (1, 0)):
        draft = draft_pseudo_labels(Runner(model, ATTN), prompt, slots, rounds, rows=rows)
        tokens, committed = _draft_oracle(model, prompt, slots, rounds)
        assert draft.committed.tolist() == committed and sum(committed) == rounds + 1
        assert draft.tokens.tolist() == tokens


def overlap_model(family: str) -> DiffusionLM:
    """A 1-layer model whose logits reward tokens present among the attended keys.

    Embeddings are orthonormal; q = k = 0 makes attention uniform; v and o are identities; the MLP
    is zero; the head is the embedding. So a row's logits are high for the tokens its visible keys
    hold: a chunk that contains the question's tokens explains the question better. An honest,
    constructed case for the scorer, independent of training.
    """
    hidden, vocab = 256, 64
    cfg = ModelConfig(family=family, vocab_size=vocab, hidden_size=hidden, intermediate_size=8, num_layers=1,
                      num_heads=2, num_kv_heads=2, head_dim=128, rms_norm_eps=1e-6, rope_theta=1e4,
                      logits_shifted=family == "dream", mask_token_id=3, bos_token_id=1, eos_token_id=2,
                      pad_token_id=0)
    model = DiffusionLM(cfg)
    q, _ = torch.linalg.qr(torch.randn(hidden, vocab, generator=torch.Generator().manual_seed(0)))
    emb = q.T.contiguous()  # [V, hidden], orthonormal rows
    state = {name: torch.zeros_like(p) for name, p in model.state_dict().items()}
    state["embed_tokens.weight"] = emb
    state["lm_head.weight"] = 5.0 * emb
    state["layers.0.self_attn.v_proj.weight"] = torch.eye(hidden)
    state["layers.0.self_attn.o_proj.weight"] = torch.eye(hidden)
    for name in state:
        if name.endswith("layernorm.weight") or name == "norm.weight":
            state[name] = torch.ones(hidden)
    model.load_state_dict(state)
    return model.eval()


def planted_doc(model, planted_chunk: int, question: list[int], n_chunks=6, c=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    content = torch.randint(20, 60, (n_chunks * (c - 1),), generator=g)
    span = planted_chunk * (c - 1)
    content[span + 2:span + 2 + 2 * len(question)] = torch.tensor(question * 2)
    return prefill_document(Runner(model, ATTN), content, chunk_size=c)


@pytest.mark.parametrize("family,folds", [("dream", None), ("llada", None), ("llada", 3)])
def test_scoring_picks_the_planted_chunk(family, folds):
    model = overlap_model(family)
    question = [10, 11, 12, 13, 14, 15, 16]
    doc = planted_doc(model, planted_chunk=4, question=question)
    rows = scoring_rows([7] + question, (1, 1 + len(question)), None, 4, model.cfg.logits_shifted)
    params = ScoringParams(scorer="self_information", llada_folds=folds, max_rows=20)  # several batches
    scores = score_document(Runner(model, ATTN), doc, rows, params).scores
    assert int(scores.argmax()) == 4, scores
    assert torch.isfinite(scores).all()


def _score_oracle(model, doc, rows, folds):
    """Each chunk, each fold, one forward of its own over that chunk's valid keys alone (no
    batching, padding or shared folds): mean log-likelihood of the targets, and the window rows'
    attention on the chunk's BOS per layer (fold 0)."""
    cfg = model.cfg
    n = rows.ids.numel()
    plans = [torch.zeros(n, dtype=torch.bool)] if folds is None else list(folds)
    scores, anchors = [], []
    for chunk in range(doc.num_chunks):
        length = int(doc.lengths[chunk])
        past = [(doc.keys[i, chunk:chunk + 1, :, :length], doc.values[i, chunk:chunk + 1, :, :length])
                for i in range(cfg.num_layers)]
        read = []
        for f, hide in enumerate(plans):
            ids = rows.ids.clone()
            ids[hide] = cfg.mask_token_id
            mask = causal_mask() if cfg.logits_shifted else full_mask()
            with torch.no_grad():
                out = model(ids[None], (length + torch.arange(n))[None], mask, ATTN, past=past, logits_rows="all",
                            capture=AttentionCapture(tuple(range(cfg.num_layers)), rows.window))
            log_probs = torch.log_softmax(out.logits[0].float(), -1)
            targets = torch.nonzero(rows.targets if cfg.logits_shifted else hide)[:, 0]
            at = targets - 1 if cfg.logits_shifted else targets
            read.append(log_probs[at, rows.ids[targets]])
            if f == 0:
                anchors.append(torch.stack([out.attention[i][0, :, :, 0].mean() for i in range(cfg.num_layers)]))
        scores.append(torch.cat(read).mean())
    return torch.stack(scores), torch.stack(anchors)


@pytest.mark.parametrize("family,folds,max_rows", [("dream", None, 4096), ("dream", None, 50),
                                                   ("llada", None, 4096), ("llada", 3, 100)])
def test_batched_scoring_equals_one_forward_per_chunk_and_fold(engines, family, folds, max_rows):
    """Folds side by side in one batch item, rows padded, chunks batched: the same scores and
    anchors as scoring every chunk and fold on its own (a short last chunk included)."""
    engine = engines[family]
    model, cfg = engine.model, engine.config
    doc = prefill_document(Runner(model, ATTN), doc_ids(5 * 16 - 7, 60, seed=5), chunk_size=16)
    query = doc_ids(11, 60, seed=6).tolist()
    rows = scoring_rows(query, (1, 9), None, 4, cfg.logits_shifted)
    params = ScoringParams(scorer="self_information", llada_folds=folds, max_rows=max_rows)
    got = score_document(Runner(model, ATTN), doc, rows, params)
    plan = None if cfg.logits_shifted else masking_folds(rows.targets, folds)
    want_scores, want_anchors = _score_oracle(model, doc, rows, plan)
    torch.testing.assert_close(got.scores, want_scores, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.anchors, want_anchors, atol=1e-5, rtol=1e-5)


def test_scoring_layout_pads_and_separates_folds():
    rows = scoring_rows([5, 6, 7, 8, 9], (0, 5), None, 2, shifted=False)
    folds = masking_folds(rows.targets, 2)  # targets 0, 2, 4 hidden in fold 0; 1, 3 in fold 1
    layout = scoring_layout(rows, folds, shifted=False, mask_token_id=3, round_to=4)
    assert layout.shape == (16, 8, 2)  # 2 folds of 8 rows (5 padded to 8); 3 reads padded to 4 per fold
    assert layout.ids.tolist() == [3, 3, 3, 3, 6, 3, 8, 3, 3, 3, 3, 5, 3, 7, 3, 9]  # padding first
    assert layout.offsets.tolist()[:8] == [0, 0, 0, 0, 1, 2, 3, 4]
    assert not layout.row_mask[0, 8:].any() and not layout.row_mask[:, 8:11].any()  # no other fold, no padding
    assert layout.read.tolist()[:3] == [3, 5, 7] and layout.read.tolist()[4:6] == [12, 14]
    assert layout.read_tokens.tolist()[:3] == [5, 7, 9] and layout.read_valid.sum() == 5
    assert layout.window.tolist() == [6, 7]
    causal = scoring_layout(scoring_rows([5, 6, 7], (0, 3), None, 2, shifted=True), None, True, 3, 4)
    assert causal.row_mask[1:, 1:].tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert causal.read.tolist()[:2] == [1, 2] and causal.read_tokens.tolist()[:2] == [6, 7]
    wide = scoring_layout(rows, folds, shifted=False, mask_token_id=3, round_to=4, rows_per_fold=9, reads_per_fold=5)
    assert wide.shape == (24, 16, 2) and wide.window.tolist() == [10, 11]  # the window stays last


def test_leave_one_out_and_folds_agree_on_ranking():
    """The cheaper strided estimator ranks chunks like leave-one-out on the planted case."""
    model = overlap_model("llada")
    question = [10, 11, 12, 13, 14, 15, 16, 17]
    doc = planted_doc(model, planted_chunk=2, question=question, n_chunks=8)
    rows = scoring_rows(question, (0, len(question)), None, 4, False)
    runner = Runner(model, ATTN)
    loo = score_document(runner, doc, rows, ScoringParams(scorer="self_information")).scores
    strided = score_document(runner, doc, rows, ScoringParams(scorer="self_information", llada_folds=2)).scores
    assert int(loo.argmax()) == int(strided.argmax()) == 2
    # Both separate the planted chunk from the best distractor (distractors are random tokens,
    # so their order among themselves is noise for either estimator).
    for s in (loo, strided):
        others = torch.cat((s[:2], s[3:]))
        assert s[2] - others.max() > 0.05


def test_token_scores_are_what_the_chunk_score_averages():
    model = overlap_model("llada")
    question = [10, 11, 12, 13, 14, 15, 16, 17]
    doc = planted_doc(model, planted_chunk=2, question=question, n_chunks=5)
    rows = scoring_rows(question, (0, len(question)), None, 4, False)
    got = score_document(Runner(model, ATTN), doc, rows, ScoringParams(scorer="self_information", llada_folds=3))
    assert got.token_scores.shape == (5, len(question))  # each target read once, whatever the folds
    torch.testing.assert_close(got.token_scores.mean(1), got.scores)


def test_the_runner_keeps_one_draft_pass_per_padded_prompt_length(engines):
    runner = Runner(engines["dream"].model, ATTN)
    first = kept_draft_pass(runner, 17, 4, 1)
    assert kept_draft_pass(runner, 32, 4, 1) is first  # 17 and 32 pad to 32 rows
    assert kept_draft_pass(runner, 33, 4, 1) is not first
    for n in range(1, MAX_DRAFT_PASSES + 2):
        kept_draft_pass(runner, 16 * n, 4, 1)
    assert len(runner.kept_items("draft")) == MAX_DRAFT_PASSES  # the least recently used are dropped


@pytest.mark.parametrize("family", ["dream", "llada"])
def test_staged_scoring_passes_serve_any_document(engines, family, monkeypatch):
    """Where graphs are used, a document's chunks are copied into the runner's staging buffers and
    scored by passes kept by chunk count and layout shape, not by document: two documents and a
    prefiltered cut (a new tensor, as the app's) score as the eager passes over their own KV do,
    a short pass's spare items and a byte cap on the staging included; the passes are reused."""
    from engine.cuda_graphs import GraphedCall
    from engine.method import chunk_scorer
    from engine.method.kv_cache import take_chunks

    monkeypatch.setattr(Runner, "uses_graphs", property(lambda self: True))
    monkeypatch.setattr(chunk_scorer, "kept_pool", lambda runner, kind: None)
    # The passes run eagerly on the CPU: what is tested is the staging, not the capture (test_gpu.py).
    monkeypatch.setattr(chunk_scorer, "GraphedCall", lambda fn, use_graph, what, pool: GraphedCall(fn, False, what))
    engine = engines[family]
    runner, cfg = Runner(engine.model, ATTN), engine.config
    # 2 chunks first: its staging of 2 grows to 4 for the next document, dropping the pass over it.
    docs = [prefill_document(runner, doc_ids(n, 60, seed=n), chunk_size=16) for n in (20, 5 * 16 - 7)]
    docs.append(take_chunks(docs[1], [4, 0, 2]))
    rows = scoring_rows(doc_ids(11, 60, seed=6).tolist(), (1, 9), None, 4, cfg.logits_shifted)
    folds = None if cfg.logits_shifted else 3
    params = ScoringParams(scorer="self_information", llada_folds=folds)
    shape = chunk_scorer.question_layout(runner, rows, params).shape
    params = dataclasses.replace(params, max_rows=4 * shape[0])
    staged, seen = runner.kept_items("scoring"), []
    for _ in range(3):  # the third time, every pass is one kept before
        for doc in docs:  # 5 chunks: passes of 4 and 1; 3 chunks: one pass of 4, a spare item
            got = score_document(runner, doc, rows, params)
            want = score_document(runner, doc, rows, params, keep_passes=False)
            torch.testing.assert_close(got.scores, want.scores, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(got.anchors, want.anchors, atol=1e-5, rtol=1e-5)
        seen.append({id(p) for p in staged.values()})
    assert seen[0] < seen[1] == seen[2]  # the 2-chunk pass came back over the grown staging
    assert sorted(p.b for p in staged.values()) == [1, 2, 4]
    stagings = runner.kept_items("scoring staging")
    assert len(stagings) == 1 and {id(p.staging) for p in staged.values()} == {id(next(iter(stagings.values())))}
    assert next(iter(stagings.values())).keys.shape[1] == 4  # one buffer, grown to the largest pass
    docs = docs[1:]
    chunk_bytes = docs[0].keys[:, 0].nbytes + docs[0].values[:, 0].nbytes
    monkeypatch.setattr(chunk_scorer, "MAX_COPIED_KV_BYTES", 2 * chunk_bytes)
    passes = chunk_scorer.scoring_passes(runner, docs[0], shape, params.max_rows)
    assert [(start, end) for start, end, _ in passes] == [(0, 2), (2, 4), (4, 5)]
    got = score_document(runner, docs[0], rows, params)
    torch.testing.assert_close(got.scores, score_document(runner, docs[0], rows, params, keep_passes=False).scores,
                               atol=1e-5, rtol=1e-5)


def test_eager_scoring_passes_keep_nothing(engines):
    """Without graphs each question's passes read the document's KV in place and nothing is kept."""
    runner = Runner(engines["llada"].model, ATTN)
    doc = prefill_document(runner, doc_ids(70, 60), chunk_size=16)
    rows = scoring_rows(doc_ids(11, 60, seed=6).tolist(), (1, 9), None, 4, runner.cfg.logits_shifted)
    score_document(runner, doc, rows, ScoringParams(scorer="self_information", llada_folds=2))
    assert not runner.kept_items("scoring") and not runner.kept_items("scoring staging")


@pytest.mark.parametrize("family", ["dream", "llada"])
def test_drafts_in_one_batched_pass_equal_each_alone(engines, family):
    """Prompts of three lengths in one four-row pass (a spare row): each gets the draft it gets alone."""
    runner = Runner(engines[family].model, ATTN)
    gen = torch.Generator().manual_seed(3)
    vocab = runner.cfg.vocab_size
    prompts = [torch.randint(8, vocab - 8, (n,), generator=gen).tolist() for n in (5, 17, 9)]
    alone = [draft_pseudo_labels(runner, p, 4, 2) for p in prompts]
    batched = kept_draft_pass(runner, 17, 4, 2, batch=4)(prompts)
    assert len(batched) == 3
    for a, b in zip(alone, batched, strict=True):
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.committed, b.committed)
        assert int(b.committed.sum()) == 3


@pytest.mark.parametrize("family,folds", [("dream", None), ("llada", 3), ("llada", None)])
def test_shared_passes_score_each_job_as_it_scores_alone(engines, family, folds):
    """Several questions' documents (odd lengths and chunk counts) in shared passes, split where a
    pass fills, questions of several lengths padded to one shape, a question shorter than the
    window (a pass of its own) and the attention scorer among them: each job's scores, token
    scores and anchors equal its own `score_document`'s."""
    engine = engines[family]
    runner, cfg = engine.runner, engine.config
    docs = [prefill_document(runner, doc_ids(length, 60, seed=20 + i), chunk_size=16)
            for i, length in enumerate((5 * 16 - 7, 2 * 16 + 3, 9 * 16 - 1, 15))]
    queries = [doc_ids(n, 60, seed=30 + n).tolist() for n in (11, 7, 15, 3)]
    jobs = []
    for i, (doc, query) in enumerate(zip(docs, queries, strict=True)):
        rows = scoring_rows(query, (1, len(query) - 1), None, 4, cfg.logits_shifted)
        scorer = "attention" if i == 1 else "self_information"
        jobs.append(ScoringJob(doc, rows, ScoringParams(scorer=scorer, llada_folds=folds, max_rows=150)))
    jobs.append(ScoringJob(docs[0], jobs[2].rows, jobs[2].params))  # one document for two questions
    together = score_documents_together(runner, jobs)
    for job, got in zip(jobs, together, strict=True):
        _assert_same_scores(got, score_document(runner, job.document, job.rows, job.params, keep_passes=False))


def _assert_same_scores(got, want) -> None:
    """Two DocumentScores equal up to a larger matmul's floating-point order."""
    torch.testing.assert_close(got.scores, want.scores, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.anchors, want.anchors, atol=1e-5, rtol=1e-5)
    if want.token_scores is None:
        assert got.token_scores is None
    else:
        torch.testing.assert_close(got.token_scores, want.token_scores, atol=1e-5, rtol=1e-5)


def test_a_stopped_job_leaves_the_shared_passes_and_the_others_score_on(engines):
    """A job whose interrupt check raises before its second pass (its question was cancelled) gets
    no scores and is in no later pass; the other jobs' scores are unchanged."""
    engine = engines["llada"]
    runner, cfg = engine.runner, engine.config
    docs = [prefill_document(runner, doc_ids(9 * 16 - 1, 60, seed=40 + i), chunk_size=16) for i in range(3)]
    calls = []

    def cancelled_after_one_pass() -> None:
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("cancelled")

    query = doc_ids(11, 60, seed=7).tolist()
    rows = scoring_rows(query, (1, 10), None, 4, cfg.logits_shifted)
    params = ScoringParams(scorer="self_information", llada_folds=2, max_rows=80)  # several passes a document
    jobs = [ScoringJob(doc, rows, params, cancelled_after_one_pass if i == 1 else None) for i, doc in enumerate(docs)]
    together = score_documents_together(runner, jobs)
    assert together[1] is None and len(calls) == 2  # checked before its first two passes, then left
    for i in (0, 2):
        want = score_document(runner, docs[i], rows, params, keep_passes=False)
        torch.testing.assert_close(together[i].scores, want.scores, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family,folds", [("dream", None), ("llada", 3)])
def test_staged_shared_passes_score_as_the_eager_shared_passes(engines, family, folds, monkeypatch):
    """Where graphs are used, the shared passes copy the runs of several questions' chunks into the
    runner's staging (room for the rows' KV after each chunk's) and replay one pass a chunk count:
    each job's scores, token scores and anchors equal the eager shared passes' (their reference),
    with passes split where they fill, spare items, a one-document run and, the second time, longer
    questions (the staging grows its room and the passes over the old one are dropped)."""
    from engine.cuda_graphs import GraphedCall
    from engine.method import chunk_scorer

    engine = engines[family]
    runner, cfg = Runner(engine.model, ATTN), engine.config
    docs = [prefill_document(runner, doc_ids(length, 60, seed=50 + i), chunk_size=16)
            for i, length in enumerate((5 * 16 - 7, 2 * 16 + 3, 3 * 16 - 1))]

    def jobs_of(lengths):
        jobs = []
        for i, (doc, n) in enumerate(zip(docs, lengths, strict=True)):
            rows = scoring_rows(doc_ids(n, 60, seed=60 + i).tolist(), (1, n - 1), None, 4, cfg.logits_shifted)
            scorer = "attention" if i == 1 else "self_information"
            jobs.append(ScoringJob(doc, rows, ScoringParams(scorer=scorer, llada_folds=folds, max_rows=200)))
        return jobs

    rounds = [jobs_of((11, 7, 9)), jobs_of((19, 17, 21))]
    want = [score_documents_together(runner, jobs) for jobs in rounds]  # eager, read in place
    monkeypatch.setattr(Runner, "uses_graphs", property(lambda self: True))
    monkeypatch.setattr(chunk_scorer, "kept_pool", lambda runner, kind: None)
    # The passes run eagerly on the CPU: what is tested is the staging, not the capture (test_gpu.py).
    monkeypatch.setattr(chunk_scorer, "GraphedCall", lambda fn, use_graph, what, pool: GraphedCall(fn, False, what))
    rooms = []
    for jobs, wanted in zip(rounds, want, strict=True):
        got = score_documents_together(runner, jobs)
        for g, w in zip(got, wanted, strict=True):
            _assert_same_scores(g, w)
        (staging,) = runner.kept_items("scoring staging").values()
        rooms.append(staging.room)
        assert all(p.staging is staging for p in runner.kept_items("scoring").values())
    assert rooms[0] < rooms[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b,hq,hkv,c,r,w", [(3, 6, 2, 13, 7, 3), (2, 4, 4, 16, 5, 5), (1, 7, 1, 9, 11, 2)])
def test_window_mass_from_the_lse_equals_the_captured_summary(dtype, b, hq, hkv, c, r, w):
    """The staged passes' BOS and content mass from the attention's log-sum-exp (`window_mass`)
    against the eager passes' reduction of fp32 probabilities over every key (`_attention_summary`),
    on odd sizes and GQA ratios: chunks of several lengths (a single token among them), the rows
    causal among themselves, the window their last rows."""
    from engine.attention import attention_probs, dense_mask, reference_attention
    from engine.method.chunk_scorer import _attention_summary, valid_chunk_keys, window_mass

    gen = torch.Generator().manual_seed(b * 100 + c)
    d, scale = 8, 8 ** -0.5
    q = (2 * torch.randn(b, hq, r, d, generator=gen)).to(dtype)
    keys = (2 * torch.randn(b, hkv, c + r, d, generator=gen)).to(dtype)
    lengths = torch.tensor([c, 1, c - 4][:b])
    own = torch.tril(torch.ones(r, r, dtype=torch.bool))[None].expand(b, r, r)
    mask = torch.cat((valid_chunk_keys(lengths, c)[:, None, :].expand(b, r, c), own), -1)[:, None]  # [b, 1, r, c + r]
    window = torch.arange(r - w, r)
    want = _attention_summary(c)(attention_probs(q[:, :, window], keys, dense_mask(mask[:, :, window]), scale))
    _, lse = reference_attention(q, keys, keys, dense_mask(mask), scale, return_lse=True)
    got = window_mass(q[:, :, window], keys, lse[:, :, window], own[:, window], c, scale)
    assert got.dtype == torch.float32 and got.shape == (b, 2)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1.5e-2, "rtol": 1e-2}
    torch.testing.assert_close(got, want, **tol)
