"""`docqa-tools eval`: RULER tasks through the whole pipeline, per KV mode, with a table and a heatmap.

Each sample's context is prefilled once (chunked, as the app does) and asked in every mode; `dense`
feeds the unchunked context, so it shows where full attention fails past the trained length.
Writes results.json (every sample), summary.md (task x length per mode) and niah_heatmap.png
(needle depth x length, static mode).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from app.defaults import answer_params, model_defaults
from app.kv_service import at_stored_precision, chunk_records, tokenize_for_chunks
from app.prefilter import PREFILTER_ALL, prefilter
from engine import CACHED_KV_MODES, DocumentKV, Engine
from engine.method.kv_cache import take_chunks
from storage.chunk_index import index_texts, search
from storage.kv_codec import DEFAULT_KV_ENCODING
from tools import ruler


@dataclass
class EvalRow:
    task: str
    length: int
    index: int
    mode: str
    score: float
    prediction: str
    outputs: list[str]
    depth: float | None
    needle_selected: bool | None
    seconds: float
    # Share of the answer-holding chunks among the selected (multi-value tasks need all of them).
    needle_recall: float | None = None
    chunks_selected: int | None = None  # how many chunks the answer was decoded over (None: not recorded)
    # With a BM25 prefilter: its M, and the share of the answer-holding chunks among its candidates.
    prefilter: int = PREFILTER_ALL
    candidate_recall: float | None = None
    kv_encoding: str = DEFAULT_KV_ENCODING  # how the KV was kept at rest (storage.kv_codec)
    setting: str = ""  # the row's label without the encoding (rows of one setting are compared across encodings)
    # With lone readings (AnswerParams.read_chunks_alone): each selected chunk's answer read alone, as
    # far as they were read, and the joint answer that none confirmed where confirmation turned it
    # into "not found" (AnswerParams.confirm_with_lone_reading): what a miss by confirmation lost.
    lone_answers: list[str] = field(default_factory=list)
    unconfirmed: str | None = None
    # The lone readings whose values completed a confirmed list answer (AnswerTrace.gathered_from).
    gathered_from: list[int] = field(default_factory=list)


def answer_chunks(sample: ruler.Sample, offsets: list[tuple[int, int]], content_starts: torch.Tensor) -> set[int]:
    """The chunks holding the sample's expected answer (`ruler.Sample.answer_spans`): for each span,
    the chunk whose content holds its first token. `offsets`: each token's character span."""
    out = set()
    for at, _ in sample.answer_spans():
        tok = next((i for i, (_, b) in enumerate(offsets) if b > at), None)
        if tok is not None:
            out.add(int(torch.searchsorted(content_starts, tok, right=True)) - 1)
    return out


def prefiltered(doc: DocumentKV, chunk_texts: list[str], question: str, m: int) -> tuple[list[int], list[float]]:
    """The chunks a question's scorer sees with a BM25 prefilter of M (app.prefilter), and their
    BM25 relevance in [0, 1], over an in-memory index of this one document: the app's rule without
    a store."""
    if not m:
        return list(range(doc.num_chunks)), [0.0] * doc.num_chunks
    hits = [(0, h.ordinal, h.bm25) for h in search(index_texts(chunk_texts), question, [0], m)]
    chosen, priors = prefilter(hits, [doc.num_chunks], m)
    return chosen[0], priors[0]


