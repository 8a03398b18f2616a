"""A document's prefill split across the processes of a `torch.distributed` group (torchrun).

Rank 0 runs the service as usual (`DocQA.ingest`: extraction, the document's row, its job); when it
comes to prefilling, `DistributedKVService` hands the document's KV key to every rank. Each rank
reads the document's text from the shared data folder, cuts it into the same chunks
(`DocumentKVService.layout`), prefills its share of whole shards (`plan_shares`) and writes those
shard files straight into a folder the store staged for the cache (`DocumentStore.stage_kv`): the
same files, names and checksums a single process writes for those chunks. The ranks then report
their shards to rank 0 (an all_gather), which commits the cache only when every rank reported
success (`DocumentStore.commit_staged_kv`). A rank that fails reports its error and rank 0 commits
nothing; a rank that dies breaks the collective and rank 0 commits nothing either. Whatever was
staged is removed then, or by the store's recovery at the next open (a temporary folder; the
document's row stays 'ingesting' until its KV is stored, and recovery removes such rows).

Bit for bit: the KV of a chunk depends only on the chunk (each attends to itself alone), but a GPU's
kernels may round differently for another batch's shape. Shares therefore start on the one-process
run's batch grid whenever the document has enough such aligned pieces for every rank; then each
rank's batches are exactly the batches one process runs. Otherwise (short documents, many ranks)
shares are whole shards and the batches at their edges differ (`ShareReport.aligned`): the same
values on the CPU (tests/test_distributed_prefill.py checks it), possibly a last bit apart on a GPU.
"""

from __future__ import annotations

import bisect
import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from app.kv_service import CHUNK_AXIS, DocumentKVService, DocumentLayout, chunk_records, file_part
from engine import DocumentKV
from engine.method.chunking import ChunkedTokens, token_breaks
from engine.method.prefill import ProgressFn, chunks_per_batch, default_token_budget
from engine.method.sentences import sentence_starts
from storage import KVKey, StagedKV, StorageError
from storage.kv_files import ShardInfo, bytes_per_chunk, chunks_per_shard

logger = logging.getLogger(__name__)


class DistributedPrefillError(StorageError):
    """A distributed prefill did not store its document: a rank failed or stopped. Nothing of it
    was committed."""


class RankLost(DistributedPrefillError):
    """A rank stopped answering (it died, or the group timed out): the group cannot go on."""


@dataclass(frozen=True)
class RankShare:
    """Chunks [start, end) of a document, shards `first_shard`... of its cache: one rank's work."""

    rank: int
    start: int
    end: int
    first_shard: int


