"""KV tensors on disk: safetensors shards, written atomically, checked on load.

A cache is one folder of shards, each holding a range of chunks. It is written into a temporary
folder (every file fsynced), then renamed into place, so a crash leaves either no folder or a
complete one; leftover temporary folders are removed at the next start. Each shard's sha256 is
recorded at write time; a load checks sizes always and hashes once per process.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save

from storage.errors import NO_SPACE, READ_ONLY, KVFileError, ReadOnlyError, StorageError, StorageFullError

TMP_MARK = ".tmp-"
# What a KV file holds and how (names, axes, dtypes, metadata). Part of every cache's key: files
# written in another format are never read as this one, but prefilled again.
KV_FORMAT = "safetensors-kv-v1"


@dataclass(frozen=True)
class ShardInfo:
    shard: int
    path: str  # relative to the data folder
    bytes: int
    sha256: str
    chunk_start: int
    chunk_end: int


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def shard_ranges(num_chunks: int, bytes_per_chunk: int, max_shard_bytes: int) -> list[tuple[int, int]]:
    """Chunk ranges [start, end) of at most `max_shard_bytes` each (at least one chunk each)."""
    per_shard = max(1, max_shard_bytes // max(bytes_per_chunk, 1))
    return [(s, min(num_chunks, s + per_shard)) for s in range(0, max(num_chunks, 1), per_shard)]


def write_kv_shards(root: Path, rel_folder: str, tensors: dict[str, torch.Tensor], chunk_axis: dict[str, int],
                    num_chunks: int, max_shard_bytes: int, metadata: dict[str, str]) -> list[ShardInfo]:
    """Writes `tensors` (split along their chunk axis) into `root/rel_folder`, atomically.

    Raises StorageFullError when the disk is full (nothing is left behind), StorageError otherwise.
    """
    folder = root / rel_folder
    tmp = folder.parent / f"{folder.name}{TMP_MARK}{uuid.uuid4().hex[:8]}"
    per_chunk = sum(t.numel() * t.element_size() for t in tensors.values()) // max(num_chunks, 1)
    shards = []
    try:
        tmp.mkdir(parents=True)
        ranges = shard_ranges(num_chunks, per_chunk, max_shard_bytes)
        for i, (start, end) in enumerate(ranges):
            part = {name: t.narrow(chunk_axis[name], start, end - start).contiguous().cpu()
                    for name, t in tensors.items()}
            blob = save(part, metadata=metadata | {"chunk_start": str(start), "chunk_end": str(end)})
            name = f"kv-{i:04d}-of-{len(ranges):04d}.safetensors"
            with open(tmp / name, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            shards.append(ShardInfo(i, f"{rel_folder}/{name}", len(blob), hashlib.sha256(blob).hexdigest(),
                                    start, end))
            del blob
        _fsync_dir(tmp)
        if folder.exists():  # an evicted or broken earlier copy: it is replaced whole
            shutil.rmtree(folder)
        os.replace(tmp, folder)
        _fsync_dir(folder.parent)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno in NO_SPACE:
            raise StorageFullError(f"no space left to store the KV cache in {root} ({exc.strerror}); "
                                   "free disk space or lower the storage budget") from None
        if exc.errno in READ_ONLY:
            raise ReadOnlyError(f"the data folder {root} is read-only: the KV cache cannot be stored") from None
        raise StorageError(f"cannot write the KV cache to {folder}: {exc}") from exc
    return shards


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def check_shard(root: Path, shard: ShardInfo, verify_hash: bool) -> None:
    """Raises KVFileError if the shard is missing, of the wrong size or (if asked) the wrong hash."""
    path = root / shard.path
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise KVFileError(f"KV file {shard.path} is missing") from None
    if size != shard.bytes:
        raise KVFileError(f"KV file {shard.path} has {size} bytes, expected {shard.bytes} (truncated?)")
    if verify_hash and file_sha256(path) != shard.sha256:
        raise KVFileError(f"KV file {shard.path} does not match its recorded checksum (corrupted)")


def read_kv_shards(root: Path, shards: list[ShardInfo], chunk_axis: dict[str, int], device: torch.device | str,
                   verify_hash: bool) -> dict[str, torch.Tensor]:
    """Loads and joins the shards (memory-mapped reads) onto `device`."""
    parts: dict[str, list[torch.Tensor]] = {}
    for shard in shards:
        check_shard(root, shard, verify_hash)
        try:
            with safe_open(str(root / shard.path), framework="pt", device="cpu") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                    parts.setdefault(name, []).append(f.get_tensor(name))
        except (SafetensorError, OSError, ValueError) as exc:
            raise KVFileError(f"KV file {shard.path} cannot be read: {exc}") from None
    missing = set(chunk_axis) - set(parts)
    if missing:
        raise KVFileError(f"KV files lack tensors: {', '.join(sorted(missing))}")
    out = {}
    for name, pieces in parts.items():
        joined = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=chunk_axis[name])
        out[name] = joined.to(device)
    return out


def read_kv_chunks(root: Path, shards: list[ShardInfo], chunk_axis: dict[str, int], ordinals: list[int],
                   device: torch.device | str, verify_hash: bool) -> dict[str, torch.Tensor]:
    """Loads only the chunks `ordinals` (sorted, distinct) of a cache: each shard holding some of
    them is memory-mapped and sliced in runs of consecutive chunks, so a question reads M chunks'
    bytes, not the document's."""
    parts: dict[str, list[torch.Tensor]] = {}
    for shard in shards:
        inside = [o for o in ordinals if shard.chunk_start <= o < shard.chunk_end]
        if not inside:
            continue
        check_shard(root, shard, verify_hash)
        runs: list[tuple[int, int]] = []  # [start, end) local to the shard
        for o in inside:
            local = o - shard.chunk_start
            if runs and runs[-1][1] == local:
                runs[-1] = (runs[-1][0], local + 1)
            else:
                runs.append((local, local + 1))
        try:
            with safe_open(str(root / shard.path), framework="pt", device="cpu") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                    axis = chunk_axis.get(name)
                    if axis is None:
                        continue
                    sl = f.get_slice(name)
                    lead = (slice(None),) * axis
                    parts.setdefault(name, []).extend(sl[(*lead, slice(a, b))] for a, b in runs)
        except (SafetensorError, OSError, ValueError) as exc:
            raise KVFileError(f"KV file {shard.path} cannot be read: {exc}") from None
    missing = set(chunk_axis) - set(parts)
    if missing:
        raise KVFileError(f"KV files lack tensors: {', '.join(sorted(missing))}")
    return {name: torch.cat(pieces, dim=chunk_axis[name]).to(device) for name, pieces in parts.items()}


def remove_temporaries(folder: Path) -> int:
    """Deletes temporary files and folders left by interrupted writes under `folder`; returns how many."""
    removed = 0
    if not folder.exists():
        return 0
    for path in sorted(folder.rglob(f"*{TMP_MARK}*")):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed += 1
    return removed
