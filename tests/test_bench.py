"""`docqa-tools bench` on a tiny random model (the real shapes need a GPU: see docs/PERFORMANCE.md)."""

from __future__ import annotations

import json

import pytest

from tools import bench


def test_bench_runs_every_mode_with_the_same_rule(tmp_path):
    rows = bench.run("tiny", [128, 256], [32], ["static", "joint", "fastdllm", "dense"], "cpu", chunk_size=32,
                     top_k=2, dense_budget_s=0.0, progress=lambda line: None)
    assert {(r.mode, r.context) for r in rows} == {(m, c) for m in ("static", "joint", "fastdllm", "dense")
                                                   for c in (128, 256)}
    for r in rows:
        assert r.steps == 32  # one token per step in every mode
        assert r.extrapolated == (r.mode == "dense")  # a zero budget forces dense extrapolation
        assert r.cached_question_s > 0 and r.first_question_s > r.prefill_s
        if r.mode in ("static", "joint"):  # first: prefill + one question; cached: another question
            assert r.prefill_s > 0 and {"draft", "scoring", "kv_build", "decode"} <= set(r.phases)
        else:  # the baselines' KV depends on the question: their first question is their cached one
            assert r.first_question_s == r.cached_question_s
    bench.write(rows, tmp_path, {"shape": "tiny"})
    data = json.loads((tmp_path / "bench.json").read_text())
    assert len(data["rows"]) == 8
    md = (tmp_path / "bench.md").read_text()
    assert "| tiny | 256 | 32 | dense |" in md and "(extrapolated)" in md
    # The phases table: every phase of the static rows, the first question's where it differs.
    phases = md.split("\n\n")[1].splitlines()
    assert phases[0].startswith("| shape | context | answer | mode | draft ms | scoring ms |")
    static = next(line for line in phases if line.startswith("| tiny | 256 | 32 | static |"))
    assert all(cell.strip() != "-" for cell in static.split("|")[5:10])
    assert all(r.first_phases for r in rows)
    assert (tmp_path / "bench.png").stat().st_size > 1000


def test_bench_with_the_prefilter_scores_m_chunks_and_times_the_search(tmp_path):
    rows = bench.run("tiny", [640], [32], ["static"], "cpu", chunk_size=32, top_k=2, dense_budget_s=0.0,
                     progress=lambda line: None, prefilters=(0, 4))
    assert [r.mode for r in rows] == ["static", "static+bm25@4"]
    plain, cut = rows
    assert cut.prefilter == 4 and "bm25" in cut.phases and "bm25" not in plain.phases
    assert cut.phases["bm25"] > 0 and cut.steps == plain.steps == 32
    md = bench.table(rows)
    assert "| static+bm25@4" in md and "bm25 ms" in md


def test_bench_concurrency_batches_the_users_questions(tmp_path):
    from tools import load_bench

    phases = load_bench.run("tiny", 3, 256, 16, "cpu", chunk_size=32, top_k=2, rounds=2, poisson_questions=6,
                            progress=lambda line: None)
    by_name = {p.name: p for p in phases}
    assert list(by_name) == ["single", "burst", "closed", "poisson@80%"]
    assert by_name["burst"].questions == 3 and by_name["closed"].questions == 6
    assert by_name["poisson@80%"].questions == 6
    assert max(by_name["burst"].batch_sizes) == 3  # the three asked at once shared steps
    assert set(by_name["single"].batch_sizes) == {1}
    for p in phases:
        assert p.p95_s >= p.p50_s > 0 and p.throughput_qps > 0
    load_bench.write(phases, tmp_path, {"shape": "tiny"})
    assert len(json.loads((tmp_path / "concurrency.json").read_text())["phases"]) == 4
    assert load_bench.table(phases).splitlines()[2].startswith("| single | 3 |")


def test_bench_concurrency_with_fewer_steps_and_a_prefilter():
    from tools import load_bench

    full = load_bench.run("tiny", 2, 256, 16, "cpu", chunk_size=32, top_k=2, rounds=1, poisson_questions=2,
                          progress=lambda line: None)
    fewer = load_bench.run("tiny", 2, 256, 16, "cpu", chunk_size=32, top_k=2, rounds=1, poisson_questions=2,
                           progress=lambda line: None, prefilter=4, tokens_per_step=2)
    # Two questions alone: one step per committed token, or one per two.
    assert full[0].batch_sizes == {1: 2 * 16} and fewer[0].batch_sizes == {1: 2 * 8}
    with pytest.raises(ValueError, match="must divide"):
        load_bench.answer_sampling(16, 3)
    with pytest.raises(ValueError, match="must divide the answer"):
        load_bench.answer_sampling(32, 1, 12)
    assert load_bench.answer_sampling(32, 2, 8).num_blocks == 4
    blocks = load_bench.run("tiny", 2, 256, 16, "cpu", chunk_size=32, top_k=2, rounds=1, poisson_questions=2,
                            progress=lambda line: None, block_length=8)
    # Two blocks: a question alone steps 16 times, and its first block is refreshed as a row once.
    assert blocks[0].batch_sizes == {1: 2 * (16 + 1)}


def test_bench_concurrency_with_the_documents_held_on_the_host():
    """The documents' KV held in host memory, each question's loader copying its document (or its
    prefiltered candidates) to the device: the same step counts as with the documents resident."""
    from tools import load_bench

    for prefilter in (0, 4):
        phases = load_bench.run("tiny", 2, 256, 16, "cpu", chunk_size=32, top_k=2, rounds=1, poisson_questions=2,
                                progress=lambda line: None, prefilter=prefilter, documents_on="host")
        assert phases[0].batch_sizes == {1: 2 * 16} and max(phases[1].batch_sizes) == 2
    with pytest.raises(ValueError, match="documents_on"):
        load_bench.run("tiny", 2, 256, 16, "cpu", chunk_size=32, top_k=2, documents_on="disk")
