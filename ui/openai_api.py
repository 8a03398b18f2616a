"""OpenAI-compatible HTTP endpoints over the DocQA service, served beside the Gradio app.

`create_api(service)` is a FastAPI app to mount at /v1 (`ui.app.launch` does, on the web app's
port). It speaks the part of OpenAI's API that a document-QA service can honour:

- `GET /v1/models`, `GET /v1/models/{id}`: the one model the service runs.
- `POST /v1/chat/completions`: the last user message is the question. The extension field
  `documents` (ids, id prefixes, names or "@collection" names) says what to read; without it, every ready
  document. Earlier messages are not read: each answer comes from the documents alone. Answers
  carry the extension fields `citations` and `warning`; `stream: true` streams server-sent events.
  An answer the documents do not give says so in its content (app.service.NOT_FOUND_ANSWER).
- `POST /v1/files`, `GET /v1/files`, `GET /v1/files/{id}`, `DELETE /v1/files/{id}`: the library;
  a file's id is its document id.

Errors have OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, and the statuses
OpenAI's clients turn into their exception classes (400, 404, 413, 422, 429, 5xx); never a traceback.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from app.errors import IngestError, QuestionStopped, ServiceBusy, StorageError
from app.service import MASK_GLYPH, AskEvent, AskResult, DocQA, DocumentInfo, DocumentNotFound, may_yet_abstain

if TYPE_CHECKING:
    from app.service import AnswerParams  # what DocQA.params returns

logger = logging.getLogger(__name__)

OWNER = "dllm-docqa"
# `max_tokens` above this decode an answer of this length: a longer canvas costs denoising time and
# no lookup answer needs it (clients often send 4096 by habit).
MAX_ANSWER_TOKENS = 512
DISCONNECT_POLL_S = 0.5  # how often a request waiting for its answer checks that its client is still there
# The service has no public token count, so usage is estimated: about four characters a token
# (English under a byte-level BPE).
CHARS_PER_TOKEN = 4
UPLOAD_OVERHEAD = 64 << 10  # multipart headers and boundaries around an upload's bytes
FILE_PURPOSE = "user_data"  # the library keeps no purpose: every document is there to be asked
# A partial answer's settled text may still end in the first bytes of a character (decoded as
# U+FFFD until its last byte is denoised).
REPLACEMENT_CHAR = "\ufffd"


# ---- errors ----------------------------------------------------------------------------------------

class ApiError(Exception):
    """An error answered in OpenAI's format."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


# IngestError codes that are not the upload's fault; every other code is (400).
INGEST_STATUS = {"too_large": 413, "read_only": 403, "storage": 507}


def service_error(exc: BaseException) -> ApiError | None:
    """The API error for an error the service raises by contract; None for anything else (a bug)."""
    if isinstance(exc, IngestError):  # before ValueError: an IngestError is one
        status = INGEST_STATUS.get(exc.code, 400)
        return ApiError(status, str(exc), "server_error" if status >= 500 else "invalid_request_error", "file",
                        exc.code)
    if isinstance(exc, ServiceBusy):
        # OpenAI's clients retry a 429 after Retry-After (twice, by default).
        return ApiError(429, str(exc), "rate_limit_error", code="server_busy", headers={"Retry-After": "1"})
    if isinstance(exc, QuestionStopped):
        return ApiError(503, str(exc), "server_error", code="question_stopped")
    if isinstance(exc, StorageError):
        return ApiError(500, str(exc), "server_error", code="storage_error")
    if isinstance(exc, ValueError):
        return ApiError(400, str(exc))
    return None


def internal_error(exc: BaseException) -> ApiError:
    logger.error("OpenAI API request failed", exc_info=exc)  # the traceback goes to the log, not the client
    return ApiError(500, "internal error; the server's log has the details", "server_error", code="internal_error")


@contextmanager
def service_errors() -> Iterator[None]:
    """Turns the errors the service raises by contract into API errors; others stay 500s."""
    try:
        yield
    except ApiError:
        raise
    except Exception as exc:  # noqa: BLE001 - sorted here: contract errors answered, the rest logged
        raise (service_error(exc) or internal_error(exc)) from None


# ---- requests --------------------------------------------------------------------------------------

class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[ContentPart] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    # Clients send more than the service reads (top_p, seed, user, stop...): accepted, not used.
    model_config = ConfigDict(extra="allow")
    model: str
    messages: list[Message] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    # Checked, not used: answers are denoised greedily, the way the method's defaults are tuned.
    temperature: float | None = Field(default=None, ge=0, le=2)
    n: int = 1
    documents: list[str] | None = None  # extension: document ids, names or "@collection" names


