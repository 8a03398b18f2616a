"""Persistent storage: SQLite metadata, safetensors KV files, a tiered KV pool, small memos.

Knows tensors and dataclasses, not model code.
"""

from storage.kv_files import KVFileError, StorageError, StorageFullError
from storage.kv_pool import PoolCounters, TieredKVPool
from storage.memo import ResultCache
from storage.store import ChunkRecord, DocumentRecord, DocumentStore, KVCacheRecord, KVKey, PageSpan

__all__ = ["ChunkRecord", "DocumentRecord", "DocumentStore", "KVCacheRecord", "KVFileError", "KVKey", "PageSpan",
           "PoolCounters", "ResultCache", "StorageError", "StorageFullError", "TieredKVPool"]
