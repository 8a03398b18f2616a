"""The Prefilling-dLLM method on tiny models: chunked prefill, placement, scoring, static decoding."""

from __future__ import annotations

import pytest
import torch

from engine import AnswerParams, Engine, SamplingParams, ScoringParams
from engine.attention import BACKENDS, causal_mask, dense_mask, full_mask, segment_mask
from engine.decode.loop import DecodeStep, DenseRunner
from engine.decode.sampling import prediction_rows
from engine.decode.static import SelectedChunks, build_joint_context
from engine.method.chunk_scorer import draft_pseudo_labels, draft_rows, score_document, scoring_layout, scoring_rows
from engine.method.chunking import chunk_starts, chunk_tokens, token_breaks
from engine.method.kv_cache import chunk_deltas, gather_kept_tokens, place_chunks
from engine.method.prefill import prefill_document
from engine.method.prompting import build_question_prompt
from engine.method.scoring import masking_folds
from engine.model.config import ModelConfig
from engine.model.transformer import AttentionCapture, DiffusionLM

ATTN = BACKENDS["sdpa"]


@pytest.fixture(scope="module")
def engines(dream_dir, llada_dir):
    return {"dream": Engine.from_pretrained(dream_dir, device="cpu"),
            "llada": Engine.from_pretrained(llada_dir, device="cpu")}


def _doc_ids(n, vocab_hi, seed=0):
    return torch.randint(5, vocab_hi, (n,), generator=torch.Generator().manual_seed(seed))


# ---- chunking and prefill ------------------------------------------------------------------------

def test_chunks_keep_every_token_and_start_with_bos():
    ids = torch.arange(100, 137)  # 37 tokens
    ch = chunk_tokens(ids, chunk_size=8, bos_id=1, pad_id=0)
    assert ch.num_chunks == 6  # ceil(37 / 7)
    assert (ch.tokens[:, 0] == 1).all()
    assert ch.lengths.tolist() == [8, 8, 8, 8, 8, 3]
    content = torch.cat([ch.tokens[i, 1:n] for i, n in enumerate(ch.lengths.tolist())])
    assert torch.equal(content, ids)
    assert ch.content_starts.tolist() == [0, 7, 14, 21, 28, 35]
    assert chunk_tokens([], 8, 1, 0).num_chunks == 0
    with pytest.raises(ValueError, match="at least 2"):
        chunk_tokens(ids, 1, 1, 0)


def test_chunks_cut_at_sentence_starts():
    """With sentence starts, a chunk ends before the sentence that would not fit; nothing is lost."""
    ids = torch.arange(100, 137)  # 37 tokens; sentences start at 5, 12, 20 and 30
    ch = chunk_tokens(ids, chunk_size=8, bos_id=1, pad_id=0, breaks=[5, 12, 20, 30])
    assert ch.content_starts.tolist() == [0, 5, 12, 19, 26, 30]  # 19 and 26: sentence 12-20 is too long
    assert ch.lengths.tolist() == [6, 8, 8, 8, 5, 8]
    assert (ch.tokens[0, 6:] == 0).all() and (ch.tokens[:, 0] == 1).all()  # padded after the cut
    content = torch.cat([ch.tokens[i, 1:n] for i, n in enumerate(ch.lengths.tolist())])
    assert torch.equal(content, ids)
    # A break too early (under min_fill) is not taken: the chunk would be mostly padding.
    assert chunk_tokens(ids, 8, 1, 0, breaks=[2]).content_starts.tolist() == [0, 7, 14, 21, 28, 35]
    with pytest.raises(ValueError, match="min_fill"):
        chunk_tokens(ids, 8, 1, 0, breaks=[5], min_fill=0.0)