def evaluate(engine: Engine, samples: list[ruler.Sample], modes: list[str], chunk_size: int,
             dense_max_tokens: int, progress=print, rows_path: Path | None = None,
             prefilters: tuple[int, ...] = (PREFILTER_ALL,),
             encodings: tuple[str, ...] = (DEFAULT_KV_ENCODING,),
             bm25_weights: tuple[float, ...] | None = None,
             read_alone: tuple[bool, ...] | None = None) -> list[EvalRow]:
    """Runs every sample in every mode; each row is also appended to `rows_path` (JSON lines) as
    soon as it is scored, so an interrupted evaluation keeps what it measured. `prefilters`: the
    BM25 prefilter sizes M to run the chunk-selecting modes with (0: every chunk scored); a row
    with M > 0 is labelled "<mode>+bm25@M". `encodings`: the KV files' encodings to answer from
    (each the same prefill, rounded as its files keep it); with more than one, labels end in
    "/<encoding>" and `summarize` reports how often the answers agree. `bm25_weights`: the score
    fusion weights (app.defaults.ModelDefaults.bm25_weight) prefiltered rows run with (None: the
    model's); a row with weight w > 0 is labelled "...+fuse<w>". `read_alone`: whether chunk-selecting
    rows also read each chosen chunk alone (AnswerParams.read_chunks_alone; None: the model's); a
    row with it is labelled "...+alone"."""
    defaults = model_defaults(engine.path)
    weights = bm25_weights if bm25_weights is not None else (defaults.bm25_weight,)
    alone_settings = read_alone if read_alone is not None else (defaults.read_chunks_alone,)
    if any(alone_settings) and not defaults.abstain_answer:
        raise ValueError("reading chunks alone needs the model's abstain_answer (its docqa.json)")
    # The modes in which a question reads its chunks alone at all (static, no re-selection).
    alone_modes = {mode for mode in modes if any(alone_settings)
                   and answer_params(defaults, kv_mode=mode, read_chunks_alone=True).reads_chunks_alone}
    rows = []
    for s in samples:
        start = time.perf_counter()
        ids, offsets, breaks = tokenize_for_chunks(engine, s.context)
        exact = engine.prefill(ids, chunk_size, breaks=breaks)
        prefill_s = time.perf_counter() - start
        doc = exact
        needle_chunks = answer_chunks(s, offsets, doc.content_starts)
        texts = [c.text for c in chunk_records(doc, offsets, s.context, [])]
        # Absolute positions place each chunk at its ordinal in the document: a subset would move
        # them, so (as the app does) they always score every chunk.
        absolute = defaults.position_mode == "absolute"
        selecting = CACHED_KV_MODES if not absolute else ()
        runs = [(enc, mode, m, w, a) for enc in encodings for mode in modes
                for m in (prefilters if mode in selecting else (PREFILTER_ALL,))
                for w in (weights if m else weights[:1])
                for a in (alone_settings if mode in alone_modes else (False,))
                if mode in CACHED_KV_MODES or enc == encodings[0]]  # the others do not read the KV
        for enc, mode, m, w, alone in runs:
            if mode == "dense" and len(offsets) > dense_max_tokens:
                continue
            doc = at_stored_precision(exact, enc)
            t = time.perf_counter()
            candidates, priors = prefiltered(doc, texts, s.question, m)
            given = doc if len(candidates) == doc.num_chunks else take_chunks(doc, candidates)
            result = engine.answer(given, s.question, answer_params(defaults, kv_mode=mode, bm25_weight=w,
                                                                    read_chunks_alone=alone),
                                   chunk_priors=[priors])
            seconds = time.perf_counter() - t + prefill_s * (mode in CACHED_KV_MODES)
            chosen = {candidates[r.chunk] for r in result.trace.selected}
            scored = bool(needle_chunks) and mode in CACHED_KV_MODES
            selected = bool(needle_chunks & chosen) if scored else None
            recall = len(needle_chunks & chosen) / len(needle_chunks) if scored else None
            seen = len(needle_chunks & set(candidates)) / len(needle_chunks) if scored else None
            setting = ((f"{mode}+bm25@{m}" + (f"+fuse{w:g}" if w else "")) if m else mode) + ("+alone" if alone else "")
            label = f"{setting}/{enc}" if len(encodings) > 1 and mode in CACHED_KV_MODES else setting
            row = EvalRow(s.task, s.length, s.index, label, ruler.score(s.task, result.text, s.outputs),
                          result.text, [str(o) for o in s.outputs], s.depth, selected, seconds, recall,
                          len(result.trace.selected), m, seen, enc, setting, list(result.trace.lone_answers),
                          result.trace.unconfirmed, list(result.trace.gathered_from))
            rows.append(row)
            if rows_path is not None:
                with open(rows_path, "a") as f:
                    f.write(json.dumps(asdict(row)) + "\n")
            progress(f"{s.task} {s.length} #{s.index} {label}: {row.score:.2f} ({row.seconds:.1f} s) "
                     f"{result.text[:40]!r} vs {row.outputs[:2]}")
    return rows


