"""Inspect panel, read as text: the relevance of every scored chunk over the document's pages
(a bar opens its chunk in the viewer), the chosen chunks as words shaded by how many layers and
heads kept their tokens, the attention each chosen chunk's BOS anchor receives per layer
(labelled by page), and the timings in milliseconds."""

from __future__ import annotations

import html

import gradio as gr
import matplotlib

from app.service import AskResult

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# A click on a bar (or anything carrying data-bar) asks for that scored chunk.
BAR_CLICKS = """
element.addEventListener('click', (e) => {
  const bar = e.target.closest('[data-bar]');
  if (bar) trigger('click', {bar: Number(bar.dataset.bar)});
});
"""

PHASES = {"load_kv": "load the chunks' KV", "draft": "draft", "score": "score the chunks", "select": "select",
          "place": "place the KV", "gather": "gather the KV", "decode": "decode the answer"}


def build():
    gr.Markdown("The numbers behind the latest answer (or the answer clicked in the chat).")
    scores = gr.HTML("", elem_id="relevance", js_on_load=BAR_CLICKS)
    chosen = gr.HTML("", elem_id="chosen-chunks", js_on_load=None)
    anchors = gr.Plot(label="Attention on each chosen chunk's BOS anchor, per layer", elem_id="anchors")
    timings = gr.HTML("", elem_id="timings", js_on_load=None)
    return scores, chosen, anchors, timings


def panels(result: AskResult | None):
    """The four panels' values for one answer (None: empty panels)."""
    if result is None:
        return "", "", None, ""
    return relevance_html(result), chosen_html(result), anchors_figure(result), timings_html(result)


def bar_layout(scores: list[dict]) -> list[dict]:
    """Each scored chunk as a bar of its document's row: `left` and `width` as percentages of the
    row, `height` as a percentage of the best score's above the worst's. A multi-page document's
    row runs over its pages: a chunk stands on the page it starts on, the chunks starting on one
    page sharing it in their order. A single-page one's runs over its text."""
    if not scores:
        return []
    lo, hi = min(s["score"] for s in scores), max(s["score"] for s in scores)
    per_page: dict[tuple[str, int], list[int]] = {}
    for i, s in enumerate(scores):
        per_page.setdefault((s["document"], s.get("page_start", -1)), []).append(i)
    for members in per_page.values():
        members.sort(key=lambda i: scores[i]["chunk"])
    out = []
    for i, s in enumerate(scores):
        pages = int(s.get("document_pages") or 0)
        if pages > 1 and s.get("page_start", -1) >= 0:
            members = per_page[(s["document"], s["page_start"])]
            width = 100 / pages / len(members)
            left = 100 * s["page_start"] / pages + width * members.index(i)
        elif s.get("document_chars") and s.get("char_start", -1) >= 0:
            left = 100 * s["char_start"] / s["document_chars"]
            width = 100 * (s["char_end"] - s["char_start"]) / s["document_chars"]
        else:  # an answer stored before chunks kept their place: by order
            left, width = 100 * i / len(scores), 100 / len(scores)
        height = 100 * (s["score"] - lo) / (hi - lo) if hi > lo else 100.0
        out.append({**s, "index": i, "left": round(left, 3), "width": round(max(width, 0.4), 3),
                    "height": round(max(height, 3.0), 2)})
    return out


def relevance_html(result: AskResult) -> str:
    bars = bar_layout(result.scores)
    if not bars:
        return "<p>No chunk was scored.</p>"
    rows = []
    for doc in dict.fromkeys(b["document"] for b in bars):
        mine = [b for b in bars if b["document"] == doc]
        pages = int(mine[0].get("document_pages") or 0)
        axis = (f"pages 1-{pages}" if pages > 1 else "position in the text")
        cells = "".join(
            f'<div class="docqa-bar" data-bar="{b["index"]}" data-pages="{html.escape(str(b["pages"]))}" '
            f'data-selected="{int(b["selected"])}" title="{html.escape(doc)}, p. {html.escape(str(b["pages"]))}: '
            f'score {b["score"]:.2f}{" (chosen)" if b["selected"] else ""}; click to see it" '
            f'style="position:absolute;bottom:0;left:{b["left"]}%;width:{b["width"]}%;height:{b["height"]}%;'
            f'background:{"#e67e00" if b["selected"] else "#8aa4c8"};cursor:pointer;'
            f'box-shadow:inset -1px 0 0 #fff"></div>' for b in mine)
        ticks = _page_ticks(pages) if pages > 1 else ""
        rows.append(f'<div style="margin:4px 0 14px 0"><div style="font-weight:600">{html.escape(doc)} '
                    f'<span style="font-weight:400;color:#666">({len(mine)} chunks scored, over {axis})</span></div>'
                    f'<div style="position:relative;height:110px;border-bottom:1px solid #888;'
                    f'background:#fafafa">{cells}</div>{ticks}</div>')
    legend = ('<p style="margin:2px 0 8px 0;color:#555">Chunk relevance (higher is better: how well each chunk '
              'explains the question, in nats, plus its BM25 prior). <span style="color:#e67e00">&#9632;</span> '
              'chosen, <span style="color:#8aa4c8">&#9632;</span> not chosen; chunks BM25 ranked lower were not '
              'scored. Click a bar to see its chunk in the document.</p>')
    return legend + "".join(rows)


