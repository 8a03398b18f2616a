"""Writes the sample documents (deterministic): a 60-page PDF report and a Markdown note.

    python sample_docs/make_samples.py

Known facts are planted on known pages (FACTS below, also written to facts.json) so the quick start
and the tests can check answers and citations.
"""

from __future__ import annotations

import json
import random
from datetime import datetime, timezone
from pathlib import Path

from fpdf import FPDF

HERE = Path(__file__).parent
PAGES = 60
FACTS = [
    {"page": 17, "sentence": "One of the special magic numbers for harbor-dredging is: 4729135.",
     "question": "What is the special magic number for harbor-dredging mentioned in the provided text?",
     "answer": "4729135"},
    {"page": 42, "sentence": "One of the special magic numbers for quiet-lighthouse is: 8316402.",
     "question": "What is the special magic number for quiet-lighthouse mentioned in the provided text?",
     "answer": "8316402"},
    {"page": 55, "sentence": "The harbour master in 2025 was Odile Varga, who signed the new berth contract.",
     "question": "Who was the harbour master in 2025?", "answer": "Odile Varga"},
]
_SUBJECTS = ["The pilot boats", "The container terminal", "The fishing fleet", "The ferry service",
             "The maintenance crew", "The port authority", "The customs office", "The tug operators"]
_VERBS = ["reported", "reviewed", "scheduled", "completed", "postponed", "inspected", "upgraded", "measured"]
_OBJECTS = ["the north quay repairs", "the annual safety drill", "the tide gauge calibration",
            "the lighting on pier four", "the berth allocation plan", "the dredging survey",
            "the storm barrier tests", "the cargo crane audit"]


def filler(rng: random.Random, sentences: int) -> str:
    out = []
    for _ in range(sentences):
        out.append(f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} in week "
                   f"{rng.randint(1, 52)}, with {rng.randint(2, 40)} staff on duty.")
    return " ".join(out)


def make_pdf(path: Path) -> None:
    rng = random.Random(7)
    pdf = FPDF(format="A4")
    pdf.set_creation_date(datetime(2026, 1, 1, tzinfo=timezone.utc))  # same bytes every time
    pdf.set_auto_page_break(False)
    facts = {f["page"]: f["sentence"] for f in FACTS}
    for page in range(1, PAGES + 1):
        pdf.add_page()
        pdf.set_font("Helvetica", "B", 14)
        pdf.cell(0, 10, f"Harbour Authority Annual Report - page {page}", new_x="LMARGIN", new_y="NEXT")
        pdf.set_font("Helvetica", size=11)
        body = filler(rng, 9)
        if page in facts:
            parts = body.split(". ")
            parts.insert(4, facts[page].rstrip("."))
            body = ". ".join(parts)
        pdf.multi_cell(0, 6, body + "\n\n" + filler(rng, 9))
    pdf.output(str(path))


def make_markdown(path: Path) -> None:
    rng = random.Random(11)
    sections = [f"## Week {w}\n\n{filler(rng, 6)}" for w in range(1, 9)]
    sections.insert(5, "## Codes\n\nThe gate code for the east warehouse is 55-1207.")
    path.write_text("# Harbour field notes\n\n" + "\n\n".join(sections) + "\n", encoding="utf-8")


if __name__ == "__main__":
    make_pdf(HERE / "harbour-annual-report.pdf")
    make_markdown(HERE / "harbour-field-notes.md")
    (HERE / "facts.json").write_text(json.dumps(FACTS, indent=2))
    print("wrote", *(p.name for p in HERE.iterdir() if p.suffix in (".pdf", ".md", ".json")))
