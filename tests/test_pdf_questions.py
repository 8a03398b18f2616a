"""The real-PDF question set (tools/pdf_questions.py): its data checked against the installed
manuals, its scoring rule, and one run through the app with the bundled model."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import pytest
from fpdf import FPDF

from app.defaults import BUNDLED_MODEL
from tools import pdf_questions as pq


def test_holds_answer_takes_whole_words_and_ignores_case_quotes_and_spacing():
    assert pq.holds_answer("The block size is 16 bytes.", ["16"]) and pq.holds_answer("is 16, then", ["16"])
    assert not pq.holds_answer("160", ["16"]) and not pq.holds_answer("v2.16", ["2.1"])
    assert not pq.holds_answer("100,000", ["100"]) and not pq.holds_answer("3.5", ["3"])
    assert not pq.holds_answer("ASN1_REAL", ["REAL"]) and pq.holds_answer("pages 1\u201316", ["1-16"])
    assert pq.holds_answer("use  --LEAK-check=full here", ["--leak-check=full"])
    assert pq.holds_answer("the \u201cdefault\u201d value", ['"default"'])
    assert pq.holds_answer("Julian\nSeward", ["julian seward"])
    assert not pq.holds_answer("", ["16"]) and not pq.holds_answer("anything", []) and not pq.holds_answer("", [""])


def test_the_question_file_is_valid_and_split_by_source():
    questions = pq.load_questions()
    by_source = Counter(q.source for q in questions)
    assert set(by_source) == set(pq.SOURCES)  # every source asked about, none unknown
    for name in pq.SOURCES:
        mine = [q for q in questions if q.source == name]
        assert sum(q.answerable for q in mine) >= 5 and sum(not q.answerable for q in mine) >= 1, name
    held_out = [q for q in questions if pq.SOURCES[q.source].held_out and q.answerable]
    assert len(held_out) >= 40  # the number reported first rests on more than a handful
    assert len({q.question for q in questions}) == len(questions)
    assert all(len(a.split()) <= 8 for q in questions for a in q.answers)


def test_a_malformed_question_file_is_refused_with_its_line(tmp_path):
    good = {"source": "valgrind", "question": "q?", "answers": ["1"], "page": 3, "kind": "number", "evidence": "e"}
    for bad, message in ((dict(good, source="nope"), "unknown source"), (dict(good, kind="guess"), "unknown kind"),
                         (dict(good, page=None), "needs answers and a page"),
                         (dict(good, kind="no_answer"), "needs answers and a page"),
                         (dict(good, answers=["1", " "]), "an empty accepted answer")):
        path = tmp_path / "q.jsonl"
        path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
        with pytest.raises(ValueError, match=f"q.jsonl:2: .*{message}"):
            pq.load_questions(path)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(pq.SOURCES))
def test_every_answer_is_on_its_page_as_the_app_extracts_it(name):
    source = pq.SOURCES[name]
    if not source.path.exists():
        pytest.skip(f"{source.path} not installed (scripts/install_eval_pdfs.sh)")
    from app.ingest import extract_pdf

    doc = pq.read_pdf(source)
    if pq.pdf_digest(doc) != source.sha256:
        pytest.skip(f"{source.path} is another version than the questions were written from")
    extracted = extract_pdf(doc)
    pages = [extracted.text[p.char_start:p.char_end] for p in extracted.pages]
    for q in pq.load_questions():
        if q.source == name and q.answerable:
            assert 1 <= q.page <= len(pages), q.question
            assert pq.holds_answer(pages[q.page - 1], q.answers), (q.question, q.page, q.answers)


def test_corpus_overlap_counts_word_runs_seen():
    corpus = "the default port is 8080 unless the administrator sets another port in the file"
    words = corpus.split()
    seen = {" ".join(words[i:i + pq.SHINGLE_WORDS]) for i in range(len(words) - pq.SHINGLE_WORDS + 1)}
    assert pq.corpus_overlap(" ".join(words[:pq.SHINGLE_WORDS]), seen) == 1.0  # one run, seen
    assert pq.corpus_overlap(corpus + " " + corpus, seen) > 0.5
    assert pq.corpus_overlap("nothing of this text was ever in the corpus at all, not one run", seen) == 0.0


def _fact_pdf(path: Path) -> None:
    pdf = FPDF()
    pdf.set_creation_date(datetime(2026, 1, 1, tzinfo=timezone.utc))
    filler = ("The committee met in the spring and discussed the maintenance of the northern quay, "
              "the dredging schedule and the budget for the coming year. ") * 6
    for page in range(3):
        pdf.add_page()
        pdf.set_font("Helvetica", size=11)
        body = filler + ("One of the special magic numbers for harbor-dredging is: 4729135. " if page == 1 else "")
        pdf.multi_cell(0, 6, body + filler)
    path.write_bytes(bytes(pdf.output()))


@pytest.mark.slow
def test_a_run_through_the_app_scores_and_reports(tmp_path):
    """The bundled model on a three-page PDF: a question it reads (RULER's wording) is right and its
    page cited; the rows and the report say so."""
    _fact_pdf(tmp_path / "report.pdf")
    sources = {"report": pq.PdfSource("report", "none", tmp_path / "report.pdf", True, "a test report")}
    questions = tmp_path / "questions.jsonl"
    asked = [pq.PdfQuestion("report", "What is the special magic number for harbor-dredging mentioned in the "
                                      "provided text?", ["4729135"], 2, "number", "harbor-dredging is: 4729135"),
             pq.PdfQuestion("report", "What colour is the committee's flag?", [], None, "no_answer", "absent")]
    questions.write_text("".join(json.dumps(dataclasses.asdict(q)) + "\n" for q in asked))
    rows = pq.evaluate(BUNDLED_MODEL, tmp_path / "out", questions, device="cpu", sources=sources,
                       progress=lambda line: None)
    assert [r.kind for r in rows] == ["number", "no_answer"]
    found = rows[0]
    assert found.right and "4729135" in found.shown and found.page_cited and found.page_candidate
    assert found.passage_alone_right and "4729135" in found.passage_alone  # its passage, read alone
    assert found.bm25_rank == 0  # BM25 alone finds it first: "harbor-dredging" is on that page only
    assert rows[1].page_cited is None and rows[1].right == rows[1].not_found
    assert rows[1].passage_alone is None and rows[1].passage_alone_right is None and rows[1].bm25_rank is None
    written = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert [w["question"] for w in written] == [q.question for q in asked]
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "Held-out sources" in summary
    assert "| report | 1 | 100% (1/1) | 0% (0/1) | 100% (1/1) (100%) | 100% (1/1) | 100% (1/1) | 100% (1/1) (100%) |" \
        in summary
    assert not list(tmp_path.glob("docqa-eval-pdfs-*"))  # the temporary library is removed
    assert found.cited_pages == ["2"]  # the model's margin rule keeps the one chunk that explains the question
    (wide, _) = pq.evaluate(BUNDLED_MODEL, tmp_path / "out-wide", questions, device="cpu", sources=sources,
                            progress=lambda line: None, overrides={"score_margin": 0, "coverage_gain": 0})
    assert wide.right and len(wide.cited_pages) == 4  # changed defaults reach the answer: the top 4, rules off


def test_the_passage_holding_an_answer_is_on_its_page_and_holds_it_whole():
    """`passage_holding` takes the chunk on the answer's page that holds an accepted answer as whole
    words; none when the answer is cut between two chunks."""
    from storage.store import ChunkRecord

    def chunk(ordinal, pages, text):
        return ChunkRecord(ordinal, 0, 0, 0, 0, pages[0], pages[1], text)

    q = pq.PdfQuestion("report", "What is the default port?", ["8080"], 3, "number", "")
    chunks = [chunk(0, (0, 1), "The default port is 8080."),  # the answer, on another page
              chunk(1, (2, 2), "Ports above 80800 are refused."),  # on its page, not as a whole word
              chunk(2, (1, 2), "Set it to 8080 to keep the default."),
              chunk(3, (2, 3), "The default port is 8080.")]
    assert pq.passage_holding(q, chunks) == "Set it to 8080 to keep the default."
    assert pq.passage_holding(q, chunks[:2]) is None


def test_a_missing_pdf_names_its_package(tmp_path):
    source = pq.PdfSource("gone", "some-doc-package", tmp_path / "gone.pdf", True, "missing")
    with pytest.raises(FileNotFoundError, match="install the Debian package some-doc-package"):
        pq.read_pdf(source)


def test_the_held_out_sources_packages_are_kept_out_of_the_training_corpus():
    from training.corpus import HELD_OUT_PACKAGES

    held_out = {s.package for s in pq.SOURCES.values() if s.held_out}
    assert held_out == set(HELD_OUT_PACKAGES)
    assert not held_out & {s.package for s in pq.SOURCES.values() if not s.held_out}


def test_settings_given_on_the_command_line_take_their_fields_types():
    from app.defaults import parse_overrides

    assert parse_overrides(["bm25_weight=4", "top_k=2", "read_chunks_alone=false", "scorer=self_information",
                            "score_margin=0"]) == {"bm25_weight": 4.0, "top_k": 2, "read_chunks_alone": False,
                                                   "scorer": "self_information", "score_margin": 0.0}
    for bad, message in (("nope=1", "NAME one of"), ("top_k=two", "top_k is int"), ("top_k", "NAME=VALUE"),
                         ("auto_k=maybe", "true or false")):
        with pytest.raises(ValueError, match=message):
            parse_overrides([bad])
