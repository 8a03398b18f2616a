"""KV files at Dream-7B shape (random bf16 weights): size, load time and error per encoding
(fp8 e4m3 with scales, bf16), against re-prefilling.

    python scripts/bench_kv_storage.py --tokens 8192 32768 --out results.json [--encodings fp8 bf16]

On a GPU: the whole random Dream-7B model prefills each document (chunked, C=512), the KV is saved
through DocumentStore, and loaded back onto the GPU: first load (checksums verified), then again
with the file pages dropped from the page cache (posix_fadvise DONTNEED), then warm; then the M
chunks a prefiltered question reads. Each load decodes to bf16 on the device.
On a CPU-only machine the 7B model does not fit in fp32 and would take an hour per document, so
prefill is timed on `--cpu-layers` real-shape layers and scaled to 28 (prefill is linear in
tokens and layers once the chunk size is fixed); the load is real. The JSON says which.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile
import time
from dataclasses import replace

import torch

from app.kv_service import CHUNK_AXIS, OPTIONAL_TENSORS, kv_to_tensors, tensors_to_kv
from engine.attention import select_backend
from engine.method.prefill import prefill_document
from engine.model.config import KNOWN_CONFIGS
from engine.model.weights import random_model
from engine.runner import Runner
from storage import ChunkRecord, DocumentStore, KVKey, PageSpan
from storage.kv_codec import KV_ENCODINGS


def drop_page_cache(root: str) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def timed(device, fn, *args, **kwargs):
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return out, time.perf_counter() - t


def load_resident(store, cache, device, ordinals=None):
    """Loads a cache (or the chunks `ordinals`) decoded to bf16 on `device`, as a question does. On
    the CPU a memory-mapped read is lazy, so the decode touches every page before it returns."""
    tensors = store.load_kv(cache, CHUNK_AXIS, "cpu", ordinals, optional=OPTIONAL_TENSORS)
    return tensors_to_kv(tensors, torch.bfloat16, device)


def bench_one(runner, store, root, n_tokens, chunk_size, scale, device, encodings, prefilter) -> list[dict]:
    dtype = torch.bfloat16
    ids = torch.randint(0, 150000, (n_tokens,))
    prefill_document(runner, ids[: chunk_size * 2], chunk_size)  # warm-up
    doc, prefill_s = timed(device, prefill_document, runner, ids, chunk_size, token_budget=16384)
    if device.type != "cuda":
        # Real-shape layers in fp32 on the CPU; the stored cache is what the full bf16 model makes.
        doc = replace(doc, keys=doc.keys.to(dtype).repeat(int(scale), 1, 1, 1, 1),
                      values=doc.values.to(dtype).repeat(int(scale), 1, 1, 1, 1))
    rows = []
    for encoding in encodings:
        text = f"doc {n_tokens} {encoding}"
        doc_id = hashlib.sha256(text.encode()).hexdigest()
        store.add_document(doc_id, text, "text/plain", len(text), text, [PageSpan(0, "1", 0, len(text), True)])
        key = KVKey(doc_id, f"bench-dream7b-{encoding}", chunk_size, "bfloat16", "fixed")
        chunks = [ChunkRecord(j, 0, 1, 0, 1, 0, 0, "") for j in range(doc.num_chunks)]
        cache, save_s = timed(device, store.save_kv, key, kv_to_tensors(doc, encoding), CHUNK_AXIS, chunks, n_tokens)
        fresh = DocumentStore(root)  # a new process's view: checksums not yet verified
        drop_page_cache(root)
        loaded, load_verify_s = timed(device, load_resident, fresh, cache, device)
        keys = loaded.keys.float()
        rel_err = float((keys - doc.keys.float()).norm() / doc.keys.float().norm())
        del loaded, keys
        drop_page_cache(root)
        _, load_cold_s = timed(device, load_resident, fresh, cache, device)
        _, load_warm_s = timed(device, load_resident, fresh, cache, device)
        picked = sorted(torch.randperm(doc.num_chunks)[:prefilter].tolist())
        drop_page_cache(root)
        _, chunks_cold_s = timed(device, load_resident, fresh, cache, device, picked)
        _, chunks_warm_s = timed(device, load_resident, fresh, cache, device, picked)
        row = {"tokens": n_tokens, "encoding": encoding, "kv_bytes": cache.bytes, "files": len(cache.files),
               "bytes_per_token": cache.bytes / n_tokens, "keys_relative_error": rel_err,
               "prefill_s_measured": prefill_s, "prefill_s_full_model": prefill_s * scale,
               "prefill_extrapolated": device.type != "cuda", "save_s": save_s,
               "load_first_with_checksum_s": load_verify_s, "load_cold_page_cache_s": load_cold_s,
               "load_warm_page_cache_s": load_warm_s, "prefilter_chunks": len(picked),
               "load_prefilter_chunks_cold_s": chunks_cold_s, "load_prefilter_chunks_warm_s": chunks_warm_s}
        row["speedup_cold_load_vs_prefill"] = row["prefill_s_full_model"] / load_cold_s
        rows.append(row)
        store.delete_document(doc_id)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--chunk-size", type=int, default=512)
    ap.add_argument("--cpu-layers", type=int, default=1)
    ap.add_argument("--out", required=True)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--encodings", nargs="+", choices=KV_ENCODINGS, default=list(KV_ENCODINGS))
    ap.add_argument("--prefilter", type=int, default=64, help="chunks a question reads (the BM25 prefilter's M)")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    full = KNOWN_CONFIGS["dream-7b"]
    layers = full.num_layers if device.type == "cuda" else args.cpu_layers
    cfg = replace(full, num_layers=layers)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    # Eager layers: what is measured here is the KV's way to disk and back, not the prefill's kernels.
    runner = Runner(random_model(cfg, device, dtype), select_backend(device, dtype))
    record = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "cpu_threads": torch.get_num_threads(), "torch": torch.__version__, "chunk_size": args.chunk_size,
              "prefill_layers_run": layers, "results": []}
    root = args.data_dir or tempfile.mkdtemp(prefix="docqa-bench-")
    store = DocumentStore(root)
    for n_tokens in args.tokens:
        for row in bench_one(runner, store, root, n_tokens, args.chunk_size, full.num_layers / layers, device,
                             args.encodings, args.prefilter):
            record["results"].append(row)
            print(json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
