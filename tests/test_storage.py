"""Storage: real SQLite files, real safetensors files, real second processes."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from app.kv_service import (
    CHUNK_AXIS,
    CHUNKING,
    OPTIONAL_TENSORS,
    DocumentKVService,
    at_stored_precision,
)
from engine import DocumentKV, Engine
from engine.model.weights import model_fingerprint
from storage import (
    ChunkRecord,
    DocumentStore,
    KVFileError,
    KVKey,
    PageSpan,
    ResultCache,
    StorageFullError,
    TieredKVPool,
)
from storage.db import connect, migrations
from storage.kv_codec import KV_ENCODINGS, decode_kv, encode_kv, round_trip, sixteen_bit

REPO = Path(__file__).resolve().parents[1]
TEXT = ("The harbour master logs every ship. " * 30 + "The lighthouse keeper is named Odile Varga. "
        + "Gulls circle the pier at dawn. " * 30)


def _pages(text: str, n: int = 3) -> list[PageSpan]:
    step = len(text) // n
    return [PageSpan(i, str(i + 1), i * step, len(text) if i == n - 1 else (i + 1) * step, True) for i in range(n)]


def _add(store: DocumentStore, text: str = TEXT, name: str = "harbour.txt") -> str:
    doc_id = hashlib.sha256(text.encode()).hexdigest()
    store.add_document(doc_id, name, "text/plain", len(text.encode()), text, _pages(text))
    return doc_id


@pytest.fixture(scope="module")
def engine(llada_dir):
    return Engine.from_pretrained(llada_dir, device="cpu")


def _service(engine, root, **store_kw):
    store = DocumentStore(root, **store_kw)
    return DocumentKVService(engine, store, TieredKVPool("cpu", hot_bytes=1 << 30)), store


# ---- schema, documents ----------------------------------------------------------------------------

def test_migrations_apply_to_an_empty_database(tmp_path):
    db = connect(tmp_path / "x.sqlite")
    assert {"documents", "pages", "kv_caches", "kv_files", "chunks", "conversations", "messages"} <= set(
        db.table_names())
    assert [m.name for m in migrations.applied(db)] == ["m001_initial", "m002_jobs", "m003_collections",
                                                        "m004_kv_chunking", "m005_deletions", "m006_chunk_index",
                                                        "m007_answer_details", "m008_job_counts", "m009_document_names",
                                                        "m010_conversation_origin"]
    assert db.journal_mode == "wal"
    assert next(db.query("PRAGMA foreign_keys"))["foreign_keys"] == 1
    again = connect(tmp_path / "x.sqlite")
    assert [m.name for m in migrations.pending(again)] == []


def test_answers_and_jobs_stored_before_migration_7_read_with_empty_details(tmp_path):
    """A library from before answers kept their scores and anchors, and jobs their counts, opens
    with its conversations and jobs whole: the new columns read as none."""
    import sqlite3

    from sqlite_utils import Database

    (tmp_path / "lib").mkdir()
    path = tmp_path / "lib" / "docqa.sqlite"
    old = Database(sqlite3.connect(str(path)))
    migrations.apply(old, stop_before="m007_answer_details")
    old.execute("INSERT INTO conversations VALUES ('c1', 'old', '2026-01-01', '2026-01-01')")
    old.execute("INSERT INTO messages (conversation_id, question, answer, documents, params, selected_chunks, "
                "timings, created_at) VALUES ('c1', 'q?', 'a', '[]', '{}', "
                "'[{\"document\": \"a.pdf\", \"chunk\": 0, \"pages\": \"1\", \"score\": -1.0}]', '{}', "
                "'2026-01-01')")
    old.execute("INSERT INTO jobs (name, stage, fraction, state, started_at, updated_at) VALUES "
                "('a.pdf', 'ready', 1.0, 'done', '2026-01-01', '2026-01-01')")
    old.conn.commit()
    old.conn.close()
    store = DocumentStore(tmp_path / "lib")
    (message,) = store.messages("c1")
    assert (message.warning, message.scores, message.anchors) == (None, [], [])
    assert message.selected_chunks[0]["document"] == "a.pdf"
    job = store.jobs()[0]
    assert (job["pages_done"], job["chunks_total"], job["stage_started_at"]) == (0, 0, None)


def test_caches_written_before_the_cut_was_recorded_read_as_the_fixed_cut(tmp_path):
    import sqlite3

    from sqlite_utils import Database

    (tmp_path / "lib").mkdir()
    path = tmp_path / "lib" / "docqa.sqlite"
    old = Database(sqlite3.connect(str(path)))
    migrations.apply(old, stop_before="m004_kv_chunking")
    old["documents"].insert({"id": "d", "name": "d.txt", "mime": "text/plain", "size_bytes": 1, "page_count": 1,
                             "text_chars": 1, "status": "ready", "created_at": "t", "updated_at": "t"})
    old["kv_caches"].insert({"document_id": "d", "model_fingerprint": "fp", "chunk_size": 16, "dtype": "float32",
                             "num_chunks": 1, "num_tokens": 1, "status": "ready", "folder": "kv/d/x", "bytes": 0,
                             "created_at": "t", "last_used_at": "t"})
    old.conn.close()
    db = connect(path)
    assert [row["chunking"] for row in db.query("SELECT chunking FROM kv_caches")] == ["fixed"]


def test_documents_are_deduplicated_by_content(tmp_path):
    store = DocumentStore(tmp_path)
    doc_id = _add(store)
    record, added = store.add_document(doc_id, "copy.txt", "text/plain", 1, TEXT, _pages(TEXT))
    assert not added and record.name == "harbour.txt"
    assert [d.id for d in store.list_documents()] == [doc_id]
    assert store.document_text(doc_id) == TEXT
    assert [p.label for p in store.pages(doc_id)] == ["1", "2", "3"]


# ---- KV files ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("encoding", KV_ENCODINGS)
def test_kv_round_trip_is_bitwise_and_sharded(engine, tmp_path, encoding):
    store = DocumentStore(tmp_path, max_shard_bytes=20_000)
    service = DocumentKVService(engine, store, TieredKVPool("cpu", hot_bytes=1 << 30), encoding)
    doc_id = _add(store)
    first = service.get(doc_id, chunk_size=32)
    record = store.find_kv(service.key(doc_id, 32))
    assert len(record.files) > 1, "small shard limit should split the cache"
    files = DocumentStore(tmp_path).load_kv(record, CHUNK_AXIS, optional=OPTIONAL_TENSORS)
    # An fp32 (CPU) engine's KV is kept in bf16 (half the disk) or e4m3 with scales (a quarter).
    stored = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}[encoding]
    assert files["keys"].dtype == files["values"].dtype == stored
    assert ("keys_scale" in files) == (encoding == "fp8")
    assert files["tokens"].dtype == torch.int32 and torch.equal(files["tokens"].long(), first.tokens)
    keys, values = decode_kv(files, torch.float32, "cpu")
    assert torch.equal(keys, first.keys.cpu()) and torch.equal(values, first.values.cpu())
    assert torch.equal(files["lengths"], first.lengths) and torch.equal(files["content_starts"], first.content_starts)
    restarted = DocumentKVService(engine, DocumentStore(tmp_path), TieredKVPool("cpu", 1 << 30), encoding)
    again = restarted.get(doc_id, chunk_size=32)
    assert restarted.pool.counters.loads == 1 and restarted.prefills == 0
    for name in ("keys", "values", "tokens", "lengths", "content_starts"):  # the first question saw what a
        assert torch.equal(getattr(again, name), getattr(first, name)), name  # restart loads
    chunks = store.chunks(record.id)
    assert len(chunks) == first.num_chunks == record.num_chunks
    assert "Odile Varga" in "".join(c.text for c in chunks)
    assert chunks[0].page_start == 0 and chunks[-1].page_end == 2
    assert all(TEXT[c.char_start:c.char_end] == c.text for c in chunks)


def test_second_question_hits_the_pool_not_the_disk(engine, tmp_path):
    service, store = _service(engine, tmp_path)
    doc_id = _add(store)
    service.get(doc_id, 32)
    service.get(doc_id, 32)
    c = service.pool.counters
    assert service.prefills == 1 and (c.loads, c.hits_hot) == (1, 1)  # prefilled into files, read once


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_damaged_kv_file_is_detected_and_recomputed(engine, tmp_path, damage):
    service, store = _service(engine, tmp_path)
    doc_id = _add(store)
    original = service.get(doc_id, 32)
    record = store.find_kv(service.key(doc_id, 32))
    path = tmp_path / record.files[0].path
    if damage == "flip":
        data = bytearray(path.read_bytes())
        data[-100] ^= 0xFF  # inside the tensor data: only the checksum can tell
        path.write_bytes(bytes(data))
    elif damage == "truncate":
        path.write_bytes(path.read_bytes()[:-64])
    else:
        path.unlink()
    fresh_store = DocumentStore(tmp_path)  # a new process: nothing verified yet, nothing pooled
    with pytest.raises(KVFileError):
        fresh_store.load_kv(record, CHUNK_AXIS)
    assert fresh_store.find_kv(service.key(doc_id, 32)) is None  # marked evicted, not answered from
    fresh = DocumentKVService(engine, fresh_store, TieredKVPool("cpu", 1 << 30))
    again = fresh.get(doc_id, 32)
    assert fresh.prefills == 1
    assert torch.equal(again.keys, original.keys)


def test_interrupted_writes_leave_nothing_visible(engine, tmp_path):
    service, store = _service(engine, tmp_path)
    doc_id = _add(store)
    service.get(doc_id, 32)
    kv_dir = tmp_path / "kv" / doc_id
    # What a kill leaves: a temporary folder (before the rename) and a renamed folder without its
    # database row (between rename and commit), and a half-written text file.
    (kv_dir / "abc-c64-float32.tmp-1234abcd").mkdir()
    (kv_dir / "abc-c64-float32.tmp-1234abcd" / "kv-0000-of-0001.safetensors").write_bytes(b"partial")
    (kv_dir / "deadbeef-c16-float32").mkdir()
    (tmp_path / "documents" / "x.txt.tmp-00000000").write_text("half")
    stats = DocumentStore(tmp_path).last_recovery
    assert stats["temporaries"] == 2 and stats["orphans"] == 1
    assert sorted(p.name for p in kv_dir.iterdir()) == [Path(store.find_kv(service.key(doc_id, 32)).folder).name]


WRITER = textwrap.dedent("""
    import hashlib, sys, torch
    from storage import DocumentStore, KVKey, ChunkRecord, PageSpan
    store = DocumentStore(sys.argv[1], max_shard_bytes=1 << 20)
    text = "x" * 100
    doc = hashlib.sha256(text.encode()).hexdigest()
    store.add_document(doc, "x.txt", "text/plain", 100, text, [PageSpan(0, "1", 0, 100, True)])
    axis = {"keys": 1}
    i = 0
    print("ready", flush=True)
    while True:
        key = KVKey(doc, f"fp{i % 3}", 16, "float32", "fixed")
        store.save_kv(key, {"keys": torch.full((2, 64, 4, 16, 64), float(i))}, axis,
                      [ChunkRecord(j, 0, 1, 0, 1, 0, 0, "x") for j in range(64)], 64)
        i += 1
