"""The document viewer beside the chat: the cited page as an image with the chunk's lines boxed
(PDF), or the passage with the chunk marked (text, Markdown); the neighbouring pages a click away.

What it shows is a `Target` (a document, a page, the chunk's character span), kept in a gr.State;
the service draws the page (`DocQA.view`). Boxes are fractions of the page, laid over the image
as absolutely placed elements, so they scale with it and a browser test can read them back.
"""

from __future__ import annotations

import base64
import html
import logging
from dataclasses import asdict, dataclass

import gradio as gr

from app.service import Citation, DocQA, PageView, ViewerError

logger = logging.getLogger(__name__)

HINT = "Click a source under an answer, or a bar of the relevance plot in Inspect, to see it in its document."


@dataclass(frozen=True)
class Target:
    document_id: str
    document: str
    page: int | None  # physical page (text documents: part), 0-based; None: where the span starts
    span_start: int = -1  # the chunk's characters in the document's text; -1: nothing to highlight
    span_end: int = -1
    caption: str = ""  # what is highlighted: "[1] notes.pdf, p. 3 (score -0.42)"

    @property
    def span(self) -> tuple[int, int] | None:
        return (self.span_start, self.span_end) if 0 <= self.span_start < self.span_end else None


def target_of(citation: dict, caption: str = "") -> Target | None:
    """The viewer's target for a citation (a Citation as a dict) or a scored chunk; None when it
    names no document in the library (an answer stored before documents were removed)."""
    if not citation.get("document_id"):
        return None
    return Target(citation["document_id"], citation.get("document", ""), None, int(citation.get("char_start", -1)),
                  int(citation.get("char_end", -1)), caption)


def citation_caption(number: int, c: Citation | dict) -> str:
    c = asdict(c) if isinstance(c, Citation) else c
    return f"[{number}] {c['document']}, p. {c['pages']} (score {c['score']:.2f})"


def build():
    with gr.Column(elem_id="viewer-panel"):
        title = gr.Markdown(HINT, elem_id="viewer-title")
        page = gr.HTML("", elem_id="viewer", js_on_load=None)
        with gr.Row(equal_height=True):
            prev = gr.Button("Previous page", elem_id="viewer-prev", size="sm", min_width=90, scale=1)
            number = gr.Number(label="Go to page", precision=0, minimum=1, elem_id="viewer-page", min_width=90,
                               scale=1)
            nxt = gr.Button("Next page", elem_id="viewer-next", size="sm", min_width=90, scale=1)
    state = gr.State(None)
    return title, page, prev, number, nxt, state


def page_html(view: PageView) -> str:
    """The page as HTML: the image with one box a highlighted line, or the marked passage."""
    parts = []
    if view.png is not None:
        src = "data:image/png;base64," + base64.b64encode(view.png).decode("ascii")
        boxes = "".join(
            f'<div class="docqa-box" style="position:absolute;left:{100 * b.left:.3f}%;top:{100 * b.top:.3f}%;'
            f'width:{100 * b.width:.3f}%;height:{100 * b.height:.3f}%;background:rgba(255,200,0,0.35);'
            f'outline:2px solid rgba(230,140,0,0.9);pointer-events:none"></div>' for b in view.boxes)
        parts.append(f'<div id="docqa-page" data-page="{view.page_index}" style="position:relative;width:100%;'
                     f'border:1px solid #ccc;line-height:0"><img id="docqa-page-image" src="{src}" '
                     f'alt="page {html.escape(view.label)} of {html.escape(view.document)}" '
                     f'style="width:100%;height:auto;display:block">{boxes}</div>')
    if view.note:
        parts.append(f'<p id="docqa-note" style="margin:6px 0;color:#8a5a00">{html.escape(view.note)}</p>')
    if view.passage:
        runs = "".join(f'<mark class="docqa-mark">{html.escape(t)}</mark>' if marked else html.escape(t)
                       for t, marked in view.passage)
        parts.append(f'<div id="docqa-passage" style="white-space:pre-wrap;max-height:640px;overflow:auto;'
                     f'border:1px solid #ccc;padding:8px;font-size:0.95em;line-height:1.45">{runs}</div>')
    return "".join(parts)


def error_html(message: str) -> str:
    return f'<p id="docqa-viewer-error" style="color:#b00020">{html.escape(message)}</p>'


def show(service: DocQA, target: Target | None):
    """(title, page HTML, page number, target) for the viewer's outputs."""
    if target is None:
        return HINT, error_html("This source's document is no longer in the library."), gr.update(), None
    try:
        view = service.view(target.document_id, target.page, target.span)
    except ViewerError as exc:
        return f"**{html.escape(target.document)}**", error_html(str(exc)), gr.update(), target
    except Exception as exc:  # noqa: BLE001 - the page shows a sentence, the log has the details
        logger.exception("the viewer failed on %s page %s", target.document_id, target.page)
        return (f"**{html.escape(target.document)}**",
                error_html(f"This page cannot be shown (an internal error: {type(exc).__name__}; see the server log)."),
                gr.update(), target)
    unit = "page" if view.kind == "pdf" or not view.label.startswith("part") else "part"
    where = (f"page {html.escape(view.label)} ({view.page_index + 1} of {view.page_count})" if unit == "page"
             else view.label)
    title = f"**{html.escape(view.document)}**, {where}"
    if target.caption:
        title += f"<br>Highlighted: {html.escape(target.caption)}"
    number = gr.update(value=view.page_index + 1, maximum=view.page_count,
                       label="Go to page" if unit == "page" else "Go to part")
    kept = Target(target.document_id, target.document, view.page_index, target.span_start, target.span_end,
                  target.caption)
    return title, page_html(view), number, kept


def wire(service: DocQA, parts) -> None:
    title, page, prev, number, nxt, state = parts
    outputs = [title, page, number, state]

    def step(target: Target | None, delta: int):
        if target is None:
            return HINT, "", gr.update(), None
        return show(service, Target(target.document_id, target.document, (target.page or 0) + delta,
                                    target.span_start, target.span_end, target.caption))

    def go(target: Target | None, value):
        if target is None or value is None:
            return HINT if target is None else gr.update(), gr.update(), gr.update(), target
        return show(service, Target(target.document_id, target.document, int(value) - 1, target.span_start,
                                    target.span_end, target.caption))

    prev.click(lambda t: step(t, -1), state, outputs, api_visibility="private")
    nxt.click(lambda t: step(t, +1), state, outputs, api_visibility="private")
    number.submit(go, [state, number], outputs, api_visibility="private")
