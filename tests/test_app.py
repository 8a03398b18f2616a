"""The application: ingestion (every bad input), the QA service, the Gradio API, a real browser."""

from __future__ import annotations

import io
import json
import shutil
import socket
import threading
from datetime import datetime, timezone
from pathlib import Path

import pytest
from fpdf import FPDF
from pypdf import PdfReader, PdfWriter

from app.ingest import IngestError, extract, normalize
from app.service import DocQA, ServiceConfig

SAMPLES = Path(__file__).resolve().parents[1] / "sample_docs"
FACTS = json.loads((SAMPLES / "facts.json").read_text())
NEEDLE = "One of the special magic numbers for amber-falcon is: 6150382."
NEEDLE_Q = "What is the special magic number for amber-falcon mentioned in the provided text?"


def small_pdf(pages: int = 4, needle_page: int = 3, text: bool = True, needle: str = NEEDLE) -> bytes:
    pdf = FPDF()
    pdf.set_creation_date(datetime(2026, 1, 1, tzinfo=timezone.utc))  # same bytes every time
    for p in range(1, pages + 1):
        pdf.add_page()
        if text:
            pdf.set_font("Helvetica", size=11)
            body = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. " * 6
            if p == needle_page:
                body += needle
            pdf.multi_cell(0, 6, body)
    return bytes(pdf.output())


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    return DocQA(ServiceConfig(data_dir=tmp_path_factory.mktemp("data"), device="cpu", max_upload_bytes=2 << 20))


def covers(pages: str, page: int) -> bool:
    """Whether a cited page label ("3" or "3-4") includes `page` (chunks can straddle pages)."""
    lo, _, hi = pages.partition("-")
    return int(lo) <= page <= int(hi or lo)


def _stored(service) -> tuple[int, int]:
    uploads = Path(service.config.data_dir) / "uploads"
    return len(service.documents()), len(list(uploads.glob("*"))) if uploads.exists() else 0


# ---- extraction ------------------------------------------------------------------------------------

def test_normalisation_keeps_words_whole():
    raw = "con\ufb01rm the ex-\nample   text\nwraps\n\n\nNew para"
    assert normalize(raw) == "confirm the example text wraps\n\nNew para"


def test_pdf_pages_labels_and_offsets():
    data = (SAMPLES / "harbour-annual-report.pdf").read_bytes()
    seen = []
    doc = extract(data, "report.pdf", 50 << 20, progress=lambda done, total: seen.append((done, total)))
    assert len(doc.pages) == 60 and seen[-1] == (60, 60)
    page = doc.pages[FACTS[1]["page"] - 1]
    assert FACTS[1]["sentence"].rstrip(".") in doc.text[page.char_start:page.char_end]
    assert page.label == str(FACTS[1]["page"])


def test_pdfium_text_joins_hyphenated_words_and_keeps_the_hyphens_of_names():
    """PDFium marks a hyphen that ended a line with U+FFFE, the parts already joined (strings as
    it gives them for Valgrind's, Nettle's and the Debian FAQ's manuals)."""
    from app.pdf_text import pdfium_text

    cases = {"pointers to other docu\ufffementation will": "pointers to other documentation will",
             "use --gen\ufffesuppressions=yes": "use --gen-suppressions=yes",
             "--max-invoke\ufffems=<delay>": "--max-invoke-ms=<delay>", "a RISC\ufffelike set": "a RISC-like set",
             "ChaCha\ufffePoly1305": "ChaCha-Poly1305", "in February\ufffeMarch": "in February-March",
             "day\ufffeto-day": "day-to-day", "line one\r\nline two\x01.": "line one\nline two."}
    for raw, text in cases.items():
        assert pdfium_text(raw) == text, raw


FAQ_PDF = Path("/usr/share/doc/debian/FAQ/debian-faq.en.pdf.gz")


