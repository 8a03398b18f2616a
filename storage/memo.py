"""Small memoised results (extracted text by file hash, finished answers by request hash).

diskcache with an explicit size limit and JSON values only: no pickles from disk, nothing large
(KV tensors live in safetensors files, see kv_files.py). Secure delete on, and the log emptied after
a document's entries go, so a deleted document leaves no copy of its text here.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


class ResultCache:
    def __init__(self, folder: str | Path, size_limit_bytes: int = 256 << 20, read_only: bool = False) -> None:
        # Values are JSON strings, which diskcache stores as text (its pickling is never used).
        # A read-only data folder has no memo: diskcache cannot open its database there. Imported
        # here: the evaluation tools use storage without a memo, on machines without diskcache.
        import diskcache

        self._cache = None if read_only else diskcache.Cache(
            str(folder), size_limit=size_limit_bytes, eviction_policy="least-recently-used", sqlite_secure_delete=1)

    def get(self, namespace: str, key: str) -> Any | None:
        value = None if self._cache is None else self._cache.get(f"{namespace}:{key}")
        return None if value is None else json.loads(value)

    def set(self, namespace: str, key: str, value: Any) -> None:
        if self._cache is not None:
            self._cache.set(f"{namespace}:{key}", json.dumps(value))

    def delete(self, namespace: str, key: str) -> None:
        if self._cache is not None:
            self._cache.delete(f"{namespace}:{key}")

    def delete_where(self, namespace: str, predicate: Callable[[Any], bool]) -> int:
        """Deletes the entries of `namespace` whose value matches; returns how many. Reads every entry
        of the namespace: for deletions, which are rare."""
        if self._cache is None:
            return 0
        doomed = [k for k in self._cache.iterkeys() if isinstance(k, str) and k.startswith(f"{namespace}:")
                  and (v := self._cache.get(k)) is not None and predicate(json.loads(v))]
        for k in doomed:
            self._cache.delete(k)
        return len(doomed)

    def compact_log(self) -> None:
        """Folds diskcache's write-ahead log into its database and empties it (old page copies)."""
        if self._cache is None:
            return
        try:
            self._cache._sql("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as exc:
            logger.warning("could not checkpoint the memo database: %s", exc)

    def volume(self) -> int:
        return 0 if self._cache is None else self._cache.volume()

    def close(self) -> None:
        if self._cache is not None:
            self._cache.close()