def question_of(messages: list[Message]) -> str:
    """The last user message's text."""
    for message in reversed(messages):
        if message.role != "user":
            continue
        if isinstance(message.content, str):
            return message.content
        parts = message.content or []
        if any(part.type != "text" for part in parts):
            raise ApiError(400, "only text content can be asked (found "
                           f"{', '.join(sorted({p.type for p in parts if p.type != 'text'}))})", param="messages")
        return "\n".join(part.text or "" for part in parts)
    raise ApiError(400, "no user message: the last message with role 'user' is the question", param="messages")


FILES_LISTING = "GET /v1/files"  # where a client finds the documents' ids and names


def resolve_documents(service: DocQA, names: list[str] | None) -> list[str]:
    """Document ids for the request's `documents`, by the rule the CLI uses (DocQA.resolve_documents):
    ids, id prefixes, names or "@collection" names; every ready document when it is absent."""
    if names is None:
        docs = service.documents()
        if not docs:
            raise ApiError(400, "the library has no documents: upload one with POST /v1/files", param="documents",
                           code="no_documents")
        return [d.record.id for d in docs]
    if not names:
        raise ApiError(400, "`documents` is empty: give document ids, names or @collection names, or leave it "
                            "out to read every document", param="documents")
    try:
        return service.resolve_documents(names, listing=FILES_LISTING)
    except DocumentNotFound as exc:
        raise ApiError(400, str(exc), param="documents", code=exc.code) from None


# ---- answers ---------------------------------------------------------------------------------------

def settled_text(partial: str, abstain_answer: str | None) -> str:
    """The part of a partial answer that the rest of the denoising cannot change, so it can be
    streamed: the text before the first still-masked slot. Diffusion fills slots in any order, so
    only that prefix is final. Held back as well: what the final answer (stripped) may lose, namely
    blanks at either end and a half-decoded character; and an answer on its way to the model's
    abstain answer ("not found"), which the reply words as a sentence of its own (AskResult.reply)."""
    text = partial.split(MASK_GLYPH, 1)[0].lstrip()
    text = text.rstrip().rstrip(REPLACEMENT_CHAR).rstrip()
    return "" if may_yet_abstain(text, abstain_answer) else text


def estimated_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


def usage(question: str, result: AskResult) -> dict[str, int]:
    """Estimated token counts: the prompt is the question and the chunks the model read (the
    citations are exactly the selected chunks); the completion is the answer."""
    prompt = estimated_tokens(question) + sum(estimated_tokens(c.text) for c in result.citations)
    completion = estimated_tokens(result.reply)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _finite(x: float) -> float | None:
    return round(x, 4) if math.isfinite(x) else None  # JSON has no infinities


def answer_extension(result: AskResult) -> dict[str, Any]:
    """The fields an answer adds to OpenAI's: its sources and the service's warning (e.g. "not found")."""
    return {"citations": [{"document": c.document, "document_id": c.document_id, "chunk": c.chunk,
                           "pages": c.pages, "score": _finite(c.score), "text": c.text} for c in result.citations],
            "warning": result.warning}


class ClientGone(Exception):
    """The client disconnected while its question was waiting or being answered."""


@dataclass
class RunningQuestion:
    """One `service.ask` run in a worker thread of its own, its events handed to the event loop.

    Model work blocks (torch, the model lock), so it never runs on the event loop, which keeps
    serving the Gradio UI and other requests. A thread of its own rather than the shared thread
    pool: a question can wait minutes for the model, and the pool's 40 threads also run Gradio's
    handlers. `close` sets `cancel`: the service then stops at its next decode step, or stops
    waiting for the model, and frees it."""

    service: DocQA
    question: str
    document_ids: list[str]
    params: AnswerParams
    cancel: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._items: deque[AskEvent | BaseException | None] = deque()  # None: the events ended
        self._arrived = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        threading.Thread(target=self._work, name="openai-question", daemon=True).start()

    def _work(self) -> None:
        # origin "api": kept apart from the web page's conversations
        events = self.service.ask(self.question, self.document_ids, self.params, cancel=self.cancel, origin="api")
        try:
            for event in events:
                self._hand(event)
                if self.cancel.is_set():
                    break
        except BaseException as exc:  # noqa: BLE001 - handed to the request, which answers it
            self._hand(exc)
            return
        finally:
            events.close()  # an abandoned generator frees the model at once, not when collected
        self._hand(None)

    def _hand(self, item: AskEvent | BaseException | None) -> None:
        def arrive() -> None:
            self._items.append(item)
            self._arrived.set()
        try:
            self._loop.call_soon_threadsafe(arrive)
        except RuntimeError:  # the loop is closed: the server stopped, nobody waits for this
            self.cancel.set()

    async def next(self, request: Request | None = None) -> AskEvent:
        """The next event other than a status; the service's errors raised as API errors. With
        `request` (until a response streams, when Starlette watches the connection instead), a
        client gone while this waits cancels the question and raises ClientGone."""
        while True:
            while not self._items:
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), DISCONNECT_POLL_S if request else None)
                except asyncio.TimeoutError:
                    if request is not None and await request.is_disconnected():
                        self.close()
                        raise ClientGone() from None
            item = self._items.popleft()
            if item is None:
                raise internal_error(RuntimeError("the service's answer ended without a result"))
            if isinstance(item, BaseException):
                raise (service_error(item) or internal_error(item)) from None
            if item.kind != "status":  # "waiting for the model", "selecting chunks": nothing to send
                return item

    def close(self) -> None:
        self.cancel.set()