@pytest.mark.skipif(not FAQ_PDF.exists(), reason="the debian-faq package is not installed")
def test_words_spaced_by_position_are_read_apart():
    """Debian's FAQ (pdfTeX, CID fonts) spaces its words by glyph position, not with space
    characters: pypdf's text glued them ("Thisdocumentgives..."); PDFium's keeps them apart."""
    import gzip

    doc = extract(gzip.decompress(FAQ_PDF.read_bytes()), "debian-faq.pdf", 50 << 20)
    assert "This document gives frequently asked questions" in doc.text
    assert "Thisdocument" not in doc.text
    assert doc.pages[0].label == "i"  # page labels as the PDF names them (pypdf's)


def test_citations_follow_the_selections_ranking_after_the_chunk_that_answered_alone():
    from app.service import citation_order

    assert citation_order([-2.0, -1.0, -3.0], None) == [1, 0, 2]
    assert citation_order([-2.0, -1.0, -3.0], 2) == [2, 1, 0]
    assert citation_order([-2.0, -1.0, -3.0, -4.0], 2, [3]) == [2, 3, 1, 0]  # then the chunks a list was completed from
    assert citation_order([], None) == []


def _encrypted(user_password: str) -> bytes:
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(small_pdf())))
    writer.encrypt(user_password=user_password, owner_password="owner")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def test_encrypted_pdfs():
    assert "green" in extract(_encrypted(""), "open.pdf", 2 << 20).text  # empty user password: opens
    locked = _encrypted("s3cret")
    with pytest.raises(IngestError) as err:
        extract(locked, "locked.pdf", 2 << 20)
    assert err.value.code == "needs_password" and "password" in str(err.value)
    with pytest.raises(IngestError) as err:
        extract(locked, "locked.pdf", 2 << 20, password="wrong")
    assert err.value.code == "wrong_password"
    assert NEEDLE in extract(locked, "locked.pdf", 2 << 20, password="s3cret").text


@pytest.mark.parametrize("case", ["truncated", "garbage", "scanned", "empty", "png", "too_large", "binary"])
def test_bad_files_are_clear_errors_and_store_nothing(service, case):
    data, name, code = {
        "truncated": (small_pdf()[:700], "cut.pdf", "corrupt"),
        "garbage": (b"%PDF-1.7\n" + bytes(range(256)) * 20, "garbage.pdf", "corrupt"),
        "scanned": (small_pdf(text=False), "scan.pdf", "no_text"),
        "empty": (b"  \n", "empty.txt", "empty"),
        "png": (b"\x89PNG\r\n\x1a\n" + b"\x00" * 100, "photo.pdf", "wrong_type"),
        "too_large": (b"a" * (3 << 20), "big.txt", "too_large"),
        "binary": (b"\x00\x01\x02" * 100, "notes.txt", "wrong_type"),
    }[case]
    before = _stored(service)
    with pytest.raises(IngestError) as err:
        service.ingest(data, name)
    assert err.value.code == code
    assert "Traceback" not in str(err.value) and len(str(err.value)) < 300
    assert _stored(service) == before
    assert service.jobs()[0]["state"] == "failed"


def test_pdf_extraction_timeout():
    with pytest.raises(IngestError) as err:
        extract((SAMPLES / "harbour-annual-report.pdf").read_bytes(), "slow.pdf", 50 << 20, timeout_s=0.05)
    assert err.value.code == "timeout"


# ---- the service -----------------------------------------------------------------------------------

def test_ingest_ask_cite_and_remember(service):
    steps = []
    info, added = service.ingest(small_pdf(), "notes.pdf", progress=lambda stage, frac: steps.append(frac))
    assert added and info.record.page_count == 4 and info.cached and steps[-1] == 1.0
    again, added_again = service.ingest(small_pdf(), "copy.pdf")
    assert not added_again and again.record.id == info.record.id
    events = list(service.ask(NEEDLE_Q, [info.record.id]))
    assert [e.kind for e in events][-1] == "done" and any(e.kind == "step" for e in events)
    result = events[-1].result
    assert result.answer == "6150382"
    assert covers(result.citations[0].pages, 3) and result.citations[0].document == "notes.pdf"
    assert result.warning is None
    msgs = service.messages(result.conversation_id)
    assert msgs[-1].answer == "6150382" and covers(msgs[-1].selected_chunks[0]["pages"], 3)
    cached = service.answer(NEEDLE_Q, [info.record.id])
    assert cached.cached and cached.answer == "6150382"


