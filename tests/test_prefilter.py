"""Two-stage chunk selection: BM25 over the chunks' text (SQLite FTS5), then the predictive scorer
on the top M only; and reading just those chunks' KV from the files."""

from __future__ import annotations

import sqlite3

import pytest
import torch

from app.kv_service import CHUNK_AXIS, OPTIONAL_TENSORS, at_stored_precision, kv_to_tensors
from app.prefilter import bm25_priors, candidate_chunks
from app.service import DocQA, ServiceConfig
from engine import DocumentKV
from engine.method.kv_cache import take_chunks
from engine.method.scoring import fuse_scores
from storage.chunk_index import fts_query, index_texts, query_terms, search
from storage.kv_codec import FP8, KV_ENCODINGS
from storage.kv_files import read_kv_chunks, write_kv_shards


def test_candidates_are_every_chunk_for_a_small_pool_or_when_off():
    assert candidate_chunks([(0, 3)], [5, 2], m=8) == [[0, 1, 2, 3, 4], [0, 1]]
    assert candidate_chunks([(0, 3)], [50], m=0) == [list(range(50))]
    assert candidate_chunks([(0, 3)], [50], m=None) == [list(range(50))]


def test_candidates_take_the_best_hits_then_fill_evenly():
    hits = [(1, 7), (0, 2), (1, 7), (0, 99), (1, 0)]  # a repeat and an ordinal out of range are skipped
    got = candidate_chunks(hits, [10, 10], m=3)
    assert got == [[2], [0, 7]]
    filled = candidate_chunks([(0, 5)], [40, 40], m=9)
    assert sum(map(len, filled)) == 9 and 5 in filled[0]
    assert filled[1], "the fill spreads over every document"
    assert filled == candidate_chunks([(0, 5)], [40, 40], m=9)  # a pure function
    assert candidate_chunks([], [40], m=4) == [[0, 13, 20, 27]]  # the middle one, then a stride


def test_every_document_gets_a_candidate_even_when_the_hits_are_all_in_one():
    hits = [(0, i) for i in range(64)]
    got = candidate_chunks(hits, [100, 50], m=64)
    assert sum(map(len, got)) == 64 and got[1] == [25] and len(got[0]) == 63
    assert candidate_chunks([(0, 1)], [3, 0, 4], m=2) == [[1], [], [2]]
    assert [len(c) for c in candidate_chunks([], [10, 10, 10], m=2)] == [1, 1, 1]  # M raised to 3 documents


def test_questions_become_quoted_content_words():
    assert query_terms("What is the default port of the Munin node?") == ["default", "port", "munin", "node"]
    # FTS5 operators and quotes in a question are words, not syntax
    assert fts_query('Is "NEAR" AND OR NOT (x)*? 7') == '"near" OR "7"'
    assert fts_query("What is it?") is None
    conn = index_texts(["alpha beta", 'the "NEAR" operator and friends'])
    assert [h.ordinal for h in search(conn, 'Is "NEAR" AND OR NOT (x)*?', [0], 5)] == [1]


def test_bm25_ranks_the_chunk_holding_the_rare_words_first():
    texts = ["The harbour logs every ship that enters. " * 3,
             "The inspection code for the northern reservoir is 73914.",
             "The reservoir is drained in spring. The harbour is busy.",
             "Gulls circle the pier at dawn."]
    conn = index_texts(texts, cache_id=7)
    hits = search(conn, "What is the inspection code of the northern reservoir?", [7], 10)
    assert hits[0].ordinal == 1 and hits[0].bm25 < hits[1].bm25 and {h.ordinal for h in hits} == {1, 2}
    assert search(conn, "inspections", [7], 10)[0].ordinal == 1  # Porter stemming
    assert search(conn, "inspection", [8], 10) == []  # other caches are not searched