def plan_shares(num_chunks: int, per_shard: int, per_batch: int, world_size: int) -> list[RankShare]:
    """Contiguous runs of whole shards, one per rank, as even as the pieces allow. The pieces are
    runs of lcm(per_shard, per_batch) chunks (each share then starts where a one-process prefill
    starts a batch) when there are at least as many as ranks, else single shards. Ranks past the
    last piece get an empty share."""
    aligned = per_shard * per_batch // math.gcd(per_shard, per_batch)
    piece = aligned if math.ceil(num_chunks / aligned) >= world_size else per_shard
    pieces = math.ceil(num_chunks / piece)
    shares = []
    for rank in range(world_size):
        start = min(num_chunks, rank * pieces // world_size * piece)
        end = min(num_chunks, (rank + 1) * pieces // world_size * piece)
        shares.append(RankShare(rank, start, end, start // per_shard))
    return shares


SEAM_CHARS = 256  # characters each side of a cut that are tokenized whole to check it


def _cut_at_or_after(text: str, pos: int) -> int | None:
    """The first position from `pos` where a byte-level BPE's pre-tokenizer cuts whatever comes
    before: a space after a non-space and before a letter (the space starts the next word's token)."""
    for i in range(max(pos, 1), len(text) - 1):
        if text[i] == " " and not text[i - 1].isspace() and text[i + 1].isalpha():
            return i
    return None


def tokenize_in_pieces(tokenizer, text: str, pieces: int) -> tuple[list[int], list[tuple[int, int]]] | None:
    """`text`'s token ids and character spans as tokenizing it whole gives them, from `pieces`
    pieces tokenized at once (a fast tokenizer spreads a batch over its threads). The pieces are
    cut where the pre-tokenizer cuts anyway, and each cut is checked: a window of text around it,
    tokenized whole, must give exactly the tokens the pieces give there. None when the text is too
    short to cut, or any check fails (a tokenizer that treats a piece's start specially): then the
    caller tokenizes it whole."""
    n = len(text)
    if pieces < 2 or n < pieces * 4 * SEAM_CHARS:
        return None
    cuts = [0]
    for k in range(1, pieces):
        cut = _cut_at_or_after(text, k * n // pieces)
        if cut is None or cut < cuts[-1] + 2 * SEAM_CHARS or cut > n - 2 * SEAM_CHARS:
            return None
        cuts.append(cut)
    cuts.append(n)
    windows = [(_cut_at_or_after(text, c - SEAM_CHARS), _cut_at_or_after(text, c + SEAM_CHARS)) for c in cuts[1:-1]]
    if any(a is None or b is None or not a < c < b for (a, b), c in zip(windows, cuts[1:-1], strict=True)):
        return None
    texts = [text[a:b] for a, b in zip(cuts, cuts[1:], strict=False)] + [text[a:b] for a, b in windows]
    enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    ids: list[int] = []
    offsets: list[tuple[int, int]] = []
    for start, piece_ids, piece_offsets in zip(cuts, enc["input_ids"][:pieces], enc["offset_mapping"][:pieces],
                                               strict=False):
        ids += piece_ids
        offsets += [(a + start, b + start) for a, b in piece_offsets]
    starts = [a for a, _ in offsets]
    for (a, b), window_ids, window_offsets in zip(windows, enc["input_ids"][pieces:], enc["offset_mapping"][pieces:],
                                                  strict=True):
        i, j = bisect.bisect_left(starts, a), bisect.bisect_left(starts, b)
        if ids[i:j] != window_ids or offsets[i:j] != [(x + a, y + a) for x, y in window_offsets]:
            return None
    return ids, offsets


def share_chunks(chunks: ChunkedTokens, share: RankShare) -> ChunkedTokens:
    """The chunks of a share, as a document of their own (its batches start at the share's start)."""
    return ChunkedTokens(chunks.tokens[share.start:share.end], chunks.lengths[share.start:share.end],
                         chunks.content_starts[share.start:share.end])


@dataclass(frozen=True)
class PrefillJob:
    """What rank 0 hands every rank for one document (None ends the ranks' loop)."""

    key: KVKey


@dataclass(frozen=True)
class ShareReport:
    """What a rank tells rank 0 after writing its share: its shards, or why it could not."""

    rank: int
    shards: tuple[ShardInfo, ...] = ()
    error: str | None = None
    aligned: bool = True  # whether its batches were the one-process run's


@dataclass(frozen=True)
class RankGroup:
    """This process's place in the default `torch.distributed` group (set up by the caller)."""

    rank: int
    world_size: int

    @classmethod
    def current(cls) -> RankGroup:
        return cls(dist.get_rank(), dist.get_world_size())


class DistributedKVService(DocumentKVService):
    """A DocumentKVService whose ingest prefills are split across the ranks of `group`: rank 0's
    service calls `_prefill_alone` from `DocQA.ingest`; every other rank runs `serve_prefills`.
    Prefills asked for by a question (not an ingest) stay on the process that asks."""

    def __init__(self, *args: Any, group: RankGroup, tokenizer_pieces: int = 1, **kw: Any) -> None:
        """`tokenizer_pieces`: pieces a document's text is tokenized in at once (`tokenize_in_pieces`),
        so that the tokenizing every rank does in full costs a fraction of its time."""
        super().__init__(*args, **kw)
        self.group = group
        self.tokenizer_pieces = tokenizer_pieces
        self.lost = False  # a collective failed: the group cannot be used again

    def layout(self, doc_id: str, chunk_size: int) -> DocumentLayout:
        """As DocumentKVService.layout, the text tokenized in pieces when it can be (the same tokens)."""
        text = self.store.document_text(doc_id)
        pieces = tokenize_in_pieces(self.engine.tokenizer, text, self.tokenizer_pieces)
        if pieces is None:
            return super().layout(doc_id, chunk_size)
        ids, offsets = pieces
        breaks = token_breaks(sentence_starts(text), offsets)
        return DocumentLayout(text, ids, offsets, breaks, self.engine.chunk(ids, chunk_size, breaks))

    # ---- the collectives -----------------------------------------------------------------------

    def _collective(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except RuntimeError as exc:  # gloo and NCCL report a dead peer or a timeout this way
            self.lost = True
            # gloo's first line: "[file:line] Connection closed by peer [addr]. This is typically..."
            reason = re.sub(r"^\[[^\]]*\]\s*", "", str(exc).strip().splitlines()[0] if str(exc).strip() else "")
            reason = reason.split(". ")[0] or type(exc).__name__
            raise RankLost(f"a rank stopped before the prefill was done ({reason}); nothing was committed") from None

    def _broadcast(self, obj: Any) -> Any:
        box = [obj]
        self._collective(lambda: dist.broadcast_object_list(box, src=0))
        return box[0]

    def _gather(self, report: ShareReport) -> list[ShareReport]:
        out: list[Any] = [None] * self.group.world_size
        self._collective(lambda: dist.all_gather_object(out, report))
        return out

    # ---- rank 0 and the others -----------------------------------------------------------------

    def _prefill_alone(self, key: KVKey, progress: ProgressFn | None, must_persist: bool) -> DocumentKV | None:
        if self.group.world_size == 1 or not must_persist or self.group.rank != 0:
            return super()._prefill_alone(key, progress, must_persist)
        if self.lost:
            raise RankLost("the ranks' group stopped earlier; restart the run")
        self.prefills += 1
        self._broadcast(PrefillJob(key))
        self._prefill_shared(key, progress)
        return None

    def serve_prefills(self) -> int:
        """On ranks other than 0: prefills each document rank 0 hands out, until it says stop.
        Returns how many documents this rank took part in."""
        done = 0
        while (job := self._broadcast(None)) is not None:
            self._prefill_shared(job.key, None)
            done += 1
        self._leave_together()
        return done

    def stop_ranks(self) -> None:
        """On rank 0: ends the other ranks' `serve_prefills`."""
        if self.group.world_size > 1 and not self.lost:
            self._broadcast(None)
            self._leave_together()

    def _leave_together(self) -> None:
        """The ranks' last collective, so that no rank tears its group down while a peer is still in
        the last exchange: gloo can then abort the rank at exit ("terminate called without an active
        exception"), failing a run whose documents were all stored."""
        self._collective(dist.barrier)

    def _prefill_shared(self, key: KVKey, progress: ProgressFn | None) -> None:
        """Every rank: its share written into the cache rank 0 staged; on rank 0, the commit."""
        staged: StagedKV | None = None
        stage_error = ""
        if self.group.rank == 0:
            try:
                staged = self.store.stage_kv(key)
            except StorageError as exc:
                stage_error = str(exc)
        staged = self._broadcast(staged)
        report, layout = (self._write_share(staged, progress) if staged is not None
                          else (ShareReport(self.group.rank), None))
        try:
            reports = self._gather(report)
        except RankLost:
            if self.group.rank == 0 and staged is not None:
                self.store.discard_staged_kv(staged)
            raise
        if self.group.rank != 0:
            return
        if staged is None:
            raise StorageError(stage_error)
        failed = [r for r in reports if r.error is not None]
        if failed or layout is None:
            self.store.discard_staged_kv(staged)
            raise DistributedPrefillError("; ".join(f"rank {r.rank}: {r.error}" for r in failed)
                                          + " (nothing was committed)")
        if not all(r.aligned for r in reports):
            logger.info("%s: shares off the batch grid (a short document for %d ranks); on a GPU its KV may "
                        "differ in the last bit from a one-process prefill", key.document_id[:12],
                        self.group.world_size)
        records = chunk_records(layout.chunks, layout.offsets, layout.text, self.store.pages(key.document_id))
        self.store.commit_staged_kv(staged, [s for r in reports for s in r.shards], records, len(layout.offsets))

    def _write_share(self, staged: StagedKV, progress: ProgressFn | None
                     ) -> tuple[ShareReport, DocumentLayout | None]:
        """This rank's shards of the staged cache; any error is reported, not raised, so that every
        rank still meets the others at the gather."""
        rank, key = self.group.rank, staged.key
        try:
            if self.key(key.document_id, key.chunk_size) != key:
                raise StorageError("this rank runs another model, dtype or KV encoding than rank 0")
            layout = self.layout(key.document_id, key.chunk_size)
            share, aligned = self.share_of(layout.chunks)
            if share.start == share.end:
                return ShareReport(rank, aligned=aligned), layout
            mine = share_chunks(layout.chunks, share)
            with self.store.writing():
                writer = self.store.staged_writer(staged, CHUNK_AXIS, share.first_shard, share.start)
                try:
                    for part in self.file_parts(mine, progress):
                        writer.append(part)
                    shards = writer.finish()
                except BaseException:
                    writer.abort()
                    raise
            return ShareReport(rank, tuple(shards), aligned=aligned), layout
        except Exception as exc:  # noqa: BLE001 - reported to rank 0, which then commits nothing
            logger.warning("rank %d could not prefill its share of %s: %s", rank, key.document_id[:12], exc)
            return ShareReport(rank, error=str(exc) or type(exc).__name__), None

    def share_of(self, chunks: ChunkedTokens) -> tuple[RankShare, bool]:
        """This rank's share of a document's chunks, and whether it starts where a one-process
        prefill starts a batch."""
        budget = self.prefill_tokens
        per_batch = chunks_per_batch(chunks.chunk_size,
                                     budget if budget is not None else default_token_budget(self.engine.device))
        per_shard = chunks_per_shard(self._chunk_bytes(chunks), self.store.max_shard_bytes)
        share = plan_shares(chunks.num_chunks, per_shard, per_batch, self.group.world_size)[self.group.rank]
        return share, share.start % per_batch == 0

    def _chunk_bytes(self, chunks: ChunkedTokens) -> int:
        """Bytes a chunk takes in the KV files (what decides the shards' size): one chunk of zeros
        encoded as a prefill's batches are."""
        cfg = self.engine.config
        zeros = torch.zeros(cfg.num_layers, 1, cfg.num_kv_heads, chunks.chunk_size, cfg.head_dim,
                            dtype=self.engine.dtype)
        return bytes_per_chunk(file_part(zeros, zeros, chunks, 0, 1, self.encoding), CHUNK_AXIS)

