"""Load-from-disk versus re-prefill of a document's KV at Dream-7B shape (random bf16 weights).

    python scripts/bench_kv_storage.py --tokens 8192 32768 --out results.json [--cpu-layers 1]

On a GPU: the whole random Dream-7B model prefills each document (chunked, C=512), the KV is saved
through DocumentStore, and loaded back onto the GPU: first load (checksums verified), then again
with the file pages dropped from the page cache (posix_fadvise DONTNEED), then warm.
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

from app.kv_service import CHUNK_AXIS, kv_to_tensors
from engine.attention import select_backend
from engine.config import KNOWN_CONFIGS
from engine.prefill import prefill_document
from engine.weights import random_model
from storage import ChunkRecord, DocumentStore, KVKey, PageSpan


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


def load_resident(store, cache, device):
    """Loads a cache and makes it resident: on the CPU a memory-mapped load is lazy, so every
    page is read (cloned) to count what a question would pay before its first use."""
    tensors = store.load_kv(cache, CHUNK_AXIS, device)
    if device.type == "cpu":
        tensors = {k: v.clone() for k, v in tensors.items()}
    return tensors


def bench_one(model, attn, store, root, n_tokens, chunk_size, scale, device) -> dict:
    dtype = torch.bfloat16
    ids = torch.randint(0, 150000, (n_tokens,))
    prefill_document(model, attn, ids[: chunk_size * 2], chunk_size)  # warm-up
    doc, prefill_s = timed(device, prefill_document, model, attn, ids, chunk_size, token_budget=16384)
    if device.type != "cuda":
        # Real-shape layers in fp32 on the CPU; the stored cache is what the full bf16 model makes.
        doc = replace(doc, keys=doc.keys.to(dtype).repeat(int(scale), 1, 1, 1, 1),
                      values=doc.values.to(dtype).repeat(int(scale), 1, 1, 1, 1))
    text = f"doc {n_tokens}"
    doc_id = hashlib.sha256(text.encode()).hexdigest()
    store.add_document(doc_id, text, "text/plain", len(text), text, [PageSpan(0, "1", 0, len(text), True)])
    key = KVKey(doc_id, "bench-dream7b", chunk_size, "bfloat16")
    chunks = [ChunkRecord(j, 0, 1, 0, 1, 0, 0, "") for j in range(doc.num_chunks)]
    cache, save_s = timed(device, store.save_kv, key, kv_to_tensors(doc), CHUNK_AXIS, chunks, n_tokens)
    del doc
    fresh = DocumentStore(root)  # a new process's view: checksums not yet verified
    drop_page_cache(root)
    _, load_verify_s = timed(device, load_resident, fresh, cache, device)
    drop_page_cache(root)
    _, load_cold_s = timed(device, load_resident, fresh, cache, device)
    _, load_warm_s = timed(device, load_resident, fresh, cache, device)
    row = {"tokens": n_tokens, "kv_bytes": cache.bytes, "files": len(cache.files),
           "prefill_s_measured": prefill_s, "prefill_s_full_model": prefill_s * scale,
           "prefill_extrapolated": device.type != "cuda", "save_s": save_s,
           "load_first_with_checksum_s": load_verify_s, "load_cold_page_cache_s": load_cold_s,
           "load_warm_page_cache_s": load_warm_s}
    row["speedup_cold_load_vs_prefill"] = row["prefill_s_full_model"] / load_cold_s
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--chunk-size", type=int, default=512)
    ap.add_argument("--cpu-layers", type=int, default=1)
    ap.add_argument("--out", required=True)
    ap.add_argument("--data-dir", default=None)
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    full = KNOWN_CONFIGS["dream-7b"]
    layers = full.num_layers if device.type == "cuda" else args.cpu_layers
    cfg = replace(full, num_layers=layers)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = random_model(cfg, device, dtype)
    attn = select_backend(device, dtype)
    record = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "cpu_threads": torch.get_num_threads(), "torch": torch.__version__, "chunk_size": args.chunk_size,
              "prefill_layers_run": layers, "results": []}
    root = args.data_dir or tempfile.mkdtemp(prefix="docqa-bench-")
    store = DocumentStore(root)
    for n_tokens in args.tokens:
        row = bench_one(model, attn, store, root, n_tokens, args.chunk_size, full.num_layers / layers, device)
        record["results"].append(row)
        print(json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
