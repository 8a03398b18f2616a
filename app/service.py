"""The QA service (`DocQA`): documents in, streamed cited answers out.

It composes the pieces: ingestion (app.ingest), the store and KV pool (storage), the KV service
(prefill once, reuse forever) and the engine. The CLI and the Gradio UI are thin shells over it.
Model work is serialised by one lock (one model, one GPU); storage reads are concurrent. A question
holds the model for at most `request_timeout_s` and can be cancelled (a closed browser tab), and
its length is limited, so one request cannot starve the others.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import json
import logging
import re
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime, timezone
from pathlib import Path

import torch

from app.defaults import BUNDLED_MODEL, ModelDefaults, answer_params, model_defaults, prefilter_for
from app.grounding import Passage, grounded_answer, without_repeated_items
from app.ingest import IngestError, extract
from app.jobs import JobProgress, progress_of
from app.kv_service import DocumentKVService
from app.prefilter import PREFILTER_ALL
from app.viewer import (
    MIN_PLACED,
    TEXT_WINDOW,
    PageView,
    ViewerError,
    outline,
    part_count,
    passage_runs,
    render_pdf_page,
    spans_on_pages,
    text_part,
)
from engine import AnswerParams, AnswerResult, DocumentKV, Engine, JointAnswer, ReadsAlone
from engine.decode.loop import DecodeStep
from engine.engine import resolve_device
from engine.method.chunking import CONTENT_OFFSET
from engine.method.reading import abstains
from engine.model.weights import cpu_has_native_bf16, weight_file_digests
from engine.scheduler import AnswerScheduler, QueueFull, SchedulerStopped
from storage import DocumentRecord, DocumentStore, PageSpan, ResultCache, StorageError, TieredKVPool
from storage.kv_codec import DEFAULT_KV_ENCODING
from storage.kv_files import file_sha256
from storage.kv_pool import default_budgets
from storage.store import DEFAULT_MAX_SHARD_BYTES, write_atomically

logger = logging.getLogger(__name__)

MASK_GLYPH = "\u2591"  # shown for an answer slot still masked while the answer is denoised


@dataclass(frozen=True)
class ServiceConfig:
    data_dir: Path = Path("docqa-data")
    model_dir: Path = BUNDLED_MODEL
    device: str | None = None
    max_upload_bytes: int = 200 << 20
    extract_timeout_s: float = 300.0
    hot_bytes: int | None = None  # KV kept on the compute device (None: storage.kv_pool.default_budgets)
    warm_bytes: int | None = None  # KV kept in pinned CPU memory, GPU only (None: the default)
    kv_budget_bytes: int | None = None  # disk budget for KV files (None: unbounded)
    weak_score: float | None = None  # warn below this best chunk score (default: the model's)
    max_question_tokens: int = 512  # longer questions are refused (scoring cost grows with them)
    request_timeout_s: float = 300.0  # a question holds the model at most this long
    prefilter_chunks: int | None = None  # BM25 candidates a question scores (None: the model's default; 0: all)
    kv_encoding: str = DEFAULT_KV_ENCODING  # how KV files keep keys and values (storage.kv_codec)
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES  # the most bytes one KV file holds (storage.store)
    dtype: str | None = None  # "float32" or "bfloat16" (None: app_dtype for the device)
    # Questions that may wait for the model at once; one more is refused with ServiceBusy, so a
    # burst gets a quick "try again" instead of answers that arrive after everyone gave up.
    max_waiting_questions: int = 64
    # Questions decoded together in one batched forward a step (engine.scheduler); more wait.
    max_batch_questions: int = 16


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def app_dtype(device: torch.device, name: str | None = None) -> torch.dtype:
    """The dtype the app runs the model in: `name` when given; else bf16 on a GPU, and on a CPU bf16
    where it multiplies bf16 natively (about twice fp32's speed there; the model's scores in the
    model card are measured in bf16, on the GPU), fp32 elsewhere."""
    if name is not None:
        if name not in DTYPES:
            raise ValueError(f"unknown dtype {name!r}; choose from {', '.join(DTYPES)}")
        return DTYPES[name]
    if device.type == "cuda" or cpu_has_native_bf16():
        return torch.bfloat16
    return torch.float32


class QuestionStopped(RuntimeError):
    """A question was stopped before its answer: cancelled by its asker, or past its time budget."""


class DocumentNotFound(ValueError):
    """A name given for documents names none, or several: `code` says which
    ("document_not_found", "collection_not_found", "ambiguous_document", "empty_name")."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


# The faces that ask questions, kept with each conversation: the web page lists only its own (an
# API client's or the CLI's questions are not the page's conversations).
ORIGINS = ("web", "api", "cli")

# The shortest id prefix a document may be named by (the UI's table and `docqa list` show 12
# characters): shorter ones are too easily typed by mistake, and "" would match every id.
MIN_ID_PREFIX = 6


class ServiceBusy(RuntimeError):
    """More questions are waiting for the model than `ServiceConfig.max_waiting_questions`: the
    asker should try again shortly (HTTP 429 on the API)."""


RENDERED_PAGES_KEPT = 16  # page images the viewer keeps in memory (about 100 KB each)
UPLOAD_TEMP = "tmp"  # the app's own temporary folder in the data folder (the web UI's uploads)
STALE_UPLOAD_S = 3600.0  # uploads left there longer than this (by a killed server) are removed at start


def upload_debris(folder: Path, before: float | None = None) -> list[Path]:
    """The empty files directly in the app's temporary folder (modified before `before`, a time.time()
    value, when given): debris, never an upload. Gradio keeps each upload in a folder of its own, and
    its File component leaves one empty temporary file beside them for every file it hands to an
    event (gradio.components.File._process_single_file), which it never removes."""
    out = []
    for path in folder.iterdir() if folder.is_dir() else []:
        with contextlib.suppress(OSError):
            info = path.stat()
            if path.is_file() and info.st_size == 0 and (before is None or info.st_mtime < before):
                out.append(path)
    return out


@dataclass(frozen=True)
class DocumentInfo:
    record: DocumentRecord
    chunks: int
    tokens: int
    cached: bool
    kv_bytes: int