""")


def test_process_killed_mid_write_leaves_a_consistent_store(tmp_path):
    """A writer SIGKILLed at arbitrary moments: every ready cache is whole, debris is removed."""
    for attempt in range(3):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE,
                                env=os.environ | {"PYTHONPATH": str(REPO)})
        assert proc.stdout.readline().strip() == b"ready"
        time.sleep(0.3 + 0.2 * attempt)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        store = DocumentStore(tmp_path)  # recovery runs here
        assert not list(tmp_path.rglob("*.tmp-*"))
        doc = store.list_documents()[0].id
        for record in store.caches_of(doc):
            if record.status == "ready":
                tensors = store.load_kv(record, {"keys": 1})  # full checksum verification
                assert tensors["keys"].shape == (2, 64, 4, 16, 64)
                assert len(torch.unique(tensors["keys"])) == 1  # one write, not a mix of two


def test_delete_leaves_no_rows_and_no_files(engine, tmp_path):
    service, store = _service(engine, tmp_path)
    doc_id = _add(store)
    service.get(doc_id, 32)
    service.get(doc_id, 16)
    service.forget(doc_id)
    assert store.delete_document(doc_id)
    for table in ("documents", "pages", "kv_caches", "kv_files", "chunks"):
        assert store.db[table].count == 0, table
    assert list((tmp_path / "documents").iterdir()) == []
    assert list((tmp_path / "kv").iterdir()) == []
    assert service.pool.usage()["hot_entries"] == 0


def test_budget_evicts_least_recently_used_kv(engine, tmp_path):
    service, store = _service(engine, tmp_path)
    a = _add(store)
    b = _add(store, TEXT.replace("Odile", "Ines"), "b.txt")
    service.get(a, 32)
    size = store.kv_bytes()
    store.kv_budget_bytes = int(size * 1.5)  # room for one cache
    service.get(b, 32)
    assert store.find_kv(service.key(a, 32)) is None
    assert store.find_kv(service.key(b, 32)) is not None
    evicted = [r for r in store.caches_of(a) if r.status == "evicted"]
    assert len(evicted) == 1 and len(store.chunks(evicted[0].id)) > 0  # metadata stays
    assert not (tmp_path / evicted[0].folder).exists()
    assert store.kv_bytes() <= store.kv_budget_bytes
    # On demand, the evicted document is prefilled again (the pool still holds it here, so drop it).
    service.pool.drop(service.key(a, 32))
    service.get(a, 32)
    assert service.prefills == 3


def test_chunk_size_change_keeps_old_cache_until_new_is_complete(engine, tmp_path):
    service, store = _service(engine, tmp_path)
    doc_id = _add(store)
    service.get(doc_id, 32)
    old = store.find_kv(service.key(doc_id, 32))
    service.get(doc_id, 64)
    assert store.find_kv(service.key(doc_id, 32)) == old  # untouched
    assert store.find_kv(service.key(doc_id, 64)).num_chunks < old.num_chunks


def test_stored_precision_rounds_only_wider_than_16_bits():
    g = torch.Generator().manual_seed(0)
    keys = torch.randn(2, 3, 1, 5, 4, generator=g)
    doc = DocumentKV(keys, -keys, torch.tensor([5, 5, 3]), torch.zeros(3, 5, dtype=torch.long),
                     torch.tensor([0, 4, 8]))
    assert sixteen_bit(torch.float32) == torch.bfloat16
    assert sixteen_bit(torch.float16) == torch.float16 and sixteen_bit(torch.bfloat16) == torch.bfloat16
    rounded = at_stored_precision(doc, "bf16")
    assert rounded.keys.dtype == torch.float32 and torch.equal(rounded.keys, keys.bfloat16().float())
    assert torch.equal(rounded.values, -keys.bfloat16().float()) and not torch.equal(rounded.keys, keys)
    half = DocumentKV(keys.half(), keys.half(), doc.lengths, doc.tokens, doc.content_starts)
    assert at_stored_precision(half, "bf16") is half


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fp8_keeps_every_block_to_e4m3_precision_whatever_its_magnitude(dtype):
    """One scale per (layer, chunk, head): blocks 10^-3 and 10^3 apart keep the same relative
    precision (e4m3: 3 mantissa bits, so at most 1/16 off for a value within 2^15 of its block's
    largest), and the decoded KV keeps the engine's dtype."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 2, 7, 9, generator=g)  # [L, N, Hkv, C, D], odd sizes
    x[:, 1] *= 1e-3
    x[:, 3] *= 1e3
    x[0, 2, 1] = 0.0  # an all-zero block (a padded head) stays zero
    x = x.to(dtype)
    keys, values = round_trip(x, -x, "fp8")
    assert keys.dtype == values.dtype == dtype and torch.equal(values, -keys)
    assert torch.equal(keys[0, 2, 1], torch.zeros_like(keys[0, 2, 1]))
    amax = x.float().abs().amax(dim=(3, 4), keepdim=True)
    # Half a step: 1/16 of the value for e4m3's normal numbers (a little more once rounded to a
    # 16-bit dtype), half of the smallest subnormal (2^-9 of the scale) below them.
    bound = torch.maximum(x.float().abs() / 15, amax / 448 / 2 ** 10)
    assert bool(((keys.float() - x.float()).abs() <= bound).all())
    share = ((keys.float() - x.float()).abs() / x.float().abs().clamp_min(1e-30))[x.float() != 0]
    assert float(share.median()) < 0.04  # typical error, about 2^-5
    encoded = encode_kv(x, x, "fp8")
    assert encoded["keys"].dtype == torch.float8_e4m3fn and encoded["keys_scale"].shape == (3, 5, 2)
    assert encoded["keys"].element_size() == 1


