"""The document viewer's mapping from a chunk's characters to boxes on its page (pure functions),
the viewer over a real data folder (PDF pages drawn by PDFium, text documents, bad input), answers
reopened after a restart, and ingest progress and cancelling."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pypdfium2 as pdfium
import pytest

from app.ingest import IngestError
from app.jobs import JobProgress, describe, progress_of, seconds_left
from app.service import DocQA, ServiceConfig
from app.viewer import (
    Box,
    ViewerError,
    align_texts,
    line_boxes,
    matched_indices,
    part_count,
    passage_runs,
    spans_on_pages,
    text_part,
    to_fractions,
)
from storage import PageSpan
from tests.test_app import NEEDLE, NEEDLE_Q, small_pdf

# ---- pure functions --------------------------------------------------------------------------------


def test_spans_on_pages_cut_a_chunk_by_page():
    pages = [PageSpan(0, "i", 0, 10, True), PageSpan(1, "1", 12, 30, True), PageSpan(2, "2", 32, 40, True)]
    assert spans_on_pages(5, 20, pages) == {0: (5, 10), 1: (0, 8)}
    assert spans_on_pages(10, 12, pages) == {}  # the separator between two pages belongs to neither
    assert spans_on_pages(0, 40, pages) == {0: (0, 10), 1: (0, 18), 2: (0, 8)}


def test_align_texts_ignores_whitespace_case_ligatures_and_hyphenation():
    ours = "The office confirms the example."
    theirs = "The o\ufb03ce con-\r\nﬁrms the EX-\r\nample."
    alignment = align_texts(ours, theirs)
    assert theirs[alignment[ours.index("confirms")]] == "c"
    assert theirs[alignment[ours.index("example")]] == "E"
    assert alignment[ours.index("ffice")] == alignment[ours.index("ffice") + 2]  # "ffi" is one ligature there
    assert all(alignment[i] == -1 for i, ch in enumerate(ours) if ch == " ")
    same = align_texts("a b\nc", "a\r\nb c")
    assert [same[0], same[2], same[4]] == [0, 3, 5]


def test_matched_indices_bridge_line_end_hyphens_and_report_the_share_placed():
    ours = "the example text"
    theirs = "the ex-\r\nample text"
    alignment = align_texts(ours, theirs)
    indices, share = matched_indices(alignment, 4, 11, ours, theirs)  # "example"
    assert share == 1.0
    assert "".join(theirs[i] for i in indices) == "ex-ample"  # the hyphen is boxed too, the line break not
    _, none = matched_indices(align_texts("zzzz", "abcd"), 0, 4, "zzzz", "abcd")
    assert none == 0.0


def test_line_boxes_merge_characters_by_line():
    line1 = [(10 + 6 * i, 700, 15 + 6 * i, 710) for i in range(5)]
    line2 = [(10 + 6 * i, 688, 15 + 6 * i, 698) for i in range(3)]
    glyphless = [(50, 700, 50, 700)]
    assert line_boxes(line1 + glyphless + line2) == [(10, 700, 39, 710), (10, 688, 27, 698)]
    far = [(10, 700, 15, 710), (400, 700, 405, 710)]  # another column on the same height
    assert len(line_boxes(far)) == 2


def test_to_fractions_flips_to_a_top_left_origin():
    assert to_fractions((100, 700, 300, 720), 400, 800) == Box(0.25, 0.1, 0.5, 0.025)


def test_passage_runs_mark_the_chunk_inside_the_window():
    text = "abcdefghij"
    assert passage_runs(text, (2, 8), [(4, 6)]) == [("cd", False), ("ef", True), ("gh", False)]
    assert passage_runs(text, (2, 8), [(0, 3)]) == [("c", True), ("defgh", False)]
    assert passage_runs(text, (0, 4), []) == [("abcd", False)]
    assert text_part(7000, 2) == (6000, 7000) and part_count(7000) == 3 and part_count(0) == 1


def test_job_progress_reads_as_pages_chunks_and_time_left():
    assert seconds_left(0, 10, 5.0) is None
    assert seconds_left(4, 10, 8.0) == 12.0
    now = datetime(2026, 12, 3, 12, 0, 0, tzinfo=timezone.utc)
    row = {"id": 3, "name": "big.pdf", "stage": "encoding chunk 10/40", "fraction": 0.625, "state": "running",
           "error": None, "pages_done": 60, "pages_total": 60, "chunks_done": 10, "chunks_total": 40,
           "stage_started_at": (now - timedelta(seconds=20)).isoformat()}
    job = progress_of(row, now)
    assert job.seconds_left == 60.0
    assert describe(job) == "60 pages read; encoding chunk 10 of 40, about 1 min 00 s left"
    reading = JobProgress(1, "a.pdf", "extracting", 0.1, 12, 60, 0, 0, None, "running", None)
    assert describe(reading) == "reading page 12 of 60"


def test_relevance_bars_stand_on_their_pages():
    from ui.inspect import bar_layout

    scores = [{"document": "a.pdf", "chunk": c, "score": s, "selected": c == 2, "pages": str(p + 1),
               "page_start": p, "page_end": p, "document_pages": 4, "char_start": 0, "char_end": 1,
               "document_chars": 10} for c, (p, s) in enumerate([(0, -3.0), (0, -2.0), (3, -1.0)])]
    bars = bar_layout(scores)
    assert [(b["left"], b["width"]) for b in bars] == [(0.0, 12.5), (12.5, 12.5), (75.0, 25.0)]
    assert [b["height"] for b in bars] == [3.0, 50.0, 100.0]


# ---- the viewer over a real data folder --------------------------------------------------------------

@pytest.fixture(scope="module")
def service(tmp_path_factory):
    svc = DocQA(ServiceConfig(data_dir=tmp_path_factory.mktemp("viewer-data"), device="cpu"))
    yield svc
    svc.close()


def _needle_fractions(pdf: bytes, page_index: int) -> list[tuple[float, float]]:
    doc = pdfium.PdfDocument(pdf)
    try:
        page = doc[page_index]
        w, h = page.get_width(), page.get_height()
        text = page.get_textpage()
        start, count = text.search(NEEDLE).get_next()
        out = []
        for i in range(start, start + count):
            left, bottom, right, top = text.get_charbox(i)
            if right > left:
                out.append(((left + right) / 2 / w, (h - (top + bottom) / 2) / h))
        return out
    finally:
        doc.close()


def test_a_cited_pdf_page_has_its_passage_boxed(service):
    pdf = small_pdf(pages=4, needle_page=3)
    info, _ = service.ingest(pdf, "notes.pdf")
    result = service.answer(NEEDLE_Q, [info.record.id])
    cite = next(c for c in result.citations if NEEDLE in c.text)
    view = service.view(cite.document_id, None, (cite.char_start, cite.char_end))
    assert view.kind == "pdf" and view.page_index == 2 and view.label == "3" and view.page_count == 4
    assert view.png.startswith(b"\x89PNG")
    centres = _needle_fractions(pdf, 2)
    assert centres and all(any(b.left <= x <= b.left + b.width and b.top <= y <= b.top + b.height
                               for b in view.boxes) for x, y in centres)
    other = service.view(cite.document_id, 0, (cite.char_start, cite.char_end))  # a page the chunk is not on
    assert other.boxes == [] and other.png is not None
    with pytest.raises(ViewerError, match="page 9 does not exist: notes.pdf has 4 pages"):
        service.view(cite.document_id, 8, None)
    with pytest.raises(ViewerError, match="no longer in the library"):
        service.view("f" * 64, 0, None)


def test_a_pdf_pdfium_cannot_open_shows_its_text_instead(service):
    info, _ = service.ingest(small_pdf(pages=2, needle_page=2), "damaged-later.pdf")
    for path in service.store.uploads_of(info.record.id):
        path.write_bytes(b"%PDF-1.7\n" + bytes(range(256)) * 4)  # the kept original damaged on disk
    chunk = service.kv.chunks(info.record.id, service.defaults.chunk_size)[-1]
    view = service.view(info.record.id, None, (chunk.char_start, chunk.char_end))
    assert view.kind == "text" and view.png is None
    assert "cannot be shown" in view.note and "Traceback" not in view.note
    assert any(marked and NEEDLE[:20] in text for text, marked in view.passage)


def test_a_text_document_shows_the_passage_marked(service):
    body = "Notes about the harbour.\n\n" + "The tide was calm that week. " * 200 + "The gate code is 55-1207. " + \
        "Gulls circled the quay. " * 200
    info, _ = service.ingest(body.encode(), "harbour.md")
    start = body.index("The gate code")
    view = service.view(info.record.id, None, (start, start + 26))
    assert view.kind == "text" and view.label.startswith("part ")
    marked = "".join(t for t, m in view.passage if m)
    assert marked == "The gate code is 55-1207. "
    with pytest.raises(ViewerError, match="does not exist"):
        service.view(info.record.id, 99, None)


def test_answers_and_sources_reopen_after_a_restart(service, tmp_path):
    data = tmp_path / "restart"
    first = DocQA(ServiceConfig(data_dir=data, device="cpu"))
    info, _ = first.ingest(small_pdf(), "notes.pdf")
    result = first.answer(NEEDLE_Q, [info.record.id])
    first.close()
    again = DocQA(ServiceConfig(data_dir=data, device="cpu"))
    try:
        question, stored = again.stored_results(result.conversation_id)[-1]
        assert question == NEEDLE_Q and stored.answer == "6150382"
        assert [c.char_start for c in stored.citations] == [c.char_start for c in result.citations]
        assert stored.citations[0].kept_words == result.citations[0].kept_words
        assert stored.scores == result.scores and stored.anchors == result.anchors
        c = stored.citations[0]
        assert again.view(c.document_id, None, (c.char_start, c.char_end)).boxes
    finally:
        again.close()


def test_an_answer_stored_before_spans_finds_its_chunk(service):
    info, _ = service.ingest(small_pdf(pages=3, needle_page=3), "old.pdf")
    conv = service.store.create_conversation("old")
    service.store.add_message(conv, "q?", "6150382", [info.record.id], {},
                              [{"document": "old.pdf", "chunk": 1, "pages": "1", "score": -1.0}], {})
    (_, result), = service.stored_results(conv)
    chunk = service.kv.chunks(info.record.id, service.defaults.chunk_size)[1]
    assert result.citations[0].document_id == info.record.id
    assert (result.citations[0].char_start, result.citations[0].char_end) == (chunk.char_start, chunk.char_end)


def test_an_ingest_reports_pages_and_chunks_and_can_be_cancelled(service):
    info, _ = service.ingest(small_pdf(pages=3, needle_page=1, needle="Counted once."), "counted.pdf")
    job = service.ingest_progress(active_only=False)[0]
    assert (job.name, job.state, job.pages_done, job.pages_total) == ("counted.pdf", "done", 3, 3)
    assert job.chunks_total == info.chunks and job.chunks_done == info.chunks
    cancel = threading.Event()
    seen = []

    def progress(stage, frac):
        seen.append(stage)
        if stage == "extracting page 2/6":
            cancel.set()  # as the Cancel button does, midway

    before = {d.record.id for d in service.documents(include_failed=True)}
    with pytest.raises(IngestError) as err:
        service.ingest(small_pdf(pages=6, needle_page=2, needle="Never kept."), "stopped.pdf", progress=progress,
                       cancel=cancel)
    assert err.value.code == "cancelled" and "nothing of it was kept" in str(err.value)
    assert {d.record.id for d in service.documents(include_failed=True)} == before
    assert service.ingest_progress(active_only=False)[0].state == "failed"
    assert "extracting page 3/6" not in seen  # it stopped at the next page
    assert not service.cancel_job(10_000)
