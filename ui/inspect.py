"""Inspect panel: chunk relevance across the documents, the chosen chunks with their kept tokens,
the attention each chosen chunk's BOS anchor receives per layer, and timings."""

from __future__ import annotations

import gradio as gr
import matplotlib
import pandas as pd

from app.service import AskResult

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def build():
    scores = gr.BarPlot(x="chunk", y="score", color="selected", label="Chunk relevance (higher is better)",
                        elem_id="relevance", tooltip=["document", "chunk", "pages", "score"])
    chosen = gr.HighlightedText(label="Chosen chunks (darker = token kept by more layers and heads)",
                                show_legend=False, combine_adjacent=False, elem_id="chosen-chunks")
    anchors = gr.Plot(label="Attention on each chosen chunk's BOS anchor, per layer", elem_id="anchors")
    timings = gr.JSON(label="Timings (seconds)")
    return scores, chosen, anchors, timings


def scores_frame(result: AskResult) -> pd.DataFrame:
    rows = [{"chunk": i, "score": s["score"], "selected": "chosen" if s["selected"] else "not chosen",
             "document": s["document"], "pages": s["pages"]} for i, s in enumerate(result.scores)]
    return pd.DataFrame(rows, columns=["chunk", "score", "selected", "document", "pages"])


def chosen_spans(result: AskResult) -> list[tuple[str, float | None]]:
    """The chosen chunks as words, each shaded by the share of (layer, head) pairs that kept it."""
    spans: list[tuple[str, float | None]] = []
    for c in result.citations:
        spans.append((f"\n[{c.document}, p. {c.pages}, score {c.score:.2f}]\n", None))
        # A conversation saved before words were kept shows its chunk's text unshaded.
        spans.extend((word, heat) for word, heat in c.kept_words or [(c.text, None)])
    return spans


def anchors_figure(result: AskResult):
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.35 * max(len(result.anchors), 1)))
    if result.anchors:
        im = ax.imshow(result.anchors, aspect="auto", cmap="viridis")
        ax.set_yticks(range(len(result.anchors)), [f"{c.document[:18]} p.{c.pages}"
                                                    for c in sorted(result.citations, key=lambda c: c.chunk)])
        fig.colorbar(im, ax=ax)
    ax.set_xlabel("layer")
    fig.tight_layout()
    return fig