def _random_kv(n: int, seed: int = 0) -> DocumentKV:
    g = torch.Generator().manual_seed(seed)
    shape = (3, n, 2, 5, 4)  # [L, N, Hkv, C, D], odd sizes
    keys, values = (torch.randn(shape, generator=g).bfloat16() for _ in range(2))
    return DocumentKV(keys=keys, values=values,
                      lengths=torch.randint(1, 6, (n,), generator=g), tokens=torch.randint(0, 99, (n, 5), generator=g),
                      content_starts=torch.arange(n) * 4)


@pytest.mark.parametrize("encoding", KV_ENCODINGS)
def test_reading_some_chunks_from_the_files_equals_taking_them_from_the_whole(tmp_path, encoding):
    doc = _random_kv(23)
    tensors = kv_to_tensors(doc, encoding)
    per_chunk = sum(t.numel() * t.element_size() for t in tensors.values()) // 23
    shards = write_kv_shards(tmp_path, "kv/x", tensors, CHUNK_AXIS, 23, 4 * per_chunk, {})
    assert len(shards) == 6
    for ordinals in ([0], [3, 4, 5, 6], [1, 7, 8, 22], list(range(23))):
        got = read_kv_chunks(tmp_path, shards, CHUNK_AXIS, ordinals, "cpu", True, OPTIONAL_TENSORS)
        want = kv_to_tensors(take_chunks(at_stored_precision(doc, encoding), ordinals), encoding)
        assert set(got) == set(want)
        for name in want:
            bits = [t.view(torch.uint8) if t.dtype == FP8 else t for t in (got[name], want[name])]
            assert torch.equal(*bits), (name, ordinals)


def _long_text(n_paragraphs: int) -> str:
    topics = ["harbour", "orchard", "railway", "glacier", "bakery", "library", "foundry", "meadow"]
    paras = [f"Paragraph {i} is about the {topics[i % 8]} district. " + f"The {topics[i % 8]} was quiet that year. " * 6
             for i in range(n_paragraphs)]
    paras[37] += " The inspection code for the northern reservoir is 73914."
    return "\n\n".join(paras)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    return DocQA(ServiceConfig(data_dir=tmp_path_factory.mktemp("data"), device="cpu"))


def test_a_question_scores_only_the_prefiltered_chunks_and_cites_real_ordinals(service):
    info, _ = service.ingest(_long_text(60).encode(), "districts.txt")
    assert info.chunks > 20
    question = "What is the inspection code for the northern reservoir?"
    scorer_only = service.params(bm25_weight=0.0)  # the scores compared below are the scorer's own
    result = service.answer(question, [info.record.id], params=scorer_only, prefilter_chunks=6)
    assert len(result.scores) == 6  # the scorer saw M chunks, not the document's
    holding = [c for c in service.kv.chunks(info.record.id, service.defaults.chunk_size) if "73914" in c.text]
    assert holding and holding[0].ordinal in {s["chunk"] for s in result.scores}
    assert any(c.chunk == holding[0].ordinal and "73914" in c.text for c in result.citations)
    full = service.answer(question, [info.record.id], params=scorer_only, prefilter_chunks=0)
    assert len(full.scores) == info.chunks
    # The same chunk scores the same whether the scorer saw 6 chunks or all of them.
    by_chunk = {s["chunk"]: s["score"] for s in full.scores}
    for s in result.scores:
        assert s["score"] == pytest.approx(by_chunk[s["chunk"]], abs=1e-4)
    with pytest.raises(ValueError, match="prefilter_chunks"):
        service.answer(question, [info.record.id], prefilter_chunks=-1)


def test_the_index_follows_documents_in_and_out(service, tmp_path):
    info, _ = service.ingest(b"The zephyrine lantern festival is held in Velda every May.", "velda.txt")
    store = service.store
    record = store.find_kv(service.kv.key(info.record.id, service.defaults.chunk_size))
    assert [h.ordinal for h in store.search_chunks("zephyrine festival", [record.id], 5)] == [0]
    service.delete(info.record.id)
    assert store.search_chunks("zephyrine festival", [record.id], 5) == []
    conn = sqlite3.connect(store.root / "docqa.sqlite")
    assert conn.execute("SELECT count(*) FROM chunk_index WHERE chunk_index MATCH 'zephyrine'").fetchone() == (0,)
    conn.close()
    raw = b"".join(p.read_bytes() for p in store.root.glob("docqa.sqlite*"))
    assert b"zephyrine" not in raw.lower()  # the index keeps no copy of a deleted document's words


