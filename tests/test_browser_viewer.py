"""The document viewer and the Inspect view in a real headless Chromium, over a real server on
127.0.0.1 and a real data folder: upload, ask, click a source, and check that the page image
shows with the highlight on the cited text (against the boxes PDFium reports for the needle);
read the Inspect view's words back; page through; reopen the conversation after a restart."""

from __future__ import annotations

import shutil
from pathlib import Path

import pypdfium2 as pdfium
import pytest

from app.service import DocQA, ServiceConfig
from tests.test_app import _free_port, small_pdf

NEEDLE = "One of the special magic numbers for silver-heron is: 4142135."
QUESTION = "What is the special magic number for silver-heron mentioned in the provided text?"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian chromium is not installed (.ci/run does)")


def needle_boxes(pdf: bytes, page_index: int, needle: str) -> list[tuple[float, float, float, float]]:
    """The needle's characters' boxes as PDFium reports them, as fractions of the page (left, top,
    right, bottom; origin top-left), whitespace left out."""
    doc = pdfium.PdfDocument(pdf)
    try:
        page = doc[page_index]
        width, height = page.get_width(), page.get_height()
        text = page.get_textpage()
        found = text.search(needle[:30]).get_next()
        assert found is not None, "the needle is not on its page"
        start = found[0]
        out = []
        for i in range(start, start + len(needle)):
            left, bottom, right, top = text.get_charbox(i)
            if right > left and top > bottom:
                out.append((left / width, (height - top) / height, right / width, (height - bottom) / height))
        return out
    finally:
        doc.close()


def on_page_boxes(page) -> tuple[dict, list[dict]]:
    """The page image's rectangle and the highlight boxes' rectangles, in CSS pixels."""
    image = page.locator("#docqa-page-image").bounding_box()
    boxes = [page.locator(".docqa-box").nth(i).bounding_box() for i in range(page.locator(".docqa-box").count())]
    return image, boxes


def covered(char: tuple[float, float, float, float], image: dict, boxes: list[dict], slack_px: float = 2.5) -> bool:
    """Whether the character's centre (fractions of the page) lies inside one of the boxes."""
    x = image["x"] + (char[0] + char[2]) / 2 * image["width"]
    y = image["y"] + (char[1] + char[3]) / 2 * image["height"]
    return any(b["x"] - slack_px <= x <= b["x"] + b["width"] + slack_px
               and b["y"] - slack_px <= y <= b["y"] + b["height"] + slack_px for b in boxes)


def open_app(playwright, url: str, height: int):
    """Headless Chromium on the app: (browser, page)."""
    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
    page = browser.new_page(viewport={"width": 1400, "height": height})
    page.goto(url)
    return browser, page


def launch(data_dir: Path):
    from ui.app import launch as serve

    port = _free_port()
    service = DocQA(ServiceConfig(data_dir=data_dir, device="cpu"))
    return service, serve(service, host="127.0.0.1", port=port, block=False), f"http://127.0.0.1:{port}/"


