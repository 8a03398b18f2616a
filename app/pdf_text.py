"""Text of a PDF's pages, in a child process of its own (`python -m app.pdf_text`).

A malformed file can hang or exhaust the parser; in a child it cannot take the app down, and the
parent kills it after a time limit (`app.ingest.extract_pdf`). This module imports only pypdf and
pypdfium2, so the child starts in a fraction of a second.

pypdf opens the file and answers for it (encryption, passwords, damage, page labels); the words come
from PDFium, which places spaces by the glyphs' positions. pypdf's own text glues the words of PDFs
that space them by position instead of with space characters, as pdfTeX's often do (Debian's FAQ:
"Thisdocumentgivesfrequentlyaskedquestions"), and takes several times as long (Valgrind's
397-page manual: 3.7 s against 0.4 s). Where PDFium cannot read a file that pypdf can, or finds
no text in it, pypdf's text is taken.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
from collections.abc import Callable

_LIGATURES = {"\ufb00": "ff", "\ufb01": "fi", "\ufb02": "fl", "\ufb03": "ffi", "\ufb04": "ffl", "\ufb05": "st",
              "\ufb06": "st", "\u00ad": ""}
_HYPHEN_BREAK = re.compile(r"(\w)-\n(\w)")
_SPACES = re.compile(r"[ \t\r\f\v\u00a0]+")
_PARAGRAPH = re.compile(r"\n\s*\n+")
# PDFium: U+FFFE stands for a hyphen that ended a line, the two parts already joined on one line;
# C0 controls are glyphs of symbol fonts with no Unicode mapping.
_LINE_END_HYPHEN = re.compile("(\\S*)\ufffe\\s*(\\S*)")
_CONTROLS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f]")


def _rejoined(match: re.Match) -> str:
    """A word hyphenated at a line's end ("docu-mentation") is joined; a hyphen that belongs to a
    name stays ("--gen-suppressions", "RISC-like", "ChaCha-Poly1305", "February-March")."""
    left, right = match.group(1), match.group(2)
    named = (left.startswith("-") or any(c in "-_" or c.isdigit() for c in left + right)
             or any(c.isupper() for c in left[1:]) or right[:1].isupper())
    return f"{left}-{right}" if named else left + right


def normalize(text: str) -> str:
    """Ligatures, soft hyphens, line-end hyphenation and whitespace; paragraphs kept as blank lines."""
    for src, dst in _LIGATURES.items():
        text = text.replace(src, dst)
    text = _HYPHEN_BREAK.sub(r"\1\2", text)
    text = _SPACES.sub(" ", text)
    paragraphs = [" ".join(line.strip() for line in p.splitlines() if line.strip())
                  for p in _PARAGRAPH.split(text)]
    return "\n\n".join(p for p in paragraphs if p)


def pdfium_text(text: str) -> str:
    """Pure: PDFium's page text as pypdf would give it (line breaks as \\n, its line-end hyphens
    joined or kept by `_rejoined`, unmapped glyphs dropped)."""
    return _CONTROLS.sub("", _LINE_END_HYPHEN.sub(_rejoined, text.replace("\r\n", "\n")))


def _pdfium_page_texts(data: bytes, password: str | None, pages: int, emit: Callable[[list], None]
                       ) -> list[str] | None:
    """Each page's text through PDFium, or None where PDFium cannot read the file, sees another
    number of pages than pypdf, or finds no text on any page (pypdf's text is taken then)."""
    try:
        import pypdfium2 as pdfium
    except ImportError:
        return None
    try:
        pdf = pdfium.PdfDocument(data, password=password or None)
    except pdfium.PdfiumError:
        return None
    try:
        if len(pdf) != pages:
            return None
        texts = []
        for i in range(pages):
            page = pdf[i]
            textpage = page.get_textpage()
            texts.append(normalize(pdfium_text(textpage.get_text_range())))
            for handle in (textpage, page):  # children before the document, as PDFium wants
                handle.close()
            emit(["progress", i + 1, pages])
        return texts if any(t.strip() for t in texts) else None
    except Exception:  # noqa: BLE001 - any failure of PDFium's reading: pypdf's text instead
        return None
    finally:
        pdf.close()


def _pdf_page_texts(data: bytes, password: str | None, emit: Callable[[list], None]) -> None:
    """Runs in the child process: emits ["progress", i, n] per page, then ["ok", texts, labels,
    encrypted] or ["error", code, message]."""
    try:
        import pypdf
        from pypdf.errors import DependencyError, FileNotDecryptedError, PdfReadError

        try:
            reader = pypdf.PdfReader(io.BytesIO(data))
            encrypted = reader.is_encrypted
            # An owner-password-only PDF opens with the empty user password; so does a password
            # given for either of the two.
            if encrypted and not reader.decrypt(password or ""):
                emit(["error", "wrong_password" if password else "needs_password",
                      "the PDF is encrypted and the password is wrong" if password else
                      "the PDF is encrypted; give its password to open it"])
                return
            n = len(reader.pages)
            labels = list(reader.page_labels) if n else []
            texts = _pdfium_page_texts(data, password, n, emit)
            if texts is None:
                texts = []
                for i, page in enumerate(reader.pages):
                    texts.append(normalize(page.extract_text() or ""))
                    emit(["progress", i + 1, n])
        except DependencyError as exc:
            emit(["error", "unsupported_encryption",
                  f"the PDF is encrypted in a way this installation cannot open ({exc}); "
                  "reinstall with scripts/install.sh, which installs the cryptography package"])
            return
        except FileNotDecryptedError:
            emit(["error", "needs_password", "the PDF is encrypted; give its password to open it"])
            return
        except (PdfReadError, ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
            # The parser's own words ("Stream has ended unexpectedly") go to the log, not the reader.
            emit(["error", "corrupt", "the PDF is damaged or truncated and cannot be read",
                  f"{type(exc).__name__}: {exc}"])
            return
        emit(["ok", texts, labels, encrypted])
    except Exception as exc:  # anything else in the parser: still a clear answer, never a crash
        emit(["error", "corrupt", "the PDF cannot be read", f"{type(exc).__name__}: {exc}"])


if __name__ == "__main__":  # PDF bytes on stdin, JSON lines on stdout
    def _emit(msg: list) -> None:
        sys.stdout.write(json.dumps(msg) + "\n")
        sys.stdout.flush()

    _pdf_page_texts(sys.stdin.buffer.read(), os.environ.get("DOCQA_PDF_PASSWORD") or None, _emit)
