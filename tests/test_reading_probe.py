"""docqa-tools probe-reading: questions made from a PDF's own sentences, each read over its passage alone."""

from __future__ import annotations

import json
import random
from datetime import datetime, timezone

import pytest
from fpdf import FPDF

from app.defaults import BUNDLED_MODEL
from tools import pdf_questions as pq
from tools import reading_probe as rp

PARAGRAPHS = [
    "The server keeps its state in one file. The default port is 8080 for every new installation. "
    "Clients connect to it over plain TCP.",
    "Our build tool was first released in 2003. It reads the project file and runs the "
    "steps in order, one after another. The cache size defaults to 64 megabytes.",
    "Version 2.1 of the archive format added the option --checksum-every for long transfers over slow links.",
    "short heading",
]


def test_paragraphs_join_lines_and_drop_headings():
    text = "\n\n".join(p.replace(". ", ".\n", 1) for p in PARAGRAPHS)
    got = rp.paragraphs(text)
    assert got == [" ".join(p.split()) for p in PARAGRAPHS[:3]]  # lines joined, the heading dropped


def test_rule_questions_come_in_both_wordings_of_one_sentence_and_answers_lie_in_their_passage():
    asked = rp.probe_questions("manual", "\n\n".join(PARAGRAPHS), per_kind=5, rng=random.Random(3))
    kinds = [q.kind for q in asked]
    assert set(kinds) <= set(rp.KINDS) and kinds.count(rp.KINDS[0]) == kinds.count(rp.KINDS[1]) >= 2
    for q in asked:
        assert q.source == "manual" and q.answer in q.passage and len(q.passage) <= rp.CONTEXT_CHARS
    rule = [q for q in asked if q.kind != "cloze"]
    for trained, held_out in zip(rule[::2], rule[1::2], strict=True):  # the same sentence, the two wordings
        assert (trained.passage, trained.answer) == (held_out.passage, held_out.answer)
        assert trained.question != held_out.question
    assert any(q.answer == "8080" for q in rule) and any(q.answer == "64 megabytes" for q in rule)
    assert rp.probe_questions("manual", "\n\n".join(PARAGRAPHS), 5, random.Random(3)) == asked  # the seed decides
    assert len(rp.probe_questions("manual", "\n\n".join(PARAGRAPHS), 1, random.Random(3))) <= 3  # per kind


def test_parsed_questions_ask_in_peoples_order_with_the_answer_once_in_their_passage():
    pytest.importorskip("spacy", reason="the parsed questions need spaCy (pip install -e '.[train]')")
    from training.parsed_questions import load_parser

    text = "\n\n".join(PARAGRAPHS)
    asked = rp.probe_questions("manual", text, per_kind=5, rng=random.Random(3), parser=load_parser())
    parsed = [q for q in asked if q.kind == "parsed"]
    assert ("What is the default port for every new installation?", "8080") in {(q.question, q.answer) for q in parsed}
    for q in parsed:
        assert pq.holds_answer(q.passage, [q.answer]) and q.passage.count(q.answer) == 1
    without = rp.probe_questions("manual", text, per_kind=5, rng=random.Random(3))
    assert without == [q for q in asked if q.kind != "parsed"]  # the other kinds draw as before
    # Reworded, each parsed question is asked again over the same passage, for the same answer.
    rewording = rp.Rewording({"default": ["standard"], "installation": ["facility"]}, lambda word: True)
    both = rp.probe_questions("manual", text, per_kind=5, rng=random.Random(3), parser=load_parser(),
                              rewording=rewording)
    assert [q for q in both if q.kind != "parsed, reworded"] == asked
    pairs = [(a, b) for a, b in zip(both, both[1:], strict=False) if b.kind == "parsed, reworded"]
    assert pairs and all(a.kind == "parsed" and (a.passage, a.answer) == (b.passage, b.answer) for a, b in pairs)
    assert any(a.question != b.question for a, b in pairs)


def test_the_summary_counts_right_per_kind_held_out_first():
    row = rp.ProbeRow("m", True, rp.KINDS[0], "q", "a", "a", True)
    rows = [row, rp.ProbeRow("m", True, rp.KINDS[0], "q", "a", "not found", False),
            rp.ProbeRow("s", False, "cloze", "q", "a", "a", True)]
    lines = rp.summarize(rows).splitlines()
    assert lines[0] == "| sources | rule, training wording | cloze |"  # the kinds asked, in KINDS' order
    assert lines[2] == "| held-out | 1/2 (50%) | - |"
    assert lines[3] == "| seen | - | 1/1 (100%) |"


@pytest.mark.slow
def test_a_probe_through_the_app_reads_and_reports(tmp_path):
    """The bundled model over a two-page PDF: every question is read over its passage alone and the
    rows, the report and the meta say what was asked; an unknown source is refused by name."""
    pdf = FPDF()
    pdf.set_creation_date(datetime(2026, 1, 1, tzinfo=timezone.utc))
    for para in PARAGRAPHS[:3]:
        pdf.add_page()
        pdf.set_font("Helvetica", size=11)
        pdf.multi_cell(0, 6, para)
    (tmp_path / "m.pdf").write_bytes(bytes(pdf.output()))
    sources = {"m": pq.PdfSource("m", "none", tmp_path / "m.pdf", True, "a test manual")}
    rows = rp.probe(BUNDLED_MODEL, tmp_path / "out", per_kind=2, device="cpu", sources=sources,
                    progress=lambda line: None)
    assert rows and all(r.source == "m" and r.held_out and r.shown.strip() for r in rows)
    assert all(r.right == pq.holds_answer(r.shown, [r.answer]) for r in rows)
    written = [json.loads(line) for line in (tmp_path / "out" / "rows.jsonl").read_text().splitlines()]
    assert [w["question"] for w in written] == [r.question for r in rows]
    assert (tmp_path / "out" / "summary.md").read_text().startswith("| sources |")
    assert json.loads((tmp_path / "out" / "meta.json").read_text())["device"] == "cpu"
    with pytest.raises(ValueError, match="unknown source"):
        rp.probe(BUNDLED_MODEL, tmp_path / "x", only=["nope"], sources=sources)