@pytest.mark.parametrize("seed", range(5))
def test_short_sentences_never_straddle_chunks(seed):
    """The property the cut exists for: every sentence of at most span - min_fill tokens lies
    inside one chunk (a needle split in two leaves no chunk with both its key and its value)."""
    g = torch.Generator().manual_seed(seed)
    n, span, min_fill = 3000, 127, 63
    lengths = torch.randint(3, 90, (200,), generator=g)
    breaks = torch.cumsum(lengths, 0)
    breaks = breaks[breaks < n].tolist()
    starts = chunk_starts(n, span, breaks, min_fill)
    ends = [*starts[1:], n]
    assert starts[0] == 0 and all(0 < e - s <= span for s, e in zip(starts, ends, strict=True))
    for a, b in zip([0, *breaks], [*breaks, n], strict=True):
        if b - a <= span - min_fill:
            assert any(s <= a and b <= e for s, e in zip(starts, ends, strict=True)), (a, b)


def test_token_breaks_map_characters_to_the_tokens_holding_them():
    offsets = [(0, 3), (3, 9), (9, 10), (10, 14), (14, 20)]  # e.g. "The", " magic", ".", " One", " of it"
    assert token_breaks([10, 11, 3, 25], offsets) == [3, 3, 1]  # a space-led token holds the start
    assert chunk_starts(0, 7, [1, 2]) == []


