"""Prefill once, reuse forever: a document's KV from the pool, the disk, or a fresh prefill.

`DocumentKVService.get` looks in the tiered pool (GPU / pinned CPU), then in the store (safetensors
files, checksum-verified on first read), and only then prefills; `get_chunks` reads only the chunks a
question scores from the files. A prefill streams its batches into the files (fp8 by default,
storage.kv_codec) as it goes, so a document's KV is never in memory whole while it is made; every
later question and restart reads it back. A damaged file is never answered from: it is detected,
dropped and recomputed.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace

import torch

from app.prefilter import prefilter
from engine import DocumentKV, Engine
from engine.method.chunking import ChunkedTokens, token_breaks
from engine.method.kv_cache import take_chunks
from engine.method.prefill import ProgressFn
from engine.method.sentences import sentence_starts
from storage import ChunkRecord, DocumentStore, KVFileError, KVKey, PageSpan, StorageError, TieredKVPool
from storage.kv_codec import (
    DEFAULT_KV_ENCODING,
    SCALE_NAMES,
    check_encoding,
    decode_kv,
    encode_kv,
    round_trip,
)
from storage.kv_files import KV_FORMAT

logger = logging.getLogger(__name__)

CHUNK_AXIS = {"keys": 1, "values": 1, "keys_scale": 1, "values_scale": 1, "tokens": 0, "lengths": 0,
              "content_starts": 0}
OPTIONAL_TENSORS = SCALE_NAMES  # only fp8 files have them (storage.kv_codec)
# The cut `prefill_text` makes, recorded with every cache: caches cut another way (the fixed-length
# cut of older caches) are not reused, but prefilled again. Rename it when the cut changes.
CHUNKING = "sentence-starts-v1"


@dataclass(frozen=True)
class DocumentLayout:
    """A document's text as the model reads it: token ids, each token's character span, the token
    indices where sentences begin, and the chunks cut from them."""

    text: str
    ids: list[int]
    offsets: list[tuple[int, int]]
    breaks: list[int]
    chunks: ChunkedTokens


def at_stored_precision(doc: DocumentKV, encoding: str = DEFAULT_KV_ENCODING) -> DocumentKV:
    """The KV as its files of `encoding` give it back, in the engine's dtype (`doc` itself when
    they keep it exactly): the first question on a new document sees exactly what every later one,
    and a restart, will load."""
    keys, values = round_trip(doc.keys, doc.values, encoding)
    return doc if keys is doc.keys else replace(doc, keys=keys, values=values)


def file_part(keys: torch.Tensor, values: torch.Tensor, chunks: ChunkedTokens | DocumentKV, start: int, end: int,
              encoding: str) -> dict[str, torch.Tensor]:
    """What the KV files hold of chunks [start, end): keys and values [L, n, Hkv, C, D] encoded,
    and the chunks' tokens (int32: a vocabulary is far below 2^31), lengths and offsets."""
    return {**encode_kv(keys, values, encoding), "tokens": chunks.tokens[start:end].to(torch.int32),
            "lengths": chunks.lengths[start:end], "content_starts": chunks.content_starts[start:end]}


def kv_to_tensors(doc: DocumentKV, encoding: str = DEFAULT_KV_ENCODING) -> dict[str, torch.Tensor]:
    """A whole document's KV as the tensors its files hold."""
    return file_part(doc.keys, doc.values, doc, 0, doc.num_chunks, encoding)


def tensors_to_kv(t: dict[str, torch.Tensor], dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None) -> DocumentKV:
    """A DocumentKV from file tensors (decoded to `dtype` on `device`) or from a pool entry (plain
    keys and values, as they are when `dtype` is None)."""
    if dtype is None:
        keys, values = t["keys"], t["values"]
    else:
        keys, values = decode_kv(t, dtype, device if device is not None else t["keys"].device)
    return DocumentKV(keys=keys, values=values, lengths=t["lengths"].cpu(), tokens=t["tokens"].cpu().long(),
                      content_starts=t["content_starts"].cpu())