def test_a_cache_cut_another_way_is_prefilled_again_and_replaced(engine, tmp_path):
    service, store = _service(engine, tmp_path)
    doc_id = _add(store)
    service.get(doc_id, 32)
    before = store.find_kv(service.key(doc_id, 32))
    # As a cache written before the cut was recorded reads after the migration.
    store.db.execute("UPDATE kv_caches SET chunking = 'fixed' WHERE id = ?", [before.id])
    assert store.find_kv(service.key(doc_id, 32)) is None
    fresh, _ = _service(engine, tmp_path)
    fresh.get(doc_id, 32)
    assert fresh.prefills == 1, "the old cut is not answered from"
    caches = store.caches_of(doc_id)
    assert [c.key.chunking for c in caches] == [CHUNKING], "one cache per key: the old one is replaced"
    assert not (tmp_path / before.folder).exists()


# ---- restart and two processes -------------------------------------------------------------------

ASKER = textwrap.dedent("""
    import json, sys
    from app.kv_service import DocumentKVService
    from engine import AnswerParams, Engine, SamplingParams
    from storage import DocumentStore, TieredKVPool
    engine = Engine.from_pretrained(sys.argv[1], device="cpu")
    store = DocumentStore(sys.argv[2])
    service = DocumentKVService(engine, store, TieredKVPool("cpu", 1 << 30))
    doc = store.list_documents()[0].id
    kv = service.get(doc, 32)
    res = engine.answer(kv, "Who keeps the lighthouse?",
                        AnswerParams(top_k=2, sampling=SamplingParams(gen_length=8, block_length=8)))
    print(json.dumps(service.pool.counters.snapshot() | {"prefills": service.prefills}))
""")