@pytest.mark.parametrize("family", ["dream", "llada"])
def test_prefill_equals_one_forward_under_block_diagonal_mask(engines, family):
    engine = engines[family]
    model = engine.model
    ids = _doc_ids(45, 300)
    seen = []
    doc = prefill_document(model, ATTN, ids, chunk_size=16, token_budget=32,
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


@pytest.mark.parametrize("family", ["dream", "llada"])
def test_placed_keys_equal_keys_encoded_at_shifted_positions(engines, family):
    model = engines[family].model
    doc = prefill_document(model, ATTN, _doc_ids(40, 300, seed=1), chunk_size=16)
    starts = torch.tensor([1000, 37, 5000])
    placed = place_chunks(doc.keys, starts, model.cfg.rope_theta)
    lengths = doc.lengths.tolist()
    seq = torch.cat([doc.tokens[j, :n] for j, n in enumerate(lengths)])
    pos = torch.cat([starts[j] + torch.arange(n) for j, n in enumerate(lengths)])
    seg = torch.cat([torch.full((n,), j) for j, n in enumerate(lengths)])
    with torch.no_grad():
        out = model(seq[None], pos[None], segment_mask(seg[None], seg[None]), ATTN)
    offset = 0
    for j, n in enumerate(lengths):
        for layer, (k, _) in enumerate(out.kv):
            # fp32 RoPE angles at position ~5000 are themselves only good to ~2e-4 rad.
            torch.testing.assert_close(placed[layer, j, :, :n], k[0, :, offset:offset + n], atol=1e-3, rtol=1e-3)
        offset += n


# ---- positions and token selection ---------------------------------------------------------------

def test_position_modes_and_short_chunk_gap():
    ordinals = torch.tensor([2, 5, 9])
    starts, q = chunk_deltas("continuous", 7, 16, ordinals, 10)
    assert starts.tolist() == [7, 23, 39] and q == 55  # a short chunk leaves a gap before the next
    starts, q = chunk_deltas("reuse", 7, 16, ordinals, 10)
    assert starts.tolist() == [7, 7, 7] and q == 23
    starts, q = chunk_deltas("absolute", 7, 16, ordinals, 10)
    assert starts.tolist() == [39, 87, 151] and q == 167
    with pytest.raises(ValueError):
        chunk_deltas("sideways", 7, 16, ordinals, 10)


def test_kept_tokens_keep_bos_and_respect_budget():
    from engine.method.scoring import select_kept_tokens

    g = torch.Generator().manual_seed(0)
    relevance = torch.rand(3, 2, 4, 20, generator=g)
    relevance[..., 0] = -5.0  # BOS has the lowest relevance and is still kept
    lengths = torch.tensor([20, 20, 5])
    kept, valid = select_kept_tokens(relevance, lengths, budget=8, pool_kernel=1)
    assert kept.shape == (3, 2, 4, 8) and valid.shape == (3, 8)
    assert (kept[..., 0] == 0).all()
    assert (kept[:2].diff(dim=-1) > 0).all(), "ascending, distinct offsets"
    assert valid[2].tolist() == [True] * 5 + [False] * 3  # short chunk: all 5 tokens, 3 padding slots
    assert sorted(kept[2, 0, 0, :5].tolist()) == [0, 1, 2, 3, 4]
    top = torch.topk(relevance[0, 1, 2, 1:], 7).indices + 1
    assert sorted(kept[0, 1, 2, 1:].tolist()) == sorted(top.tolist())
    everything, all_valid = select_kept_tokens(relevance, lengths, budget=0)
    assert everything.shape[-1] == 20 and all_valid[0].all()


def test_maxpool_smoothing_keeps_neighbours():
    from engine.method.scoring import select_kept_tokens

    relevance = torch.zeros(1, 1, 1, 30)
    relevance[..., 15] = 1.0  # one hot spot: smoothing spreads it to its neighbours
    kept, _ = select_kept_tokens(relevance, torch.tensor([30]), budget=8, pool_kernel=7)
    assert kept[0, 0, 0].tolist() == [0, 12, 13, 14, 15, 16, 17, 18]


def test_gather_kept_tokens_per_head():
    kv = torch.randn(2, 3, 4, 10, 5)
    kept = torch.randint(0, 10, (3, 2, 4, 6))
    out = gather_kept_tokens(kv, kept)
    assert out.shape == (2, 3, 4, 6, 5)
    assert torch.equal(out[1, 2, 3, 4], kv[1, 2, 3, kept[2, 1, 3, 4]])


# ---- decoding over static KV equals a full recompute under the same mask -------------------------

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
    doc = engine.prefill(_doc_ids(40, 300, seed=2), chunk_size=16)  # 3 chunks, the last one short
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
    content = _doc_ids(30, 300, seed=3)
    doc = engine.prefill(content, chunk_size=31)  # [BOS] + 30 tokens: one full chunk
    assert doc.num_chunks == 1
    gen = block = 8
    question = "Who wrote it?"
    prompt = build_question_prompt(engine.tokenizer, question, engine.config.bos_token_id)
    starts, q_start = chunk_deltas("continuous", len(prompt.prefix_ids), 31, torch.tensor([0]), 1)
    chunks = SelectedChunks(keys=doc.keys, values=doc.values, valid=torch.ones(1, 31, dtype=torch.bool),
                            starts=starts, tokens=doc.tokens, lengths=doc.lengths, kept=None)
    with torch.no_grad():
        ctx = build_joint_context(engine.model, ATTN, prompt, chunks, q_start, gen, block)
        dense_prompt = torch.cat((torch.tensor(prompt.prefix_ids), doc.tokens[0], torch.tensor(prompt.query_ids)))
        dense = DenseRunner(engine.model, ATTN, dense_prompt)
        masks = torch.full((gen,), engine.config.mask_token_id)
        dense_logits = dense.slot_logits(0, masks, torch.arange(gen))
    torch.testing.assert_close(ctx.first_step_logits, dense_logits, atol=1e-5, rtol=1e-5)
    sampling = SamplingParams(decoder="threshold", threshold=1e-6, gen_length=gen, block_length=block,
                              stop_at_eos=False)
    joint = engine.answer(doc, question, AnswerParams(top_k=1, kv_mode="joint", sampling=sampling))
    dense_ans = engine.answer(doc, question, AnswerParams(kv_mode="dense", sampling=sampling))
    assert joint.answer_ids == dense_ans.answer_ids
    assert joint.trace.steps == dense_ans.trace.steps == 1


# ---- the draft (pseudo-labels) ---------------------------------------------------------------------

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
    prompt = _doc_ids(13, 60, seed=3).tolist()
    rows = draft_rows(len(prompt)) if extra_rows is None else len(prompt) + extra_rows
    for slots, rounds in ((4, 1), (3, 2), (1, 0)):
        draft = draft_pseudo_labels(model, ATTN, prompt, slots, rounds, rows=rows)
        tokens, committed = _draft_oracle(model, prompt, slots, rounds)
        assert draft.committed.tolist() == committed and sum(committed) == rounds + 1
        assert draft.tokens.tolist() == tokens


# ---- scoring picks the chunk that explains the question -----------------------------------------

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


def _planted_doc(model, planted_chunk: int, question: list[int], n_chunks=6, c=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    content = torch.randint(20, 60, (n_chunks * (c - 1),), generator=g)
    span = planted_chunk * (c - 1)
    content[span + 2:span + 2 + 2 * len(question)] = torch.tensor(question * 2)
    return prefill_document(model, ATTN, content, chunk_size=c)


@pytest.mark.parametrize("family,folds", [("dream", None), ("llada", None), ("llada", 3)])
def test_scoring_picks_the_planted_chunk(family, folds):
    model = overlap_model(family)
    question = [10, 11, 12, 13, 14, 15, 16]
    doc = _planted_doc(model, planted_chunk=4, question=question)
    rows = scoring_rows([7] + question, (1, 1 + len(question)), None, 4, model.cfg.logits_shifted)
    params = ScoringParams(scorer="self_information", llada_folds=folds, max_rows=20)  # several batches
    scores = score_document(model, ATTN, doc, rows, params).scores
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
    doc = prefill_document(model, ATTN, _doc_ids(5 * 16 - 7, 60, seed=5), chunk_size=16)
    query = _doc_ids(11, 60, seed=6).tolist()
    rows = scoring_rows(query, (1, 9), None, 4, cfg.logits_shifted)
    params = ScoringParams(scorer="self_information", llada_folds=folds, max_rows=max_rows)
    got = score_document(model, ATTN, doc, rows, params)
    plan = None if cfg.logits_shifted else masking_folds(rows.targets, folds)
    want_scores, want_anchors = _score_oracle(model, doc, rows, plan)
    torch.testing.assert_close(got.scores, want_scores, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.anchors, want_anchors, atol=1e-5, rtol=1e-5)


def test_scoring_layout_pads_and_separates_folds():
    rows = scoring_rows([5, 6, 7, 8, 9], (0, 5), None, 2, shifted=False)
    folds = masking_folds(rows.targets, 2)  # targets 0, 2, 4 hidden in fold 0; 1, 3 in fold 1
    layout = scoring_layout(rows, folds, shifted=False, mask_token_id=3, round_to=4)
    assert layout.shape == (16, 8, 2)  # 2 folds of 8 rows (5 padded to 8); 3 reads padded to 4 per fold
    assert layout.ids.tolist() == [3, 6, 3, 8, 3, 3, 3, 3, 5, 3, 7, 3, 9, 3, 3, 3]
    assert not layout.row_mask[0, 8:].any() and not layout.row_mask[:, 5:8].any()  # no other fold, no padding
    assert layout.read.tolist()[:3] == [0, 2, 4] and layout.read.tolist()[4:6] == [9, 11]
    assert layout.read_tokens.tolist()[:3] == [5, 7, 9] and layout.read_valid.sum() == 5
    causal = scoring_layout(scoring_rows([5, 6, 7], (0, 3), None, 2, shifted=True), None, True, 3, 4)
    assert causal.row_mask[:3, :3].tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert causal.read.tolist()[:2] == [0, 1] and causal.read_tokens.tolist()[:2] == [6, 7]


def test_leave_one_out_and_folds_agree_on_ranking():
    """The cheaper strided estimator ranks chunks like leave-one-out on the planted case."""
    model = overlap_model("llada")
    question = [10, 11, 12, 13, 14, 15, 16, 17]
    doc = _planted_doc(model, planted_chunk=2, question=question, n_chunks=8)
    rows = scoring_rows(question, (0, len(question)), None, 4, False)
    loo = score_document(model, ATTN, doc, rows, ScoringParams(scorer="self_information")).scores
    strided = score_document(model, ATTN, doc, rows, ScoringParams(scorer="self_information", llada_folds=2)).scores
    assert int(loo.argmax()) == int(strided.argmax()) == 2
    # Both separate the planted chunk from the best distractor (distractors are random tokens,
    # so their order among themselves is noise for either estimator).
    for s in (loo, strided):
        others = torch.cat((s[:2], s[3:]))
        assert s[2] - others.max() > 0.05


def test_token_scores_are_what_the_chunk_score_averages():
    model = overlap_model("llada")
    question = [10, 11, 12, 13, 14, 15, 16, 17]
    doc = _planted_doc(model, planted_chunk=2, question=question, n_chunks=5)
    rows = scoring_rows(question, (0, len(question)), None, 4, False)
    got = score_document(model, ATTN, doc, rows, ScoringParams(scorer="self_information", llada_folds=3))
    assert got.token_scores.shape == (5, len(question))  # each target read once, whatever the folds
    torch.testing.assert_close(got.token_scores.mean(1), got.scores)


def test_select_by_coverage_keeps_complementary_chunks_not_decoys():
    from engine.method.scoring import select_by_coverage

    # Question tokens: two of shared wording, then two keys. Chunk 3 explains the wording and the
    # first key (the best); chunk 0 is a decoy (the wording only) that scores above chunk 5,
    # which explains the second key; chunk 1 is haystack.
    token_scores = torch.tensor([[0.0, 0.0, -0.5, -5.0],  # 0: decoy, mean -1.375
                                 [-4.0, -4.0, -5.0, -5.0],  # 1: haystack
                                 [-3.0, -3.0, -5.0, -5.0],  # 2: haystack
                                 [-0.1, -0.1, -0.1, -5.0],  # 3: best, mean -1.325
                                 [-4.0, -4.0, -5.0, -5.0],  # 4: haystack
                                 [-0.6, -0.6, -5.0, -0.1]])  # 5: the second key, mean -1.575
    scores = token_scores.mean(1)
    assert select_by_coverage(scores, token_scores, 4, 0.1).tolist() == [3, 5]  # document order
    assert select_by_coverage(scores, token_scores, 4, 0.01).tolist() == [0, 3, 5]  # the decoy adds 0.05
    assert select_by_coverage(scores, token_scores, 1, 0.1).tolist() == [3]  # K caps it
    assert select_by_coverage(scores, token_scores, 4, 0.1, pool=2).tolist() == [3]  # 5 is third by score
    assert select_by_coverage(scores, token_scores, 4, 100.0).tolist() == [3]  # the best is always kept
    # A margin keeps near-best chunks that add nothing (a second value for the same key) as well.
    assert select_by_coverage(scores, token_scores, 4, 0.1, margin=0.1).tolist() == [0, 3, 5]
    assert select_by_coverage(scores, token_scores, 4, 100.0, margin=0.3).tolist() == [0, 3, 5]
    assert select_by_coverage(torch.zeros(0), torch.zeros(0, 4), 4, 0.1).numel() == 0


def test_coverage_gain_in_answer_params(engines):
    with pytest.raises(ValueError, match="coverage_gain"):
        AnswerParams(coverage_gain=0.0)
    with pytest.raises(ValueError, match="likelihood scorer"):
        AnswerParams(coverage_gain=0.1, scoring=ScoringParams(scorer="attention"))
    engine = engines["llada"]
    doc = engine.prefill(_doc_ids(60, 200, seed=8), chunk_size=16)
    sampling = SamplingParams(gen_length=8, block_length=8, stop_at_eos=False)
    res = engine.answer(doc, "What?", AnswerParams(top_k=3, coverage_gain=1e6, sampling=sampling,
                                                   scoring=ScoringParams(scorer="self_information")))
    best = max(range(len(res.trace.scores)), key=res.trace.scores.__getitem__)
    assert [r.chunk for r in res.trace.selected] == [res.trace.candidates[best].chunk]


def test_pooled_documents_and_k_larger_than_n(engines):
    engine = engines["llada"]
    small = engine.prefill(_doc_ids(20, 300, seed=4), chunk_size=16)
    other = engine.prefill(_doc_ids(50, 300, seed=5), chunk_size=16)
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
    from engine.method.answer import _score_all
    from engine.method.scoring import select_top_chunks

    model = overlap_model("dream")
    question = [10, 11, 12, 13, 14, 15, 16]
    unrelated = torch.randint(20, 60, (60,), generator=torch.Generator().manual_seed(1))
    docs = [prefill_document(model, ATTN, unrelated, chunk_size=16),
            _planted_doc(model, planted_chunk=1, question=question, seed=2)]
    rows = scoring_rows([7] + question, (1, 1 + len(question)), None, 4, True)
    scores, _, _ = _score_all(model, ATTN, docs, rows, ScoringParams(scorer="self_information"))
    best = select_top_chunks(scores, 1)
    assert int(best) == docs[0].num_chunks + 1


def test_auto_top_k_cuts_at_the_largest_drop():
    from engine.method.scoring import auto_top_k

    assert auto_top_k(torch.tensor([-1.0, -0.1, -1.1, -0.2, -1.2])) == 2  # -0.2 -> -1.0 is the drop
    assert auto_top_k(torch.tensor([-0.1, -5.0, -5.1]), k_min=2) == 2
    assert auto_top_k(torch.tensor([-0.1, float("-inf"), -3.0]), k_max=8) == 1  # failed chunks never count
    assert auto_top_k(torch.tensor([-0.1])) == 1


def test_select_within_margin_drops_far_chunks_keeps_the_best_and_document_order():
    from engine.method.scoring import select_within_margin

    scores = torch.tensor([-1.5, -0.02, -1.1, -1.6, -0.4, -1.2])
    assert select_within_margin(scores, 4, 0.5).tolist() == [1, 4]  # -1.1 and -1.2 are > 0.5 below
    assert select_within_margin(scores, 4, 2.0).tolist() == [1, 2, 4, 5]  # K still caps it
    assert select_within_margin(scores, 1, 2.0).tolist() == [1]
    assert select_within_margin(scores, 4, 1e-9).tolist() == [1]  # the best is always kept
    assert select_within_margin(torch.zeros(0), 4, 0.5).numel() == 0


def test_score_margin_in_answer_params(engines):
    with pytest.raises(ValueError, match="score_margin"):
        AnswerParams(score_margin=0.0)
    engine = engines["llada"]
    doc = engine.prefill(_doc_ids(60, 200, seed=8), chunk_size=16)
    sampling = SamplingParams(gen_length=8, block_length=8, stop_at_eos=False)
    res = engine.answer(doc, "What?", AnswerParams(top_k=3, score_margin=1e-6, sampling=sampling))
    best = max(range(len(res.trace.scores)), key=res.trace.scores.__getitem__)
    assert [r.chunk for r in res.trace.selected] == [res.trace.candidates[best].chunk]


def test_token_budget_is_respected_and_reported(engines):
    engine = engines["dream"]
    doc = engine.prefill(_doc_ids(60, 300, seed=6), chunk_size=16)
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
    doc = engine.prefill(_doc_ids(40, 300, seed=7), chunk_size=8)
    long_question = " ".join(["which river flows to the sea"] * 10)  # far longer than C = 8
    res = engine.answer(doc, long_question, AnswerParams(top_k=2, sampling=sampling))
    assert all(torch.isfinite(torch.tensor(res.trace.scores)))
    with pytest.raises(ValueError, match="question is empty"):
        engine.answer(doc, "   ", AnswerParams(sampling=sampling))


def test_reselection_after_each_block(engines):
    engine = engines["dream"]
    doc = engine.prefill(_doc_ids(80, 300, seed=8), chunk_size=16)
    sampling = SamplingParams(gen_length=24, block_length=8, stop_at_eos=False)
    res = engine.answer(doc, "Where?", AnswerParams(top_k=2, reselect_every=1, sampling=sampling))
    assert len(res.trace.reselections) == 2  # after blocks 0 and 1, not after the last
    assert all(len(sel) == 2 for sel in res.trace.reselections)
    assert len(res.answer_ids) <= 24


@pytest.mark.parametrize("mode", ["static", "joint", "dense", "fastdllm"])
def test_all_kv_modes_run_with_every_decoder_family(engines, mode):
    engine = engines["dream"]
    doc = engine.prefill(_doc_ids(50, 300, seed=9), chunk_size=16)
    for decoder, steps in (("threshold", None), ("low_confidence", 8), ("entropy", 8), ("origin", 8)):
        sampling = SamplingParams(decoder=decoder, gen_length=16, block_length=8, steps=steps, stop_at_eos=False)
        res = engine.answer(doc, "What?", AnswerParams(top_k=2, kv_mode=mode, sampling=sampling))
        assert res.trace.steps >= 2 and res.trace.forward_passes >= 1
        assert set(res.trace.timings) >= {"draft", "scoring", "selection", "kv_build", "decode"}


def test_fastdllm_first_block_step_matches_dense(engines):
    """Fast-dLLM's block-start forward is a full forward, so its first step equals dense's."""
    from engine.decode.loop import FastDLLMRunner

    engine = engines["dream"]
    prompt = torch.randint(5, 300, (40,), generator=torch.Generator().manual_seed(10))
    answer = torch.full((16,), engine.config.mask_token_id)
    with torch.no_grad():
        fast = FastDLLMRunner(engine.model, ATTN, prompt, 8)
        fast.block_start(0, answer)
        a = fast.slot_logits(0, answer, torch.arange(8))
        b = DenseRunner(engine.model, ATTN, prompt).slot_logits(0, answer, torch.arange(8))
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_the_engine_keeps_one_draft_pass_per_padded_prompt_length(engines):
    from engine.decode.paged import MAX_QUERY_PASSES, PagedDecodeCache

    model, cache = engines["dream"].model, PagedDecodeCache()
    first = cache.draft_pass(model, ATTN, 17, 4, 1, False, None)
    assert cache.draft_pass(model, ATTN, 32, 4, 1, False, None) is first  # 17 and 32 pad to 32 rows
    assert cache.draft_pass(model, ATTN, 33, 4, 1, False, None) is not first
    for n in range(1, MAX_QUERY_PASSES + 2):
        cache.draft_pass(model, ATTN, 16 * n, 4, 1, False, None)
    assert len(cache.drafts) == MAX_QUERY_PASSES  # the least recently used are dropped


def test_kept_scoring_passes_follow_the_document_kv(engines):
    """A scoring pass is reused for the same document KV, chunk range and layout; it holds the KV
    weakly, so a dropped document is neither kept alive nor scored with a stale pass; a document
    needing more passes than are kept gets fresh ones."""
    import gc
    import weakref

    from engine.decode.paged import MAX_SCORING_PASSES, PagedDecodeCache

    model, cache, shape = engines["llada"].model, PagedDecodeCache(), (32, 8, 4)
    doc = prefill_document(model, ATTN, _doc_ids(70, 60), chunk_size=16)
    first = cache.scoring_passes(model, ATTN, doc, [(0, 3), (3, 5)], shape, None)
    again = cache.scoring_passes(model, ATTN, doc, [(0, 3), (3, 5)], shape, None)
    assert again[0] is first[0] and again[1] is first[1] and len(cache.scoring) == 2
    keys = weakref.ref(doc.keys)
    del doc, first, again
    gc.collect()
    assert keys() is None  # the kept passes did not keep the KV alive
    other = prefill_document(model, ATTN, _doc_ids(70, 60, seed=1), chunk_size=16)
    cache.scoring_passes(model, ATTN, other, [(0, 3)], shape, None)
    assert [p.keys_ref() is other.keys for p in cache.scoring.values()] == [True]  # stale passes dropped
    too_many = [(i % 5, i % 5 + 1) for i in range(MAX_SCORING_PASSES + 1)]
    fresh = cache.scoring_passes(model, ATTN, other, too_many, shape, None)
    assert len(fresh) == len(too_many) and len(cache.scoring) == 1  # not kept: they would evict each other