@dataclass(frozen=True)
class Citation:
    document_id: str
    document: str
    chunk: int
    pages: str  # printed page labels, "12" or "12-13"
    score: float
    text: str
    kept_tokens: list[int] = field(default_factory=list)  # per token slot, BOS first: (layer, head) pairs keeping it
    # The text as words, each with the largest share of (layer, head) pairs that kept one of its tokens
    # (0-1; None when the selection kept every token): what the Inspect view shades.
    kept_words: list[tuple[str, float | None]] = field(default_factory=list)
    # Where the chunk lies, for the document viewer: physical page indices (inclusive) and its
    # character span in the document's extracted text (-1: not known, an answer stored before).
    page_start: int = -1
    page_end: int = -1
    char_start: int = -1
    char_end: int = -1


# What an answer says where the model read none (it abstained): the reply a reader sees in place of
# an empty answer, and the first sentence of the warning such an answer carries.
NOT_FOUND_ANSWER = "Not found: no answer was read in the chosen passages."
# Measured (model card): where the bundled model abstains, the passage holding the answer is often
# among the chosen ones, in a wording it does not read; so the warning sends the reader to them
# rather than claiming they do not say it.
NOT_FOUND_WARNING = (f"{NOT_FOUND_ANSWER} The documents may not contain it, or may word it in a way the model does "
                     "not read: check the passages cited.")
# Where no chosen passage read alone confirmed the answer read over them together
# (AnswerParams.confirm_with_lone_reading): that answer was more likely made up than read.
UNCONFIRMED_WARNING = ("Not found: the answer read over the chosen passages together was not confirmed by "
                       "reading them one by one, so it is not shown: check the passages cited.")
UNGROUNDED_WARNING = ("Check this answer: none of the chosen passages contains it, so it may not come from "
                      "the documents.")


def may_yet_abstain(partial: str, abstain_answer: str | None) -> bool:
    """Pure: whether a partial answer (masked slots as MASK_GLYPH) may still end as the model's
    abstain answer ("not found"): its text before the first masked slot is empty or begins that
    answer. Such a partial is no answer to show yet: abstaining, the answer is NOT_FOUND_ANSWER."""
    if not abstain_answer:
        return False
    settled = partial.split(MASK_GLYPH, 1)[0].strip().lower().rstrip(".")
    return abstain_answer.lower().startswith(settled)


def answer_warning(text: str, citations: list[Citation], best_score: float, weak_score: float | None,
                   extractive: bool, abstain_answer: str | None, unconfirmed: bool = False
                   ) -> tuple[str, str | None]:
    """Pure: the answer as shown and the warning it carries, if any. The model's abstain answer
    ("not found" for the bundled model, trained to say so) shows as no answer with a warning, which
    says why where it stands for an `unconfirmed` answer (engine AnswerTrace.unconfirmed); an
    answer none of the passages contains, from a model that copies its answers (`extractive`), is
    shown as the passages' span it was copying where one is close (`closest_span`: a garbled copy),
    else flagged; a list's value given twice is shown once (`without_repeated_items`); then a best
    score below `weak_score` warns that the documents may not hold the answer."""
    if abstain_answer and abstains(text, abstain_answer):
        return "", UNCONFIRMED_WARNING if unconfirmed else NOT_FOUND_WARNING
    if extractive:
        shown = grounded_answer(text, [Passage(c.document_id, c.char_start, c.char_end, c.text) for c in citations])
        if shown is None:
            return text, UNGROUNDED_WARNING
        text = shown
    text = without_repeated_items(text)
    if weak_score is not None and best_score < weak_score:
        return text, ("The documents may not contain this: no passage explains the question well "
                      f"(best score {best_score:.2f}, below {weak_score:.2f}).")
    return text, None


@dataclass(frozen=True)
class AskResult:
    answer: str
    citations: list[Citation]
    warning: str | None
    conversation_id: str
    scores: list[dict]  # every candidate chunk: document, chunk, pages, score (the scorer's), bm25, selected
    anchors: list[list[float]]  # [selected chunk][layer] attention on each selected chunk's BOS
    timings: dict[str, float]
    steps: int
    cached: bool = False

    @property
    def reply(self) -> str:
        """The answer as a reader is told it: its text, or where the model read none, a sentence
        saying so (an empty reply reads as a failure)."""
        return self.answer or NOT_FOUND_ANSWER


@dataclass(frozen=True)
class AskEvent:
    kind: str  # "status" | "step" | "done"
    message: str = ""
    partial: str = ""  # the answer as denoised so far, masked slots as MASK_GLYPH
    result: AskResult | None = None
    # The partial answer may still be replaced whole: each chosen passage is read alone once it is
    # settled (AnswerParams.reads_chunks_alone), so even its settled text is not yet the answer.
    may_change: bool = False


ANSWER_MEMO = "answer-v9"  # {"document_ids": [...], "result": AskResult as JSON}
# Earlier versions' answers (another rule gave them), purged with a document as well: the memo
# would evict them only by age, and a deleted document's answers must not outlive it.
# v6: near copies of a span flagged, not mended; v7: the selection's margin read the fused scores;
# v8: list answers not completed from the chunks read alone
RETIRED_ANSWER_MEMOS = ("answer-v2", "answer-v3", "answer-v4", "answer-v5", "answer-v6", "answer-v7", "answer-v8")
# A PDF's extracted text and pages ({"text", "pages", "mime"}), by the document's id. "extracted"
# held pypdf's text, which glues the words of some PDFs (app.pdf_text): never read again, deleted
# with its document.
EXTRACTED_MEMO = "extracted-v2"
EXTRACTED_MEMOS = (EXTRACTED_MEMO, "extracted")


def citation_order(ranking: list[float], answered_from: int | None, gathered_from: Sequence[int] = ()
                   ) -> list[int]:
    """Pure: the order to cite selected chunks in (indices into `ranking`): the chunk that alone gave
    the answer first (AnswerParams.read_chunks_alone), then those that alone gave the values a list
    answer was completed with (AnswerTrace.gathered_from), then by the score the selection ranked
    them by, the scorer's fused with BM25. Measured on `docqa-tools eval-pdfs` (held-out manuals):
    the passage cited first held the answer for 8% of the questions in the scorer's own order, 28% in
    this one (58% among all the cited)."""
    return sorted(range(len(ranking)), key=lambda i: (i != answered_from, i not in gathered_from, -ranking[i]))


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def _page_label(pages: list, start: int, end: int) -> str:
    if not pages:
        return ""
    a, b = pages[min(start, len(pages) - 1)].label, pages[min(end, len(pages) - 1)].label
    return a if a == b else f"{a}-{b}"


