"""Persistent storage: SQLite metadata, safetensors KV files, a tiered KV pool, small memos.

Knows tensors and dataclasses, not model code.
"""

from storage.errors import DatabaseError, KVFileError, ReadOnlyError, StorageError, StorageFullError
from storage.kv_pool import PoolCounters, TieredKVPool
from storage.memo import ResultCache
from storage.repair import RepairReport, diagnose, repair
from storage.store import (
    ChunkRecord,
    DocumentRecord,
    DocumentStore,
    KVCacheRecord,
    KVKey,
    PageSpan,
    StagedKV,
    write_atomically,
)

__all__ = ["ChunkRecord", "DatabaseError", "DocumentRecord", "DocumentStore", "KVCacheRecord", "KVFileError", "KVKey",
           "PageSpan", "PoolCounters", "ReadOnlyError", "RepairReport", "ResultCache", "StorageError",
           "StagedKV", "StorageFullError", "TieredKVPool", "diagnose", "repair", "write_atomically"]