def test_a_collection_whose_words_match_one_document_keeps_the_others_cached(service):
    first, _ = service.ingest(_long_text(40).encode(), "first.txt")
    second, _ = service.ingest(("The weather was mild. " * 400).encode(), "second.txt")
    size = service.defaults.chunk_size
    before = service.store.find_kv(service.kv.key(second.record.id, size))
    result = service.answer("What is the inspection code for the northern reservoir?",
                            [first.record.id, second.record.id], prefilter_chunks=4)
    assert len(result.scores) == 4 and {s["document"] for s in result.scores} == {"first.txt", "second.txt"}
    after = service.store.find_kv(service.kv.key(second.record.id, size))
    assert after is not None and after.id == before.id  # not evicted, not prefilled again


# ---- score fusion -------------------------------------------------------------------------------

def test_bm25_priors_are_shares_of_the_best_match():
    hits = [(0, 4, -6.0), (1, 2, -3.0), (0, 9, -1.5)]
    chosen = [[1, 4, 9], [2, 5]]  # 1 and 5: the even fill, no question word
    assert bm25_priors(hits, chosen) == [[0.0, 1.0, 0.25], [0.5, 0.0]]
    assert bm25_priors([], [[0, 1]]) == [[0.0, 0.0]]


def test_fuse_scores_adds_the_weighted_prior_and_checks_shapes():
    scores = torch.tensor([-2.0, -1.0, -3.0])
    priors = torch.tensor([1.0, 0.0, 0.5])
    assert fuse_scores(scores, None, 2.0) is scores and fuse_scores(scores, priors, 0.0) is scores
    assert torch.equal(fuse_scores(scores, priors, 2.0), torch.tensor([0.0, -1.0, -2.0]))
    with pytest.raises(ValueError, match="2 priors for 3"):
        fuse_scores(scores, priors[:2], 1.0)


def test_a_heavy_bm25_weight_selects_the_best_match_whatever_the_scorer_says(service):
    """With the prior worth far more than any score gap, the top-1 chunk is BM25's best; with
    weight 0 the scorer's choice stands, and the trace shows the fused scores."""
    from dataclasses import replace

    info, _ = service.ingest(_long_text(50).encode() + b" The orchard ledger lists 412 pear trees.", "fused.txt")
    question = "How many pear trees does the orchard ledger list?"
    params = replace(service.params(), top_k=1, score_margin=None, coverage_gain=None)
    plain = service.answer(question, [info.record.id], params=params, prefilter_chunks=8)
    best = max(plain.scores, key=lambda s: s["score"])
    fused = service.answer(question, [info.record.id], params=replace(params, prior_weight=1000.0),
                           prefilter_chunks=8)
    holding = [c.ordinal for c in service.kv.chunks(info.record.id, service.defaults.chunk_size) if "412" in c.text]
    assert [c.chunk for c in fused.citations] == holding  # the only chunk with "pear" and "ledger"
    assert [c.chunk for c in plain.citations] == [best["chunk"]]
    # The scores shown (and warned on) stay the scorer's own; the prior is beside them.
    assert {(s["chunk"], s["score"]) for s in fused.scores} == {(s["chunk"], s["score"]) for s in plain.scores}
    assert next(s["bm25"] for s in fused.scores if s["chunk"] == holding[0]) == 1.0


def test_the_cpu_gets_the_models_cpu_prefilter_when_it_has_one():
    from app.defaults import ModelDefaults, prefilter_for

    both = ModelDefaults(prefilter_chunks=64, prefilter_chunks_cpu=32)
    assert prefilter_for(both, "cuda") == 64 and prefilter_for(both, "cpu") == 32
    assert prefilter_for(ModelDefaults(prefilter_chunks=48), "cpu") == 48