def test_each_chosen_passage_is_read_alone_before_the_answer_is_given(service):
    """With every one of the top 4 passages kept, the bundled model reads each alone once the answer
    over all of them is settled (its docqa.json read_chunks_alone): the steps say the answer may
    still change, a status tells of the check, and the answer cites the needle's page first."""
    info, _ = service.ingest(small_pdf(pages=6, needle_page=5), "six.pdf")
    params = service.params(score_margin=0, coverage_gain=0)  # 0: the rule off, so all top_k are kept
    assert params.reads_chunks_alone
    events = list(service.ask(NEEDLE_Q, [info.record.id], params))
    steps = [e for e in events if e.kind == "step"]
    checks = [i for i, e in enumerate(events) if e.kind == "status" and e.partial]
    assert steps and all(e.may_change for e in steps)
    assert len(checks) == 1 and events[checks[0] - 1].kind == "step" and events[-1].kind == "done"
    result = events[-1].result
    assert len(result.citations) > 1 and result.answer == "6150382" and covers(result.citations[0].pages, 5)
    assert "lone_readings" in result.timings
    # Given only where a passage read alone confirms it: the needle's passage does.
    confirming = service.params(score_margin=0, coverage_gain=0, confirm_with_lone_reading=True)
    confirmed = service.answer(NEEDLE_Q, [info.record.id], params=confirming)
    assert confirmed.answer == "6150382" and covers(confirmed.citations[0].pages, 5) and confirmed.warning is None
    # One passage chosen: nothing to read alone, so the steps are the answer's as they come.
    events = list(service.ask(NEEDLE_Q, [info.record.id], service.params(top_k=1)))
    assert not any(e.may_change for e in events) and not any(e.kind == "status" and e.partial for e in events)
    assert events[-1].result.answer == "6150382" and len(events[-1].result.citations) == 1


def test_an_answer_past_the_budget_while_it_is_confirmed_is_not_found(service, monkeypatch):
    """The time budget runs out while the chosen passages are read alone to confirm the answer: the
    unconfirmed answer is not given; "not found" is, saying why (without confirmation the answer
    over all of them would be)."""
    import time

    from app.service import UNCONFIRMED_WARNING, QuestionStopped
    from engine.method.answer import LoneReadings

    info, _ = service.ingest(small_pdf(pages=6, needle_page=5), "six.pdf")
    params = service.params(score_margin=0, coverage_gain=0, confirm_with_lone_reading=True)
    spent = threading.Event()
    stopper, read = service._stopper, LoneReadings.read

    def budget_spent_once_reading_alone(cancel):
        stop = stopper(cancel)

        def check(budget: bool = True) -> None:
            if budget and spent.is_set():
                raise QuestionStopped("the answer took longer than its budget")
            stop(budget)
        return check

    def slow_read(self, *args):
        time.sleep(1.0)  # the asker, told the joint answer is read, checks its budget every 0.25 s
        return (yield from read(self, *args))

    monkeypatch.setattr(service, "_stopper", budget_spent_once_reading_alone)
    monkeypatch.setattr(LoneReadings, "read", slow_read)
    result = None
    for event in service.ask(f"{NEEDLE_Q} (past the budget)", [info.record.id], params):
        if event.kind == "status" and event.partial:  # the joint answer is settled: its passages are read alone
            spent.set()
        result = event.result if event.kind == "done" else result
    assert spent.is_set() and result.answer == "" and result.warning == UNCONFIRMED_WARNING


