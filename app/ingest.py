"""Turning an uploaded file into text with page spans: PDF (app.pdf_text: PDFium, pypdf), plain text and Markdown.

Each page's text is normalised (`app.pdf_text.normalize`: ligatures, soft hyphens, words
hyphenated across lines, runs of whitespace) and pages are joined with a blank line, so every
character of the text belongs to a known page and chunks can cite page labels. PDF extraction runs
in a child process with a time limit (`app.pdf_text`): a malformed file can hang or exhaust the
parser without taking the app down.
Every failure is an `IngestError` with a code and a sentence a person understands; nothing is
stored for a file that fails.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.pdf_text import normalize
from storage import PageSpan

logger = logging.getLogger(__name__)

PAGE_SEPARATOR = "\n\n"


class IngestError(ValueError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class ExtractedDocument:
    text: str
    pages: list[PageSpan]
    mime: str
    encrypted: bool = False  # a PDF opened with a password: its text is never memoised


def sniff_kind(data: bytes, name: str) -> str:
    """'pdf', 'markdown' or 'text', decided from the bytes (the name only tells Markdown from text)."""
    if data.lstrip()[:5] == b"%PDF-":
        return "pdf"
    head = data[:8]
    signatures = ((b"\x89PNG", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"), (b"GIF8", "a GIF image"),
                  (b"PK\x03\x04", "a ZIP archive (or an Office file)"), (b"\x1f\x8b", "a gzip archive"))
    for magic, what in signatures:
        if head.startswith(magic):
            raise IngestError("wrong_type", f"{name} is {what}, not a PDF, text or Markdown file")
    if b"\x00" in data[:65536]:
        raise IngestError("wrong_type", f"{name} is a binary file, not a PDF, text or Markdown file")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        raise IngestError("wrong_type", f"{name} is neither a PDF nor UTF-8 text") from None
    return "markdown" if Path(name).suffix.lower() in (".md", ".markdown") else "text"


def _join_pages(page_texts: list[str], labels: list[str]) -> tuple[str, list[PageSpan]]:
    parts, pages, pos = [], [], 0
    for i, (text, label) in enumerate(zip(page_texts, labels, strict=True)):
        if parts:
            parts.append(PAGE_SEPARATOR)
            pos += len(PAGE_SEPARATOR)
        parts.append(text)
        pages.append(PageSpan(i, label, pos, pos + len(text), bool(text.strip())))
        pos += len(text)
    return "".join(parts), pages


def extract_text_file(data: bytes, kind: str) -> ExtractedDocument:
    text = normalize(data.decode("utf-8-sig"))
    if not text.strip():
        raise IngestError("empty", "the file contains no text")
    joined, pages = _join_pages([text], ["1"])
    return ExtractedDocument(joined, pages, "text/markdown" if kind == "markdown" else "text/plain")


def extract_pdf(data: bytes, password: str | None = None, timeout_s: float = 300.0,
                progress: Callable[[int, int], None] | None = None) -> ExtractedDocument:
    """Extracts a PDF in a child process (`python -m app.pdf_text`), killed after `timeout_s`."""
    env = dict(os.environ, DOCQA_PDF_PASSWORD=password or "")
    repo = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([repo, env.get("PYTHONPATH", "")])
    proc = subprocess.Popen([sys.executable, "-m", "app.pdf_text"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env)
    timer = threading.Timer(timeout_s, proc.kill)
    timer.start()
    result = None
    try:
        proc.stdin.write(data)
        proc.stdin.close()
        for line in proc.stdout:
            msg = json.loads(line)
            if msg[0] == "progress":
                if progress is not None:
                    progress(msg[1], msg[2])
            else:
                result = msg
        proc.wait()
    except (BrokenPipeError, json.JSONDecodeError):
        proc.kill()
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
    if result is None:
        if proc.returncode == -9 or not timer.is_alive() and proc.returncode not in (0, None):
            raise IngestError("timeout", f"reading the PDF took longer than {timeout_s:.0f} s or crashed the reader")
        raise IngestError("corrupt", "the PDF reader stopped unexpectedly on this file")
    if result[0] == "error":  # ["error", kind, what the reader is told, the parser's detail (optional)]
        if len(result) > 3:
            logger.info("PDF not read (%s): %s", result[1], result[3])
        raise IngestError(result[1], result[2])
    texts, labels, encrypted = result[1], result[2], result[3]
    if not texts:
        raise IngestError("empty", "the PDF has no pages")
    if not any(t.strip() for t in texts):
        raise IngestError("no_text", "the PDF has no text layer (a scan?); run OCR on it first")
    text, pages = _join_pages(texts, labels)
    return ExtractedDocument(text, pages, "application/pdf", encrypted)


def extract(data: bytes, name: str, max_bytes: int, password: str | None = None, timeout_s: float = 300.0,
            progress: Callable[[int, int], None] | None = None) -> ExtractedDocument:
    """Checks size and type from the bytes, then extracts. Raises IngestError."""
    if len(data) > max_bytes:
        raise IngestError("too_large", f"{name} is {len(data) / 2**20:.1f} MiB; the limit is "
                                       f"{max_bytes / 2**20:.0f} MiB")
    if not data.strip():
        raise IngestError("empty", f"{name} is empty")
    kind = sniff_kind(data, name)
    if kind == "pdf":
        return extract_pdf(data, password, timeout_s, progress)
    return extract_text_file(data, kind)
