"""Prefill once, reuse forever: a document's KV from the pool, the disk, or a fresh prefill.

`DocumentKVService.get` looks in the tiered pool (GPU / pinned CPU), then in the store (safetensors
files, checksum-verified on first read), and only then prefills, saving the result for every later
question and restart. A damaged file is never answered from: it is detected, dropped and recomputed.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
from dataclasses import replace

import torch

from app.prefilter import candidate_chunks
from app.sentences import sentence_starts
from engine import DocumentKV, Engine
from engine.chunking import token_breaks
from engine.kv_cache import take_chunks
from engine.prefill import ProgressFn
from storage import ChunkRecord, DocumentStore, KVFileError, KVKey, PageSpan, StorageError, TieredKVPool
from storage.kv_files import KV_FORMAT

logger = logging.getLogger(__name__)

CHUNK_AXIS = {"keys": 1, "values": 1, "tokens": 0, "lengths": 0, "content_starts": 0}
# The cut `prefill_text` makes, recorded with every cache: caches cut another way (the fixed cut of
# caches written before the eighth session) are not reused, but prefilled again. Rename it when the
# cut changes.
CHUNKING = "sentence-starts-v1"


def stored_kv_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype KV files hold keys and values in: the engine's own when it computes in 16 bits,
    else bf16. A CPU engine computes in fp32, whose KV would take twice the disk (36 KB a token for
    the bundled model) for digits the GPU path never has."""
    return dtype if torch.finfo(dtype).bits <= 16 else torch.bfloat16


def at_stored_precision(doc: DocumentKV) -> DocumentKV:
    """The KV rounded to what its files keep (a no-op for a 16-bit engine), in the engine's dtype:
    the first question on a new document then sees exactly what every later one, and a restart,
    will load."""
    stored = stored_kv_dtype(doc.keys.dtype)
    if stored == doc.keys.dtype:
        return doc
    return replace(doc, keys=doc.keys.to(stored).to(doc.keys.dtype), values=doc.values.to(stored).to(doc.values.dtype))