def test_citation_opens_the_page_with_the_passage_highlighted(tmp_path):
    from playwright.sync_api import expect, sync_playwright

    pdf_bytes = small_pdf(pages=5, needle_page=4, needle=NEEDLE)
    pdf = tmp_path / "heron-notes.pdf"
    pdf.write_bytes(pdf_bytes)
    data = tmp_path / "data"
    shots = Path(__file__).resolve().parents[1] / "test-artifacts"
    shots.mkdir(exist_ok=True)
    service, web, url = launch(data)
    try:
        with sync_playwright() as p:
            browser, page = open_app(p, url, height=1100)
            expect(page.locator("#header")).to_contain_text("docqa-tiny")
            expect(page.locator("#header")).to_contain_text("on CPU")
            page.locator("#upload input[type=file]").set_input_files(str(pdf))
            page.locator("#add-documents").click()
            expect(page.locator("#ingest-status")).to_contain_text("heron-notes.pdf: added", timeout=180_000)
            expect(page.locator("#documents")).to_contain_text("ready")

            page.get_by_role("tab", name="Chat").click()
            expect(page.locator("#model-note")).to_contain_text("trained for lookups")
            page.locator("#question textarea").fill(QUESTION)
            page.locator("#ask").click()
            expect(page.locator("#chatbot")).to_contain_text("4142135", timeout=300_000)
            expect(page.locator("#sources .docqa-cite").first).to_be_visible(timeout=60_000)

            # The source that holds the needle: the answer's citation on page 4.
            result = service.stored_results(service.conversations()[0]["id"])[-1][1]
            cited = next(i for i, c in enumerate(result.citations) if NEEDLE in c.text)
            page.locator(f'#sources [data-cite="{cited}"]').click()
            expect(page.locator("#viewer-title")).to_contain_text("page 4 (4 of 5)", timeout=60_000)
            image = page.locator("#docqa-page-image")
            expect(image).to_be_visible()
            assert image.evaluate("img => img.complete && img.naturalWidth > 500")
            page_rect, boxes = on_page_boxes(page)
            assert boxes, "no highlight on the page"
            chars = needle_boxes(pdf_bytes, 3, NEEDLE)
            assert chars and all(covered(c, page_rect, boxes) for c in chars), (chars, page_rect, boxes)
            # The highlight is the passage, not the whole page: the page's first line (page 4's
            # chunk starts within the page's text) is not boxed entirely.
            assert sum(b["height"] for b in boxes) < 0.6 * page_rect["height"]
            page.screenshot(path=str(shots / "viewer.png"), full_page=True)

            page.locator("#viewer-next").click()
            expect(page.locator("#viewer-title")).to_contain_text("page 5 (5 of 5)")
            page.locator("#viewer-prev").click()
            expect(page.locator("#viewer-title")).to_contain_text("page 4 (4 of 5)")
            expect(page.locator(".docqa-box").first).to_be_visible()

            # Inspect: the chosen chunks read back as their text, one element a word.
            page.get_by_role("tab", name="Inspect").click()
            chunk = page.locator("#chosen-chunks .docqa-words").nth(cited)
            expect(chunk).to_be_visible()
            words = chunk.locator(".docqa-word").all_inner_texts()
            assert "".join(words).split() == result.citations[cited].text.split()
            assert len(words) == len(result.citations[cited].text.split())
            assert "silver-heron" in [w.strip() for w in words]
            expect(page.locator("#timings-table")).to_contain_text("ms")
            expect(page.locator("#timings-table")).to_contain_text("total")
            page.screenshot(path=str(shots / "inspect-words.png"), full_page=True)

            # A bar of the relevance plot opens its chunk in the viewer, on the Chat tab.
            page.locator('#relevance .docqa-bar[data-selected="1"]').first.click()
            expect(page.locator("#viewer-title")).to_contain_text("Highlighted:")
            expect(page.locator("#docqa-page-image")).to_be_visible()

            # With a token budget (B > 0) the words are shaded by the share of layers and heads
            # that kept them: the shades differ from word to word.
            page.get_by_role("tab", name="Settings").click()
            page.get_by_label("B tokens per chunk (0 = all)").fill("16")
            page.get_by_role("tab", name="Chat").click()
            page.locator("#question textarea").fill(QUESTION)
            page.locator("#ask").click()
            expect(page.locator("#chatbot em", has_text="Sources:")).to_have_count(2, timeout=300_000)
            page.get_by_role("tab", name="Inspect").click()
            expect(page.locator("#chosen-chunks")).to_contain_text("Darker: more layers and heads", timeout=60_000)
            heats = page.locator("#chosen-chunks .docqa-word").evaluate_all("ws => ws.map(w => w.dataset.heat)")
            assert len({h for h in heats if h}) > 2, heats
            page.get_by_role("tab", name="Chat").click()
            browser.close()
    finally:
        web.close()
        service.close()

    # After a restart the conversation, its sources and its page come back.
    service, web, url = launch(data)
    try:
        with sync_playwright() as p:
            browser, page = open_app(p, url, height=1100)
            page.get_by_role("tab", name="Chat").click()
            page.get_by_role("combobox", name="Conversation").click()
            page.get_by_role("option").first.click()
            expect(page.locator("#chatbot")).to_contain_text("4142135", timeout=60_000)
            expect(page.locator("#sources .docqa-cite").first).to_be_visible(timeout=60_000)
            page.locator(f'#sources [data-cite="{cited}"]').click()
            expect(page.locator("#viewer-title")).to_contain_text("page 4 (4 of 5)", timeout=60_000)
            page_rect, boxes = on_page_boxes(page)
            assert boxes and all(covered(c, page_rect, boxes) for c in needle_boxes(pdf_bytes, 3, NEEDLE))
            browser.close()
    finally:
        web.close()
        service.close()


def long_pdf(pages: int) -> bytes:
    from datetime import datetime, timezone

    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_creation_date(datetime(2026, 1, 1, tzinfo=timezone.utc))
    pdf.set_font("Helvetica", size=10)
    for p in range(pages):
        pdf.add_page()
        pdf.multi_cell(0, 5, f"Page {p + 1}. " + "The pilot boats reviewed the quay repairs with the crew. " * 14)
    return bytes(pdf.output())


def test_an_ingest_shows_one_progress_bar_and_can_be_cancelled(tmp_path):
    """A long document being added shows in the library with its progress (pages, chunks, time
    left) as one bar, and its Cancel button stops it: nothing of it stays."""
    from playwright.sync_api import expect, sync_playwright

    pdf = tmp_path / "long-report.pdf"
    pdf.write_bytes(long_pdf(300))
    service, web, url = launch(tmp_path / "data")
    try:
        with sync_playwright() as p:
            browser, page = open_app(p, url, height=1000)
            page.locator("#upload input[type=file]").set_input_files(str(pdf))
            page.locator("#add-documents").click()
            job = page.locator("#jobs .docqa-job")
            expect(job).to_have_count(1, timeout=60_000)
            expect(job.locator("progress")).to_have_count(1)
            expect(job).to_contain_text("encoding chunk", timeout=60_000)
            expect(job).to_contain_text("left", timeout=60_000)
            expect(page.locator("#documents")).to_contain_text("being added")
            assert page.locator("progress").count() == 1  # one bar an ingest, not one a panel
            page.screenshot(path=str(Path(__file__).resolve().parents[1] / "test-artifacts" / "ingest.png"))
            job.locator(".docqa-cancel").click()
            expect(page.locator("#ingest-status")).to_contain_text("was cancelled", timeout=60_000)
            expect(page.locator("#jobs .docqa-job")).to_have_count(0, timeout=10_000)
            expect(page.locator("#documents")).not_to_contain_text("long-report.pdf")
            browser.close()
        assert service.documents(include_failed=True) == []
    finally:
        web.close()
        service.close()