def kept_words(text: str, token_spans: list[tuple[int, int]], kept: list[int]) -> list[tuple[str, float | None]]:
    """`text` cut after each run of whitespace into words, each with the largest share of (layer,
    head) pairs that kept one of its tokens. `token_spans` are the content tokens' character spans
    in `text`; `kept` counts per token slot, the chunk's BOS first (engine.method.chunking.CONTENT_OFFSET).
    Without counts (every token kept) the heat is None."""
    words = [(m.start(), m.end()) for m in re.finditer(r"\s*\S+\s*|\s+", text)]  # leading blanks join the first
    if not kept:
        return [(text[a:b], None) for a, b in words]
    top = max(kept) or 1
    heat = [kept[i + CONTENT_OFFSET] / top if i + CONTENT_OFFSET < len(kept) else 0.0
            for i in range(len(token_spans))]
    # A token belongs to the word holding its first visible character: the byte-level BPE puts the
    # space before a word into that word's first token, while the words keep it at their end.
    best = [0.0] * len(words)
    starts = [a for a, _ in words]
    for (a, b), h in zip(token_spans, heat, strict=True):
        visible = a + len(text[a:b]) - len(text[a:b].lstrip())
        w = max(bisect.bisect_right(starts, min(visible, max(b - 1, a))) - 1, 0)
        best[w] = max(best[w], h)
    return [(text[a:b], round(h, 3)) for (a, b), h in zip(words, best, strict=True)]


WEIGHT_DIGESTS_FILE = "fingerprints.json"


def kept_weight_digests(store: DocumentStore, model_dir: Path) -> dict[str, list]:
    """The checkpoint's weight-file digests, reusing those kept in the data folder from earlier
    runs and keeping any new ones there, so a 15 GB checkpoint is hashed once, not at every start.
    A file that cannot be read or written (read-only folder, full disk) only costs the hashing."""
    path = store.root / WEIGHT_DIGESTS_FILE
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    known = known if isinstance(known, dict) else {}
    digests = weight_file_digests(model_dir, known)
    if not store.read_only and any(known.get(k) != v for k, v in digests.items()):
        try:
            write_atomically(path, json.dumps(known | digests))
        except StorageError as exc:
            logger.warning("weight digests not kept: %s", exc)
    return digests