def _pool_entry(doc: DocumentKV) -> dict[str, torch.Tensor]:
    return {"keys": doc.keys, "values": doc.values, "tokens": doc.tokens, "lengths": doc.lengths,
            "content_starts": doc.content_starts}


def chunk_records(doc: ChunkedTokens | DocumentKV, offsets: list[tuple[int, int]], text: str,
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


def tokenize_for_chunks(engine: Engine, text: str) -> tuple[list[int], list[tuple[int, int]], list[int]]:
    """The document's token ids, each token's character span, and the token indices where its
    sentences and paragraphs begin (where the app's chunks are cut when they can be)."""
    enc = engine.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return enc["input_ids"], enc["offset_mapping"], token_breaks(sentence_starts(text), enc["offset_mapping"])


def prefill_text(engine: Engine, text: str, chunk_size: int, progress: ProgressFn | None = None,
                 encoding: str = DEFAULT_KV_ENCODING) -> tuple[DocumentKV, list[tuple[int, int]]]:
    """The app's prefill of a document's text, in memory: chunks cut at sentence and paragraph
    starts where they can be, so a short sentence (a fact, a needle) is never split between two
    chunks; the KV as files of `encoding` give it back (`at_stored_precision`). Returns the KV and
    each token's character span. (The app itself streams the prefill to files:
    `DocumentKVService`.)"""
    ids, offsets, breaks = tokenize_for_chunks(engine, text)
    doc = engine.prefill(ids, chunk_size, progress, breaks=breaks)
    return at_stored_precision(doc, encoding), offsets


def in_turns(batches: Iterable, turn: Callable[[], AbstractContextManager]) -> Iterator:
    """`batches`, each one computed inside its own `turn()`: a long prefill gives the model back
    between its batches, so questions are answered while a document is being added."""
    batches = iter(batches)
    while True:
        with turn():
            try:
                batch = next(batches)
            except StopIteration:
                return
        yield batch


class DocumentKVService:
    """`model_turn`: held around each piece of model work (a prefill batch), so that it takes turns
    with the questions' decode steps (engine.scheduler.AnswerScheduler.turn)."""

    def __init__(self, engine: Engine, store: DocumentStore, pool: TieredKVPool,
                 encoding: str = DEFAULT_KV_ENCODING, prefill_tokens: int | None = None,
                 model_turn: Callable[[], AbstractContextManager] = contextlib.nullcontext) -> None:
        self.engine, self.store, self.pool = engine, store, pool
        self.model_turn = model_turn
        # One prefill at a time: two of the same document would write the same files, and two of
        # different ones would only halve each other's speed.
        self._prefill_lock = threading.Lock()
        self.encoding = check_encoding(encoding)
        # Tokens a prefill forward holds (None: the engine's default for its device); with the
        # store's shard size, what bounds an ingest's memory.
        self.prefill_tokens = prefill_tokens
        # Every byte of the checkpoint (engine.model.weights.model_fingerprint), the files' format and
        # their encoding: KV kept another way is another cache.
        self.fingerprint = hashlib.sha256(f"{engine.fingerprint}:{KV_FORMAT}:{encoding}".encode()).hexdigest()
        self.prefills = 0  # documents this service prefilled (the pool counts only what it holds)
        # Citations' chunk metadata of KV that could not be written (kept in the pool only).
        self._unsaved_chunks: dict[KVKey, list[ChunkRecord]] = {}

    def key(self, doc_id: str, chunk_size: int) -> KVKey:
        # The engine's dtype, not the files' (the encoding, in the fingerprint): the prefill's
        # arithmetic decides the values, the files only how they are rounded.
        dtype = str(self.engine.dtype).removeprefix("torch.")
        return KVKey(doc_id, self.fingerprint, chunk_size, dtype, CHUNKING)

    def ensure_stored(self, doc_id: str, chunk_size: int, progress: ProgressFn | None = None) -> None:
        """Prefills the document into its KV files unless they exist (an ingest): the KV streams to
        disk a batch at a time and is not kept in memory. Raises StorageError when the files cannot
        be written."""
        key = self.key(doc_id, chunk_size)
        if self.store.find_kv(key) is None:
            self._prefill(key, progress, must_persist=True)

    def get(self, doc_id: str, chunk_size: int, progress: ProgressFn | None = None) -> DocumentKV:
        """The document's whole KV on the engine's device: pool hit, disk load, or prefill (streamed
        to its files, then loaded). A prefill whose files cannot be written (a full disk, a
        read-only folder) is kept in the pool only and the question is answered all the same."""
        key = self.key(doc_id, chunk_size)
        hit = self.pool.get(key)
        if hit is not None:
            return tensors_to_kv(hit)
        loaded = self._load(key)
        if loaded is None:
            loaded = self._prefill(key, progress, must_persist=False) or self._load(key)
        if loaded is None:
            raise StorageError(f"the KV of {doc_id} was written but cannot be read back")
        return loaded

    def _load(self, key: KVKey, ordinals: list[int] | None = None) -> DocumentKV | None:
        """The stored KV (all of it, into the pool; or the chunks `ordinals`, not pooled) on the
        engine's device; None when there are no files, or damaged ones (then dropped)."""
        record = self.store.find_kv(key)
        if record is None:
            return None
        try:
            tensors = self.store.load_kv(record, CHUNK_AXIS, "cpu", ordinals, optional=OPTIONAL_TENSORS)
        except KVFileError as exc:
            logger.warning("recomputing the KV of %s: %s", key.document_id, exc)
            return None
        doc = tensors_to_kv(tensors, self.engine.dtype, self.engine.device)
        if ordinals is not None:
            return doc
        return tensors_to_kv(self.pool.put(key, _pool_entry(doc), source="disk"))

    def get_chunks(self, doc_id: str, chunk_size: int, ordinals: list[int]) -> DocumentKV:
        """Some chunks of the document's KV (sorted ordinals): from a pooled whole copy when there
        is one, else read from its files alone (memory-mapped), so a question over a long document
        holds only the chunks it scores. Prefills first if needed. On the engine's device, except
        from the pool's warm tier: gathered there into pinned host memory for the scheduler's
        loader to copy, rather than the whole document copied to the device first."""
        if not ordinals:
            raise ValueError("get_chunks needs at least one chunk")
        key = self.key(doc_id, chunk_size)
        hit = self.pool.peek(key)
        if hit is not None:
            return take_chunks(tensors_to_kv(hit), ordinals, pin=self.engine.device.type == "cuda")
        loaded = self._load(key, ordinals)
        if loaded is None:  # no files yet, or damaged ones: prefilled to files, then read
            kept = self._prefill(key, None, must_persist=False)
            loaded = take_chunks(kept, ordinals) if kept is not None else self._load(key, ordinals)
        if loaded is None:
            raise StorageError(f"the KV of {doc_id} was written but cannot be read back")
        return loaded

    def num_chunks(self, doc_id: str, chunk_size: int) -> int:
        record = self.store.find_kv(self.key(doc_id, chunk_size))
        return record.num_chunks if record is not None else len(self.chunks(doc_id, chunk_size))

    def candidates(self, doc_ids: list[str], chunk_size: int, question: str, m: int | None
                   ) -> tuple[list[list[int]], list[list[float]]]:
        """Per document, the chunks the question's scorer will see (app.prefilter): all of them, or
        the top M by BM25 over the documents together, filled evenly when fewer match; and each
        one's BM25 relevance in [0, 1] (app.prefilter.bm25_priors; all 0 with M = 0)."""
        counts = [self.num_chunks(d, chunk_size) for d in doc_ids]
        if not m:
            return [list(range(n)) for n in counts], [[0.0] * n for n in counts]
        # Searched even when all chunks fit in M: the priors still rank them for the fusion.
        records = [self.store.find_kv(self.key(d, chunk_size)) for d in doc_ids]
        by_cache = {r.id: i for i, r in enumerate(records) if r is not None}
        hits = [(by_cache[h.cache_id], h.ordinal, h.bm25)
                for h in self.store.search_chunks(question, list(by_cache), m)]
        return prefilter(hits, counts, m)

    def chunks(self, doc_id: str, chunk_size: int) -> list[ChunkRecord]:
        """Chunk metadata for citations (prefilling first if this chunking was never computed)."""
        key = self.key(doc_id, chunk_size)
        record = self.store.find_kv(key)
        if record is None and key not in self._unsaved_chunks:
            self._prefill(key, None, must_persist=False)
            record = self.store.find_kv(key)
        return self.store.chunks(record.id) if record is not None else self._unsaved_chunks[key]

    def _prefill(self, key: KVKey, progress: ProgressFn | None, must_persist: bool) -> DocumentKV | None:
        """Prefills the document, streaming each batch's KV into its files (nothing returned). When
        they cannot be written, raises with `must_persist`; otherwise prefills again in memory and
        returns that KV, kept in the pool only."""
        with self._prefill_lock:
            if self.store.find_kv(key) is not None:  # another thread stored it while this one waited
                return None
            return self._prefill_alone(key, progress, must_persist)

    def layout(self, doc_id: str, chunk_size: int) -> DocumentLayout:
        """The stored document's tokens and chunks, as every prefill of it cuts them."""
        text = self.store.document_text(doc_id)
        ids, offsets, breaks = tokenize_for_chunks(self.engine, text)
        return DocumentLayout(text, ids, offsets, breaks, self.engine.chunk(ids, chunk_size, breaks))

    def file_parts(self, chunks: ChunkedTokens, progress: ProgressFn | None = None
                   ) -> Iterator[dict[str, torch.Tensor]]:
        """The chunks' prefill, a batch at a time, as the tensors their KV files hold (on the host)."""
        # Each batch encoded (fp8 scales) and copied to the host inside its turn too: GPU work from
        # another thread during a CUDA-graph capture on the scheduler's would break the capture.
        return in_turns(({name: t.cpu() for name, t in file_part(b.keys, b.values, chunks, b.start, b.end,
                                                                 self.encoding).items()}
                         for b in self.engine.prefill_stream(chunks, progress, self.prefill_tokens)), self.model_turn)

    def _prefill_alone(self, key: KVKey, progress: ProgressFn | None, must_persist: bool) -> DocumentKV | None:
        self.prefills += 1
        doc = self.layout(key.document_id, key.chunk_size)
        ids, offsets, breaks, chunks = doc.ids, doc.offsets, doc.breaks, doc.chunks
        records = chunk_records(chunks, offsets, doc.text, self.store.pages(key.document_id))
        parts = self.file_parts(chunks, progress)
        try:
            self.store.save_kv(key, parts, CHUNK_AXIS, records, num_tokens=len(offsets))
            return None
        except StorageError as exc:
            if must_persist:
                raise
            logger.warning("the KV of %s is kept in memory only: %s", key.document_id, exc)
        with self.model_turn():
            doc = at_stored_precision(self.engine.prefill(ids, key.chunk_size, progress, breaks=breaks), self.encoding)
        self._unsaved_chunks[key] = records
        return tensors_to_kv(self.pool.put(key, _pool_entry(doc), source="prefill"))

    def forget(self, doc_id: str) -> None:
        """Drops every pooled entry of a document (when it is deleted)."""
        self.pool.drop_matching(lambda key: key.document_id == doc_id)
        for key in [k for k in self._unsaved_chunks if k.document_id == doc_id]:
            del self._unsaved_chunks[key]