def test_chunks_keep_a_needle_whole(service):
    """The app cuts chunks at sentence starts: a needle that a fixed 127-token cut would split
    (its key in one chunk, its value in the next, so no chunk answers) stays in one chunk, and
    the question is answered."""
    from engine.method.chunking import chunk_starts

    filler = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. " * 4
    tok = service.engine.tokenizer
    for words in range(200):  # move the needle until a fixed cut falls inside it
        text = filler + "So it goes. " * (words // 3) + "And " * (words % 3) + NEEDLE + " " + filler
        at = text.index(NEEDLE)
        offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        first = next(i for i, (_, end) in enumerate(offsets) if end > at)
        last = next(i for i, (_, end) in enumerate(offsets) if end >= at + len(NEEDLE))
        if any(first < cut <= last for cut in chunk_starts(len(offsets), 127)):
            break
    else:
        pytest.fail("no filler length put a fixed cut inside the needle")
    info, _ = service.ingest(text.encode(), "cut.txt")
    records = service.kv.chunks(info.record.id, 128)
    assert sum(NEEDLE in r.text for r in records) == 1
    assert service.answer(NEEDLE_Q, [info.record.id]).answer == "6150382"


def test_weak_score_warns(service):
    info, _ = service.ingest(small_pdf(), "notes.pdf")
    result = service.answer("Who painted the ceiling of the opera house in Lisbon?", [info.record.id])
    assert result.warning and "may not contain" in result.warning


def test_sample_report_fact_on_page_42(service):
    info, _ = service.ingest((SAMPLES / "harbour-annual-report.pdf").read_bytes(), "harbour-annual-report.pdf")
    assert info.record.page_count == 60
    fact = FACTS[1]
    result = service.answer(fact["question"], [info.record.id])
    assert result.answer == fact["answer"]
    assert result.warning is None  # read from its passage: not flagged (app.grounding)
    assert covers(result.citations[0].pages, fact["page"])


def test_eight_simultaneous_questions(service):
    info, _ = service.ingest(small_pdf(), "notes.pdf")
    results, errors = [], []

    def one(i):
        try:
            results.append(service.answer(f"{NEEDLE_Q} ({i})", [info.record.id]))
        except Exception as exc:  # noqa: BLE001 - collected and reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors and len(results) == 8


def test_delete_removes_everything(service):
    info, _ = service.ingest(small_pdf(pages=2, needle_page=1), "gone.pdf")
    assert service.delete(info.record.id)
    assert info.record.id not in {d.record.id for d in service.documents()}
    assert not list((Path(service.config.data_dir) / "uploads").glob(f"{info.record.id}*"))


# ---- the web app -----------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(service, tmp_path_factory):
    from ui.app import launch  # uploads go to the service's own folder in its data folder

    port = _free_port()
    return launch(service, host="127.0.0.1", port=port, block=False), f"http://127.0.0.1:{port}/"


@pytest.fixture(scope="module")
def server(service, tmp_path_factory):
    web, url = _serve(service, tmp_path_factory)
    yield url
    web.close()


@pytest.fixture
def fresh_server(tmp_path_factory):
    """A server over an empty library, as a new user sees it."""
    web, url = _serve(DocQA(ServiceConfig(data_dir=tmp_path_factory.mktemp("fresh"), device="cpu")),
                       tmp_path_factory)
    yield url
    web.close()


def test_gradio_api(server, tmp_path):
    from gradio_client import Client, handle_file

    client = Client(server, verbose=False)
    path = tmp_path / "api-notes.pdf"
    path.write_bytes(small_pdf(pages=3, needle_page=2))
    status = client.predict([handle_file(str(path))], "", api_name="/ingest")
    assert "api-notes.pdf" in status[0]
    docs = client.predict(api_name="/list_documents")
    doc_id = next(d["id"] for d in docs if d["name"] == "api-notes.pdf")
    job = client.submit(NEEDLE_Q, [], [doc_id], None, 4, 128, 0, 64, 0.9, "static", "threshold", 0.8,
                        api_name="/ask")
    updates = list(job)
    final = job.result()
    assert len(updates) >= 2
    assert "6150382" in final[0][-1]["content"][0]["text"] if isinstance(final[0][-1]["content"], list) \
        else "6150382" in final[0][-1]["content"]


ASK_SETTINGS = (4, 128, 0, 64, 0.9, "static", "threshold", 0.8)  # the Settings tab's inputs, as the page sends them


def _chat_message(role: str, text: str) -> dict:
    return {"role": role, "content": [{"type": "text", "text": text}]}


def _text_of(message: dict) -> str:
    content = message["content"]
    return content if isinstance(content, str) else " ".join(part.get("text", "") for part in content)


def test_an_empty_question_leaves_the_conversation_as_it_was(server, service):
    """Ask with nothing typed: a note says to type a question; no output is replaced by an error."""
    from gradio_client import Client

    doc_id = service.ingest(small_pdf(), "notes.pdf")[0].record.id
    history = [_chat_message("user", "earlier"), _chat_message("assistant", "an answer")]
    for blank in ("", "   "):
        outputs = Client(server, verbose=False).predict(blank, history, [doc_id], None, *ASK_SETTINGS,
                                                        api_name="/ask")
        # Chat, conversation, question and sources all left unchanged.
        assert all(o.get("__type__") == "update" and o.get("value") is None for o in outputs if isinstance(o, dict))


def test_a_question_read_shows_no_interim_answer_and_clears_the_old_sources(server, service):
    """While a question the documents do not answer is read, the chat shows a neutral note, not the
    model's "not found" as if it were the answer; the sources line is marked pending at once."""
    from gradio_client import Client

    from app.service import NOT_FOUND_ANSWER

    doc_id = service.ingest(small_pdf(), "notes.pdf")[0].record.id
    question = "What is the special magic number for violet-badger mentioned in the provided text?"
    job = Client(server, verbose=False).submit(question, [], [doc_id], None, *ASK_SETTINGS, api_name="/ask")
    updates = [u for u in job if isinstance(u[0], list)]  # those that show the chat
    chat = [_text_of(u[0][-1]) for u in updates]
    assert not any("not found" in text.lower() for text in chat[:-1]), chat
    assert _text_of(job.result()[0][-1]).startswith(NOT_FOUND_ANSWER)
    assert "Sources of" in updates[0][3] and "when the answer is given" in updates[0][3]


def test_uploads_leave_no_temporary_files_and_start_up_removes_old_ones(server, service, tmp_path):
    from gradio_client import Client, handle_file

    from app.maintenance import diagnose
    from app.service import upload_debris

    path = tmp_path / "tmp-check.md"
    path.write_text("# Check\n\nThe boat is red.")
    Client(server, verbose=False).predict([handle_file(str(path))], "", api_name="/ingest")
    assert upload_debris(service.upload_dir) == []
    # Left by an earlier version or a killed server: the doctor reports it, the next start removes it.
    (service.upload_dir / "tmpleft0ver").touch()
    assert any("temporary upload" in problem for problem in diagnose(service.config.data_dir).problems)
    DocQA(ServiceConfig(data_dir=service.config.data_dir, device="cpu")).close()
    assert upload_debris(service.upload_dir) == []


def test_settings_score_margin(service):
    import gradio as gr

    from ui.settings import to_params

    values = (4, 128, 0, 64, 0.9, "static", "threshold")
    # The bundled model's docqa.json: selection by coverage, with a margin of 0.5.
    assert (service.defaults.score_margin, service.defaults.coverage_gain) == (0.5, 0.1)
    assert to_params(service, *values, 0.3)[0].score_margin == 0.3
    assert to_params(service, *values)[0].coverage_gain == 0.1
    both_off = to_params(service, *values, 0, 0)[0]  # both rules off: all K chunks are kept
    assert both_off.score_margin is None and both_off.coverage_gain is None
    # The model's block (64) where it divides the answer length, else the largest that does.
    assert to_params(service, *values)[0].sampling.block_length == 64
    assert to_params(service, 4, 128, 0, 96, 0.9, "static", "threshold")[0].sampling.block_length == 32
    with pytest.raises(gr.Error, match="score_margin"):
        to_params(service, *values, -1)
    with pytest.raises(gr.Error, match="coverage_gain"):
        to_params(service, *values, 0.5, -0.1)


def test_browser_upload_ask_and_inspect(fresh_server, tmp_path):
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(chromium).exists():
        pytest.skip("Debian chromium is not installed (.ci/run installs it)")
    from playwright.sync_api import expect, sync_playwright

    pdf = tmp_path / "browser-notes.pdf"  # its own needle: other documents in the library hold NEEDLE
    pdf.write_bytes(small_pdf(pages=5, needle_page=4,
                              needle="One of the special magic numbers for crimson-otter is: 2718281."))
    question = "What is the special magic number for crimson-otter mentioned in the provided text?"
    shots = Path(__file__).resolve().parents[1] / "test-artifacts"
    shots.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        page = browser.new_page(viewport={"width": 1300, "height": 1000})
        page.goto(fresh_server)
        page.locator("#upload input[type=file]").set_input_files(str(pdf))
        page.locator("#add-documents").click()
        # "chunks)" is in the final status only (the progress overlay also names the file).
        expect(page.locator("#ingest-status")).to_contain_text("browser-notes.pdf: added", timeout=180_000)
        expect(page.locator("#ingest-status")).to_contain_text("chunks)", timeout=180_000)
        page.get_by_role("tab", name="Chat").click()
        page.locator("#question textarea").fill(question)
        page.locator("#ask").click()
        expect(page.locator("#chatbot")).to_contain_text("2718281", timeout=300_000)
        expect(page.locator("#chatbot")).to_contain_text("browser-notes.pdf", timeout=30_000)
        page.screenshot(path=str(shots / "chat.png"), full_page=True)
        page.get_by_role("tab", name="Inspect").click()
        expect(page.locator("#relevance")).to_be_visible(timeout=30_000)
        page.screenshot(path=str(shots / "inspect.png"), full_page=True)
        # The panel holds the model's own defaults: a slider step coarser than the bundled
        # threshold (0.999) snapped it to 1 in the browser.
        page.get_by_role("tab", name="Settings").click()
        expect(page.get_by_label("range slider for Confidence threshold")).to_have_value("0.999")
        browser.close()


def test_collections(service):
    a, _ = service.ingest(small_pdf(pages=2, needle_page=1), "a.pdf")
    b, _ = service.ingest(b"Notes about the harbour.\n\nThe gate code is 55-1207.", "b.md")
    service.save_collection("harbour", [a.record.id, b.record.id])
    assert set(service.collections()["harbour"]) == {a.record.id, b.record.id}
    result = service.answer(NEEDLE_Q, service.collections()["harbour"])
    assert result.answer == "6150382" and result.citations[0].document == "a.pdf"
    with pytest.raises(ValueError, match="needs a name"):
        service.save_collection("  ", [a.record.id])
    assert service.delete_collection("harbour") and "harbour" not in service.collections()


CLI_ENV = {"GRADIO_ANALYTICS_ENABLED": "False"}


def test_cli_ingest_ask_list_rm(tmp_path):
    import os
    import subprocess
    import sys

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "ui.cli", *args, "--data-dir", str(tmp_path / "d"),
                               "--device", "cpu"], capture_output=True, text=True, timeout=600,
                              env=os.environ | CLI_ENV)

    pdf = tmp_path / "cli-notes.pdf"
    pdf.write_bytes(small_pdf())
    res = cli("ingest", str(pdf))
    assert res.returncode == 0 and "added: cli-notes.pdf" in res.stdout, res.stderr
    res = cli("ask", "cli-notes.pdf", NEEDLE_Q)
    assert res.returncode == 0 and res.stdout.strip() == "6150382", res.stderr
    assert "[cli-notes.pdf, p. 3" in res.stderr
    assert "cli-notes.pdf" in cli("list").stdout
    bad = tmp_path / "photo.pdf"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64)
    res = cli("ingest", str(bad))
    assert res.returncode == 1 and "photo.pdf: it is a PNG image" in res.stderr and "Traceback" not in res.stderr
    res = cli("ask", "nothing.pdf", "What?")
    assert res.returncode == 2 and "no stored document named 'nothing.pdf'" in res.stderr
    assert cli("rm", "cli-notes.pdf").returncode == 0
    assert "no documents yet" in cli("list").stdout