def _ask_in_subprocess(model_dir, data_dir):
    return subprocess.Popen([sys.executable, "-c", ASKER, str(model_dir), str(data_dir)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=os.environ | {"PYTHONPATH": str(REPO)})


def test_restart_answers_without_prefill(llada_dir, tmp_path):
    store = DocumentStore(tmp_path)
    _add(store)
    first = _ask_in_subprocess(llada_dir, tmp_path)
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1])["prefills"] == 1
    second = _ask_in_subprocess(llada_dir, tmp_path)
    out, err = second.communicate(timeout=300)
    assert second.returncode == 0, err
    counters = json.loads(out.strip().splitlines()[-1])
    assert counters["prefills"] == 0 and counters["loads"] == 1


def test_two_processes_read_the_same_store(llada_dir, engine, tmp_path):
    service, store = _service(engine, tmp_path)
    _add(store)
    service.get(_add(store), 32)
    procs = [_ask_in_subprocess(llada_dir, tmp_path) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1])["loads"] == 1


# ---- a full disk -------------------------------------------------------------------------------------

FULL_DISK = textwrap.dedent("""
    import resource, signal, sys, torch, hashlib
    from storage import DocumentStore, KVKey, ChunkRecord, PageSpan, StorageFullError
    store = DocumentStore(sys.argv[1])
    doc = store.list_documents()[0].id
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))  # no file may exceed 1 MiB
    try:
        store.save_kv(KVKey(doc, "fp", 16, "float32", "fixed"), {"keys": torch.zeros(2, 8, 4, 16, 1024)}, {"keys": 1},
                      [ChunkRecord(j, 0, 1, 0, 1, 0, 0, "x") for j in range(8)], 8)
    except StorageFullError as exc:
        print("FULL:", exc)
""")