def _now() -> int:
    return int(time.time())


@dataclass(frozen=True)
class Reply:
    """One chat completion's envelope: its id, time and model, shared by all its chunks."""

    model: str
    id: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex}")
    created: int = field(default_factory=_now)

    def completion(self, question: str, result: AskResult) -> dict[str, Any]:
        extension = answer_extension(result)
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                             "message": {"role": "assistant", "content": result.reply, **extension}}],
                "usage": usage(question, result), **extension}

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> str:
        return sse({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
                    **extra})

    def usage_chunk(self, question: str, result: AskResult) -> str:
        return sse({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                    "choices": [], "usage": usage(question, result)})


def sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


async def stream_answer(question: RunningQuestion, first: AskEvent, reply: Reply,
                        include_usage: bool) -> AsyncIterator[str]:
    """The answer as OpenAI's chunks: each step's newly settled text, the rest of the final
    answer, a last chunk with the finish reason and the citations, then [DONE]."""
    yield reply.chunk({"role": "assistant", "content": ""})
    sent = ""
    event = first
    try:
        while event.kind != "done":
            if event.kind == "step" and not event.may_change:  # else the final answer may differ whole
                settled = settled_text(event.partial, question.service.defaults.abstain_answer)
                if len(settled) > len(sent) and settled.startswith(sent):
                    yield reply.chunk({"content": settled[len(sent):]})
                    sent = settled
            event = await question.next()
    except ApiError as err:  # the status line is sent: the error goes as an event (the client raises it)
        yield sse(err.body())
        return
    result = event.result
    if result.reply.startswith(sent):
        if rest := result.reply[len(sent):]:
            yield reply.chunk({"content": rest})
    else:  # settled_text's rules missed a case: what was sent cannot be taken back
        logger.warning("streamed %r, which the final answer %r does not start with", sent, result.reply)
    yield reply.chunk({}, "stop", **answer_extension(result))
    if include_usage:
        yield reply.usage_chunk(question.question, result)
    yield sse("[DONE]")


class AnswerStream(StreamingResponse):
    """A streamed answer that cancels its question when the response ends, however it ends: a
    client that disconnects mid-answer frees the model at the next decode step."""

    def __init__(self, content: AsyncIterator[str], question: RunningQuestion) -> None:
        # no-cache and no proxy buffering: each chunk is meant to be seen as it is denoised
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.question = question

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.question.close()


# ---- files -----------------------------------------------------------------------------------------

def _epoch(iso: str) -> int:
    try:
        return int(datetime.fromisoformat(iso).timestamp())
    except ValueError:
        return 0


def file_object(info: DocumentInfo) -> dict[str, Any]:
    r = info.record
    return {"id": r.id, "object": "file", "bytes": r.size_bytes, "created_at": _epoch(r.created_at),
            "filename": r.name, "purpose": FILE_PURPOSE, "status": "processed" if r.status == "ready" else "error",
            "status_details": r.error,
            # extensions: what the library made of it
            "pages": r.page_count, "chunks": info.chunks, "tokens": info.tokens}


def find_file(service: DocQA, file_id: str) -> DocumentInfo:
    """The file `file_id` names: its id or an id prefix (as the web page and `docqa list` show it)."""
    try:
        found = service.resolve_documents([file_id], include_failed=True, listing=FILES_LISTING)
    except DocumentNotFound as exc:
        if exc.code == "ambiguous_document":
            raise ApiError(400, str(exc), param="file_id", code=exc.code) from None
        raise ApiError(404, f"no file {file_id!r} ({FILES_LISTING} lists them)", param="file_id",
                       code="file_not_found") from None
    return next(info for info in service.documents(include_failed=True) if info.record.id == found[0])


# ---- the app ---------------------------------------------------------------------------------------

