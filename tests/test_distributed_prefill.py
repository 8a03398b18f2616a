"""Distributed prefill (app.distributed_prefill, tools.distributed_prefill): two real gloo ranks
launched by torchrun on 127.0.0.1 write the KV files one process writes, byte for byte, and a rank
that fails or dies leaves nothing committed."""

from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from app.distributed_prefill import plan_shares, tokenize_in_pieces
from storage import DocumentStore
from storage.kv_files import TMP_MARK

REPO = Path(__file__).resolve().parents[1]
CHUNK_SIZE = 32


def test_shares_are_whole_shards_covering_the_document_in_order():
    for n, per_shard, per_batch, world in [(576, 12, 128, 2), (576, 7, 128, 2), (100, 8, 4, 3), (5, 4, 2, 4),
                                           (1, 1, 1, 8), (1000, 9, 32, 8)]:
        shares = plan_shares(n, per_shard, per_batch, world)
        assert [s.rank for s in shares] == list(range(world))
        assert shares[0].start == 0 and shares[-1].end == n
        for a, b in zip(shares, shares[1:], strict=False):
            assert a.end == b.start
        for s in shares:
            assert s.start % per_shard == 0 and s.first_shard == s.start // per_shard
            assert s.start <= s.end
    # Enough pieces on both grids: every share starts where a one-process batch starts.
    assert all(s.start % 128 == 0 for s in plan_shares(576, 12, 128, 2))
    assert all(s.start % 4 == 0 for s in plan_shares(100, 8, 4, 3))
    # Too few: single shards, as even as they come.
    assert [(s.start, s.end) for s in plan_shares(576, 7, 128, 2)] == [(0, 287), (287, 576)]
    assert [(s.start, s.end) for s in plan_shares(5, 4, 2, 4)] == [(0, 0), (0, 4), (4, 4), (4, 5)]


def test_text_tokenized_in_pieces_gives_the_tokens_of_the_whole(dream_dir, llada_dir):
    from engine.model.tokenizer import load_tokenizer
    from engine.model.weights import read_model_config

    rng = random.Random(1)
    words = "the harbour's pier, gull; tide: 3.14 keeper Étude naïve café — ½ 42 rope".split()
    text = "".join(rng.choice(words) + rng.choice([" ", " ", " ", "  ", ". ", "\n\n", "\t"]) for _ in range(6000))
    for folder in (dream_dir, llada_dir):
        tokenizer = load_tokenizer(folder, read_model_config(folder))
        whole = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        spans = [tuple(o) for o in whole["offset_mapping"]]
        assert tokenize_in_pieces(tokenizer, text, 8) == (whole["input_ids"], spans)
        assert tokenize_in_pieces(tokenizer, text[:3000], 8) is None  # too short to cut: tokenized whole

        def marks_each_start(texts, tokenizer=tokenizer, **kw):  # treats the start of what it reads specially
            enc = tokenizer(texts, **kw)
            return {"input_ids": [[0, *ids] for ids in enc["input_ids"]],
                    "offset_mapping": [[(0, 0), *offs] for offs in enc["offset_mapping"]]}

        assert tokenize_in_pieces(marks_each_start, text, 8) is None  # a seam's check fails: tokenized whole


@pytest.fixture(scope="module")
def document(tmp_path_factory) -> Path:
    rng = random.Random(0)
    words = "harbour ship pier gull tide lantern keeper rope anchor sail dock crane wave salt fog bell".split()
    sentences = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 14))).capitalize() + "."
                 for _ in range(160)]
    sentences.insert(80, "The lighthouse keeper is named Odile Varga.")
    path = tmp_path_factory.mktemp("docs") / "harbour.txt"
    path.write_text(" ".join(sentences))
    return path


def _config(data_dir: Path, model_dir: Path, shard_mb: float):
    from app.service import ServiceConfig

    return ServiceConfig(data_dir=data_dir, model_dir=model_dir, device="cpu", max_shard_bytes=int(shard_mb * 2**20))


def _ingest_one_process(data_dir: Path, model_dir: Path, path: Path, shard_mb: float) -> None:
    from app.service import DocQA

    service = DocQA(_config(data_dir, model_dir, shard_mb))
    try:
        service.ingest_file(path, chunk_size=CHUNK_SIZE)
    finally:
        service.close()


def _two_ranks(launch: list[str], data_dir: Path, model_dir: Path, path: Path, shard_mb: float
               ) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    cmd = [sys.executable, *launch, "--data-dir", str(data_dir), "--model", str(model_dir),
           "--chunk-size", str(CHUNK_SIZE), "--max-shard-mb", str(shard_mb), "--device", "cpu", "--timeout", "60",
           str(path)]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "tools.distributed_prefill"]


