"""The OpenAI-compatible API (ui.openai_api): a real server on the bundled model beside the web app,
driven by the official `openai` client and by raw HTTP."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.error
import urllib.request
import uuid

import httpx
import pytest
from test_app import NEEDLE_Q, covers, small_pdf

from app.service import MASK_GLYPH, NOT_FOUND_ANSWER, NOT_FOUND_WARNING, DocQA, QuestionStopped, ServiceConfig
from ui.openai_api import settled_text

openai = pytest.importorskip("openai")

MODEL = "docqa-tiny"


def _start(service: DocQA):
    from ui.app import launch

    return launch(service, host="127.0.0.1", port=0, block=False)  # port 0: a free one


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    return DocQA(ServiceConfig(data_dir=tmp_path_factory.mktemp("api"), device="cpu", max_upload_bytes=1 << 20))


@pytest.fixture(scope="module")
def server(service):
    web = _start(service)
    yield web
    web.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def notes(client):
    """notes.pdf (4 pages, the needle on page 3) uploaded through the API."""
    return client.files.create(file=("notes.pdf", small_pdf()), purpose="assistants")


@contextlib.contextmanager
def holding_the_model(service: DocQA):
    """Holds the model the way a real ingest does: a new document's prefill takes the model, and
    its progress callback (called under the model's lock) waits until the block ends."""
    held, release = threading.Event(), threading.Event()

    def progress(stage: str, frac: float) -> None:
        if stage.startswith("encoding chunk"):
            held.set()
            release.wait(60)

    doc = f"The grass is green. The sky is blue. Marker {uuid.uuid4().hex}.".encode()
    worker = threading.Thread(target=service.ingest, args=(doc, "held.txt"), kwargs={"progress": progress})
    worker.start()
    try:
        assert held.wait(60), "the ingest never reached its prefill"
        yield
    finally:
        release.set()
        worker.join(60)


def test_models_and_files(client, notes):
    models = client.models.list().data
    assert [(m.id, m.owned_by) for m in models] == [(MODEL, "dllm-docqa")]
    assert client.models.retrieve(MODEL).id == MODEL
    assert notes.object == "file" and notes.filename == "notes.pdf" and notes.status == "processed"
    assert notes.bytes == len(small_pdf()) and notes.created_at > 0
    listed = client.files.list().data
    assert [f.id for f in listed if f.filename == "notes.pdf"] == [notes.id]
    assert client.files.retrieve(notes.id).filename == "notes.pdf"
    again = client.files.create(file=("copy.pdf", small_pdf()), purpose="assistants")  # the same bytes
    assert again.id == notes.id and again.model_extra["added"] is False


def test_chat_completion_answers_the_needle_with_citations(client, notes):
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": NEEDLE_Q}],
        extra_body={"documents": ["notes.pdf"]})
    choice = reply.choices[0]
    assert reply.object == "chat.completion" and choice.finish_reason == "stop"
    assert choice.message.role == "assistant" and choice.message.content == "6150382"
    citations = reply.model_extra["citations"]
    assert citations[0]["document"] == "notes.pdf" and citations[0]["document_id"] == notes.id
    assert covers(citations[0]["pages"], 3) and "6150382" in citations[0]["text"]
    assert choice.message.model_extra["citations"] == citations and reply.model_extra["warning"] is None
    assert reply.usage.completion_tokens > 0 and reply.usage.prompt_tokens > reply.usage.completion_tokens
    # Content as a list of text parts, the document by its id: the same answer.
    parts = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": [{"type": "text", "text": NEEDLE_Q}]}],
        extra_body={"documents": [notes.id]})
    assert parts.choices[0].message.content == "6150382"


def test_streamed_answer_is_the_answer_and_ends_with_citations(client, notes):
    # max_tokens 32 (not the model's 64): a question not answered before, so it is decoded, not memoised.
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": NEEDLE_Q}],
                                            stream=True, max_tokens=32, extra_body={"documents": ["notes.pdf"]})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    last = chunks[-1]
    assert last.choices[0].finish_reason == "stop" and all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert last.model_extra["citations"][0]["document"] == "notes.pdf"
    assert covers(last.model_extra["citations"][0]["pages"], 3)
    whole = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": NEEDLE_Q}],
                                           max_tokens=32, extra_body={"documents": ["notes.pdf"]})
    assert streamed == whole.choices[0].message.content == "6150382"