def summarize(rows: list[EvalRow]) -> str:
    """Markdown: mean score (%) per task and length, one table per mode."""
    out = []
    for mode in sorted({r.mode for r in rows}):
        sub = [r for r in rows if r.mode == mode]
        lengths = sorted({r.length for r in sub})
        out.append(f"\n### mode `{mode}`\n")
        out.append("| task | " + " | ".join(f"{n // 1024}K" for n in lengths) + " |")
        out.append("|---|" + "---|" * len(lengths))
        for task in sorted({r.task for r in sub}):
            cells = []
            for n in lengths:
                vals = [r.score for r in sub if r.task == task and r.length == n]
                # One decimal: a cell at 98.75 must not read as 99.
                cells.append(f"{100 * sum(vals) / len(vals):.1f} (n={len(vals)})" if vals else "-")
            out.append(f"| {task} | " + " | ".join(cells) + " |")
        sel = [r.needle_selected for r in sub if r.needle_selected is not None]
        if sel:
            out.append(f"\nchunk selection recall (an answer-holding chunk among the selected): "
                       f"{100 * sum(sel) / len(sel):.1f}% of {len(sel)} samples")
        every = [r.needle_recall for r in sub if r.needle_recall is not None]
        if every:
            out.append(f"\nanswer-holding chunks selected, on average: {100 * sum(every) / len(every):.1f}% "
                       f"(all of them in {sum(v == 1.0 for v in every)} of {len(every)} samples)")
        seen = [r.candidate_recall for r in sub if r.candidate_recall is not None and r.prefilter]
        if seen:
            out.append(f"\nanswer-holding chunks among the BM25 prefilter's candidates: "
                       f"{100 * sum(seen) / len(seen):.1f}% ({len(seen)} samples)")
        kept = [r.chunks_selected for r in sub if r.chunks_selected is not None]
        if kept:
            out.append(f"\nchunks decoded over, on average: {sum(kept) / len(kept):.2f} "
                       f"(from {min(kept)} to {max(kept)}, {len(kept)} samples)")
        unconfirmed = [r for r in sub if r.unconfirmed is not None]
        if unconfirmed:
            lost = sum(ruler.score(r.task, r.unconfirmed, r.outputs) > r.score for r in unconfirmed)
            out.append(f"\nanswers no chunk read alone confirmed, shown as the abstain answer: {len(unconfirmed)} of "
                       f"{len(sub)} samples ({lost} of them would have scored higher as read)")
    agreement = encoding_agreement(rows)
    if agreement:
        out.append("\n### answers against bf16 KV\n")
        out.append("| setting | encoding | samples | same answer | same score |")
        out.append("|---|---|---|---|---|")
        for (setting, enc), (n, same, same_score) in sorted(agreement.items()):
            out.append(f"| {setting} | {enc} | {n} | {100 * same / n:.1f}% | {100 * same_score / n:.1f}% |")
    return "\n".join(out) + "\n"


def encoding_agreement(rows: list[EvalRow], reference: str = "bf16") -> dict[tuple[str, str], tuple[int, int, int]]:
    """Per (setting, encoding other than `reference`): samples compared, identical answers, equal
    scores, each row against the row of the same sample and setting answered from `reference` KV."""
    ref = {(r.task, r.length, r.index, r.setting): r for r in rows if r.kv_encoding == reference and r.setting}
    out: dict[tuple[str, str], list[int]] = {}
    for r in rows:
        other = ref.get((r.task, r.length, r.index, r.setting))
        if r.kv_encoding == reference or other is None or other is r:
            continue
        cell = out.setdefault((r.setting, r.kv_encoding), [0, 0, 0])
        cell[0] += 1
        cell[1] += r.prediction.strip() == other.prediction.strip()
        cell[2] += r.score == other.score
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}


def heatmap(rows: list[EvalRow], path: Path, mode: str = "static") -> None:
    """Needle depth (10 bins) x context length, mean NIAH score, for one mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    sub = [r for r in rows if r.mode == mode and r.task.startswith("niah") and r.depth is not None]
    if not sub:
        return
    lengths = sorted({r.length for r in sub})
    grid = np.full((10, len(lengths)), np.nan)
    for j, n in enumerate(lengths):
        for b in range(10):
            vals = [r.score for r in sub if r.length == n and min(int(r.depth * 10), 9) == b]
            if vals:
                grid[b, j] = 100 * sum(vals) / len(vals)
    fig, ax = plt.subplots(figsize=(1.2 * len(lengths) + 2, 5))
    im = ax.imshow(grid, vmin=0, vmax=100, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(len(lengths)), [f"{n // 1024}K" for n in lengths])
    ax.set_yticks(range(10), [f"{10 * b}-{10 * b + 10}%" for b in range(10)])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("needle depth")
    ax.set_title(f"NIAH score (%), mode {mode}")
    for b in range(10):
        for j in range(len(lengths)):
            if not np.isnan(grid[b, j]):
                ax.text(j, b, f"{grid[b, j]:.0f}", ha="center", va="center", fontsize=8)
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_reports(rows: list[EvalRow], out_dir: Path, meta: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=1))
    (out_dir / "summary.md").write_text(summarize(rows))
    heatmap(rows, out_dir / "niah_heatmap.png")
