"""Questions under faults: huge ones, stuck ones, abandoned ones, a changed model, damaged KV,
and deletion that leaves no trace."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import threading
import time

import pytest
from faultkit import DOC_A, DOC_B, NEEDLE_Q

from app.defaults import BUNDLED_MODEL, answer_params, model_defaults
from app.service import QuestionStopped
from engine.method.answer import AnswerResult
from engine.scheduler import _DONE  # a handle's last event


def _in_thread(fn, timeout: float = 300):
    """Runs fn in a thread; returns its result (a question stuck behind a held model lock fails here)."""
    out: list = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "the model stayed busy"
    return out[0]


@contextlib.contextmanager
def _handles_submitted(service):
    """The scheduler's handles of the questions `service` submits meanwhile, each with `sent`: every
    event the scheduler puts for it, whoever takes it (the service's stream may take the last)."""
    handles = []
    submit = service.scheduler.submit

    def submitted(*args, **kw):
        handle = submit(*args, **kw)
        handle.sent, put = [], handle._events.put  # (before any answer: decoding comes after drafting)

        def recorded(item, *a, **k):
            handle.sent.append(item)
            put(item, *a, **k)

        handle._events.put = recorded
        handles.append(handle)
        return handle

    service.scheduler.submit = submitted
    try:
        yield handles
    finally:
        del service.scheduler.submit  # the method again


def _never_answered(handle, timeout_s: float = 300) -> bool:
    """Whether the scheduler ended a stopped question without its answer: it may still send a step
    already under way, then its end (plain, or the asker's stop as an error); had it run on, its
    answer would come (answering others proves nothing alone: they may share its batch and finish
    first)."""
    deadline = time.monotonic() + timeout_s
    while not any(e is _DONE or isinstance(e, BaseException) for e in handle.sent):
        assert time.monotonic() < deadline, "the scheduler never ended the stopped question"
        time.sleep(0.05)
    return not any(isinstance(e, AnswerResult) for e in handle.sent)


@pytest.fixture(scope="module")
def service(tmp_path_factory, bundled_service_factory):
    return bundled_service_factory(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def doc_a(service):
    return service.ingest(DOC_A, "a.txt")[0].record.id


def test_a_huge_question_is_refused_at_once(service, doc_a):
    for question in ("x " * 10_000, "word " * 4_000):  # 20,000 characters; ~4,000 tokens in fewer characters
        with pytest.raises(ValueError, match="the question is too long: at most 512 tokens"):
            next(service.ask(question, [doc_a]))
    assert service.answer(NEEDLE_Q, [doc_a]).answer == "6150382"


def test_the_time_budget_stops_a_question_and_frees_the_model(service, doc_a):
    config = service.config
    service.config = dataclasses.replace(config, request_timeout_s=0.0)
    try:
        with pytest.raises(QuestionStopped, match="took longer than 0 s"):
            service.answer(f"{NEEDLE_Q} (budget)", [doc_a])
    finally:
        service.config = config
    assert _in_thread(lambda: service.answer(f"{NEEDLE_Q} (after)", [doc_a])).answer == "6150382"


def _one_token_a_step():
    """Answer params that commit one token a step: the question is still decoding after its first
    step, however sure the model is (with its threshold decoder it may settle all in one)."""
    return answer_params(model_defaults(BUNDLED_MODEL), decoder="low_confidence")


def test_a_cancelled_question_stops_and_frees_the_model(service, doc_a):
    cancel = threading.Event()
    with _handles_submitted(service) as handles:
        events = service.ask(f"{NEEDLE_Q} (cancelled)", [doc_a], params=_one_token_a_step(), cancel=cancel)
        for event in events:
            if event.kind == "step":
                cancel.set()  # what closing the browser tab does (the UI's unload event)
                break
        with pytest.raises(QuestionStopped, match="cancelled"):
            next(events)
    assert _never_answered(handles[0])
    assert _in_thread(lambda: service.answer(NEEDLE_Q, [doc_a])).answer == "6150382"


def test_an_abandoned_answer_stream_frees_the_model(service, doc_a):
    with _handles_submitted(service) as handles:
        events = service.ask(f"{NEEDLE_Q} (abandoned)", [doc_a], params=_one_token_a_step())
        assert next(e for e in events if e.kind == "step")
        events.close()  # what Gradio does with the generator of a client that went away
    assert _never_answered(handles[0])
    assert _in_thread(lambda: service.answer(NEEDLE_Q, [doc_a])).answer == "6150382"


def test_questions_are_answered_while_a_document_is_ingested(service, doc_a):
    results, errors = [], []

    def ingest():
        service.ingest(DOC_B + b" More filler about the harbour. " * 200, "growing.txt")

    def ask(i):
        try:
            results.append(service.answer(f"{NEEDLE_Q} ({i})", [doc_a]).answer)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=ingest)] + [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not errors and results == ["6150382"] * 4
    assert "growing.txt" in {d.record.name for d in service.documents()}


@pytest.mark.parametrize("damage", ["truncated", "overwritten"])
def test_damaged_kv_is_recomputed_not_answered_from(tmp_path, bundled_service_factory, damage):
    data = tmp_path / "data"
    first = bundled_service_factory(data)
    doc_id = first.ingest(DOC_A, "a.txt")[0].record.id
    del first
    shard = next((data / "kv" / doc_id).rglob("*.safetensors"))
    blob = shard.read_bytes()
    shard.write_bytes(blob[: len(blob) // 2] if damage == "truncated" else blob[:-4096] + b"\x7f" * 4096)
    service = bundled_service_factory(data)
    assert service.answer(NEEDLE_Q, [doc_id]).answer == "6150382"
    assert service.kv.prefills == 1  # recomputed, then stored again
    assert service.documents()[0].cached


def test_changed_weights_or_tokenizer_are_another_model(tmp_path, bundled_service_factory):
    from app.service import DocQA, ServiceConfig

    model = tmp_path / "model"
    shutil.copytree(BUNDLED_MODEL, model)
    data = tmp_path / "data"
    before = DocQA(ServiceConfig(data_dir=data, model_dir=model, device="cpu"))
    doc_id = before.ingest(DOC_A, "a.txt")[0].record.id
    assert before.answer(NEEDLE_Q, [doc_id]).answer == "6150382"
    fingerprint = before.kv.fingerprint
    del before
    shard = sorted(model.glob("*.safetensors"))[0]
    blob = bytearray(shard.read_bytes())
    blob[len(blob) // 3] ^= 0x01  # deep inside: neither the header nor the first or last MiB
    shard.write_bytes(bytes(blob))
    after = DocQA(ServiceConfig(data_dir=data, model_dir=model, device="cpu"))
    weights_changed = after.kv.fingerprint
    assert weights_changed != fingerprint
    assert not after.documents()[0].cached  # the old model's KV is not this model's
    result = after.answer(NEEDLE_Q, [doc_id])
    assert not result.cached and after.kv.prefills == 1  # nor are its stored answers
    del after
    tokenizer_config = model / "tokenizer_config.json"
    tokenizer_config.write_text(tokenizer_config.read_text().replace("{", '{"x": 1, ', 1))
    changed = DocQA(ServiceConfig(data_dir=data, model_dir=model, device="cpu"))
    assert changed.kv.fingerprint not in (fingerprint, weights_changed)
    digests = (data / "fingerprints.json").read_text()
    assert str(shard.resolve()) in digests  # weight digests are kept, keyed by size, times and inode


def test_deleting_a_document_leaves_no_trace(tmp_path, bundled_service_factory):
    data = tmp_path / "data"
    service = bundled_service_factory(data)
    marker = b"The quay inspector signs the ledger at noon."
    assert marker in DOC_A
    doc_id = service.ingest(DOC_A, "a.txt")[0].record.id
    keep = service.ingest(DOC_B, "b.md")[0].record.id
    assert service.answer(NEEDLE_Q, [doc_id]).answer == "6150382"  # memoised, with the cited text
    assert service.delete(doc_id)
    leftovers = [p for p in data.rglob("*") if p.is_file() and (marker in p.read_bytes() or doc_id in p.name)]
    assert leftovers == []
    assert [d.record.id for d in service.documents()] == [keep]
    assert service.answer(NEEDLE_Q.replace("amber-falcon", "silver-heron"), [keep]).answer == "4417093"
