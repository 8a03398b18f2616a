"""A tiered pool of KV caches: hot (the compute device), warm (pinned CPU memory), cold (disk).

Each tier has a byte budget; the least recently used entry moves down a tier when room is needed
(hot -> warm -> dropped, the disk copy stays). On a CPU-only machine the hot tier is CPU memory and
there is no warm tier. The pool holds plain tensor dicts; it knows nothing of models.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import asdict, dataclass

import torch

TensorDict = dict[str, torch.Tensor]


@dataclass
class PoolCounters:
    hits_hot: int = 0
    hits_warm: int = 0
    loads: int = 0  # entries read from disk
    prefills: int = 0  # entries computed by a prefill
    bytes_loaded: int = 0  # disk -> memory
    bytes_to_hot: int = 0  # warm (or disk) -> hot device
    evictions_hot: int = 0
    evictions_warm: int = 0

    def snapshot(self) -> dict[str, int]:
        return asdict(self)


def nbytes(entry: TensorDict) -> int:
    return sum(t.numel() * t.element_size() for t in entry.values())


def _copy_to(entry: TensorDict, device: torch.device, pin: bool) -> TensorDict:
    out = {}
    for name, t in entry.items():
        if device.type == "cpu" and pin:
            dst = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            dst.copy_(t)
            out[name] = dst
        else:
            out[name] = t.to(device, non_blocking=True)
    return out


HOT_FRACTION_GPU = 0.25  # of the device's memory: the rest is weights, activations, decode buffers
HOT_FRACTION_CPU = 0.125  # of the machine's memory, when the hot tier is the CPU
WARM_FRACTION = 0.125  # of the machine's memory, pinned (pinned pages cannot be swapped out)


def machine_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_budgets(hot_device: torch.device | str) -> tuple[int, int]:
    """(hot, warm) byte budgets: fractions of the device's and the machine's memory, so the pool's
    size follows the machine, not the documents. A CPU-only machine has no warm tier."""
    device = torch.device(hot_device)
    ram = machine_memory_bytes()
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        return int(HOT_FRACTION_GPU * total), int(WARM_FRACTION * ram)
    return int(HOT_FRACTION_CPU * ram), 0


class TieredKVPool:
    """LRU tiers with byte budgets. Thread-safe; `get` returns tensors on the hot device."""

    def __init__(self, hot_device: torch.device | str, hot_bytes: int, warm_bytes: int = 0) -> None:
        device = torch.device(hot_device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.hot_device = device
        self.hot_bytes, self.warm_bytes = hot_bytes, warm_bytes
        self.has_warm = self.hot_device.type != "cpu" and warm_bytes > 0
        self.counters = PoolCounters()
        self._hot: OrderedDict[Hashable, TensorDict] = OrderedDict()
        self._warm: OrderedDict[Hashable, TensorDict] = OrderedDict()
        self._lock = threading.RLock()

    def usage(self) -> dict[str, int]:
        with self._lock:
            return {"hot_bytes": sum(nbytes(e) for e in self._hot.values()),
                    "warm_bytes": sum(nbytes(e) for e in self._warm.values()),
                    "hot_entries": len(self._hot), "warm_entries": len(self._warm)}

    def tier_of(self, key: Hashable) -> str | None:
        with self._lock:
            return "hot" if key in self._hot else "warm" if key in self._warm else None

    def get(self, key: Hashable) -> TensorDict | None:
        """The entry on the hot device, or None if it is only on disk (or nowhere)."""
        with self._lock:
            entry = self._hit(key)
            if entry is not None and key in self._warm:
                return self._admit_hot(key, self._warm.pop(key))
            return entry

    def peek(self, key: Hashable) -> TensorDict | None:
        """The entry where it is (on the hot device, or in the warm tier's pinned host memory),
        marked recently used in its tier but not moved: for a caller that takes a few of its
        chunks, which would otherwise copy the whole document to the device (and evict others)."""
        with self._lock:
            return self._hit(key)

    def _hit(self, key: Hashable) -> TensorDict | None:
        """The entry in its tier, counted as a hit there and made its most recently used."""
        if key in self._hot:
            self._hot.move_to_end(key)
            self.counters.hits_hot += 1
            return self._hot[key]
        if key in self._warm:
            self._warm.move_to_end(key)
            self.counters.hits_warm += 1
            return self._warm[key]
        return None

    def put(self, key: Hashable, entry: TensorDict, source: str) -> TensorDict:
        """Adds an entry that came from `source` ("disk" or "prefill"); returns it on the hot device."""
        with self._lock:
            if source == "disk":
                self.counters.loads += 1
                self.counters.bytes_loaded += nbytes(entry)
            elif source == "prefill":
                self.counters.prefills += 1
            else:
                raise ValueError(f"unknown source {source!r}")
            self.drop(key)
            return self._admit_hot(key, entry)

    def drop(self, key: Hashable) -> None:
        with self._lock:
            self._hot.pop(key, None)
            self._warm.pop(key, None)

    def drop_matching(self, predicate) -> int:
        """Drops every entry whose key satisfies `predicate`; returns how many."""
        with self._lock:
            keys = [k for k in list(self._hot) + list(self._warm) if predicate(k)]
            for k in keys:
                self.drop(k)
            return len(keys)

    def _admit_hot(self, key: Hashable, entry: TensorDict) -> TensorDict:
        size = nbytes(entry)
        on_hot = all(t.device == self.hot_device for t in entry.values())
        if not on_hot:
            entry = _copy_to(entry, self.hot_device, pin=False)
            self.counters.bytes_to_hot += size
        if size > self.hot_bytes:  # too big to keep hot: serve it, keep it warm if it fits
            self._admit_warm(key, entry)
            return entry
        while self._hot and nbytes_total(self._hot) + size > self.hot_bytes:
            old_key, old = self._hot.popitem(last=False)
            self.counters.evictions_hot += 1
            self._admit_warm(old_key, old)
        self._hot[key] = entry
        return entry

    def _admit_warm(self, key: Hashable, entry: TensorDict) -> None:
        size = nbytes(entry)
        if not self.has_warm or size > self.warm_bytes:
            return  # dropped from memory; the disk copy remains
        while self._warm and nbytes_total(self._warm) + size > self.warm_bytes:
            self._warm.popitem(last=False)
            self.counters.evictions_warm += 1
        self._warm[key] = _copy_to(entry, torch.device("cpu"), pin=True)


def nbytes_total(tier: OrderedDict[Hashable, TensorDict]) -> int:
    return sum(nbytes(e) for e in tier.values())