def _page_ticks(pages: int) -> str:
    marks = sorted({1, pages, *range(10, pages, 10)} if pages > 12 else set(range(1, pages + 1)))
    spans = "".join(f'<span style="position:absolute;left:{100 * (p - 0.5) / pages:.3f}%;transform:translateX(-50%)">'
                    f'{p}</span>' for p in marks)
    return f'<div style="position:relative;height:16px;font-size:0.8em;color:#555">{spans}</div>'


def chosen_html(result: AskResult) -> str:
    """The chosen chunks as words; a word's shade is the largest share of (layer, head) pairs that
    kept one of its tokens (the token budget B); unshaded where every token was kept."""
    blocks = []
    # Every token kept (B = 0) gives every word the full share: nothing to tell apart.
    shaded = any(h is not None and h < 0.999 for c in result.citations for _, h in c.kept_words)
    for i, c in enumerate(result.citations):
        words = c.kept_words or [(c.text, None)]
        spans = "".join(
            f'<span class="docqa-word" data-heat="{"" if h is None else h}" '
            f'style="background:{_shade(h if shaded else None)}">{html.escape(w)}</span>' for w, h in words)
        blocks.append(f'<div class="docqa-chunk" style="margin:0 0 10px 0"><div style="font-weight:600">[{i + 1}] '
                      f'{html.escape(c.document)}, p. {html.escape(c.pages)}, score {c.score:.2f}</div>'
                      f'<div class="docqa-words" style="white-space:pre-wrap;line-height:1.6">{spans}</div></div>')
    if not blocks:
        return "<p>No chunk was chosen.</p>"
    legend = ("Darker: more layers and heads kept the word's tokens." if shaded
              else "Every token of the chosen chunks was kept (token budget B = 0), so no word is shaded.")
    return f'<p style="font-weight:600;margin:8px 0 4px 0">Chosen chunks</p><p style="color:#555">{legend}</p>' + \
        "".join(blocks)


def _shade(heat: float | None) -> str:
    return "transparent" if heat is None else f"rgba(230,126,0,{0.08 + 0.6 * heat:.3f})"


def anchors_figure(result: AskResult):
    rows = result.anchors
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.35 * max(len(rows), 1)))
    if rows:
        im = ax.imshow(rows, aspect="auto", cmap="viridis")
        labels = [f"[{i + 1}] p. {c.pages} {c.document[:18]}" for i, c in enumerate(result.citations)]
        if len(labels) == len(rows):
            ax.set_yticks(range(len(rows)), labels)
        fig.colorbar(im, ax=ax, label="attention share")
    ax.set_xlabel("layer")
    ax.set_title("BOS-anchor attention of each chosen chunk", fontsize=10)
    fig.tight_layout()
    plt.close(fig)  # gr.Plot draws the figure it is given; pyplot need not keep it
    return fig


def timings_html(result: AskResult) -> str:
    if not result.timings:
        return ""
    rows = "".join(f"<tr><td>{html.escape(PHASES.get(k, k.replace('_', ' ')))}</td>"
                   f'<td style="text-align:right">{1000 * v:,.1f}</td></tr>' for k, v in result.timings.items())
    total = sum(result.timings.values())
    note = " (answered from the cache: the times of the first answer)" if result.cached else ""
    return (f'<p style="font-weight:600;margin:8px 0 4px 0">Timings{note}</p>'
            f'<table id="timings-table" style="border-collapse:collapse;min-width:260px"><thead><tr><th '
            f'style="text-align:left">phase</th><th style="text-align:right">ms</th></tr></thead><tbody>{rows}'
            f'<tr style="border-top:1px solid #888;font-weight:600"><td>total</td><td style="text-align:right">'
            f'{1000 * total:,.1f}</td></tr></tbody></table>')