class DocQA:
    """`kv_service`: the class that prefills and loads KV (app.distributed_prefill's splits each
    prefill across torch.distributed ranks)."""

    def __init__(self, config: ServiceConfig = ServiceConfig(),
                 kv_service: Callable[..., DocumentKVService] = DocumentKVService) -> None:
        self.config = config
        # The store first: a missing or damaged library is reported before the model loads.
        self.store = DocumentStore(config.data_dir, kv_budget_bytes=config.kv_budget_bytes,
                                   max_shard_bytes=config.max_shard_bytes)
        device = resolve_device(config.device)
        self.engine = Engine.from_pretrained(config.model_dir, device=device, dtype=app_dtype(device, config.dtype),
                                             weight_digests=kept_weight_digests(self.store, config.model_dir))
        self.defaults: ModelDefaults = model_defaults(config.model_dir)
        hot, warm = default_budgets(self.engine.device)
        self.pool = TieredKVPool(self.engine.device, hot if config.hot_bytes is None else config.hot_bytes,
                                 warm if config.warm_bytes is None else config.warm_bytes)
        # Every question's model work runs on the scheduler's thread, batched with the others';
        # a prefill takes its turns between their steps.
        self.scheduler = AnswerScheduler(self.engine.runner, self.engine.tokenizer,
                                         max_batch=config.max_batch_questions,
                                         max_waiting=config.max_waiting_questions)
        self.kv = kv_service(self.engine, self.store, self.pool, config.kv_encoding, model_turn=self.scheduler.turn)
        self.memo = ResultCache(self.store.root / "memo", read_only=self.store.read_only)
        for doc_id in self.store.removed_unfinished:  # an ingest killed midway: its extracted text goes too
            self._forget_extraction(doc_id)
        if self.store.read_only:  # nothing can be added, but the web page still needs a folder of its own
            self.upload_dir = Path(tempfile.mkdtemp(prefix="docqa-uploads-"))
        else:
            self.upload_dir = self.store.root / UPLOAD_TEMP
            self.upload_dir.mkdir(exist_ok=True)
            self._remove_stale_uploads()
        self.weak_score = config.weak_score if config.weak_score is not None else self.defaults.weak_score
        self._jobs_lock = threading.Lock()
        self._job_cancels: dict[int, threading.Event] = {}  # running ingests of this process, by job id
        self._pages_lock = threading.Lock()
        self._rendered: OrderedDict[tuple[str, int], dict] = OrderedDict()  # the last pages drawn

    # ---- documents -------------------------------------------------------------------------------

    @property
    def read_only(self) -> bool:
        return self.store.read_only

    def ingest(self, data: bytes, name: str, password: str | None = None, chunk_size: int | None = None,
               progress: Callable[[str, float], None] | None = None,
               cancel: threading.Event | None = None) -> tuple[DocumentInfo, bool]:
        """Extracts, stores and prefills a file. Returns (info, added); an identical file already
        stored is not added twice. Raises IngestError with a clear message; a file that fails at
        any stage (unreadable, a full disk, an interrupted prefill) leaves nothing in the library.
        Progress goes to `progress` and to the jobs table (visible after a page refresh), in pages
        and chunks. Setting `cancel` (or `cancel_job` with this job's id) stops the ingest at its
        next page or chunk batch: IngestError "cancelled", nothing of the file kept."""
        name = Path(name).name or "document"
        try:
            job = self.store.start_job(name)
        except StorageError as exc:
            raise IngestError("read_only" if self.read_only else "storage", f"{name} cannot be added: {exc}") from None
        cancel = cancel or threading.Event()
        with self._jobs_lock:
            self._job_cancels[job] = cancel
        last, phase = [0.0], [""]

        def say(stage: str, frac: float, pages: tuple[int, int] | None = None,
                chunks: tuple[int, int] | None = None) -> None:
            if cancel.is_set() and stage != "ready":  # once stored it is added: too late to cancel
                raise IngestError("cancelled", f"adding {name} was cancelled; nothing of it was kept")
            if progress is not None:
                progress(stage, frac)
            began = None
            if stage.split()[0] != phase[0]:  # a new stage: its rate (and so the time left) starts anew
                phase[0] = stage.split()[0]
                began = _utc_now()
            now = time.monotonic()
            if now - last[0] > 0.5 or frac >= 1.0 or began is not None:
                last[0] = now
                self.store.update_job(job, stage, frac, pages=pages, chunks=chunks, stage_started_at=began)

        try:
            with self.store.writing():  # a document 'ingesting' here is not another process's debris
                result = self._ingest(data, name, password, chunk_size, say)
        except BaseException as exc:
            self.store.finish_job(job, str(exc) or type(exc).__name__)
            raise
        finally:
            with self._jobs_lock:
                self._job_cancels.pop(job, None)
        self.store.finish_job(job)
        return result

    def cancel_job(self, job_id: int) -> bool:
        """Asks the running ingest `job_id` of this service to stop; False when none runs by that id."""
        with self._jobs_lock:
            event = self._job_cancels.get(int(job_id))
        if event is None:
            return False
        event.set()
        return True

    def jobs(self, active_only: bool = False) -> list[dict]:
        return self.store.jobs(active_only)

    def ingest_progress(self, active_only: bool = True) -> list[JobProgress]:
        """The ingests running now (or the latest ones), as pages and chunks done and time left."""
        now = datetime.now(timezone.utc)
        return [progress_of(row, now) for row in self.store.jobs(active_only)]

    def _ingest(self, data, name, password, chunk_size, say) -> tuple[DocumentInfo, bool]:
        doc_id = hashlib.sha256(data).hexdigest()
        existing = self.store.get_document(doc_id)
        added = existing is None or existing.status != "ready"
        created = False  # whether this call stored the document (and so removes it if it fails)
        if existing is not None and existing.status == "failed" and self.store.has_text(doc_id):
            record = existing  # a retry: the text is stored, the KV is what failed
        elif added:
            created = True
            say("extracting", 0.0)
            entry = self.memo.get(EXTRACTED_MEMO, doc_id)  # the same bytes were extracted before
            remember = False
            if entry is None:
                doc = extract(data, name, self.config.max_upload_bytes, password, self.config.extract_timeout_s,
                              lambda done, total: say(f"extracting page {done}/{total}", 0.5 * done / total,
                                                      pages=(done, total)))
                entry = {"text": doc.text, "pages": [asdict(p) for p in doc.pages], "mime": doc.mime}
                remember = not doc.encrypted  # an encrypted PDF's text is never kept where no password guards it
            page_spans = [PageSpan(**p) for p in entry["pages"]]
            try:
                # The row first ('ingesting'): whatever a kill leaves after it, recovery accounts for.
                record, _ = self.store.add_document(doc_id, name, entry["mime"], len(data), entry["text"], page_spans,
                                                    status="ingesting")
                self.store.keep_upload(doc_id, name, data)
            except StorageError as exc:
                self.store.delete_document(doc_id)
                raise IngestError("storage", f"{name} could not be stored: {exc}") from None
            if remember:  # once its row exists: a kill from here on is undone by recovery, memo included
                try:
                    self.memo.set(EXTRACTED_MEMO, doc_id, entry)
                except Exception as exc:  # noqa: BLE001 - a cache: the ingest goes on without it
                    logger.warning("could not memoise the extraction of %s: %s", name, exc)
        else:
            record = existing
        if not created:  # the same bytes, perhaps under another name: that name finds this document too
            self.store.add_document_name(doc_id, name)
        size = chunk_size or self.defaults.chunk_size
        say("encoding", 0.5)
        try:
            pages = (record.page_count, record.page_count)
            self.kv.ensure_stored(doc_id, size, lambda done, total: say(
                f"encoding chunk {done}/{total}", 0.5 + 0.5 * done / max(total, 1), pages=pages,
                chunks=(done, total)))
        except StorageError as exc:
            if created:  # a new document that cannot be stored whole is not kept at all
                self._discard(doc_id)
                raise IngestError("storage", f"{name} was not added: its KV cache could not be stored ({exc}). "
                                             "Nothing of it was kept; add it again once that is fixed.") from None
            self.store.set_status(doc_id, "failed", str(exc))  # a library's earlier failed entry stays one
            raise IngestError("storage", f"{name} was read but its KV cache could not be stored: {exc}. It is listed "
                                         "as failed; add it again to retry.") from None
        except BaseException:
            if created:  # nothing half-stored: a new document goes again whole
                self._discard(doc_id)
            raise
        if record.status != "ready":
            self.store.set_status(doc_id, "ready")
            record = self.store.get_document(doc_id)
        say("ready", 1.0)
        return self.document_info(record, size), added

    def _discard(self, doc_id: str) -> None:
        """Removes what an ingest that did not finish stored of a new document."""
        self.kv.forget(doc_id)
        self.store.delete_document(doc_id)
        self._forget_extraction(doc_id)

    def _forget_extraction(self, doc_id: str) -> None:
        for namespace in EXTRACTED_MEMOS:
            self.memo.delete(namespace, doc_id)

    def ingest_file(self, path: str | Path, **kw) -> tuple[DocumentInfo, bool]:
        path = Path(path)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise IngestError("missing", f"no such file: {path}") from None
        except IsADirectoryError:
            raise IngestError("wrong_type", f"{path} is a folder, not a file") from None
        return self.ingest(data, path.name, **kw)

    def document_info(self, record: DocumentRecord, chunk_size: int | None = None) -> DocumentInfo:
        key = self.kv.key(record.id, chunk_size or self.defaults.chunk_size)
        cache = self.store.find_kv(key)
        return DocumentInfo(record, cache.num_chunks if cache else 0, cache.num_tokens if cache else 0,
                            cache is not None, cache.bytes if cache else 0)

    def documents(self, include_failed: bool = False) -> list[DocumentInfo]:
        """The documents that can be asked; with `include_failed`, also those whose KV could not be
        stored (status 'failed', with the reason in `record.error`)."""
        statuses = ("ready", "failed") if include_failed else ("ready",)
        return [self.document_info(r) for r in self.store.list_documents(statuses)]

    def names_of(self, doc_id: str) -> list[str]:
        """The names document `doc_id` was added under, its first one first."""
        return self.store.document_names().get(doc_id, [])

    def resolve_documents(self, names: list[str], include_failed: bool = False, listing: str = "the library"
                          ) -> list[str]:
        """Document ids for names as a person gives them: a document's id, an id prefix of at least
        MIN_ID_PREFIX characters, a name it was added under, or "@collection". Raises
        DocumentNotFound for a name that names none, or several; `listing` is where to look them up
        ("docqa list"), named in its message."""
        docs = self.documents(include_failed=include_failed)
        known_names = self.store.document_names()
        collections = self.collections()
        ids: list[str] = []
        for name in names:
            name = name.strip()
            if not name:
                raise DocumentNotFound("empty_name", f"a document name or id is empty (see {listing})")
            if name.startswith("@"):
                if name[1:] not in collections:
                    raise DocumentNotFound("collection_not_found", f"no collection named {name[1:]!r}")
                ids += collections[name[1:]]
                continue
            hits = [d.record.id for d in docs if name == d.record.id or name in known_names.get(d.record.id, ())
                    or (len(name) >= MIN_ID_PREFIX and d.record.id.startswith(name))]
            if not hits:
                raise DocumentNotFound("document_not_found", f"no stored document named {name!r} (see {listing})")
            if len(hits) > 1:
                raise DocumentNotFound("ambiguous_document", f"{name!r} matches several documents; give the id of "
                                                             f"the one to read (see {listing})")
            ids.append(hits[0])
        return list(dict.fromkeys(ids))

    def delete(self, doc_id: str) -> bool:
        """Deletes a document and everything derived from it: its rows, text, KV, original upload,
        memoised extraction and answers, and any copy left in the app's temporary folder."""
        if self.store.get_document(doc_id) is None:
            return False
        self.store.require_writable()
        self.kv.forget(doc_id)
        found = self.store.delete_document(doc_id)
        self._forget_extraction(doc_id)
        for namespace in (ANSWER_MEMO, *RETIRED_ANSWER_MEMOS):
            self.memo.delete_where(namespace, lambda entry: doc_id in entry.get("document_ids", []))
        self.memo.compact_log()
        self.discard_uploads(doc_id)
        return found

    def discard_uploads(self, doc_id: str) -> None:
        """Removes the uploaded files holding document `doc_id`'s bytes from the app's temporary
        folder, and the folders they leave empty."""
        for path in sorted(self.upload_dir.rglob("*"), reverse=True) if self.upload_dir.exists() else []:
            with contextlib.suppress(OSError):
                if path.is_dir():
                    if not any(path.iterdir()):
                        path.rmdir()
                elif file_sha256(path) == doc_id:
                    path.unlink()

    def discard_upload_file(self, path: str | Path) -> None:
        """Removes one uploaded file (and its folder, once empty) from the app's temporary folder."""
        path = Path(path)
        if not path.resolve().is_relative_to(self.upload_dir.resolve()):
            return
        path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            if path.parent.resolve() != self.upload_dir.resolve():
                path.parent.rmdir()  # Gradio keeps each upload in a folder of its own

    def discard_upload_debris(self, before: float | None = None) -> None:
        """Removes the empty files Gradio leaves in the app's temporary folder (`upload_debris`);
        `before`: only those older than that moment, so an upload still arriving is left alone."""
        for path in upload_debris(self.upload_dir, before):
            path.unlink(missing_ok=True)

    def _remove_stale_uploads(self) -> None:
        cutoff = time.time() - STALE_UPLOAD_S
        for path in self.upload_dir.rglob("*"):
            with contextlib.suppress(OSError):
                if path.is_file() and path.stat().st_mtime < cutoff:
                    path.unlink()
        self.discard_upload_debris()  # whatever their age: no upload is ever an empty file

    def save_collection(self, name: str, document_ids: list[str]) -> None:
        self.store.save_collection(name, document_ids)

    def collections(self) -> dict[str, list[str]]:
        return self.store.collections()

    def delete_collection(self, name: str) -> bool:
        return self.store.delete_collection(name)

    # ---- questions -------------------------------------------------------------------------------

    def _kept_words(self, text: str, kept: list[int]) -> list[tuple[str, float | None]]:
        enc = self.engine.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return kept_words(text, [tuple(span) for span in enc["offset_mapping"]], kept)

    def params(self, **overrides) -> AnswerParams:
        return answer_params(self.defaults, **overrides)

    def check_question(self, question: str) -> str:
        """The question stripped, or ValueError: empty, or longer than `max_question_tokens`."""
        question = question.strip()
        if not question:
            raise ValueError("the question is empty")
        limit = self.config.max_question_tokens
        too_long = (f"the question is too long: at most {limit} tokens (about {4 * limit} characters) are read; "
                    "ask it in fewer words")
        if len(question) > 16 * limit:  # refused before tokenizing a huge paste
            raise ValueError(too_long)
        if len(self.engine.tokenizer(question, add_special_tokens=False)["input_ids"]) > limit:
            raise ValueError(too_long)
        return question

    def ask(self, question: str, document_ids: list[str], params: AnswerParams | None = None,
            conversation_id: str | None = None, chunk_size: int | None = None,
            cancel: threading.Event | None = None, prefilter_chunks: int | None = None,
            origin: str = "web") -> Iterator[AskEvent]:
        """Streams the answer as it is denoised, then the cited result (also stored in SQLite).

        Raises ValueError for a question that cannot be asked (empty, too long, no or unknown
        documents), QuestionStopped when `cancel` is set or the time budget runs out (also while it
        waits for its place) or the server is stopping, ServiceBusy when too many questions wait.
        Closing the generator also frees the model (at the next decode step).

        `prefilter_chunks`: how many chunks, the best by BM25, the scorer sees (None: the model's
        default for the engine's device, `app.defaults.prefilter_for`; 0: all). Absolute positions
        place every chunk at its ordinal, so they score all. `origin`: the face asking ('web', 'api',
        'cli'), kept with the conversation its first answer starts; the web page lists its own."""
        question = self.check_question(question)
        if origin not in ORIGINS:
            raise ValueError(f"origin {origin!r} is not one of {', '.join(ORIGINS)}")
        if not document_ids:
            raise ValueError("choose at least one document")
        records = [self._askable(doc_id) for doc_id in dict.fromkeys(document_ids)]
        params = params or self.params()
        size = chunk_size or self.defaults.chunk_size
        m = next(v for v in (prefilter_chunks, self.config.prefilter_chunks,
                             prefilter_for(self.defaults, self.engine.device.type)) if v is not None)
        if m < 0:
            raise ValueError(f"prefilter_chunks must be 0 (all chunks) or more, got {m}")
        if params.position_mode == "absolute":
            m = PREFILTER_ALL
        request_key = hashlib.sha256(json.dumps(
            [question, sorted(r.id for r in records), repr(params), size, m, self.kv.fingerprint]).encode()).hexdigest()
        hit = self.memo.get(ANSWER_MEMO, request_key)
        if hit is not None:
            result = replace(self._result_from_json(hit["result"]), conversation_id=conversation_id or "", cached=True)
            result = self._record(result, question, document_ids, params, origin)
            yield AskEvent("done", "answered from cache", result.answer, result)
            return
        stop = self._stopper(cancel)
        candidates, priors = self.kv.candidates([r.id for r in records], size, question, m)
        load_s = 0.0

        def load() -> list[DocumentKV]:
            """The candidates' KV, loaded once the scheduler takes the question off its queue (on a
            loader thread: the scheduler's GPU work goes on meanwhile)."""
            nonlocal load_s
            start = time.perf_counter()
            docs = [self.kv.get(r.id, size) if len(chosen) == self.kv.num_chunks(r.id, size)
                    else self.kv.get_chunks(r.id, size, chosen) for r, chosen in zip(records, candidates, strict=True)]
            load_s = time.perf_counter() - start
            return docs

        yield AskEvent("status", "waiting for the model")
        canvas = [None] * params.sampling.gen_length
        final: AnswerResult | None = None
        joint: AnswerResult | None = None  # the answer over all chosen passages, before each is read alone
        may_change = False  # each chosen passage is read alone after the steps (ReadsAlone)
        try:
            handle = self.scheduler.submit(load, question, params, priors, interrupt_check=stop)
        except QueueFull:
            raise ServiceBusy(f"the server is busy ({self.config.max_waiting_questions} questions are waiting); "
                              "try again shortly") from None
        except SchedulerStopped as exc:
            raise QuestionStopped(str(exc)) from None
        try:
            # `stop` is also called while the question waits for its place, so a cancel or the
            # budget ends it there too. The first event comes once the scheduler chose the chunks.
            for event in handle.events(check=stop):
                # A finished answer past the time budget is still given; a cancelled one never.
                stop(budget=isinstance(event, DecodeStep))
                if isinstance(event, DecodeStep):
                    for pos, tok in zip(event.positions, event.tokens, strict=True):
                        canvas[pos] = tok
                    yield AskEvent("step", partial=self._render(canvas), may_change=may_change)
                elif isinstance(event, ReadsAlone):
                    may_change = True
                elif isinstance(event, JointAnswer):
                    joint = event.result
                    yield AskEvent("status", "reading each chosen passage alone", partial=self._render(canvas),
                                   may_change=True)
                else:
                    final = event
        except QuestionStopped:
            # Past the budget while the passages are read alone: the joint answer is an answer,
            # unless it had to be confirmed by them (then it is not found, saying why).
            if joint is None or (cancel is not None and cancel.is_set()):
                raise
            logger.warning("reading the chosen passages alone ran past the time budget; answering without it")
            if params.confirm_with_lone_reading and not abstains(joint.text, params.abstain_answer):
                joint = replace(joint, text=params.abstain_answer, trace=replace(joint.trace, unconfirmed=joint.text))
        except SchedulerStopped as exc:
            raise QuestionStopped(str(exc)) from None
        finally:  # stopped listening, cancelled or past the budget: the scheduler drops it at its next step
            handle.cancel()
        if final is None and joint is None:  # the scheduler ended it without a result (it was closed meanwhile)
            raise QuestionStopped("the question was stopped before its answer")
        result = self._build_result(final or joint, records, size, conversation_id or "", load_s, candidates)
        if final is not None and not final.trace.lone_failed:  # an unchecked answer is not kept for the next asker
            self.memo.set(ANSWER_MEMO, request_key, {"document_ids": [r.id for r in records],
                                                     "result": self._result_to_json(result)})
        result = self._record(result, question, document_ids, params, origin)
        yield AskEvent("done", partial=result.answer, result=result)

    def _askable(self, doc_id: str) -> DocumentRecord:
        rec = self.store.get_document(doc_id) if doc_id else None
        if rec is None:
            raise ValueError(f"unknown document {doc_id!r}")
        if rec.status == "failed":
            raise ValueError(f"{rec.name} could not be stored ({rec.error}); add it again to retry")
        if rec.status != "ready":
            raise ValueError(f"{rec.name} is still being added")
        return rec

    def _stopper(self, cancel: threading.Event | None) -> Callable[..., None]:
        """Raises QuestionStopped once the question is cancelled or (with `budget`) past its time
        budget."""
        seconds = self.config.request_timeout_s
        deadline = time.monotonic() + seconds

        def stop(budget: bool = True) -> None:
            if cancel is not None and cancel.is_set():
                raise QuestionStopped("the question was cancelled")
            if budget and time.monotonic() > deadline:
                raise QuestionStopped(f"the answer took longer than {seconds:.0f} s and was stopped; "
                                      "choose fewer documents or ask a shorter question")
        return stop

    def close(self) -> None:
        """Stops the scheduler's thread; questions still running end with an error."""
        self.scheduler.close()

    def answer(self, question: str, document_ids: list[str], **kw) -> AskResult:
        result = None
        for event in self.ask(question, document_ids, **kw):
            if event.kind == "done":
                result = event.result
        return result

    def _render(self, canvas: list[int | None]) -> str:
        """The partial answer: committed tokens decoded, masked slots as a glyph, up to a stop token."""
        out, run = [], []
        stops = set(self.engine.config.stop_token_ids)
        for tok in canvas:
            if tok is not None and tok in stops:
                break
            if tok is None:
                if run:
                    out.append(self.engine.tokenizer.decode(run, skip_special_tokens=True))
                    run = []
                out.append(MASK_GLYPH)
            else:
                run.append(tok)
        if run:
            out.append(self.engine.tokenizer.decode(run, skip_special_tokens=True))
        return "".join(out).rstrip(MASK_GLYPH) or MASK_GLYPH

    def _build_result(self, res: AnswerResult, records: list[DocumentRecord], size: int, conversation_id: str,
                      load_s: float, candidates: list[list[int]]) -> AskResult:
        """`candidates`: per document, the chunk ordinals the engine was given (its refs index them)."""
        tr = res.trace
        chunk_meta = {i: self.kv.chunks(r.id, size) for i, r in enumerate(records)}
        pages = {i: self.store.pages(r.id) for i, r in enumerate(records)}
        selected = {(c.document, c.chunk) for c in tr.selected}
        scores = []
        priors = tr.priors or [0.0] * len(tr.candidates)
        for ref, score, prior in zip(tr.candidates, tr.scores, priors, strict=True):
            ordinal = candidates[ref.document][ref.chunk]
            meta = chunk_meta[ref.document][ordinal]
            scores.append({"document": records[ref.document].name, "document_id": records[ref.document].id,
                           "chunk": ordinal, "score": score, "bm25": prior,
                           "pages": _page_label(pages[ref.document], meta.page_start, meta.page_end),
                           "page_start": meta.page_start, "page_end": meta.page_end,
                           "char_start": meta.char_start, "char_end": meta.char_end,
                           "document_pages": records[ref.document].page_count,
                           "document_chars": records[ref.document].text_chars,
                           "selected": (ref.document, ref.chunk) in selected})
        citations = []
        for j, (ref, score) in enumerate(zip(tr.selected, tr.selected_scores, strict=True)):
            ordinal = candidates[ref.document][ref.chunk]
            meta = chunk_meta[ref.document][ordinal]
            kept = tr.kept_tokens[j] if j < len(tr.kept_tokens) else []
            citations.append(Citation(records[ref.document].id, records[ref.document].name, ordinal,
                                      _page_label(pages[ref.document], meta.page_start, meta.page_end), score,
                                      meta.text, kept, self._kept_words(meta.text, kept),
                                      meta.page_start, meta.page_end, meta.char_start, meta.char_end))
        # The anchors' rows follow the selection (document order); they are kept in the
        # citations' order (best first), so that row i is citation i wherever they are shown.
        anchor_rows = tr.anchors_decode.tolist() if tr.anchors_decode is not None else []
        order = citation_order(tr.selected_fused_scores or tr.selected_scores, tr.answered_from, tr.gathered_from)
        citations = [citations[i] for i in order]
        anchors = [anchor_rows[i] for i in order] if len(anchor_rows) == len(order) else anchor_rows
        best = max(tr.selected_scores, default=float("-inf"))
        answer, warning = answer_warning(res.text, citations, best, self.weak_score, self.defaults.extractive_answers,
                                         self.defaults.abstain_answer, tr.unconfirmed is not None)
        timings = {"load_kv": load_s, **tr.timings}
        return AskResult(answer, citations, warning, conversation_id, scores, anchors, timings, tr.steps)

    def _record(self, result: AskResult, question: str, document_ids: list[str], params: AnswerParams,
                origin: str) -> AskResult:
        """Stores the answer in its conversation, which a first answer starts (a question never
        answered leaves none, empty); returns the result with its conversation's id."""
        if self.read_only:  # a read-only library keeps no history
            return result
        if not result.conversation_id:
            result = replace(result, conversation_id=self.store.create_conversation(question[:80], origin))
        # Each citation whole but its per-slot counts (the words carry their shading), so the
        # answer's sources and Inspect view reopen from the history, also after a restart.
        cites = [{k: v for k, v in asdict(c).items() if k != "kept_tokens"} for c in result.citations]
        self.store.add_message(
            result.conversation_id, question, result.answer, document_ids, json.loads(json.dumps(asdict(params))),
            cites, result.timings, warning=result.warning, scores=result.scores, anchors=result.anchors)
        return result

    @staticmethod
    def _result_to_json(result: AskResult) -> dict:
        return asdict(result)

    @staticmethod
    def _result_from_json(data: dict) -> AskResult:
        data = dict(data)
        data["citations"] = [Citation(**c) for c in data["citations"]]
        return AskResult(**data)

    def conversations(self, origin: str | None = "web") -> list[dict]:
        """The conversations `origin` asked (None: every face's), the latest first."""
        return self.store.list_conversations(origin)

    def messages(self, conversation_id: str):
        return self.store.messages(conversation_id)

    def stored_results(self, conversation_id: str) -> list[tuple[str, AskResult]]:
        """A conversation's questions with their answers as results, as the chat and the Inspect
        view show them again after a restart. Answers stored before citations kept their spans
        find them from the document's chunks where it is still in the library."""
        out = []
        for m in self.messages(conversation_id):
            citations = [self._stored_citation(c, m.documents) for c in m.selected_chunks]
            out.append((m.question, AskResult(m.answer, [c for c in citations if c is not None], m.warning,
                                              conversation_id, m.scores, m.anchors, m.timings, 0)))
        return out

    def _stored_citation(self, c: dict, document_ids: list[str]) -> Citation | None:
        known = {f.name for f in fields(Citation)}
        c = {k: v for k, v in c.items() if k in known}
        c.setdefault("text", "")
        c["kept_words"] = [tuple(w) for w in c.get("kept_words", [])]
        if "document_id" not in c:  # stored before citations carried their document's id and span
            match = [r for r in (self.store.get_document(d) for d in document_ids) if r and r.name == c["document"]]
            if not match:
                return Citation("", c["document"], int(c.get("chunk", 0)), str(c.get("pages", "")),
                                float(c.get("score", 0.0)), "")
            c["document_id"] = match[0].id
            chunks = self.kv.chunks(match[0].id, self.defaults.chunk_size)
            if 0 <= c.get("chunk", -1) < len(chunks):
                meta = chunks[c["chunk"]]
                c.update(text=meta.text, page_start=meta.page_start, page_end=meta.page_end,
                         char_start=meta.char_start, char_end=meta.char_end)
        return Citation(**c)

    # ---- the document viewer ---------------------------------------------------------------------

    def view(self, document_id: str, page: int | None = None, span: tuple[int, int] | None = None) -> PageView:
        """One page of a document, with the part of `span` (a chunk's character span in the
        document's text) that lies on it highlighted: a PDF page as an image with the passage's
        lines boxed, a text document's part as text with the passage marked. `page` is the
        physical page (text: the part) from 0; None: the first page the span touches. Raises
        ViewerError with a clear message (no such document or page)."""
        record = self.store.get_document(document_id) if document_id else None
        if record is None or record.status != "ready":
            raise ViewerError("missing", "this document is no longer in the library")
        try:
            text, pages = self.store.document_text(document_id), self.store.pages(document_id)
        except StorageError as exc:
            raise ViewerError("missing", str(exc)) from None
        span = span if span is not None and 0 <= span[0] < span[1] <= len(text) else None
        if record.mime != "application/pdf":
            return self._view_text(record, text, page, span)
        on_pages = spans_on_pages(*span, pages) if span else {}
        if page is None:
            page = min(on_pages, default=0)
        if not 0 <= page < len(pages):
            raise ViewerError("out_of_range", f"page {page + 1} does not exist: {record.name} has {len(pages)} pages")
        return self._view_pdf_page(record, text, pages, page, on_pages)

    def _view_text(self, record: DocumentRecord, text: str, part: int | None, span) -> PageView:
        count = part_count(len(text))
        if part is None:
            part = span[0] // TEXT_WINDOW if span else 0
        if not 0 <= part < count:
            raise ViewerError("out_of_range",
                              f"part {part + 1} does not exist: {record.name} is shown in {count} parts")
        lo, hi = text_part(len(text), part)
        if span and span[0] < hi and span[1] > lo:  # the passage whole, where it starts in this part
            lo, hi = min(lo, span[0]), max(hi, span[1])
        return PageView(record.id, record.name, "text", part, count, f"part {part + 1} of {count}",
                        passage=passage_runs(text, (lo, hi), [span] if span else []))

    def _view_pdf_page(self, record: DocumentRecord, text: str, pages: list[PageSpan], page: int,
                       on_pages: dict[int, tuple[int, int]]) -> PageView:
        p = pages[page]
        label = p.label or str(page + 1)
        page_text = text[p.char_start:p.char_end]
        local = on_pages.get(page)
        marks = [(p.char_start + local[0], p.char_start + local[1])] if local else []
        elsewhere = sorted(i for i in on_pages if i != page)
        more = (f" The passage continues on page {', '.join(pages[i].label for i in elsewhere)}." if elsewhere
                else "")
        as_text = passage_runs(text, (p.char_start, p.char_end), marks)
        try:
            rendered = self._rendered_page(record.id, page)
        except ViewerError as exc:  # no image (encrypted, damaged for PDFium): the page's text instead
            return PageView(record.id, record.name, "text", page, len(pages), label, passage=as_text,
                            note=f"The page image cannot be shown: {exc}. Its text is shown instead.{more}")
        if local is None:
            return PageView(record.id, record.name, "pdf", page, len(pages), label, rendered["png"],
                            note=(f"The cited passage is on page {', '.join(pages[i].label for i in elsewhere)}."
                                  if elsewhere else ""))
        if rendered["rotation"]:
            return PageView(record.id, record.name, "pdf", page, len(pages), label, rendered["png"], passage=as_text,
                            note=f"This page is rotated; the cited passage is marked in its text below.{more}")
        boxes, share = outline(page_text, local, rendered)
        if share < MIN_PLACED or not boxes:
            return PageView(record.id, record.name, "pdf", page, len(pages), label, rendered["png"], passage=as_text,
                            note="The cited passage could not be placed on the page image exactly; it is marked "
                                 f"in the page's text below.{more}")
        return PageView(record.id, record.name, "pdf", page, len(pages), label, rendered["png"], boxes,
                        note=more.strip())

    def _rendered_page(self, doc_id: str, page: int) -> dict:
        """The page drawn by PDFium, the last few kept in memory (paging back and forth is instant)."""
        key = (doc_id, page)
        with self._pages_lock:
            if key in self._rendered:
                self._rendered.move_to_end(key)
                return self._rendered[key]
        originals = [p for p in self.store.uploads_of(doc_id) if p.suffix.lower() == ".pdf"]
        if not originals:
            raise ViewerError("missing", "the original PDF is not in the data folder")
        rendered = render_pdf_page(originals[0], page)
        with self._pages_lock:
            self._rendered[key] = rendered
            while len(self._rendered) > RENDERED_PAGES_KEPT:
                self._rendered.popitem(last=False)
        return rendered


@dataclass(frozen=True)
class ModelInfo:
    name: str  # the model folder's name
    family: str  # "dream" | "llada"
    parameters: int
    device: str  # "NVIDIA H200 (cuda:0)", "CPU (AMD EPYC 9454)"
    dtype: str  # "bfloat16", "float32"
    bundled: bool  # the project's own docqa-tiny


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def model_info(service: DocQA) -> ModelInfo:
    dev = service.engine.device
    if dev.type == "cuda":
        where = f"{torch.cuda.get_device_name(dev)} ({dev})"
    else:
        cpu = _cpu_name()
        where = f"CPU ({cpu})" if cpu else "CPU"
    folder = Path(service.config.model_dir)
    bundled = folder.resolve() == BUNDLED_MODEL.resolve()
    return ModelInfo(folder.name, service.engine.config.family,
                     sum(p.numel() for p in service.engine.model.parameters()), where,
                     str(service.engine.dtype).removeprefix("torch."), bundled)


def device_summary(service: DocQA) -> str:
    info = model_info(service)
    return f"{info.name} on {info.device} ({info.dtype})"