def kv_to_tensors(doc: DocumentKV, kv_dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The KV as named tensors; keys and values cast to `kv_dtype` when given (for the files)."""
    keys, values = (doc.keys, doc.values) if kv_dtype is None else (doc.keys.to(kv_dtype), doc.values.to(kv_dtype))
    return {"keys": keys, "values": values, "tokens": doc.tokens, "lengths": doc.lengths,
            "content_starts": doc.content_starts}


def tensors_to_kv(t: dict[str, torch.Tensor]) -> DocumentKV:
    return DocumentKV(keys=t["keys"], values=t["values"], lengths=t["lengths"].cpu(), tokens=t["tokens"].cpu(),
                      content_starts=t["content_starts"].cpu())


def chunk_records(doc: DocumentKV, offsets: list[tuple[int, int]], text: str,
                  pages: list[PageSpan]) -> list[ChunkRecord]:
    """Citable metadata per chunk: content token span, character span, page span and text."""
    page_starts = [p.char_start for p in pages]
    records = []
    for j in range(doc.num_chunks):
        tok_start = int(doc.content_starts[j])
        tok_end = tok_start + int(doc.lengths[j]) - 1
        char_start = offsets[tok_start][0] if tok_end > tok_start else 0
        char_end = offsets[tok_end - 1][1] if tok_end > tok_start else 0
        first = max(bisect.bisect_right(page_starts, char_start) - 1, 0) if pages else 0
        last = max(bisect.bisect_right(page_starts, max(char_end - 1, char_start)) - 1, 0) if pages else 0
        records.append(ChunkRecord(j, tok_start, tok_end, char_start, char_end, first, last,
                                   text[char_start:char_end]))
    return records


def prefill_text(engine: Engine, text: str, chunk_size: int, progress: ProgressFn | None = None
                 ) -> tuple[DocumentKV, list[tuple[int, int]]]:
    """The app's prefill of a document's text: chunks cut at sentence and paragraph starts where
    they can be, so a short sentence (a fact, a needle) is never split between two chunks; the KV
    at the precision its files keep (`at_stored_precision`). Returns the KV and each token's
    character span."""
    enc = engine.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    breaks = token_breaks(sentence_starts(text), enc["offset_mapping"])
    doc = engine.prefill(enc["input_ids"], chunk_size, progress, breaks=breaks)
    return at_stored_precision(doc), enc["offset_mapping"]


class DocumentKVService:
    def __init__(self, engine: Engine, store: DocumentStore, pool: TieredKVPool) -> None:
        self.engine, self.store, self.pool = engine, store, pool
        # Every byte of the checkpoint (engine.weights.model_fingerprint) and the files' format.
        self.fingerprint = hashlib.sha256(f"{engine.fingerprint}:{KV_FORMAT}".encode()).hexdigest()
        # Citations' chunk metadata of KV that could not be written (kept in the pool only).
        self._unsaved_chunks: dict[KVKey, list[ChunkRecord]] = {}

    def key(self, doc_id: str, chunk_size: int) -> KVKey:
        # The engine's dtype, not the files' (stored_kv_dtype): the prefill's arithmetic decides
        # the values, the files only how they are rounded.
        dtype = str(self.engine.dtype).removeprefix("torch.")
        return KVKey(doc_id, self.fingerprint, chunk_size, dtype, CHUNKING)

    def get(self, doc_id: str, chunk_size: int, progress: ProgressFn | None = None,
            must_persist: bool = False) -> DocumentKV:
        """The document's KV on the engine's device: pool hit, disk load, or prefill (then saved).

        A prefill whose files cannot be written (a full disk, a read-only folder) raises with
        `must_persist` (ingest reports it); otherwise the KV is kept in the pool only and the
        question is answered all the same."""
        key = self.key(doc_id, chunk_size)
        hit = self.pool.get(key)
        if hit is not None:
            return tensors_to_kv(hit)
        record = self.store.find_kv(key)
        if record is not None:
            try:
                tensors = self.store.load_kv(record, CHUNK_AXIS, "cpu")
                for name in ("keys", "values"):  # files hold stored_kv_dtype (older ones the engine's)
                    tensors[name] = tensors[name].to(self.engine.dtype)
                return tensors_to_kv(self.pool.put(key, tensors, source="disk"))
            except KVFileError as exc:
                logger.warning("recomputing the KV of %s: %s", doc_id, exc)
        return self._prefill_and_save(key, progress, must_persist)

    def get_chunks(self, doc_id: str, chunk_size: int, ordinals: list[int]) -> DocumentKV:
        """Some chunks of the document's KV (sorted ordinals), on the engine's device: from a pooled
        whole copy when there is one, else read from its files alone (memory-mapped), so a question
        over a long document holds only the chunks it scores. Prefills first if needed."""
        if not ordinals:
            raise ValueError("get_chunks needs at least one chunk")
        key = self.key(doc_id, chunk_size)
        hit = self.pool.get(key)
        if hit is not None:
            return take_chunks(tensors_to_kv(hit), ordinals)
        record = self.store.find_kv(key)
        if record is None:
            return take_chunks(self.get(doc_id, chunk_size), ordinals)
        try:
            tensors = self.store.load_kv(record, CHUNK_AXIS, "cpu", ordinals)
        except KVFileError as exc:
            logger.warning("recomputing the KV of %s: %s", doc_id, exc)
            return take_chunks(self.get(doc_id, chunk_size), ordinals)
        for name in ("keys", "values"):
            tensors[name] = tensors[name].to(self.engine.device, self.engine.dtype)
        return tensors_to_kv(tensors)

    def num_chunks(self, doc_id: str, chunk_size: int) -> int:
        record = self.store.find_kv(self.key(doc_id, chunk_size))
        return record.num_chunks if record is not None else len(self.chunks(doc_id, chunk_size))

    def candidates(self, doc_ids: list[str], chunk_size: int, question: str, m: int | None) -> list[list[int]]:
        """Per document, the chunks the question's scorer will see (app.prefilter): all of them, or
        the top M by BM25 over the documents together, filled evenly when fewer match."""
        counts = [self.num_chunks(d, chunk_size) for d in doc_ids]
        if not m or sum(counts) <= m:
            return [list(range(n)) for n in counts]
        records = [self.store.find_kv(self.key(d, chunk_size)) for d in doc_ids]
        by_cache = {r.id: i for i, r in enumerate(records) if r is not None}
        hits = [(by_cache[h.cache_id], h.ordinal)
                for h in self.store.search_chunks(question, list(by_cache), m)]
        return candidate_chunks(hits, counts, m)

    def chunks(self, doc_id: str, chunk_size: int) -> list[ChunkRecord]:
        """Chunk metadata for citations (prefilling first if this chunking was never computed)."""
        key = self.key(doc_id, chunk_size)
        record = self.store.find_kv(key)
        if record is None and key not in self._unsaved_chunks:
            self.get(doc_id, chunk_size)
            record = self.store.find_kv(key)
        return self.store.chunks(record.id) if record is not None else self._unsaved_chunks[key]

    def _prefill_and_save(self, key: KVKey, progress: ProgressFn | None, must_persist: bool) -> DocumentKV:
        text = self.store.document_text(key.document_id)
        doc, offsets = prefill_text(self.engine, text, key.chunk_size, progress)
        chunks = chunk_records(doc, offsets, text, self.store.pages(key.document_id))
        try:
            self.store.save_kv(key, kv_to_tensors(doc, stored_kv_dtype(doc.keys.dtype)), CHUNK_AXIS, chunks,
                               num_tokens=len(offsets))
        except StorageError as exc:
            if must_persist:
                raise
            logger.warning("the KV of %s is kept in memory only: %s", key.document_id, exc)
            self._unsaved_chunks[key] = chunks
        return tensors_to_kv(self.pool.put(key, kv_to_tensors(doc), source="prefill"))

    def forget(self, doc_id: str) -> None:
        """Drops every pooled entry of a document (when it is deleted)."""
        self.pool.drop_matching(lambda key: key.document_id == doc_id)
        for key in [k for k in self._unsaved_chunks if k.document_id == doc_id]:
            del self._unsaved_chunks[key]
