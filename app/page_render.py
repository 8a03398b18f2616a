"""One PDF page as an image with its characters' boxes, in a child process of its own
(`python -m app.page_render`).

PDFium is C code: a malformed file that crashes or hangs it must not take the server with it, so
the parent (`app.viewer.render_pdf_page`) runs this module in a child and kills it after a time
limit, as ingest does with its text (`app.pdf_text`). This module imports only pypdfium2 (and PIL,
which pypdfium2 uses to encode the image).

Reads one JSON object on stdin: {"path", "page", "width_px", "password"}; writes one JSON line:
{"ok": true, "page_count", "width_pt", "height_pt", "rotation", "text", "boxes", "png"} with
`boxes[i]` the [left, bottom, right, top] box of `text[i]` in PDF points (origin bottom-left) and
`png` the page as a base64 PNG, or {"ok": false, "code", "message"}.
"""

from __future__ import annotations

import base64
import io
import json
import sys


def render(path: str, page_index: int, width_px: int, password: str | None) -> dict:
    import pypdfium2 as pdfium

    try:
        pdf = pdfium.PdfDocument(path, password=password)
    except pdfium.PdfiumError as exc:
        text = str(exc).lower()
        if "password" in text:
            return {"ok": False, "code": "needs_password",
                    "message": "the PDF is encrypted and its password is not kept, so its pages cannot be shown"}
        return {"ok": False, "code": "corrupt", "message": f"the PDF cannot be opened to show its pages ({exc})"}
    try:
        count = len(pdf)
        if not 0 <= page_index < count:
            return {"ok": False, "code": "out_of_range",
                    "message": f"page {page_index + 1} does not exist: the document has {count} pages"}
        page = pdf[page_index]
        width_pt, height_pt, rotation = page.get_width(), page.get_height(), page.get_rotation()
        textpage = page.get_textpage()
        n = textpage.count_chars()
        # One character per index: PDFium's text is indexed by character, generated spaces and
        # line breaks included, so text[i] and its box stay paired.
        text = "".join(chr(pdfium.raw.FPDFText_GetUnicode(textpage.raw, i)) for i in range(n))
        boxes = [list(textpage.get_charbox(i)) for i in range(n)]
        scale = max(0.5, min(4.0, width_px / max(width_pt, 1.0)))
        bitmap = page.render(scale=scale)
        out = io.BytesIO()
        bitmap.to_pil().save(out, format="PNG", optimize=False)
        for handle in (bitmap, textpage, page):  # children before the document, as PDFium wants
            handle.close()
        return {"ok": True, "page_count": count, "width_pt": width_pt, "height_pt": height_pt,
                "rotation": rotation, "text": text, "boxes": boxes,
                "png": base64.b64encode(out.getvalue()).decode("ascii")}
    except pdfium.PdfiumError as exc:
        return {"ok": False, "code": "corrupt", "message": f"page {page_index + 1} cannot be drawn ({exc})"}
    finally:
        pdf.close()


if __name__ == "__main__":
    try:
        request = json.loads(sys.stdin.read())
        reply = render(request["path"], int(request["page"]), int(request["width_px"]), request.get("password"))
    except Exception as exc:  # anything else in the renderer: still a clear answer, never a crash
        reply = {"ok": False, "code": "corrupt", "message": f"the page cannot be drawn ({type(exc).__name__}: {exc})"}
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
