"""KV tensors on disk: safetensors shards, written atomically, checked on load.

A cache is one folder of shards, each holding a range of chunks. It is written into a temporary
folder (every file fsynced), then renamed into place, so a crash leaves either no folder or a
complete one; leftover temporary folders are removed at the next start. Each shard's sha256 is
recorded at write time; a load checks sizes always and hashes once per process.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import shutil
import struct
import uuid
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from storage.errors import NO_SPACE, READ_ONLY, KVFileError, ReadOnlyError, StorageError, StorageFullError

TMP_MARK = ".tmp-"
# What a KV file holds and how (names, axes, dtypes, metadata). Part of every cache's key: files
# written in another format are never read as this one, but prefilled again.
KV_FORMAT = "safetensors-kv-v2"


@dataclass(frozen=True)
class ShardInfo:
    shard: int
    path: str  # relative to the data folder
    bytes: int
    sha256: str
    chunk_start: int
    chunk_end: int


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def shard_name(index: int) -> str:
    return f"kv-{index:05d}.safetensors"


def bytes_per_chunk(tensors: dict[str, torch.Tensor], chunk_axis: dict[str, int]) -> int:
    """Bytes one chunk of these file tensors takes (each holds the same number of chunks)."""
    n = next(t.shape[chunk_axis[name]] for name, t in tensors.items())
    return sum(t.numel() * t.element_size() for t in tensors.values()) // max(n, 1)


def chunks_per_shard(chunk_bytes: int, max_shard_bytes: int) -> int:
    """Chunks a shard file holds: as many as fit in `max_shard_bytes`, at least one. Shard k holds
    chunks [k * this, (k + 1) * this), whoever writes it."""
    return max(1, max_shard_bytes // max(chunk_bytes, 1))


class KVShardWriter:
    """Streams a cache's tensors, a range of consecutive chunks at a time, into shard files.

    Shards fill to `max_shard_bytes` and are written (fsynced, hashed) as they fill, so a writer
    holds at most one shard's bytes however long the document: a prefill hands it each batch and
    drops it. Everything goes into a temporary folder that `finish` renames into place; `abort` (or
    any error) removes it, so a crash or a full disk leaves no half cache. Errors are StorageError
    (StorageFullError on a full disk, ReadOnlyError on a read-only folder).
    """

    def __init__(self, root: Path, rel_folder: str, chunk_axis: dict[str, int], max_shard_bytes: int,
                 metadata: dict[str, str], staging: Path | None = None, first_shard: int = 0,
                 first_chunk: int = 0) -> None:
        """`staging`: a temporary folder shared with other writers (the ranks of a distributed
        prefill), each writing the shards from `first_shard` (starting at chunk `first_chunk`, a
        shard boundary) on; `finish` then renames nothing and `abort` removes only this writer's
        files: whoever made the folder commits it (`DocumentStore.commit_staged_kv`) or drops it."""
        self.root, self.rel_folder, self.chunk_axis = root, rel_folder, chunk_axis
        self.max_shard_bytes, self.metadata = max_shard_bytes, metadata
        self.folder = root / rel_folder
        self.shared = staging is not None
        self.tmp = staging if staging is not None else \
            self.folder.parent / f"{self.folder.name}{TMP_MARK}{uuid.uuid4().hex[:8]}"
        self.first_shard, self.first_chunk = first_shard, first_chunk
        self.shards: list[ShardInfo] = []
        self.num_chunks = 0  # chunks received so far
        self._pending: list[dict[str, torch.Tensor]] = []  # parts of the shard being filled
        self._pending_chunks = 0
        self._per_shard: int | None = None  # chunks a shard holds (known from the first part)
        with self._errors():
            self.tmp.mkdir(parents=True, exist_ok=self.shared)

    def append(self, tensors: dict[str, torch.Tensor]) -> None:
        """Adds the next chunks: every tensor holds the same number of chunks on its chunk axis."""
        counts = {t.shape[self.chunk_axis[name]] for name, t in tensors.items()}
        if len(counts) != 1:
            raise ValueError(f"tensors disagree on their number of chunks: {sorted(counts)}")
        n = counts.pop()
        if n == 0:  # an empty cache still has its (empty) tensors, so a reader finds every name
            if not self._pending and not self.shards:
                self._pending.append({name: t.cpu() for name, t in tensors.items()})
            return
        if self._per_shard is None:
            self._per_shard = chunks_per_shard(bytes_per_chunk(tensors, self.chunk_axis), self.max_shard_bytes)
        done = 0
        while done < n:  # a part larger than the room left in the shard is split across shards
            take = min(n - done, self._per_shard - self._pending_chunks)
            self._pending.append({name: t.narrow(self.chunk_axis[name], done, take).cpu()
                                  for name, t in tensors.items()})
            self._pending_chunks += take
            done += take
            if self._pending_chunks == self._per_shard:
                self._flush()
        self.num_chunks += n

    def finish(self) -> list[ShardInfo]:
        """Writes what is pending and renames the folder into place (replacing an older copy); in
        a shared staging folder, only writes what is pending."""
        if self.shared:
            if self._pending:
                with self._errors():
                    self._flush()
            return self.shards
        with self._errors():
            if self._pending or not self.shards:
                self._flush()
            fsync_dir(self.tmp)
            if self.folder.exists():  # an evicted or broken earlier copy: it is replaced whole
                shutil.rmtree(self.folder)
            os.replace(self.tmp, self.folder)
            fsync_dir(self.folder.parent)
        return self.shards

    def abort(self) -> None:
        if not self.shared:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        for shard in self.shards:
            (self.root / shard.path).unlink(missing_ok=True)
        for leftover in self.tmp.glob(f"{shard_name(self.first_shard + len(self.shards))}*"):
            leftover.unlink(missing_ok=True)  # the shard being written when it failed

    def _flush(self) -> None:
        start = self.first_chunk + sum(s.chunk_end - s.chunk_start for s in self.shards)
        end = start + self._pending_chunks
        parts, self._pending, self._pending_chunks = self._pending, [], 0
        index = self.first_shard + len(self.shards)
        name = shard_name(index)
        with self._errors(), open(self.tmp / name, "wb") as f:
            size, digest = write_safetensors(f, parts, self.chunk_axis,
                                             self.metadata | {"chunk_start": str(start), "chunk_end": str(end)})
            f.flush()
            os.fsync(f.fileno())
        self.shards.append(ShardInfo(index, f"{self.rel_folder}/{name}", size, digest, start, end))

    @contextlib.contextmanager
    def _errors(self):
        try:
            yield
        except OSError as exc:
            self.abort()
            if exc.errno in NO_SPACE:
                raise StorageFullError(f"no space left to store the KV cache in {self.root} ({exc.strerror}); "
                                       "free disk space or lower the storage budget") from None
            if exc.errno in READ_ONLY:
                raise ReadOnlyError(f"the data folder {self.root} is read-only: "
                                    "the KV cache cannot be stored") from None
            raise StorageError(f"cannot write the KV cache to {self.folder}: {exc}") from exc


SAFETENSORS_DTYPES = {torch.float8_e4m3fn: "F8_E4M3", torch.bfloat16: "BF16", torch.float16: "F16",
                      torch.float32: "F32", torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8"}


def write_safetensors(f, parts: list[dict[str, torch.Tensor]], chunk_axis: dict[str, int],
                      metadata: dict[str, str]) -> tuple[int, str]:
    """Writes the tensors of `parts` joined along their chunk axes to the open file `f` in the
    safetensors format, without joining them in memory: each tensor's bytes are streamed from its
    parts (for a chunk axis of 1, layer by layer), so a shard costs no copy of itself, neither the
    joined tensors nor a serialised blob. Returns the bytes written and their sha256.

    The format: an 8-byte little-endian header size, a JSON header (name -> dtype, shape, byte
    offsets; "__metadata__" -> strings) padded with spaces to 8 bytes, then the tensors' bytes."""
    names = sorted(parts[0]) if parts else []
    header: dict[str, object] = {"__metadata__": dict(metadata)}
    offset = 0
    for name in names:
        pieces = [p[name] for p in parts]
        axis = chunk_axis[name]
        shape = list(pieces[0].shape)
        shape[axis] = sum(t.shape[axis] for t in pieces)
        nbytes = pieces[0].element_size() * int(torch.Size(shape).numel())
        header[name] = {"dtype": SAFETENSORS_DTYPES[pieces[0].dtype], "shape": shape,
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    digest = hashlib.sha256()
    for chunk in (struct.pack("<Q", len(raw)), raw):
        f.write(chunk)
        digest.update(chunk)
    for name in names:
        pieces = [p[name] for p in parts]
        axis = chunk_axis[name]
        for lead in itertools.product(*(range(n) for n in pieces[0].shape[:axis])):
            for t in pieces:  # [*lead] of each part is one contiguous run of the joined tensor
                data = t[lead].contiguous().reshape(-1).view(torch.uint8).numpy()
                f.write(data)
                digest.update(data)
    return 8 + len(raw) + offset, digest.hexdigest()


def write_kv_shards(root: Path, rel_folder: str, tensors: dict[str, torch.Tensor] | Iterable[dict[str, torch.Tensor]],
                    chunk_axis: dict[str, int], num_chunks: int, max_shard_bytes: int,
                    metadata: dict[str, str]) -> list[ShardInfo]:
    """Writes `tensors` (the whole cache, or consecutive chunk ranges as they come: each can be
    freed once handed over) into `root/rel_folder`, atomically; nothing is left on any failure."""
    writer = KVShardWriter(root, rel_folder, chunk_axis, max_shard_bytes, metadata)
    try:
        for part in [tensors] if isinstance(tensors, dict) else tensors:
            writer.append(part)
        if writer.num_chunks != num_chunks:
            raise ValueError(f"{num_chunks} chunk records for tensors holding {writer.num_chunks} chunks")
        return writer.finish()
    except BaseException:
        writer.abort()
        raise


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
                   verify_hash: bool, optional: Collection[str] = ()) -> dict[str, torch.Tensor]:
    """Loads and joins the shards (memory-mapped reads) onto `device`. Every tensor of
    `chunk_axis` must be there but those in `optional` (an encoding's scales)."""
    parts: dict[str, list[torch.Tensor]] = {}
    for shard in shards:
        check_shard(root, shard, verify_hash)
        try:
            with safe_open(str(root / shard.path), framework="pt", device="cpu") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                    parts.setdefault(name, []).append(f.get_tensor(name))
        except (SafetensorError, OSError, ValueError) as exc:
            raise KVFileError(f"KV file {shard.path} cannot be read: {exc}") from None
    missing = set(chunk_axis) - set(optional) - set(parts)
    if missing:
        raise KVFileError(f"KV files lack tensors: {', '.join(sorted(missing))}")
    out = {}
    for name, pieces in parts.items():
        joined = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=chunk_axis[name])
        out[name] = joined.to(device)
    return out


def read_kv_chunks(root: Path, shards: list[ShardInfo], chunk_axis: dict[str, int], ordinals: list[int],
                   device: torch.device | str, verify_hash: bool, optional: Collection[str] = ()
                   ) -> dict[str, torch.Tensor]:
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
    missing = set(chunk_axis) - set(optional) - set(parts)
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
