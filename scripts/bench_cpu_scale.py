"""Ingest and a question against document size, on this machine: pages a second, seconds a
question and peak resident memory, for generated PDFs of 50-500 pages (one fresh process a size,
so each peak is that size's own).

    python scripts/bench_cpu_scale.py --pages 50 100 200 500 [--prefilter-chunks 64] [--device cpu]

The PDFs hold real English (the licence texts Debian installs under /usr/share/common-licenses,
cycled) and one fact on the page at 60% depth; the question asks for it in plain words.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FACT = "The inspection code for the northern reservoir is 73914."
QUESTION = "What is the inspection code for the northern reservoir?"


def make_pdf(pages: int, path: Path) -> None:
    from fpdf import FPDF

    texts = [p.read_text(errors="replace") for p in sorted(Path("/usr/share/common-licenses").glob("*"))
             if p.is_file()]
    words = " ".join(" ".join(texts).split()).encode("latin-1", "replace").decode("latin-1").split(" ")
    pdf = FPDF()
    pdf.set_font("Helvetica", size=10)
    per_page, at = 450, 0
    for p in range(pages):
        pdf.add_page()
        body = " ".join(words[(at + i) % len(words)] for i in range(per_page))
        at += per_page
        if p == int(0.6 * pages):
            body = body[: len(body) // 2] + " " + FACT + " " + body[len(body) // 2:]
        pdf.multi_cell(0, 5, body)
    pdf.output(str(path))


def one_size(pages: int, device: str, prefilter: int | None) -> dict:
    from app.service import DocQA, ServiceConfig

    with tempfile.TemporaryDirectory() as tmp:
        pdf = Path(tmp) / f"doc-{pages}.pdf"
        make_pdf(pages, pdf)
        service = DocQA(ServiceConfig(data_dir=Path(tmp) / "data", device=device, prefilter_chunks=prefilter))
        start = time.perf_counter()
        info, _ = service.ingest_file(pdf)
        ingest_s = time.perf_counter() - start
        ingest_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
        start = time.perf_counter()
        result = service.answer(QUESTION, [info.record.id])
        question_s = time.perf_counter() - start
        return {"pages": pages, "chunks": info.chunks, "kv_mb": round(info.kv_bytes / 1e6, 1),
                "ingest_s": round(ingest_s, 1), "pages_per_s": round(pages / ingest_s, 2),
                "question_s": round(question_s, 2), "scoring_s": round(result.timings.get("scoring", 0.0), 2),
                "answer": result.answer, "answer_pages": [c.pages for c in result.citations],
                "ingest_peak_rss_gb": round(ingest_peak, 2),
                "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, nargs="+", default=[50, 100, 200, 500])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prefilter-chunks", type=int, default=None)
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # a child's size
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(one_size(args.one, args.device, args.prefilter_chunks)))
        return
    print("| pages | chunks | KV on disk | ingest | pages/s | question | scoring | peak RSS ingest | peak RSS | "
          "answer (pages) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for pages in args.pages:
        cmd = [sys.executable, __file__, "--one", str(pages), "--device", args.device]
        if args.prefilter_chunks is not None:
            cmd += ["--prefilter-chunks", str(args.prefilter_chunks)]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            print(f"| {pages} | failed: {out.stderr.strip().splitlines()[-1] if out.stderr else out.returncode} |")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"| {r['pages']} | {r['chunks']} | {r['kv_mb']} MB | {r['ingest_s']} s | {r['pages_per_s']} | "
              f"{r['question_s']} s | {r['scoring_s']} s | {r['ingest_peak_rss_gb']} GB | {r['peak_rss_gb']} GB | "
              f"{r['answer']!r} "
              f"({', '.join(r['answer_pages'])}) |", flush=True)


if __name__ == "__main__":
    main()
