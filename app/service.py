"""The QA service (`DocQA`): documents in, streamed cited answers out.

It composes the pieces: ingestion (app.ingest), the store and KV pool (storage), the KV service
(prefill once, reuse forever) and the engine. The CLI and the Gradio UI are thin shells over it.
Model work is serialised by one lock (one model, one GPU); storage reads are concurrent.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from app.defaults import BUNDLED_MODEL, ModelDefaults, answer_params, model_defaults
from app.ingest import IngestError, extract
from app.kv_service import DocumentKVService
from engine import AnswerParams, AnswerResult, Engine
from engine.decode import DecodeStep
from storage import DocumentRecord, DocumentStore, PageSpan, ResultCache, TieredKVPool

logger = logging.getLogger(__name__)

MASK_GLYPH = "\u2591"  # shown for an answer slot still masked while the answer is denoised


@dataclass(frozen=True)
class ServiceConfig:
    data_dir: Path = Path("docqa-data")
    model_dir: Path = BUNDLED_MODEL
    device: str | None = None
    max_upload_bytes: int = 200 << 20
    extract_timeout_s: float = 300.0
    hot_bytes: int = 4 << 30  # KV kept on the compute device
    warm_bytes: int = 8 << 30  # KV kept in pinned CPU memory (GPU only)
    kv_budget_bytes: int | None = None  # disk budget for KV files (None: unbounded)
    weak_score: float | None = None  # warn below this best chunk score (default: the model's)


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
    kept_tokens: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class AskResult:
    answer: str
    citations: list[Citation]
    warning: str | None
    conversation_id: str
    scores: list[dict]  # every candidate chunk: document, chunk, pages, score, selected
    anchors: list[list[float]]  # [selected chunk][layer] attention on each selected chunk's BOS
    timings: dict[str, float]
    steps: int
    cached: bool = False


@dataclass(frozen=True)
class AskEvent:
    kind: str  # "status" | "step" | "done"
    message: str = ""
    partial: str = ""  # the answer as denoised so far, masked slots as MASK_GLYPH
    result: AskResult | None = None


def _page_label(pages: list, start: int, end: int) -> str:
    if not pages:
        return ""
    a, b = pages[min(start, len(pages) - 1)].label, pages[min(end, len(pages) - 1)].label
    return a if a == b else f"{a}-{b}"


class DocQA:
    def __init__(self, config: ServiceConfig = ServiceConfig()) -> None:
        self.config = config
        self.engine = Engine.from_pretrained(config.model_dir, device=config.device)
        self.defaults: ModelDefaults = model_defaults(config.model_dir)
        self.store = DocumentStore(config.data_dir, kv_budget_bytes=config.kv_budget_bytes)
        self.pool = TieredKVPool(self.engine.device, config.hot_bytes, config.warm_bytes)
        self.kv = DocumentKVService(self.engine, self.store, self.pool)
        self.memo = ResultCache(Path(config.data_dir) / "memo")
        self._model_lock = threading.Lock()
        weak = json.loads((Path(config.model_dir) / "docqa.json").read_text()).get("weak_score") \
            if (Path(config.model_dir) / "docqa.json").exists() else None
        self.weak_score = config.weak_score if config.weak_score is not None else weak

    # ---- documents -------------------------------------------------------------------------------

    def ingest(self, data: bytes, name: str, password: str | None = None, chunk_size: int | None = None,
               progress: Callable[[str, float], None] | None = None) -> tuple[DocumentInfo, bool]:
        """Extracts, stores and prefills a file. Returns (info, added); an identical file already
        stored is not added twice. Raises IngestError with a clear message; stores nothing then.
        Progress goes to `progress` and to the jobs table (visible after a page refresh)."""
        name = Path(name).name or "document"
        job = self.store.start_job(name)
        last = [0.0]

        def say(stage: str, frac: float) -> None:
            if progress is not None:
                progress(stage, frac)
            now = time.monotonic()
            if now - last[0] > 0.5 or frac >= 1.0:
                last[0] = now
                self.store.update_job(job, stage, frac)

        try:
            result = self._ingest(data, name, password, chunk_size, say)
        except Exception as exc:
            self.store.finish_job(job, str(exc))
            raise
        self.store.finish_job(job)
        return result

    def jobs(self, active_only: bool = False) -> list[dict]:
        return self.store.jobs(active_only)

    def _ingest(self, data, name, password, chunk_size, say) -> tuple[DocumentInfo, bool]:
        doc_id = hashlib.sha256(data).hexdigest()
        existing = self.store.get_document(doc_id)
        if existing is None or existing.status != "ready":
            say("extracting", 0.0)
            entry = self.memo.get("extracted", doc_id)  # the same bytes were extracted before
            if entry is None:
                doc = extract(data, name, self.config.max_upload_bytes, password, self.config.extract_timeout_s,
                              lambda done, total: say(f"extracting page {done}/{total}", 0.5 * done / total))
                entry = {"text": doc.text, "pages": [asdict(p) for p in doc.pages], "mime": doc.mime}
                self.memo.set("extracted", doc_id, entry)
            page_spans = [PageSpan(**p) for p in entry["pages"]]
            self._keep_upload(doc_id, name, data)
            record, added = self.store.add_document(doc_id, name, entry["mime"], len(data), entry["text"], page_spans)
        else:
            record, added = existing, False
        size = chunk_size or self.defaults.chunk_size
        say("encoding", 0.5)
        with self._model_lock:
            self.kv.get(doc_id, size, lambda done, total: say(f"encoding chunk {done}/{total}",
                                                              0.5 + 0.5 * done / max(total, 1)))
        say("ready", 1.0)
        return self.document_info(record, size), added

    def _keep_upload(self, doc_id: str, name: str, data: bytes) -> None:
        """The original file, under a generated name inside the data folder (never served)."""
        folder = Path(self.config.data_dir) / "uploads"
        folder.mkdir(parents=True, exist_ok=True)
        suffix = Path(name).suffix.lower() if Path(name).suffix.lower() in (".pdf", ".txt", ".md", ".markdown") else ""
        target = folder / f"{doc_id}{suffix}"
        if not target.exists():
            tmp = folder / f".{doc_id}.tmp-{os.getpid()}"
            tmp.write_bytes(data)
            os.replace(tmp, target)

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

    def documents(self) -> list[DocumentInfo]:
        return [self.document_info(r) for r in self.store.list_documents()]

    def delete(self, doc_id: str) -> bool:
        self.kv.forget(doc_id)
        for upload in (Path(self.config.data_dir) / "uploads").glob(f"{doc_id}*"):
            upload.unlink(missing_ok=True)
        return self.store.delete_document(doc_id)

    def save_collection(self, name: str, document_ids: list[str]) -> None:
        self.store.save_collection(name, document_ids)

    def collections(self) -> dict[str, list[str]]:
        return self.store.collections()

    def delete_collection(self, name: str) -> bool:
        return self.store.delete_collection(name)

    # ---- questions -------------------------------------------------------------------------------

    def params(self, **overrides) -> AnswerParams:
        return answer_params(self.defaults, **overrides)

    def ask(self, question: str, document_ids: list[str], params: AnswerParams | None = None,
            conversation_id: str | None = None, chunk_size: int | None = None) -> Iterator[AskEvent]:
        """Streams the answer as it is denoised, then the cited result (also stored in SQLite)."""
        question = question.strip()
        if not question:
            raise ValueError("the question is empty")
        if not document_ids:
            raise ValueError("choose at least one document")
        records = []
        for doc_id in document_ids:
            rec = self.store.get_document(doc_id)
            if rec is None:
                raise ValueError(f"unknown document {doc_id}")
            records.append(rec)
        params = params or self.params()
        size = chunk_size or self.defaults.chunk_size
        request_key = hashlib.sha256(json.dumps(
            [question, sorted(document_ids), repr(params), size, self.engine.fingerprint]).encode()).hexdigest()
        if conversation_id is None:
            conversation_id = self.store.create_conversation(question[:80])
        hit = self.memo.get("answer", request_key)
        if hit is not None:
            result = replace(self._result_from_json(hit), conversation_id=conversation_id, cached=True)
            self._record(result, question, document_ids, params)
            yield AskEvent("done", "answered from cache", result.answer, result)
            return
        yield AskEvent("status", "waiting for the model")
        with self._model_lock:
            start = time.perf_counter()
            docs = [self.kv.get(r.id, size) for r in records]
            load_s = time.perf_counter() - start
            yield AskEvent("status", "selecting chunks")
            canvas = [None] * params.sampling.gen_length
            final: AnswerResult | None = None
            for event in self.engine.stream_answer(docs, question, params):
                if isinstance(event, DecodeStep):
                    for pos, tok in zip(event.positions, event.tokens, strict=True):
                        canvas[pos] = tok
                    yield AskEvent("step", partial=self._render(canvas))
                else:
                    final = event
        result = self._build_result(final, records, size, conversation_id, load_s)
        self.memo.set("answer", request_key, self._result_to_json(result))
        self._record(result, question, document_ids, params)
        yield AskEvent("done", partial=result.answer, result=result)

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
                      load_s: float) -> AskResult:
        tr = res.trace
        chunk_meta = {i: self.kv.chunks(r.id, size) for i, r in enumerate(records)}
        pages = {i: self.store.pages(r.id) for i, r in enumerate(records)}
        selected = {(c.document, c.chunk) for c in tr.selected}
        scores = []
        for ref, score in zip(tr.candidates, tr.scores, strict=True):
            meta = chunk_meta[ref.document][ref.chunk]
            scores.append({"document": records[ref.document].name, "chunk": ref.chunk, "score": score,
                           "pages": _page_label(pages[ref.document], meta.page_start, meta.page_end),
                           "selected": (ref.document, ref.chunk) in selected})
        citations = []
        for j, (ref, score) in enumerate(zip(tr.selected, tr.selected_scores, strict=True)):
            meta = chunk_meta[ref.document][ref.chunk]
            citations.append(Citation(records[ref.document].id, records[ref.document].name, ref.chunk,
                                      _page_label(pages[ref.document], meta.page_start, meta.page_end), score,
                                      meta.text, tr.kept_tokens[j] if j < len(tr.kept_tokens) else []))
        citations.sort(key=lambda c: -c.score)
        warning = None
        best = max(tr.selected_scores, default=float("-inf"))
        if self.weak_score is not None and best < self.weak_score:
            warning = ("The documents may not contain this: no passage explains the question well "
                       f"(best score {best:.2f}, below {self.weak_score:.2f}).")
        anchors = tr.anchors_decode.tolist() if tr.anchors_decode is not None else []
        timings = {"load_kv": load_s, **tr.timings}
        return AskResult(res.text, citations, warning, conversation_id, scores, anchors, timings, tr.steps)

    def _record(self, result: AskResult, question: str, document_ids: list[str], params: AnswerParams) -> None:
        self.store.add_message(
            result.conversation_id, question, result.answer, document_ids, json.loads(json.dumps(asdict(params))),
            [{"document": c.document, "chunk": c.chunk, "pages": c.pages, "score": c.score} for c in result.citations],
            result.timings)

    @staticmethod
    def _result_to_json(result: AskResult) -> dict:
        return asdict(result)

    @staticmethod
    def _result_from_json(data: dict) -> AskResult:
        data = dict(data)
        data["citations"] = [Citation(**c) for c in data["citations"]]
        return AskResult(**data)

    def conversations(self) -> list[dict]:
        return self.store.list_conversations()

    def messages(self, conversation_id: str):
        return self.store.messages(conversation_id)


def device_summary(service: DocQA) -> str:
    dev = service.engine.device
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    return f"{Path(service.config.model_dir).name} on {name} ({service.engine.dtype})"