@pytest.mark.slow
def test_300_page_pdf_ingests_with_progress(service, tmp_path):
    import time

    pdf = FPDF()
    pdf.set_creation_date(datetime(2026, 1, 1, tzinfo=timezone.utc))
    pdf.set_font("Helvetica", size=10)
    for p in range(300):
        pdf.add_page()
        pdf.multi_cell(0, 5, f"Page {p + 1}. " + "The pilot boats reviewed the quay repairs with the crew. " * 12)
    fractions, stages = [], []
    start = time.perf_counter()
    info, _ = service.ingest(bytes(pdf.output()), "long.pdf",
                             progress=lambda stage, frac: (fractions.append(frac), stages.append(stage)))
    seconds = time.perf_counter() - start
    assert info.record.page_count == 300 and info.cached
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert any("extracting page 300/300" in s for s in stages) and any(s.startswith("encoding chunk") for s in stages)
    print(f"300-page PDF: {info.tokens} tokens, {info.chunks} chunks, ingested in {seconds:.1f} s")


def test_the_app_runs_bf16_on_a_cpu_that_multiplies_it_natively(tmp_path):
    import torch

    from app.service import app_dtype
    from engine.model.weights import cpu_has_native_bf16

    zen4, older = tmp_path / "zen4", tmp_path / "older"
    zen4.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n")
    older.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f\n")
    assert cpu_has_native_bf16(zen4) and not cpu_has_native_bf16(older)
    assert not cpu_has_native_bf16(tmp_path / "missing")
    assert app_dtype(torch.device("cpu"), "float32") == torch.float32
    assert app_dtype(torch.device("cuda"), None) == torch.bfloat16
    expected = torch.bfloat16 if cpu_has_native_bf16() else torch.float32
    assert app_dtype(torch.device("cpu")) == expected
    with pytest.raises(ValueError, match="unknown dtype"):
        app_dtype(torch.device("cpu"), "int8")


def test_kept_words_shade_whole_words_by_their_most_kept_token():
    """Inspect reads words, not BPE pieces: a word's heat is its most kept token's share, the BOS
    slot (kept counts' first) belongs to no word, and whitespace stays with the word before it."""
    from app.service import kept_words

    text = "Beruthallocation is 42."
    spans = [(0, 3), (3, 6), (6, 10), (10, 16), (16, 19), (19, 22), (22, 23)]  # "Ber" "uth" "allo" "cation" ...
    kept = [24, 6, 12, 0, 3, 24, 0, 12]  # BOS, then one count per token
    words = kept_words(text, spans, kept)
    assert [w for w, _ in words] == ["Beruthallocation ", "is ", "42."]
    assert "".join(w for w, _ in words) == text
    assert [h for _, h in words] == [0.5, 1.0, 0.5]
    assert kept_words(text, spans, []) == [("Beruthallocation ", None), ("is ", None), ("42.", None)]
    assert kept_words("  lead", [(2, 6)], [1, 1]) == [("  lead", 1.0)]