def test_full_disk_is_a_clear_error_and_changes_nothing(tmp_path):
    store = DocumentStore(tmp_path)
    _add(store)
    before = {t: store.db[t].count for t in ("kv_caches", "kv_files", "chunks")}
    res = subprocess.run([sys.executable, "-c", FULL_DISK, str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                         env=os.environ | {"PYTHONPATH": str(REPO)}, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("FULL: no space left to store the KV cache")
    after = {t: DocumentStore(tmp_path).db[t].count for t in before}
    assert after == before
    assert not list((tmp_path / "kv").rglob("*.safetensors"))


def test_full_tmpfs_is_a_clear_error(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    store = None
    try:
        store = DocumentStore(mount)
        doc_id = _add(store)
        with pytest.raises(StorageFullError, match="no space left"):
            store.save_kv(KVKey(doc_id, "fp", 16, "float32", "fixed"), {"keys": torch.zeros(2, 8, 4, 16, 4096)},
                          {"keys": 1}, [ChunkRecord(j, 0, 1, 0, 1, 0, 0, "x") for j in range(8)], 8)
        assert store.db["kv_caches"].count == 0
        assert not list((mount / "kv").rglob("*.safetensors"))
    finally:
        del store
        subprocess.run(["umount", "-l", str(mount)], check=False)


# ---- pool, fingerprint, memo ---------------------------------------------------------------------

def test_pool_lru_and_counters_on_cpu():
    pool = TieredKVPool("cpu", hot_bytes=3 * 4000)
    entry = lambda v: {"keys": torch.full((1000,), float(v))}  # noqa: E731  4000 bytes
    for i in range(3):
        pool.put(i, entry(i), source="disk")
    assert pool.get(0) is not None  # 0 becomes most recent
    pool.put(3, entry(3), source="prefill")  # evicts 1, the least recently used
    assert pool.tier_of(1) is None and pool.tier_of(0) == "hot"
    c = pool.counters.snapshot()
    assert c["loads"] == 3 and c["prefills"] == 1 and c["hits_hot"] == 1 and c["evictions_hot"] == 1
    assert pool.usage()["hot_bytes"] <= pool.hot_bytes


def test_pool_peek_marks_an_entry_recently_used_where_it_is():
    pool = TieredKVPool("cpu", hot_bytes=2 * 4000)
    for i in range(2):
        pool.put(i, {"keys": torch.full((1000,), float(i))}, source="disk")
    got = pool.peek(0)  # 0 becomes most recent in its tier
    assert float(got["keys"][0]) == 0.0 and pool.peek(7) is None
    pool.put(2, {"keys": torch.full((1000,), 2.0)}, source="disk")  # evicts 1, not 0
    assert pool.tier_of(0) == "hot" and pool.tier_of(1) is None
    assert pool.counters.hits_hot == 1


def test_fingerprint_tracks_config_tokenizer_and_weights(dream_dir, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(dream_dir, copy)
    assert model_fingerprint(copy) == model_fingerprint(dream_dir)
    cfg = json.loads((copy / "config.json").read_text())
    cfg["rope_theta"] = 10.0
    (copy / "config.json").write_text(json.dumps(cfg))
    assert model_fingerprint(copy) != model_fingerprint(dream_dir)
    shutil.copytree(dream_dir, tmp_path / "w", dirs_exist_ok=True)
    shard = sorted((tmp_path / "w").glob("model-*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[-10] ^= 1
    shard.write_bytes(bytes(data))
    assert model_fingerprint(tmp_path / "w") != model_fingerprint(dream_dir)


def test_kept_weight_digests_are_reused_only_for_an_unchanged_file(dream_dir, tmp_path):
    import shutil

    from engine.model.weights import weight_file_digests

    shutil.copytree(dream_dir, tmp_path / "m")
    digests = weight_file_digests(tmp_path / "m")
    assert digests and all(len(entry) == 5 for entry in digests.values())
    assert model_fingerprint(tmp_path / "m", digests) == model_fingerprint(tmp_path / "m")
    # A kept digest is trusted while size, times and inode match: no file is read again.
    planted = {path: [*entry[:4], "0" * 64] for path, entry in digests.items()}
    assert weight_file_digests(tmp_path / "m", planted) == planted
    shard = Path(sorted(digests)[0])
    shard.write_bytes(shard.read_bytes())  # same bytes, rewritten: its ctime changes
    again = weight_file_digests(tmp_path / "m", planted)
    assert again[str(shard)][4] == digests[str(shard)][4]  # re-hashed, not the planted digest


def test_result_cache_is_bounded_json(tmp_path):
    cache = ResultCache(tmp_path / "memo", size_limit_bytes=200_000)
    cache.set("answer", "k1", {"text": "Odile", "chunks": [1, 2]})
    assert cache.get("answer", "k1") == {"text": "Odile", "chunks": [1, 2]}
    for i in range(200):
        cache.set("text", str(i), "x" * 5000)
    assert cache.volume() < 400_000
    assert cache.get("answer", "missing") is None


def test_streamed_safetensors_read_back_as_the_joined_tensors(tmp_path):
    """write_safetensors joins parts along their chunk axes without joining them in memory: what
    safetensors' own reader gives back equals torch.cat of the parts, for every dtype a KV file
    holds, odd sizes, and an axis of 0 and 1."""
    from safetensors.torch import load_file

    from storage.kv_files import file_sha256, write_safetensors

    g = torch.Generator().manual_seed(3)
    axis = {"keys": 1, "scale": 1, "tokens": 0, "lengths": 0}

    def part(n: int) -> dict[str, torch.Tensor]:
        keys = torch.randn(3, n, 2, 5, 7, generator=g)
        return {"keys": keys.to(torch.float8_e4m3fn), "scale": torch.rand(3, n, 2, generator=g),
                "tokens": torch.randint(0, 999, (n, 5), generator=g).to(torch.int32),
                "lengths": torch.randint(1, 6, (n,), generator=g)}

    parts = [part(n) for n in (4, 1, 3)]
    path = tmp_path / "x.safetensors"
    with open(path, "wb") as f:
        size, digest = write_safetensors(f, parts, axis, {"chunk_start": "0"})
    assert size == path.stat().st_size and digest == file_sha256(path)
    got = load_file(str(path))
    for name, dim in axis.items():
        want = torch.cat([p[name] for p in parts], dim=dim)
        bits = [t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t for t in (got[name], want)]
        assert got[name].dtype == want.dtype and torch.equal(*bits), name
    writer_bf16 = [{k: (v.float().bfloat16() if k == "keys" else v) for k, v in p.items()} for p in parts]
    with open(path, "wb") as f:
        write_safetensors(f, writer_bf16, axis, {})
    assert torch.equal(load_file(str(path))["keys"], torch.cat([p["keys"] for p in writer_bf16], dim=1))


def test_a_transaction_rolls_back_whole_and_leaves_the_connection_free(tmp_path):
    store = DocumentStore(tmp_path)
    with pytest.raises(RuntimeError), store.transaction():
        store.db.execute("INSERT INTO collections (name, created_at) VALUES ('lost', 't')")
        raise RuntimeError("a failure midway")
    assert not store.db.conn.in_transaction and store.collections() == {}
    with store.transaction(), store.transaction():  # nested: a savepoint inside the IMMEDIATE one
        store.db.execute("INSERT INTO collections (name, created_at) VALUES ('kept', 't')")
    assert not store.db.conn.in_transaction and list(store.collections()) == ["kept"]
    other = DocumentStore(tmp_path)  # another connection sees it committed
    assert list(other.collections()) == ["kept"]
