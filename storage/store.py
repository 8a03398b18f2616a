"""The document store: SQLite metadata plus files, under one data folder.

Layout:
    <data>/docqa.sqlite              metadata (documents, pages, KV caches, chunks, conversations)
    <data>/docqa.sqlite.bak          a copy taken after every change to the library (`repair` uses it)
    <data>/documents/<id>.txt        each document's extracted text
    <data>/documents/<id>.json       its name, type and pages (`repair` rebuilds rows from it)
    <data>/uploads/<id>.<ext>        the original file, never served
    <data>/kv/<id>/<fingerprint>-c<chunk size>-<dtype>/kv-NNNNN.safetensors

Invariants: a document is 'ingesting' until its KV is stored, then 'ready' ('failed' when the KV
could not be stored: kept, to be retried); a KV cache row is 'ready' only once all its files are
renamed into place; deleting removes rows first (one transaction, with a deletion mark) and then
files. `recover()` (run at open) removes only what it can account for: temporaries, documents that
never became ready, the marked deletions, and KV folders of known documents that no row uses.
Files of documents the database does not know are never deleted at open: a missing or damaged
database is an error (`DatabaseError`), and `repair()` rebuilds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import sqlite3
import threading
import uuid
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import torch
from sqlite_utils import Database

from storage.chunk_index import IndexHit, search
from storage.db import connect, database_health
from storage.errors import NO_SPACE, READ_ONLY, DatabaseError, ReadOnlyError
from storage.kv_files import (
    TMP_MARK,
    KVFileError,
    KVShardWriter,
    ShardInfo,
    StorageError,
    StorageFullError,
    check_shard,
    fsync_dir,
    read_kv_chunks,
    read_kv_shards,
    remove_temporaries,
    write_kv_shards,
)

logger = logging.getLogger(__name__)

DB_FILE = "docqa.sqlite"
BACKUP_FILE = "docqa.sqlite.bak"
WRITERS_LOCK = ".writers.lock"
UPLOAD_SUFFIXES = (".pdf", ".txt", ".md", ".markdown")
# Per KV file: a prefill streams its batches into shards of this size, so it is also the most KV
# memory a write holds (the shard's parts wait in memory until it is full, then stream to the file).
DEFAULT_MAX_SHARD_BYTES = 128 << 20


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


@dataclass(frozen=True)
class PageSpan:
    index: int
    label: str
    char_start: int
    char_end: int
    has_text: bool


@dataclass(frozen=True)
class DocumentRecord:
    id: str
    name: str
    mime: str
    size_bytes: int
    page_count: int
    text_chars: int
    status: str
    error: str | None
    created_at: str
    updated_at: str


@dataclass(frozen=True)
class KVKey:
    document_id: str
    model_fingerprint: str
    chunk_size: int
    dtype: str
    chunking: str  # how the chunks were cut (the caller's name for it): another cut is another cache

    @property
    def folder_prefix(self) -> str:
        """Each write goes to a new folder under this prefix: a live cache is never overwritten."""
        return f"kv/{self.document_id}/{self.model_fingerprint[:16]}-c{self.chunk_size}-{self.dtype}"


@dataclass(frozen=True)
class StagedKV:
    """A KV cache being written by several processes: `staging` (a temporary folder, relative to
    the data folder) becomes `folder` when committed."""

    key: KVKey
    folder: str
    staging: str


def _kv_metadata(key: KVKey) -> dict[str, str]:
    """What every KV file of a cache says about it (safetensors metadata)."""
    return {"document_id": key.document_id, "model_fingerprint": key.model_fingerprint,
            "chunk_size": str(key.chunk_size), "dtype": key.dtype, "chunking": key.chunking}


@dataclass(frozen=True)
class ChunkRecord:
    ordinal: int
    token_start: int
    token_end: int
    char_start: int
    char_end: int
    page_start: int
    page_end: int
    text: str


@dataclass(frozen=True)
class KVCacheRecord:
    id: int
    key: KVKey
    num_chunks: int
    num_tokens: int
    status: str
    bytes: int
    files: tuple[ShardInfo, ...]
    last_used_at: str
    folder: str  # relative to the data folder


@dataclass(frozen=True)
class MessageRecord:
    id: int
    conversation_id: str
    question: str
    answer: str
    documents: list[str]
    params: dict
    selected_chunks: list[dict]
    timings: dict
    created_at: str
    warning: str | None = None
    scores: list[dict] = field(default_factory=list)  # every candidate chunk (the relevance plot)
    anchors: list[list[float]] = field(default_factory=list)  # [chosen chunk][layer]


def write_atomically(path: Path, data: bytes | str) -> None:
    """Writes `data` to `path` through a fsynced temporary file and a rename: a crash leaves the old
    file or the new one, and a leftover temporary that recovery removes."""
    tmp = _temporary_beside(path)
    try:
        _write_fsynced(tmp, data)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise _storage_error(exc, path) from None


def _temporary_beside(path: Path) -> Path:
    return path.with_name(f"{path.name}{TMP_MARK}{uuid.uuid4().hex[:8]}")


def _write_fsynced(path: Path, data: bytes | str) -> None:
    with open(path, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())


def _storage_error(exc: OSError, path: Path) -> StorageError:
    if exc.errno in NO_SPACE:
        return StorageFullError(f"no space left to store {path.name}: {exc.strerror}")
    if exc.errno in READ_ONLY:
        return ReadOnlyError(f"the data folder is read-only: cannot write {path.name}")
    return StorageError(f"cannot write {path}: {exc}")


def _is_writable(folder: Path) -> bool:
    """Whether files can be created in `folder` (False on a read-only mount, also for root)."""
    return os.access(folder, os.W_OK)


class DocumentStore:
    """Metadata and files of documents and their KV caches. One SQLite connection per thread.

    A data folder that cannot be written is opened read-only (`read_only`): documents can be
    listed and asked from their stored KV; every change raises ReadOnlyError.
    """

    def __init__(self, data_dir: str | Path, kv_budget_bytes: int | None = None,
                 max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES, run_recovery: bool = True) -> None:
        self.root = Path(data_dir).expanduser().resolve()
        self.read_only = self.root.is_dir() and not _is_writable(self.root)
        if not self.read_only:
            try:
                for sub in ("documents", "kv", "uploads"):
                    (self.root / sub).mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StorageError(f"cannot use the data folder {self.root}: {exc.strerror or exc}") from None
        self.kv_budget_bytes = kv_budget_bytes
        self.max_shard_bytes = max_shard_bytes
        self._local = threading.local()
        self._verified: set[str] = set()  # shard paths whose checksum this process has checked
        self._verified_lock = threading.Lock()
        self._check_database()
        self.removed_unfinished: list[str] = []  # ids of documents recovery removed (never became ready)
        self.last_recovery = self.recover() if run_recovery and not self.read_only else {}

    def _check_database(self) -> None:
        """Refuses to open over a library whose database is gone or damaged: opening would make a new
        empty database, and the library's files would then look like debris."""
        path = self.root / DB_FILE
        health = database_health(path)
        if health.state == "ok":
            return
        held = self.stored_document_ids()
        if health.state == "damaged":
            raise DatabaseError(f"the library database {path} is damaged ({health.detail}). Nothing was changed. "
                                f"Run `docqa repair --data-dir {self.root}` to rebuild it.")
        if held:
            raise DatabaseError(f"the library database {path} is {health.detail or 'missing'}, but {self.root} holds "
                                f"the files of {len(held)} document(s). Nothing was changed. Run `docqa repair "
                                f"--data-dir {self.root}` to rebuild it.")
        if self.read_only:
            raise ReadOnlyError(f"the data folder {self.root} is read-only and holds no library")

    def stored_document_ids(self) -> set[str]:
        """Document ids that have files in the data folder (text, original upload or KV)."""
        ids = {p.name.split(".")[0] for p in (self.root / "documents").glob("*.txt")}
        ids |= {p.name.split(".")[0] for p in (self.root / "uploads").glob("*") if TMP_MARK not in p.name}
        kv = self.root / "kv"
        ids |= {p.name for p in kv.iterdir() if p.is_dir()} if kv.is_dir() else set()
        return {i for i in ids if i and not i.startswith(".")}

    # ---- connections and locks ---------------------------------------------------------------

    @contextlib.contextmanager
    def writing(self):
        """Held (shared) by every writer of files, and by an ingest from its first row to its last,
        so that recovery in another process never mistakes work in progress for debris."""
        self.require_writable()
        with open(self.root / WRITERS_LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_SH)
            yield

    def require_writable(self) -> None:
        if self.read_only:
            raise ReadOnlyError(f"the data folder {self.root} is read-only: documents can be listed and asked, "
                                "not added, changed or deleted")

    @property
    def db(self) -> Database:
        db = getattr(self._local, "db", None)
        if db is None:
            db = connect(self.root / DB_FILE, read_only=self.read_only)
            self._local.db = db
        return db

    @contextlib.contextmanager
    def transaction(self):
        """A write transaction, begun IMMEDIATE: it takes the write lock first (waiting up to the
        busy timeout for another writer), so its statements never read a snapshot that another
        connection's commit makes stale; a deferred one would fail at once with "database is
        locked" on its first write after such a commit (WAL's SQLITE_BUSY_SNAPSHOT). Nested: a
        savepoint."""
        conn = self.db.conn
        if conn.in_transaction:
            with self.db.atomic():
                yield
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
            conn.commit()  # inside: a COMMIT that fails (a full disk) must not leave it open
        except BaseException as exc:
            if conn.in_transaction:
                conn.rollback()
            if isinstance(exc, sqlite3.OperationalError) and "full" in str(exc):
                raise StorageFullError(f"no space left to write the library database in {self.root}; "
                                       "free disk space") from None
            raise

    def backup(self) -> None:
        """Copies the database to BACKUP_FILE (SQLite's online backup: a consistent snapshot while
        others write). Taken after every change to the library; a failure only logs."""
        if self.read_only:
            return
        target = self.root / BACKUP_FILE
        tmp = _temporary_beside(target)
        try:
            copy = sqlite3.connect(str(tmp))
            try:
                self.db.conn.backup(copy)
            finally:
                copy.close()
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except (OSError, sqlite3.Error) as exc:
            tmp.unlink(missing_ok=True)
            logger.warning("could not back up the library database: %s", exc)

    def _compact_log(self) -> None:
        """Folds the write-ahead log into the database and empties it: the log keeps old copies of
        pages (a deleted document's text among them) until then."""
        try:
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as exc:
            logger.warning("could not checkpoint the library database: %s", exc)

    # ---- documents ---------------------------------------------------------------------------

    def add_document(self, doc_id: str, name: str, mime: str, size_bytes: int, text: str,
                     pages: list[PageSpan], status: str = "ready") -> tuple[DocumentRecord, bool]:
        """Stores a document: text and description files, rows in one transaction. Deduplicated by
        `doc_id` (the content hash): an existing ready document is returned unchanged with False; a
        failed or unfinished one is replaced. `status` 'ingesting' until its KV is stored (then
        `set_status`), so a crash before that leaves nothing that looks stored."""
        existing = self.get_document(doc_id)
        if existing is not None and existing.status == "ready":
            return existing, False
        now = _now()
        row = {"id": doc_id, "name": name, "mime": mime, "size_bytes": size_bytes, "page_count": len(pages),
               "text_chars": len(text), "status": status, "error": None, "created_at": now, "updated_at": now}
        about = {"name": name, "mime": mime, "size_bytes": size_bytes, "created_at": now,
                 "pages": [p.__dict__ for p in pages]}
        text_path, about_path = self._text_path(doc_id), self._about_path(doc_id)
        # Temporaries first, renamed only once the rows are committed: a crash before the commit
        # leaves temporaries (removed at open), after it a row that recovery accounts for.
        staged = [(_temporary_beside(text_path), text_path, text),
                  (_temporary_beside(about_path), about_path, json.dumps(about))]
        with self.writing():
            try:
                for tmp, _, data in staged:
                    _write_fsynced(tmp, data)
                with self.transaction():
                    self.db.execute("DELETE FROM documents WHERE id = ?", [doc_id])  # a failed earlier attempt
                    self.db["documents"].insert(row)
                    self.db["pages"].insert_all(
                        [{"document_id": doc_id, "page_index": p.index, "label": p.label, "char_start": p.char_start,
                          "char_end": p.char_end, "has_text": int(p.has_text)} for p in pages], batch_size=500)
                for tmp, final, _ in staged:
                    os.replace(tmp, final)
            except OSError as exc:
                raise _storage_error(exc, text_path) from None
            finally:
                for tmp, _, _ in staged:
                    tmp.unlink(missing_ok=True)
        if status == "ready":
            self.backup()
        return self.get_document(doc_id), True

    def set_status(self, doc_id: str, status: str, error: str | None = None) -> None:
        """'ready' once its KV is stored; 'failed' (with the reason) when that could not be done."""
        self.require_writable()
        with self.transaction():
            self.db.execute("UPDATE documents SET status = ?, error = ?, updated_at = ? WHERE id = ?",
                            [status, error, _now(), doc_id])
        self.backup()

    def get_document(self, doc_id: str) -> DocumentRecord | None:
        rows = list(self.db.query("SELECT * FROM documents WHERE id = ?", [doc_id]))
        return DocumentRecord(**rows[0]) if rows else None

    def list_documents(self, statuses: tuple[str, ...] = ("ready",)) -> list[DocumentRecord]:
        marks = ", ".join("?" * len(statuses))
        return [DocumentRecord(**r) for r in self.db.query(
            f"SELECT * FROM documents WHERE status IN ({marks}) ORDER BY created_at", list(statuses))]

    def add_document_name(self, doc_id: str, name: str) -> None:
        """Another name the document `doc_id` is known by (its bytes were added again under it)."""
        record = self.get_document(doc_id)
        if record is None or name == record.name:
            return
        self.require_writable()
        with self.transaction():
            self.db.execute("INSERT OR IGNORE INTO document_names VALUES (?, ?, ?)", [doc_id, name, _now()])
        self.backup()

    def document_names(self) -> dict[str, list[str]]:
        """Every document's names by its id: the name it was first added under, then the others."""
        names: dict[str, list[str]] = {}
        for row in self.db.query("SELECT id, name FROM documents"):
            names[row["id"]] = [row["name"]]
        for row in self.db.query("SELECT document_id, name FROM document_names ORDER BY added_at"):
            names.setdefault(row["document_id"], []).append(row["name"])
        return names

    def document_text(self, doc_id: str) -> str:
        try:
            return self._text_path(doc_id).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise StorageError(f"the text of document {doc_id} is missing from {self.root}") from None

    def has_text(self, doc_id: str) -> bool:
        return self._text_path(doc_id).exists()

    def pages(self, doc_id: str) -> list[PageSpan]:
        return [PageSpan(r["page_index"], r["label"], r["char_start"], r["char_end"], bool(r["has_text"]))
                for r in self.db.query("SELECT * FROM pages WHERE document_id = ? ORDER BY page_index", [doc_id])]

    def keep_upload(self, doc_id: str, name: str, data: bytes) -> None:
        """The original file, under a generated name inside the data folder (never served)."""
        suffix = Path(name).suffix.lower()
        target = self.root / "uploads" / f"{self._checked_id(doc_id)}{suffix if suffix in UPLOAD_SUFFIXES else ''}"
        if not target.exists():
            with self.writing():
                write_atomically(target, data)

    def uploads_of(self, doc_id: str) -> list[Path]:
        return [p for p in (self.root / "uploads").glob(f"{self._checked_id(doc_id)}*") if TMP_MARK not in p.name]

    def delete_document(self, doc_id: str) -> bool:
        """Deletes the rows (cascading to pages, caches, chunks) with a deletion mark in one
        transaction, then every file of the document, then the mark; the log is emptied and the
        backup retaken, so no copy of its text stays in the data folder."""
        with self.writing():
            with self.transaction():
                found = self.db.execute("DELETE FROM documents WHERE id = ?", [doc_id]).rowcount > 0
                if found:
                    self.db.execute("INSERT OR REPLACE INTO deleted_documents VALUES (?, ?)", [doc_id, _now()])
            self._remove_files_of(doc_id)
            with self.transaction():
                self.db.execute("DELETE FROM deleted_documents WHERE id = ?", [doc_id])
                if found:
                    # FTS5 records a deletion as a marker beside the old postings; merging the
                    # index's segments drops both, so the document's words leave the file (secure
                    # delete then overwrites the freed pages).
                    self.db.execute("INSERT INTO chunk_index (chunk_index) VALUES ('optimize')")
        self._compact_log()
        self.backup()
        return found

    def _remove_files_of(self, doc_id: str) -> None:
        self._text_path(doc_id).unlink(missing_ok=True)
        self._about_path(doc_id).unlink(missing_ok=True)
        for upload in self.uploads_of(doc_id):
            upload.unlink(missing_ok=True)
        shutil.rmtree(self.root / "kv" / doc_id, ignore_errors=True)

    @staticmethod
    def _checked_id(doc_id: str) -> str:
        if not doc_id or "/" in doc_id or doc_id.startswith(".") or "*" in doc_id or "?" in doc_id:
            raise ValueError(f"invalid document id {doc_id!r}")
        return doc_id

    def _text_path(self, doc_id: str) -> Path:
        return self.root / "documents" / f"{self._checked_id(doc_id)}.txt"

    def _about_path(self, doc_id: str) -> Path:
        return self.root / "documents" / f"{self._checked_id(doc_id)}.json"

    # ---- KV caches ---------------------------------------------------------------------------

    def _cache_record(self, row: dict) -> KVCacheRecord:
        files = tuple(ShardInfo(f["shard"], f["path"], f["bytes"], f["sha256"], f["chunk_start"], f["chunk_end"])
                      for f in self.db.query("SELECT * FROM kv_files WHERE cache_id = ? ORDER BY shard", [row["id"]]))
        key = KVKey(row["document_id"], row["model_fingerprint"], row["chunk_size"], row["dtype"], row["chunking"])
        return KVCacheRecord(row["id"], key, row["num_chunks"], row["num_tokens"], row["status"], row["bytes"],
                             files, row["last_used_at"], row["folder"])

    def find_kv(self, key: KVKey) -> KVCacheRecord | None:
        """The ready cache for this (document, model, chunk size, dtype, chunking), if its files exist."""
        rows = list(self.db.query(
            "SELECT * FROM kv_caches WHERE document_id = ? AND model_fingerprint = ? AND chunk_size = ? "
            "AND dtype = ? AND chunking = ? AND status = 'ready'",
            [key.document_id, key.model_fingerprint, key.chunk_size, key.dtype, key.chunking]))
        return self._cache_record(rows[0]) if rows else None

    def caches_of(self, doc_id: str) -> list[KVCacheRecord]:
        return [self._cache_record(r) for r in self.db.query(
            "SELECT * FROM kv_caches WHERE document_id = ? ORDER BY id", [doc_id])]

    def save_kv(self, key: KVKey, tensors: dict[str, torch.Tensor] | Iterable[dict[str, torch.Tensor]],
                chunk_axis: dict[str, int], chunks: list[ChunkRecord], num_tokens: int) -> KVCacheRecord:
        """Writes the KV files atomically, then records cache, files and chunks in one transaction.

        `tensors`: the whole cache, or an iterable of consecutive chunk ranges (a prefill's
        batches): each is written to the shard files as it comes and can then be freed, so a
        document of any length costs one shard's memory here. On a full disk raises
        StorageFullError and leaves the database and the folder as they were.
        """
        if self.get_document(key.document_id) is None:
            raise StorageError(f"unknown document {key.document_id}")
        with self.writing():
            folder = f"{key.folder_prefix}-{uuid.uuid4().hex[:8]}"
            shards = write_kv_shards(self.root, folder, tensors, chunk_axis, len(chunks), self.max_shard_bytes,
                                     _kv_metadata(key))
            return self._record_kv(key, folder, shards, chunks, num_tokens)

    # A KV cache written by several processes (app.distributed_prefill): one stages a folder, each
    # writes its range of shards into it, and the one that staged it commits it once all are there.

    def stage_kv(self, key: KVKey) -> StagedKV:
        """A temporary folder for a cache that several writers fill (recovery removes it if nobody
        commits it)."""
        if self.get_document(key.document_id) is None:
            raise StorageError(f"unknown document {key.document_id}")
        folder = f"{key.folder_prefix}-{uuid.uuid4().hex[:8]}"
        staged = StagedKV(key, folder, f"{folder}{TMP_MARK}{uuid.uuid4().hex[:8]}")
        with self.writing():
            try:
                (self.root / staged.staging).mkdir(parents=True)
            except OSError as exc:
                raise _storage_error(exc, self.root / staged.staging) from None
        return staged

    def staged_writer(self, staged: StagedKV, chunk_axis: dict[str, int], first_shard: int,
                      first_chunk: int) -> KVShardWriter:
        """A writer of shards `first_shard`... (from chunk `first_chunk`) into the staged folder:
        the same files, names and checksums as `save_kv` writes for those chunks. Write under
        `writing()`."""
        return KVShardWriter(self.root, staged.folder, chunk_axis, self.max_shard_bytes, _kv_metadata(staged.key),
                             staging=self.root / staged.staging, first_shard=first_shard, first_chunk=first_chunk)

    def commit_staged_kv(self, staged: StagedKV, shards: list[ShardInfo], chunks: list[ChunkRecord],
                         num_tokens: int) -> KVCacheRecord:
        """Renames the staged folder into place and records it, once `shards` (every writer's)
        cover all chunks in order and each file has its recorded size; otherwise, or on any
        error, the staged folder is removed and nothing is recorded."""
        with self.writing():
            try:
                shards = sorted(shards, key=lambda s: s.shard)
                ends = [0] + [s.chunk_end for s in shards]
                if [s.shard for s in shards] != list(range(len(shards))) or \
                        any(s.chunk_start != ends[i] for i, s in enumerate(shards)) or ends[-1] != len(chunks):
                    raise StorageError(f"the staged KV shards of {staged.key.document_id} do not cover its "
                                       f"{len(chunks)} chunks in order")
                for shard in shards:
                    check_shard(self.root, replace(shard, path=shard.path.replace(staged.folder, staged.staging, 1)),
                                verify_hash=False)
                final = self.root / staged.folder
                try:
                    fsync_dir(self.root / staged.staging)
                    os.replace(self.root / staged.staging, final)
                    fsync_dir(final.parent)
                except OSError as exc:
                    raise _storage_error(exc, final) from None
            except BaseException:
                self.discard_staged_kv(staged)
                raise
            return self._record_kv(staged.key, staged.folder, shards, chunks, num_tokens)

    def discard_staged_kv(self, staged: StagedKV) -> None:
        shutil.rmtree(self.root / staged.staging, ignore_errors=True)

    def _record_kv(self, key: KVKey, folder: str, shards: list[ShardInfo], chunks: list[ChunkRecord],
                   num_tokens: int) -> KVCacheRecord:
        """Records a cache whose files are in place (under `writing()`); on failure removes them."""
        num_chunks = len(chunks)
        total = sum(s.bytes for s in shards)
        now = _now()
        # Without `chunking`: a cache of another cut for the same key is replaced, not kept beside.
        where = "document_id = ? AND model_fingerprint = ? AND chunk_size = ? AND dtype = ?"
        args = [key.document_id, key.model_fingerprint, key.chunk_size, key.dtype]
        try:
            with self.transaction():
                old = [r["folder"] for r in self.db.query(f"SELECT folder FROM kv_caches WHERE {where}", args)]
                self.db.execute(f"DELETE FROM kv_caches WHERE {where}", args)
                cache_id = self.db["kv_caches"].insert({
                    "document_id": key.document_id, "model_fingerprint": key.model_fingerprint,
                    "chunk_size": key.chunk_size, "dtype": key.dtype, "chunking": key.chunking,
                    "num_chunks": num_chunks,
                    "num_tokens": num_tokens, "status": "ready", "folder": folder, "bytes": total,
                    "created_at": now, "last_used_at": now}).last_pk
                self.db["kv_files"].insert_all([{"cache_id": cache_id, **s.__dict__} for s in shards])
                self.db["chunks"].insert_all([{"cache_id": cache_id, "document_id": key.document_id, **c.__dict__}
                                              for c in chunks], batch_size=500)
        except Exception:
            shutil.rmtree(self.root / folder, ignore_errors=True)
            raise
        for previous in old:  # only once the new cache is committed
            shutil.rmtree(self.root / previous, ignore_errors=True)
        with self._verified_lock:
            self._verified.update(s.path for s in shards)  # just written and hashed
        self.enforce_budget(keep=cache_id)
        self.backup()
        return self.find_kv(key)

    def load_kv(self, record: KVCacheRecord, chunk_axis: dict[str, int], device: torch.device | str = "cpu",
                ordinals: list[int] | None = None, optional: Collection[str] = ()) -> dict[str, torch.Tensor]:
        """Reads a cache's tensors, or only the chunks `ordinals` (sorted, distinct: memory-mapped
        slices of the shards holding them); checksums are verified the first time this process
        reads a file.

        A missing, truncated or corrupted file raises KVFileError after the cache is marked evicted
        (its files removed), so the caller recomputes it and nothing is answered from bad data.
        """
        shards = list(record.files)
        read = {s.path for s in shards} if ordinals is None else \
            {s.path for s in shards if any(s.chunk_start <= o < s.chunk_end for o in ordinals)}
        with self._verified_lock:
            fresh = not read <= self._verified
        try:
            if ordinals is None:
                tensors = read_kv_shards(self.root, shards, chunk_axis, device, fresh, optional)
            else:
                tensors = read_kv_chunks(self.root, shards, chunk_axis, ordinals, device, fresh, optional)
        except KVFileError:
            logger.warning("KV cache %s of document %s is damaged; it will be recomputed", record.id,
                           record.key.document_id)
            self.mark_evicted(record.id)
            raise
        with self._verified_lock:
            self._verified.update(read)
        self.touch_kv(record.id)
        return tensors

    def search_chunks(self, question: str, cache_ids: list[int], limit: int) -> list[IndexHit]:
        """The best BM25 matches of the question among these caches' chunks (storage.chunk_index)."""
        return search(self.db.conn, question, cache_ids, limit)

    def touch_kv(self, cache_id: int) -> None:
        if not self.read_only:  # the eviction order is the only thing a read changes
            with self.transaction():
                self.db.execute("UPDATE kv_caches SET last_used_at = ? WHERE id = ?", [_now(), cache_id])

    def chunks(self, cache_id: int) -> list[ChunkRecord]:
        return [ChunkRecord(r["ordinal"], r["token_start"], r["token_end"], r["char_start"], r["char_end"],
                            r["page_start"], r["page_end"], r["text"])
                for r in self.db.query("SELECT * FROM chunks WHERE cache_id = ? ORDER BY ordinal", [cache_id])]

    def mark_evicted(self, cache_id: int) -> None:
        """Removes a cache's files; its metadata (chunks) stays and it is re-prefilled on demand."""
        rows = list(self.db.query("SELECT folder FROM kv_caches WHERE id = ?", [cache_id]))
        if not rows or self.read_only:  # read-only: the damaged files stay; nothing is answered from them
            return
        with self.transaction():
            self.db.execute("UPDATE kv_caches SET status = 'evicted', bytes = 0 WHERE id = ?", [cache_id])
            self.db.execute("DELETE FROM kv_files WHERE cache_id = ?", [cache_id])
        shutil.rmtree(self.root / rows[0]["folder"], ignore_errors=True)

    def kv_bytes(self) -> int:
        return next(self.db.query("SELECT COALESCE(SUM(bytes), 0) AS b FROM kv_caches WHERE status = 'ready'"))["b"]

    def enforce_budget(self, keep: int | None = None) -> list[int]:
        """Evicts least recently used KV caches until the total fits the budget; returns their ids."""
        if self.kv_budget_bytes is None:
            return []
        evicted = []
        total = self.kv_bytes()
        for row in self.db.query("SELECT id, bytes FROM kv_caches WHERE status = 'ready' ORDER BY last_used_at"):
            if total <= self.kv_budget_bytes:
                break
            if row["id"] == keep:
                continue
            self.mark_evicted(row["id"])
            total -= row["bytes"]
            evicted.append(row["id"])
        return evicted

    # ---- crash recovery and repair ----------------------------------------------------------

    def recover(self) -> dict[str, int]:
        """Removes what an interrupted process left and the database accounts for: temporary files,
        documents that never became ready, unfinished deletions, and KV folders of known documents
        that no ready cache uses. Files of documents the database does not know are left alone
        (`unaccounted` counts them; `repair` adopts them). Skipped while another process writes."""
        with open(self.root / WRITERS_LOCK, "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return {}
            return self._recover_locked()

    def _recover_locked(self) -> dict[str, int]:
        stats = {"temporaries": remove_temporaries(self.root)}
        with self.transaction():
            unfinished = [r["id"] for r in self.db.query("SELECT id FROM documents WHERE status = 'ingesting'")]
            self.db.execute("DELETE FROM documents WHERE status = 'ingesting'")
            self.db.execute("UPDATE jobs SET state = 'failed', error = 'interrupted' WHERE state = 'running'")
        deleted = [r["id"] for r in self.db.query("SELECT id FROM deleted_documents")]
        for doc_id in unfinished + deleted:
            self._remove_files_of(doc_id)
        self.db.execute("DELETE FROM deleted_documents")
        stats["unfinished_documents"] = len(unfinished)
        self.removed_unfinished = unfinished
        stats["deletions_finished"] = len(deleted)
        known_docs = {r["id"] for r in self.db.query("SELECT id FROM documents")}
        live_folders = {r["folder"] for r in self.db.query("SELECT folder FROM kv_caches WHERE status = 'ready'")}
        orphans = 0
        for doc_dir in (self.root / "kv").iterdir():
            if not doc_dir.is_dir() or doc_dir.name not in known_docs:
                continue
            for folder in doc_dir.iterdir():
                if f"kv/{doc_dir.name}/{folder.name}" not in live_folders:
                    shutil.rmtree(folder, ignore_errors=True)
                    orphans += 1
            if not any(doc_dir.iterdir()):
                doc_dir.rmdir()
        stats["orphans"] = orphans
        unaccounted = self.stored_document_ids() - known_docs
        stats["unaccounted"] = len(unaccounted)
        if unaccounted:
            logger.warning("%d document(s) in %s have files but no database row; they are kept. "
                           "`docqa repair` adds them back to the library.", len(unaccounted), self.root)
        if any(stats.values()):
            logger.info("storage recovery in %s: %s", self.root, stats)
        return stats

    # ---- jobs (ingestion progress) -----------------------------------------------------------

    def start_job(self, name: str) -> int:
        self.require_writable()
        now = _now()
        with self.transaction():
            return self.db["jobs"].insert({"name": name, "stage": "queued", "fraction": 0.0, "state": "running",
                                           "error": None, "started_at": now, "updated_at": now}).last_pk

    def update_job(self, job_id: int, stage: str, fraction: float, pages: tuple[int, int] | None = None,
                   chunks: tuple[int, int] | None = None, stage_started_at: str | None = None) -> None:
        """The job's stage and fraction done; `pages` and `chunks` as (done, total) when known."""
        sets, args = ["stage = ?", "fraction = ?", "updated_at = ?"], [stage, float(fraction), _now()]
        for names, value in ((("pages_done", "pages_total"), pages), (("chunks_done", "chunks_total"), chunks)):
            if value is not None:
                sets += [f"{names[0]} = ?", f"{names[1]} = ?"]
                args += [int(value[0]), int(value[1])]
        if stage_started_at is not None:
            sets.append("stage_started_at = ?")
            args.append(stage_started_at)
        with self.transaction():
            self.db.execute(f"UPDATE jobs SET {', '.join(sets)} WHERE id = ?", [*args, job_id])

    def finish_job(self, job_id: int, error: str | None = None) -> None:
        with self.transaction():
            self.db.execute("UPDATE jobs SET state = ?, error = ?, fraction = 1.0, updated_at = ? WHERE id = ?",
                            ["failed" if error else "done", error, _now(), job_id])

    def jobs(self, active_only: bool = False) -> list[dict]:
        where = "WHERE state = 'running'" if active_only else ""
        return list(self.db.query(f"SELECT * FROM jobs {where} ORDER BY id DESC LIMIT 50"))

    # ---- collections -------------------------------------------------------------------------

    def save_collection(self, name: str, document_ids: list[str]) -> None:
        """Creates or replaces the named collection with exactly these documents."""
        name = name.strip()
        if not name:
            raise ValueError("a collection needs a name")
        with self.transaction():
            self.db.execute("INSERT OR IGNORE INTO collections (name, created_at) VALUES (?, ?)", [name, _now()])
            cid = next(self.db.query("SELECT id FROM collections WHERE name = ?", [name]))["id"]
            self.db.execute("DELETE FROM collection_documents WHERE collection_id = ?", [cid])
            for doc_id in dict.fromkeys(document_ids):
                if self.get_document(doc_id) is None:
                    raise ValueError(f"unknown document {doc_id}")
                self.db.execute("INSERT INTO collection_documents VALUES (?, ?)", [cid, doc_id])

    def collections(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for row in self.db.query("SELECT c.name, d.document_id FROM collections c LEFT JOIN collection_documents d "
                                 "ON d.collection_id = c.id ORDER BY c.name"):
            out.setdefault(row["name"], [])
            if row["document_id"]:
                out[row["name"]].append(row["document_id"])
        return out

    def delete_collection(self, name: str) -> bool:
        with self.transaction():
            return self.db.execute("DELETE FROM collections WHERE name = ?", [name]).rowcount > 0

    # ---- conversations -----------------------------------------------------------------------

    def create_conversation(self, title: str, origin: str = "web") -> str:
        """A new conversation; `origin` is the face that asks it ('web', 'api', 'cli')."""
        conv_id = uuid.uuid4().hex
        now = _now()
        with self.transaction():
            self.db["conversations"].insert({"id": conv_id, "title": title, "created_at": now, "updated_at": now,
                                             "origin": origin})
        return conv_id

    def list_conversations(self, origin: str | None = None) -> list[dict]:
        """The conversations, the latest first: those of `origin`, or all."""
        where, args = ("WHERE origin = ?", [origin]) if origin is not None else ("", [])
        return list(self.db.query(f"SELECT * FROM conversations {where} ORDER BY updated_at DESC", args))

    def add_message(self, conversation_id: str, question: str, answer: str, documents: list[str], params: dict,
                    selected_chunks: list[dict], timings: dict, warning: str | None = None,
                    scores: list[dict] | None = None, anchors: list[list[float]] | None = None) -> int:
        now = _now()
        with self.transaction():
            msg_id = self.db["messages"].insert({
                "conversation_id": conversation_id, "question": question, "answer": answer,
                "documents": json.dumps(documents), "params": json.dumps(params),
                "selected_chunks": json.dumps(selected_chunks), "timings": json.dumps(timings),
                "created_at": now, "warning": warning, "scores": json.dumps(scores or []),
                "anchors": json.dumps(anchors or [])}).last_pk
            self.db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", [now, conversation_id])
        return msg_id

    def messages(self, conversation_id: str) -> list[MessageRecord]:
        out = []
        for r in self.db.query("SELECT * FROM messages WHERE conversation_id = ? ORDER BY id", [conversation_id]):
            out.append(MessageRecord(r["id"], r["conversation_id"], r["question"], r["answer"],
                                     json.loads(r["documents"]), json.loads(r["params"]),
                                     json.loads(r["selected_chunks"]), json.loads(r["timings"]), r["created_at"],
                                     r["warning"], json.loads(r["scores"]), json.loads(r["anchors"])))
        return out