def _stored(data_dir: Path) -> dict:
    """What the library holds of its documents' KV: rows and every KV file's bytes, by shard."""
    conn = sqlite3.connect(data_dir / "docqa.sqlite")
    try:
        files = conn.execute("SELECT shard, path, bytes, sha256, chunk_start, chunk_end FROM kv_files "
                             "ORDER BY shard").fetchall()
        return {
            "documents": conn.execute("SELECT id, status FROM documents").fetchall(),
            "caches": conn.execute("SELECT document_id, model_fingerprint, chunk_size, dtype, chunking, num_chunks, "
                                   "num_tokens, status, bytes FROM kv_caches").fetchall(),
            "files": [(shard, size, sha, start, end) for shard, _, size, sha, start, end in files],
            "file_bytes": [(data_dir / p).read_bytes() for _, p, *_ in files],
            "chunks": conn.execute("SELECT ordinal, token_start, token_end, char_start, char_end, page_start, "
                                   "page_end, text FROM chunks ORDER BY ordinal").fetchall(),
        }
    finally:
        conn.close()


# The document is 233 chunks of 4272 bytes in its files (fp8), prefilled on the CPU in batches of
# 128 chunks. Shards of 32 chunks: the ranks' shares are [0, 128) and [128, 233), one process's
# batches exactly. Shards of 7 (0.03 MiB): shares cut at chunk 119, mid-batch, so prefilled in
# other batches than one process's, which must not change a bit on the CPU.
@pytest.mark.slow
@pytest.mark.parametrize("shard_mb", [32 * 4272 / 2**20, 0.03])
def test_two_gloo_ranks_write_the_files_one_process_writes(tmp_path, dream_dir, document, shard_mb):
    _ingest_one_process(tmp_path / "one", dream_dir, document, shard_mb)
    run = _two_ranks(TORCHRUN, tmp_path / "two", dream_dir, document, shard_mb)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "over 2 rank(s)" in run.stdout
    one, two = _stored(tmp_path / "one"), _stored(tmp_path / "two")
    assert len(one["files"]) > 4  # several shards, so each rank wrote some
    assert one == two
    assert two["documents"][0][1] == "ready"
    # Loads back, checksums verified (the store checks each file once per process).
    store = DocumentStore(tmp_path / "two")
    (record,) = [c for c in store.caches_of(two["documents"][0][0]) if c.status == "ready"]
    from app.kv_service import CHUNK_AXIS, OPTIONAL_TENSORS

    tensors = store.load_kv(record, CHUNK_AXIS, optional=OPTIONAL_TENSORS)
    assert tensors["keys"].shape[1] == record.num_chunks


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["raise", "exit"])
def test_a_rank_failing_midway_leaves_nothing_committed(tmp_path, dream_dir, document, mode):
    data = tmp_path / "data"
    # Launched by the tool itself (torch's elastic launcher), which answers a failed rank in one line.
    run = _two_ranks([str(REPO / "tests" / "distributed_fault.py"), mode, "--nproc-per-node", "2"], data,
                     dream_dir, document, 0.03)
    assert run.returncode != 0
    assert "the distributed prefill stopped (rank" in run.stderr
    assert "Traceback" not in run.stderr
    if mode == "raise":  # reported by rank 1, answered by rank 0 in one sentence
        assert "rank 1: cannot write the KV cache" in run.stderr
        assert "nothing was committed" in run.stderr
    store = DocumentStore(data)  # opening runs recovery, as the next server or run would
    assert store.list_documents(("ready", "failed", "ingesting")) == []
    assert not list((data / "kv").rglob("*.safetensors"))
    assert not [p for p in data.rglob("*") if TMP_MARK in p.name]
    # The document goes in whole afterwards, as one process would have stored it.
    _ingest_one_process(data, dream_dir, document, 0.03)
    _ingest_one_process(tmp_path / "reference", dream_dir, document, 0.03)
    assert _stored(data) == _stored(tmp_path / "reference")


def test_one_process_through_docqa_tools_and_a_missing_file_is_one_line(tmp_path, dream_dir, document):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    run = subprocess.run([sys.executable, "-m", "tools.cli", "prefill-distributed", "--data-dir", str(tmp_path / "d"),
                          "--model", str(dream_dir), "--chunk-size", str(CHUNK_SIZE), "--device", "cpu",
                          str(document), str(tmp_path / "missing.txt")],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1
    assert "added: harbour.txt" in run.stdout and "over 1 rank(s)" in run.stdout
    assert run.stderr.strip() == f"docqa-tools: missing.txt: no such file: {tmp_path / 'missing.txt'}"