def create_api(service: DocQA) -> FastAPI:
    """The OpenAI-compatible endpoints, to mount at /v1."""
    api = FastAPI(title="dllm-docqa OpenAI-compatible API", docs_url=None, redoc_url=None, openapi_url=None)
    model_dir = Path(service.config.model_dir)
    model = {"id": model_dir.name, "object": "model", "created": int(model_dir.stat().st_mtime), "owned_by": OWNER}

    def check_model(name: str) -> None:
        if name != model["id"]:
            raise ApiError(404, f"the model {name!r} does not exist; this server runs {model['id']!r}",
                           param="model", code="model_not_found")

    @api.exception_handler(ApiError)
    async def on_api_error(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @api.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        route = f"{request.method} {request.url.path}"
        message = {404: f"unknown request URL: {route}", 405: f"method not allowed: {route}"}.get(
            exc.status_code, str(exc.detail))
        return ApiError(exc.status_code, message, code="unknown_url" if exc.status_code in (404, 405) else None,
                        headers=exc.headers).response()

    @api.exception_handler(RequestValidationError)
    async def on_invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
        if first["type"] == "json_invalid":  # its location is a character offset, not a field
            return ApiError(422, f"the body is not valid JSON ({first.get('ctx', {}).get('error', 'invalid')})",
                            code="invalid_json").response()
        param = ".".join(str(p) for p in first["loc"] if p != "body") or None
        message = f"{param}: {first['msg']}" if param else first["msg"]
        if len(errors) > 1:
            message += f" (and {len(errors) - 1} more)"
        return ApiError(422, message, param=param, code="invalid_request").response()

    @api.exception_handler(Exception)
    async def on_bug(request: Request, exc: Exception) -> JSONResponse:  # Starlette logs its traceback
        return ApiError(500, "internal error; the server's log has the details", "server_error",
                        code="internal_error").response()

    @api.get("/models")
    def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [model]}

    @api.get("/models/{model_id}")
    def get_model(model_id: str) -> dict[str, Any]:
        check_model(model_id)
        return model

    @api.post("/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
        check_model(body.model)
        if body.n != 1:
            raise ApiError(400, "only n=1 is supported: a question has one answer", param="n")
        question = question_of(body.messages)
        with service_errors():
            ids = await run_in_threadpool(resolve_documents, service, body.documents)
        limit = body.max_completion_tokens or body.max_tokens
        params = service.params(gen_length=min(limit, MAX_ANSWER_TOKENS) if limit else None)
        running = RunningQuestion(service, question, ids, params)
        try:
            # The first event that is not a status comes once the model has taken the question (or
            # from the cache), so a refusal (busy, a bad question) still gets its own HTTP status.
            event = await running.next(request)
            if body.stream:
                include_usage = body.stream_options is not None and body.stream_options.include_usage
                return AnswerStream(stream_answer(running, event, Reply(model["id"]), include_usage), running)
            while event.kind != "done":
                event = await running.next(request)
        except ClientGone:  # nobody reads this; the question is cancelled
            return ApiError(499, "the client closed the request", code="client_closed").response()
        except BaseException:
            running.close()
            raise
        running.close()
        return Reply(model["id"]).completion(question, event.result)

    @api.post("/files")
    async def upload_file(request: Request) -> dict[str, Any]:
        # Refused before the body is read when the client says its size; the exact limit is the service's.
        limit = service.config.max_upload_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit + UPLOAD_OVERHEAD:
            raise ApiError(413, f"the upload is {int(declared) / 2**20:.1f} MiB; the limit is {limit / 2**20:.1f} MiB",
                           param="file", code="too_large")
        try:
            form = await request.form(max_files=1, max_fields=8)
        except Exception as exc:  # noqa: BLE001 - a body that is not multipart form data
            raise ApiError(400, f"send the document as multipart/form-data with a 'file' field ({exc})",
                           param="file") from None
        try:
            upload = form.get("file")
            if not isinstance(upload, UploadFile):
                raise ApiError(400, "no file: send the document as the multipart field 'file'", param="file")
            data = await upload.read(limit + 1)
            with service_errors():
                info, added = await run_in_threadpool(service.ingest, data, upload.filename or "document")
        finally:
            await form.close()
        # extensions: whether the bytes were new, and every name that finds them (an upload of
        # bytes already stored under another name is that document, now found by both names)
        return {**file_object(info), "added": added, "names": service.names_of(info.record.id)}

    @api.get("/files")
    def list_files() -> dict[str, Any]:
        with service_errors():
            files = [file_object(info) for info in service.documents(include_failed=True)]
        return {"object": "list", "data": files, "has_more": False}

    @api.get("/files/{file_id}")
    def get_file(file_id: str) -> dict[str, Any]:
        with service_errors():
            return file_object(find_file(service, file_id))

    @api.delete("/files/{file_id}")
    def delete_file(file_id: str) -> dict[str, Any]:
        if service.read_only:
            raise ApiError(403, "the data folder is read-only: documents can be asked, not deleted",
                           code="read_only")
        with service_errors():
            doc_id = find_file(service, file_id).record.id
            if not service.delete(doc_id):  # deleted meanwhile by another request
                raise ApiError(404, f"no file {file_id!r} ({FILES_LISTING} lists them)", param="file_id",
                               code="file_not_found")
        return {"id": doc_id, "object": "file", "deleted": True}

    return api
