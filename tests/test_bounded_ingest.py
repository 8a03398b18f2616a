"""Ingest at scale: the prefill streams to the KV files (memory does not follow the document), and
an ingest killed midway leaves nothing in the library. Real processes, real files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine.model.random_checkpoint import TinyShape, write_random_checkpoint

REPO = Path(__file__).resolve().parents[1]
# Wide KV, cheap layers: 4 layers x 8 KV heads x 64 dims, 16 KB of fp32 KV a token.
WIDE_KV = TinyShape(hidden_size=512, intermediate_size=128, num_layers=4, num_heads=8, num_kv_heads=8)


@pytest.fixture(scope="module")
def wide_kv_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wide-kv")
    write_random_checkpoint(folder, "dream", WIDE_KV, seed=3, max_shard_bytes=50 << 20)
    return folder


def _words(n: int, seed: int) -> str:
    import random

    rng = random.Random(seed)
    vocab = ["harbour", "ledger", "granite", "orchard", "signal", "meadow", "copper", "lantern", "river", "valve"]
    sentences = [" ".join(rng.choice(vocab) for _ in range(11)).capitalize() + "." for _ in range(n // 11)]
    return " ".join(sentences)


PEAK = textwrap.dedent("""
    import hashlib, json, resource, sys
    from app.kv_service import DocumentKVService
    from engine import Engine
    from storage import DocumentStore, PageSpan, TieredKVPool
    model, data, small, large = sys.argv[1:5]
    engine = Engine.from_pretrained(model, device="cpu")
    store = DocumentStore(data, max_shard_bytes=8 << 20)
    service = DocumentKVService(engine, store, TieredKVPool("cpu", hot_bytes=0), prefill_tokens=2048)

    def ingest(path):
        text = open(path).read()
        doc = hashlib.sha256(text.encode()).hexdigest()
        store.add_document(doc, path, "text/plain", len(text), text, [PageSpan(0, "1", 0, len(text), True)])
        service.ensure_stored(doc, 128)
        return store.find_kv(service.key(doc, 128))

    ingest(small)  # allocator, tokenizer and kernels warmed up on a document of a few batches
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    cache = ingest(large)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    cfg = engine.config
    fp32_kv = cache.num_chunks * 128 * 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4
    print(json.dumps({"base": base, "peak": peak, "fp32_kv": fp32_kv, "file_bytes": cache.bytes,
                      "shards": len(cache.files), "chunks": cache.num_chunks}))
""")


@pytest.mark.slow
def test_prefill_memory_does_not_follow_the_document(wide_kv_model, tmp_path):
    """A document whose fp32 KV is ~0.6 GB is ingested with a peak no more than a fraction of that
    above the peak of a document of a few batches: the KV streams to 8 MB shards as it is made."""
    small, large = tmp_path / "small.txt", tmp_path / "large.txt"
    small.write_text(_words(1_500, seed=1))
    large.write_text(_words(9_000, seed=2))
    out = subprocess.run([sys.executable, "-c", PEAK, str(wide_kv_model), str(tmp_path / "data"), str(small),
                          str(large)], cwd=REPO, capture_output=True, text=True, timeout=900,
                         env=os.environ | {"PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["fp32_kv"] > 500e6, got  # the test means something only for a large document
    assert got["shards"] > 10 and got["file_bytes"] < 0.3 * got["fp32_kv"], got  # fp8: a quarter of fp32
    grew = got["peak"] - got["base"]
    assert grew < 0.2 * got["fp32_kv"], f"peak grew {grew / 1e6:.0f} MB for {got['fp32_kv'] / 1e6:.0f} MB of KV"


INGEST = textwrap.dedent("""
    import sys
    from pathlib import Path
    from app.service import DocQA, ServiceConfig
    service = DocQA(ServiceConfig(data_dir=Path(sys.argv[2]), model_dir=Path(sys.argv[1]), device="cpu"))

    def progress(stage, fraction):
        if stage.startswith("encoding chunk"):
            print(stage, flush=True)

    service.ingest_file(sys.argv[3], chunk_size=64, progress=progress)
    print("finished", flush=True)
""")


def test_an_ingest_killed_while_encoding_leaves_nothing(wide_kv_model, tmp_path):
    """SIGKILL in the middle of the prefill: at the next start the document is not in the library,
    and its text, upload, KV files, temporaries and memoised extraction are gone."""
    from app.service import EXTRACTED_MEMOS, DocQA, ServiceConfig

    doc = tmp_path / "long.txt"
    doc.write_text(_words(8_000, seed=4))
    data = tmp_path / "data"
    proc = subprocess.Popen([sys.executable, "-c", INGEST, str(wide_kv_model), str(data), str(doc)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=os.environ | {"PYTHONPATH": str(REPO)})
    seen = [proc.stdout.readline()]  # a batch encoded (its shard written or buffered), more to come
    assert all(line.startswith("encoding chunk") for line in seen), (seen, proc.stderr.read()[-2000:])
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert list((data / "documents").iterdir()), "the kill came after the document's row and text"
    service = DocQA(ServiceConfig(data_dir=data, model_dir=wide_kv_model, device="cpu"))  # recovery runs here
    assert service.documents(include_failed=True) == []
    assert service.store.list_documents(("ready", "failed", "ingesting")) == []
    assert service.store.last_recovery["unfinished_documents"] == 1
    for sub in ("documents", "kv", "uploads"):
        assert list((data / sub).iterdir()) == [], sub
    assert not list(data.rglob("*.tmp-*"))
    assert all(service.memo.get(ns, service.store.removed_unfinished[0]) is None for ns in EXTRACTED_MEMOS)
    info, added = service.ingest_file(doc, chunk_size=64)  # and adding it again works from scratch
    assert added and info.cached and info.record.status == "ready"