def test_a_not_found_answer_says_so_in_its_content_with_a_warning(client, notes):
    """A plain OpenAI client shows the content only: "not found" is said there, not left empty."""
    question = "What is the special magic number for blue-walrus mentioned in the provided text?"
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}],
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_body={"documents": ["notes.pdf"]}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == NOT_FOUND_ANSWER
    finish = next(c for c in chunks if c.choices and c.choices[0].finish_reason == "stop")
    assert finish.model_extra["warning"] == NOT_FOUND_WARNING and finish.model_extra["citations"]
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens > 0  # include_usage: a usage chunk last
    whole = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}],
                                           extra_body={"documents": ["notes.pdf"]})
    assert whole.choices[0].message.content == NOT_FOUND_ANSWER
    assert whole.model_extra["warning"] == NOT_FOUND_WARNING and whole.model_extra["citations"]


def test_settled_text_streams_only_what_cannot_change():
    def settled(partial):
        return settled_text(partial, "not found")
    assert settled(f" 61{MASK_GLYPH}0382") == "61"  # a masked slot: what follows may still change
    assert settled(" 6150382 ") == "6150382"  # the final answer is stripped
    assert settled(f"ab\ufffd{MASK_GLYPH}") == "ab"  # half a character
    assert settled("not fo") == "" and settled("Not found.") == ""  # may become "" with a warning
    assert settled(f"note{MASK_GLYPH}") == "note" and settled(MASK_GLYPH) == ""
    assert settled_text("not fo", None) == "not fo"  # a model with no abstain answer


def test_unknown_documents_and_models_are_named(client, notes):
    for missing, name in (("nowhere.pdf", "nowhere.pdf"), ("@nothing", "nothing")):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": NEEDLE_Q}],
                                           extra_body={"documents": [missing]})
        assert name in err.value.message and err.value.body["param"] == "documents"
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": NEEDLE_Q}])
    assert "gpt-4o" in err.value.message and MODEL in err.value.message
    with pytest.raises(openai.BadRequestError, match="empty"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "  "}])


def test_short_ids_name_files_and_documents_as_in_the_cli(client, notes):
    """The 12-character id the web page and `docqa list` show finds the document, as `docqa ask` does."""
    short = notes.id[:12]
    assert client.files.retrieve(short).id == notes.id
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": NEEDLE_Q}],
                                           extra_body={"documents": [short]})
    assert reply.model_extra["citations"][0]["document_id"] == notes.id
    # Two documents of one name: the name is ambiguous, and the error says so.
    for text in (b"Twin one. The gate code is 11-2233.", b"Twin two. The gate code is 44-5566."):
        client.files.create(file=("twin.md", text), purpose="assistants")
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": NEEDLE_Q}],
                                       extra_body={"documents": ["twin.md"]})
    assert "several documents" in err.value.message and err.value.body["code"] == "ambiguous_document"


def test_bytes_uploaded_again_under_another_name_are_found_by_it(client, service):
    first = client.files.create(file=("truncated.md", b"# Ferry\n\nThe ferry leaves at nine."), purpose="assistants")
    again = client.files.create(file=("bzip2.md", b"# Ferry\n\nThe ferry leaves at nine."), purpose="assistants")
    assert again.id == first.id and again.filename == "truncated.md" and again.model_extra["added"] is False
    question = [{"role": "user", "content": "When does the ferry leave?"}]
    reply = client.chat.completions.create(model=MODEL, messages=question, extra_body={"documents": ["bzip2.md"]})
    assert reply.model_extra["citations"][0]["document_id"] == first.id
    assert again.model_extra["names"] == ["truncated.md", "bzip2.md"]  # the upload's answer says so
    # Kept in the library's database: a new store over the same folder knows both names.
    from storage import DocumentStore
    assert DocumentStore(service.store.root).document_names()[first.id] == ["truncated.md", "bzip2.md"]


