"""Small memoised results (extracted text by file hash, finished answers by request hash).

diskcache with an explicit size limit and JSON values only: no pickles from disk, nothing large
(KV tensors live in safetensors files, see kv_files.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import diskcache


class ResultCache:
    def __init__(self, folder: str | Path, size_limit_bytes: int = 256 << 20) -> None:
        # Values are JSON strings, which diskcache stores as text (its pickling is never used).
        self._cache = diskcache.Cache(str(folder), size_limit=size_limit_bytes, eviction_policy="least-recently-used")

    def get(self, namespace: str, key: str) -> Any | None:
        value = self._cache.get(f"{namespace}:{key}")
        return None if value is None else json.loads(value)

    def set(self, namespace: str, key: str, value: Any) -> None:
        self._cache.set(f"{namespace}:{key}", json.dumps(value))

    def volume(self) -> int:
        return self._cache.volume()

    def close(self) -> None:
        self._cache.close()