def test_bad_uploads_are_clear_errors(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.files.create(file=("tool.exe", b"MZ\x00\x01\x02binary"), purpose="assistants")
    assert "tool.exe" in err.value.message and "not a PDF" in err.value.message
    with pytest.raises(openai.APIStatusError) as err:
        client.files.create(file=("big.txt", b"word " * (300 << 10)), purpose="assistants")  # 1.5 MiB > 1 MiB
    assert err.value.status_code == 413 and "limit" in err.value.message
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve("no-such-file")


def test_delete_a_file(client, service):
    doc = client.files.create(file=("gone.md", b"# Gone\n\nThe ferry leaves at nine."), purpose="assistants")
    assert client.files.delete(doc.id).deleted
    assert doc.id not in {d.record.id for d in service.documents()}
    with pytest.raises(openai.NotFoundError):
        client.files.delete(doc.id)


def test_a_busy_server_answers_429(tmp_path, notes):
    """One question in the batch, none may wait: while an ingest holds the model and one question
    waits for its place, another is refused at once."""
    busy = DocQA(ServiceConfig(data_dir=tmp_path, device="cpu", max_waiting_questions=0, max_batch_questions=1))
    doc_id = busy.ingest(small_pdf(), "notes.pdf")[0].record.id
    web = _start(busy)
    try:
        client = openai.OpenAI(base_url=web.url + "v1", api_key="unused", max_retries=0, timeout=60)
        for stream in (False, True):
            with holding_the_model(busy):
                first = threading.Thread(target=busy.answer, args=(f"{NEEDLE_Q} ({stream})", [doc_id]))
                first.start()
                time.sleep(0.5)  # the first question has the batch's one place
                with pytest.raises(openai.RateLimitError) as err:
                    # Streamed too: the response waits for the model to take the question, so a
                    # refusal still has its status.
                    client.chat.completions.create(model=MODEL, stream=stream,
                                                   messages=[{"role": "user", "content": NEEDLE_Q}])
            first.join(60)
            assert "busy" in err.value.message and err.value.response.headers["retry-after"]
        # The model free again, the same question is answered.
        reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": NEEDLE_Q}])
        assert reply.choices[0].message.content == "6150382"
    finally:
        web.close()
        busy.close()


def test_a_client_that_leaves_cancels_its_question(server, service, notes):
    """A question waiting for the model is cancelled when its client disconnects: it never runs."""
    question = f"What is the special magic number for {uuid.uuid4().hex[:8]} mentioned in the provided text?"
    body = {"model": MODEL, "messages": [{"role": "user", "content": question}], "stream": True,
            "documents": ["notes.pdf"]}
    with holding_the_model(service):
        with pytest.raises(httpx.ReadTimeout):  # no answer while the model is held: the client gives up
            httpx.post(server.url + "v1/chat/completions", json=body, timeout=1.5)
        time.sleep(1.5)  # the server looks for a gone client every 0.5 s, the wait for the model every 0.25 s
    time.sleep(1.0)  # the model free: a question still waiting would take it now
    # Never answered: its conversation, which a first answer starts, does not exist.
    assert question[:80] not in {c["title"] for c in service.conversations(origin=None)}


def test_api_answers_are_not_the_web_pages_conversations(client, service, notes):
    """An API call's answer is kept as an "api" conversation, not listed in the web page's; a
    question never answered leaves no empty conversation behind."""
    question = f"What is the special magic number for {uuid.uuid4().hex[:8]} mentioned in the provided text?"
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}],
                                   extra_body={"documents": [notes.id]})
    assert question[:80] not in {c["title"] for c in service.conversations()}
    assert question[:80] in {c["title"] for c in service.conversations(origin="api")}
    before = service.conversations(origin=None)
    stopped = threading.Event()
    stopped.set()
    with pytest.raises(QuestionStopped):
        service.answer(f"{question} (cancelled)", [notes.id], cancel=stopped)
    assert service.conversations(origin=None) == before


def test_errors_have_openais_shape_and_no_traceback(server):
    def call(method: str, path: str, body: bytes | None = None) -> tuple[int, dict]:
        req = urllib.request.Request(server.url + path.lstrip("/"), data=body, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            raw = e.read()
            assert b"Traceback" not in raw and b'File "' not in raw
            return e.code, json.loads(raw)

    cases = [("GET", "/v1/no/such/route", None, 404), ("GET", "/v1/chat/completions", None, 405),
             ("POST", "/v1/chat/completions", b"{not json", 422), ("POST", "/v1/chat/completions", b"{}", 422),
             ("POST", "/v1/chat/completions", json.dumps({"model": MODEL, "messages": [
                 {"role": "assistant", "content": "hi"}]}).encode(), 400),
             ("POST", "/v1/files", b"{}", 400)]
    for method, path, body, status in cases:
        got, payload = call(method, path, body)
        assert got == status, (path, payload)
        assert set(payload) == {"error"} and set(payload["error"]) == {"message", "type", "param", "code"}
        assert payload["error"]["message"] and payload["error"]["type"]
    assert call("GET", "/v1/models")[0] == 200
    with urllib.request.urlopen(server.url, timeout=30) as r:  # the web app, on the same port
        assert r.status == 200 and b"gradio" in r.read().lower()
