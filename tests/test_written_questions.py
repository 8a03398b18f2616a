"""training.written_questions: questions written as people ask them over manuals' passages, their
train / held-out split by document collection, the written_qa task and the reading probe over them."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random

import pytest
import torch
from tokenizers import Tokenizer

from app.defaults import BUNDLED_MODEL
from engine.method.reading import abstains
from engine.method.sentences import split_sentences
from tools import reading_probe as rp
from tools.pdf_questions import SOURCES, holds_answer
from training.tasks import TaskSampler
from training.train import make_layout, model_config
from training.written_questions import (
    HELD_OUT_GROUPS,
    WrittenQuestion,
    parse_written_question,
    read_written_questions,
    training_items,
)

TOK = Tokenizer.from_file(str(BUNDLED_MODEL / "tokenizer.json"))
CHUNK = 128  # the bundled model's chunk, BOS included


def _line(**kw) -> str:
    item = {"source": "written-info1/tool", "context": "The default port is 8080 for new servers.", "answer": "8080",
            "questions": ["which port does it listen on out of the box?"], "kind": "number"} | kw
    return json.dumps(item)


def test_the_committed_items_are_valid_fit_a_chunk_and_keep_to_their_split():
    """Every committed item parses, its answer survives the chunk's cut with the bundled tokenizer,
    no item reads a manual eval-pdfs asks about, and the held-out collections are never trained on."""
    items = read_written_questions()
    assert len(items) >= 150 and len({(q.context, q.answer) for q in items}) == len(items)
    for q in items:
        shown = TOK.decode(TOK.encode(" " + q.context).ids[:CHUNK - 1])
        assert q.answer in shown, q
        assert len(set(q.questions)) == len(q.questions) >= 2, q
        assert len(set(q.unanswered)) == len(q.unanswered), q
    # The manuals eval-pdfs asks about, by the words their documents' names would hold; each of
    # SOURCES must be named here (a source added there fails until it is).
    eval_manuals = ("valgrind", "zlib", "crc", "mime", "faq", "nettle", "bash", "bzip2", "libtasn1")
    assert all(any(m in f"{s.name} {s.package}" for m in eval_manuals) for s in SOURCES.values())
    assert not any(m in q.source.lower() for q in items for m in eval_manuals)
    held = [q for q in items if q.held_out]
    assert held and {q.group for q in held} <= set(HELD_OUT_GROUPS)
    trained = training_items(items)
    assert len(trained) == len(items) - len(held)
    assert not {t["source"] for t in trained} & set(HELD_OUT_GROUPS)
    assert not {t["context"] for t in trained} & {q.context for q in held}


@pytest.mark.parametrize("change, message", [
    ({"answer": "9090"}, "not a span"),
    ({"questions": ["  "]}, "no question"),
    ({"questions": "which port?"}, "a list of strings"),
    ({"questions": None}, "a list of strings"),
    ({"source": "no-group"}, "is no '<collection>/<document>'"),
    ({"source": "/tool"}, "is no '<collection>/<document>'"),
    ({"source": "written-x/"}, "is no '<collection>/<document>'"),
    ({"source": "written-pyton/json"}, "is no '<collection>/<document>'"),  # a misspelt one is not trained on
    ({"kind": "date"}, "none of number"),
    ({"context": "word " * 71 + "8080"}, "more than 70"),
    ({"unanswered": "which protocol?"}, "unanswered is a list of strings"),
    ({"unanswered": [3]}, "unanswered is a list of strings"),
    ({"unanswered": ["Which port does it listen on out of the box?"]}, "both answered and unanswered"),
    ({"unanswered": ["max clients?", "Max clients?"]}, "given twice"),
])
def test_an_item_a_task_cannot_ask_is_refused_clearly(change, message):
    with pytest.raises(ValueError, match=message):
        parse_written_question(_line(**change))


def test_unanswered_questions_are_read_and_optional():
    item = parse_written_question(_line(unanswered=[" which protocol does it speak? ", "", "max clients"]))
    assert item.unanswered == ("which protocol does it speak?", "max clients")
    assert parse_written_question(_line()).unanswered == ()
    assert training_items([item])[0]["unanswered"] == ["which protocol does it speak?", "max clients"]


def test_a_bad_line_is_named_by_its_number(tmp_path):
    path = tmp_path / "items.jsonl"
    path.write_text(_line() + "\n\n" + _line(answer="nope") + "\n")
    with pytest.raises(ValueError, match=r"items.jsonl:3: answer 'nope'"):
        read_written_questions(path)
    path.write_text(_line() + "\n" + _line(context="The   default port\nis 8080.") + "\n")
    assert [q.context for q in read_written_questions(path)][1] == "The default port is 8080."
    for bad, message in (("[1, 2]", "a JSON object, not list"), ('{"source": "written-info1/x"}', "missing field"),
                         ("{not json", "items.jsonl:1: Expecting")):
        path.write_text(bad + "\n")
        with pytest.raises(ValueError, match=message):
            read_written_questions(path)


def _answer(ex, layout) -> str:
    """A drawn example's answer as text, without its EOS padding."""
    return TOK.decode([t for t in ex.answer_ids if t != layout.eos]).strip()


def _text_corpus(items):
    seqs = [TOK.encode(f" Paragraph {i} of plain text about nothing much.").ids for i in range(40)]
    lengths = torch.tensor([len(s) for s in seqs])
    flat = {"tokens": torch.tensor([t for s in seqs for t in s], dtype=torch.int16),
            "offsets": torch.cat((torch.zeros(1, dtype=torch.long), lengths.cumsum(0)))}
    return {"essay_sentences": flat, "paragraphs": flat, "paragraph_titles": ["t"] * 40, "qa": [],
            "adjectives": ["quiet"], "nouns": ["harbor"], "text_paragraphs": flat, "written_questions": items}


def test_written_qa_asks_a_wording_over_its_passage_each_collection_as_often():
    """One collection of one item against another of nine: each is drawn about half of the time;
    the question is one of the item's wordings; an answerable example shows the passage in one
    chunk, and about the lookup task's share say "not found" without it."""
    items = [WrittenQuestion(f"written-b/doc{i}", f"Tool {i} waits {i + 10} seconds before it retries.",
                             f"{i + 10} seconds", (f"how long does tool {i} pause between tries?",
                                                   f"retry delay of tool {i}"), "number") for i in range(9)]
    items.append(WrittenQuestion("written-a/doc", "The cache of the viewer holds 64 pages.", "64 pages",
                                 ("how big is the viewer's cache",), "number"))
    layout = make_layout(BUNDLED_MODEL, model_config(TOK))
    sampler = TaskSampler(_text_corpus(training_items(items)), lambda s: TOK.encode(s).ids, TOK.decode, layout,
                          CHUNK, 64, seed=3, task_weights={"written_qa": 1})
    lone, refused = 0, 0
    for _ in range(200):
        ex = sampler.sample(3, scoring_share=0.0)
        question = TOK.decode(ex.question_ids)
        answer = _answer(ex, layout)
        item = next(q for q in items if question in q.questions)
        lone += item.group == "written-a"
        if answer == "not found":
            refused += 1
            assert not any(item.context in TOK.decode(c) for c in ex.chunks)
        else:
            assert answer == item.answer and sum(item.context in TOK.decode(c) for c in ex.chunks) == 1
    assert 70 < lone < 130 and 10 < refused < 60
    with pytest.raises(ValueError, match="written_qa task needs"):
        TaskSampler(_text_corpus([]), lambda s: TOK.encode(s).ids, TOK.decode, layout, CHUNK, 64, seed=0,
                    task_weights={"written_qa": 1})


def test_written_near_misses_show_another_passage_of_the_same_document():
    """Asked with the passage that answers left out, a near miss shows, half the time, a passage of
    the item's own document that does not hold the answer; never one of another document, never
    the answer; with `written_not_found_share` 1 every example says "not found"."""
    items = [WrittenQuestion("written-b/tool", "Tool waits 30 seconds before it retries. It logs each retry.",
                             "30 seconds", ("how long between retries?", "retry pause?"), "number"),
             WrittenQuestion("written-b/tool", "Tool keeps 12 log files. Older ones are deleted.", "12 log files",
                             ("how many logs are kept?", "log count?"), "number"),
             # A passage of the same document holding the asked answer is no near miss: never shown.
             WrittenQuestion("written-b/tool", "Tool gives up after 30 seconds of silence.", "Tool gives up",
                             ("when does it stop?", "what happens on silence?"), "phrase"),
             WrittenQuestion("written-b/other", "Other stores 30 seconds of audio.", "30 seconds",
                             ("audio kept?", "how much audio?"), "number")]
    layout = make_layout(BUNDLED_MODEL, model_config(TOK))
    sampler = TaskSampler(_text_corpus(training_items(items)), lambda s: TOK.encode(s).ids, TOK.decode, layout,
                          CHUNK, 64, seed=4, task_weights={"written_qa": 1}, near_miss_share=1.0,
                          written_not_found_share=1.0)
    shown = {"mate": 0, "own": 0, "none": 0}
    for _ in range(200):
        ex = sampler.sample(2, scoring_share=0.0)
        text = " ".join(TOK.decode(c) for c in ex.chunks)
        question = TOK.decode(ex.question_ids)
        assert _answer(ex, layout) == "not found"
        asked = next(q for q in items if question in q.questions)
        assert asked.answer not in text and "Other stores" not in text
        assert asked.answer != "30 seconds" or "of silence" not in text
        if asked.answer == "30 seconds":
            mate = "Tool keeps 12 log files." in text
            shown["mate" if mate else "own" if "It logs each retry." in text else "none"] += 1
    assert shown["mate"] > 20 and shown["own"] > 20
    with pytest.raises(ValueError, match="written_not_found_share"):
        TaskSampler(_text_corpus(training_items(items)), lambda s: TOK.encode(s).ids, TOK.decode, layout, CHUNK,
                    64, seed=0, task_weights={"written_qa": 1}, written_not_found_share=1.5)


def test_unanswered_written_questions_are_asked_over_their_whole_passage():
    """With `written_unanswered_share` 1, an item with unanswered questions is always asked one of
    them over its own passage, shown whole in one chunk, and the answer is "not found"; an item
    without any is asked as before (its wordings, answered where its passage is shown)."""
    with_unanswered = WrittenQuestion("written-b/tool", "Tool waits 30 seconds before it retries.", "30 seconds",
                                      ("how long between retries?",), "number",
                                      ("how many retries before it gives up?", "which log file records retries?"))
    without = WrittenQuestion("written-a/other", "Other keeps 12 log files.", "12 log files",
                              ("how many logs are kept?",), "number")
    layout = make_layout(BUNDLED_MODEL, model_config(TOK))
    sampler = TaskSampler(_text_corpus(training_items([with_unanswered, without])), lambda s: TOK.encode(s).ids,
                          TOK.decode, layout, CHUNK, 64, seed=5, task_weights={"written_qa": 1},
                          written_not_found_share=0.0, written_unanswered_share=1.0)
    asked = {"unanswered": 0, "other": 0}
    for _ in range(100):
        ex = sampler.sample(3, scoring_share=0.0)
        question = TOK.decode(ex.question_ids)
        answer = _answer(ex, layout)
        shown = [TOK.decode(c) for c in ex.chunks]
        if question in with_unanswered.unanswered:
            asked["unanswered"] += 1
            assert answer == "not found" and sum(with_unanswered.context in c for c in shown) == 1
        else:
            asked["other"] += 1
            assert question in without.questions and answer == without.answer
    assert asked["unanswered"] > 30 and asked["other"] > 30
    # With the share 0, items with unanswered questions draw exactly the examples they drew without.
    plain = [dataclasses.replace(with_unanswered, unanswered=()), without]
    streams = []
    for items in ([with_unanswered, without], plain):
        sampler = TaskSampler(_text_corpus(training_items(items)), lambda s: TOK.encode(s).ids, TOK.decode, layout,
                              CHUNK, 64, seed=6, task_weights={"written_qa": 1}, near_miss_share=0.5)
        streams.append([sampler.sample(2, scoring_share=0.0) for _ in range(50)])
    assert streams[0] == streams[1]
    with pytest.raises(ValueError, match="written_unanswered_share"):
        TaskSampler(_text_corpus(training_items([without])), lambda s: TOK.encode(s).ids, TOK.decode, layout,
                    CHUNK, 64, seed=0, task_weights={"written_qa": 1}, written_unanswered_share=-0.1)


def test_the_written_probe_asks_every_held_out_wording_and_a_sample_of_the_trained():
    held = WrittenQuestion(f"{HELD_OUT_GROUPS[0]}/lib", "The limit is 5 retries.", "5 retries",
                           ("how many times does it retry", "max retries?"), "number")
    mate = WrittenQuestion(f"{HELD_OUT_GROUPS[0]}/lib", "Backoff doubles each time.", "doubles",
                           ("how does the wait grow?",), "phrase")
    other_page = WrittenQuestion(f"{HELD_OUT_GROUPS[0]}/other", "Logs rotate daily.", "daily",
                                 ("how often do logs rotate?",), "phrase")
    seen = [WrittenQuestion("written-b/doc", f"Option {i} is -{i}.", f"-{i}", (f"flag {i}?", f"option {i}?"),
                            "identifier") for i in range(6)]
    every = rp.written_probe_questions([held, mate, other_page, *seen], 2, random.Random(0))
    # Every held-out wording again over its page: the passages of its document, in order, joined.
    in_page = [q for q in every if q.kind == rp.WRITTEN_IN_PAGE_KIND]
    assert [(q.question, q.passage) for q in in_page] == [
        ("how many times does it retry", "The limit is 5 retries. Backoff doubles each time."),
        ("max retries?", "The limit is 5 retries. Backoff doubles each time."),
        ("how does the wait grow?", "The limit is 5 retries. Backoff doubles each time."),
        ("how often do logs rotate?", "Logs rotate daily.")]
    assert [q for q in every if q.kind == "written"][:4] == [
        rp.ProbeQuestion(HELD_OUT_GROUPS[0], "written", q.context, w, q.answer)
        for q in (held, mate, other_page) for w in q.questions]
    asked = [q for q in rp.written_probe_questions([held, *seen], 2, random.Random(0))
             if q.kind != rp.WRITTEN_IN_PAGE_KIND]
    assert [(q.source, q.question) for q in asked[:2]] == [(HELD_OUT_GROUPS[0], "how many times does it retry"),
                                                          (HELD_OUT_GROUPS[0], "max retries?")]
    assert len(asked) == 4 and all(q.kind == "written" and q.answer in q.passage for q in asked)
    assert {q.question for q in asked[2:]} <= {f"flag {i}?" for i in range(6)}
    # Unanswered questions: all of a held-out item's, a sampled trained item's first, each with no answer.
    held = dataclasses.replace(held, unanswered=("which backoff does it use?", "who wrote it?"))
    seen = [dataclasses.replace(q, unanswered=(f"long form of {i}?", "x?")) for i, q in enumerate(seen)]
    with_unanswered = rp.written_probe_questions([held, *seen], 2, random.Random(0))
    assert [q for q in with_unanswered if q.kind == rp.WRITTEN_KIND] == asked  # the same sample drawn
    assert not any(q.kind == rp.WRITTEN_IN_PAGE_KIND and q.answer == "" for q in with_unanswered)
    unanswered = [q for q in with_unanswered if q.kind == rp.WRITTEN_UNANSWERED_KIND]
    assert [q.question for q in unanswered[:2]] == ["which backoff does it use?", "who wrote it?"]
    assert len(unanswered) == 4 and all(q.answer == "" for q in unanswered)
    # A sampled trained item's first unanswered question, over that item's passage.
    assert [q.passage for q in unanswered[2:]] == [q.passage for q in asked[2:]]
    assert all(q.question.startswith("long form of") for q in unanswered[2:])


@pytest.mark.slow
def test_the_written_probe_reads_through_the_app(tmp_path):
    """The bundled model reads a held-out item and a trained one over their passages alone; the
    summary gives the written kind its held-out and seen rows."""
    held = WrittenQuestion(f"{HELD_OUT_GROUPS[0]}/lib", "The access code for the north warehouse is 31548.",
                           "31548", ("What is the access code for the north warehouse?",), "number",
                           ("Who manages the north warehouse?",))
    seen = WrittenQuestion("written-b/doc", "The default port is 8080 for new servers.", "8080",
                           ("What is the default port?",), "number")
    rows = rp.probe(BUNDLED_MODEL, tmp_path / "out", per_kind=1, device="cpu", written=[held, seen],
                    progress=lambda line: None)
    assert [(r.source, r.held_out, r.kind) for r in rows] == [(HELD_OUT_GROUPS[0], True, "written"),
                                                             (HELD_OUT_GROUPS[0], True, "written, unanswered"),
                                                             ("written-b", False, "written"),
                                                             (HELD_OUT_GROUPS[0], True, "written, in its page")]
    assert all(r.right == (holds_answer(r.shown, [r.answer]) if r.answer else abstains(r.shown, "not found"))
               for r in rows)
    summary = (tmp_path / "out" / "summary.md").read_text()
    held_row = next(line for line in summary.splitlines() if line.startswith("| held-out |"))
    assert held_row.endswith(f"| {int(rows[1].right)}/1 ({int(rows[1].right):.0%}) | {int(rows[3].right)}/1 "
                             f"({int(rows[3].right):.0%}) |")
    assert "| written | written, unanswered | written, in its page |" in summary and "| seen |" in summary
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["written"] == sorted([HELD_OUT_GROUPS[0], "written-b"])


def test_the_cli_refuses_pdf_sources_with_written_questions(capsys):
    from tools.cli import main
    from ui.cli import EXIT_USAGE

    assert main(["probe-reading", "--written", "--sources", "valgrind"]) == EXIT_USAGE
    assert "--written asks the written questions" in capsys.readouterr().err


def test_filled_context_share_places_passages_among_text_that_fills_their_chunk():
    """With `filled_context_share` 1, every passage written_qa shows (the answering one, a near miss's,
    an unanswered question's) stands whole among real text that fills its chunk to C-1 tokens, as a
    document's chunks do at inference; answers are unchanged. With the share 0 (the default) the
    stream is the one drawn before the share existed: the digest of these examples at cebaf8f."""
    items = [WrittenQuestion("written-b/tool", "Tool waits 30 seconds before it retries. It logs each retry.",
                             "30 seconds", ("how long between retries?", "retry pause?"), "number",
                             ("how many retries before it gives up?",)),
             WrittenQuestion("written-b/tool", "Tool keeps 12 log files. Older ones are deleted.", "12 log files",
                             ("how many logs are kept?", "log count?"), "number", ("where are the logs kept?",))]
    layout = make_layout(BUNDLED_MODEL, model_config(TOK))

    def sampler(seed: int, **shares) -> TaskSampler:
        return TaskSampler(_text_corpus(training_items(items)), lambda s: TOK.encode(s).ids, TOK.decode, layout,
                           CHUNK, 64, seed=seed, task_weights={"written_qa": 1}, near_miss_share=1.0,
                           written_not_found_share=0.3, written_unanswered_share=0.3, **shares)

    filled, seen = sampler(7, filled_context_share=1.0), {"answered": 0, "not found, passage shown": 0}
    for _ in range(200):
        ex = filled.sample(3, scoring_share=0.0)
        question, text = TOK.decode(ex.question_ids), [TOK.decode(c) for c in ex.chunks]
        answer = _answer(ex, layout)
        asked = next(q for q in items if question in q.questions + q.unanswered)
        shown = [t for t in text if any(x in t for q in items for x in split_sentences(q.context))]
        assert len(shown) <= 1 and all(len(c) == CHUNK - 1 for c in ex.chunks)
        if answer != "not found":
            assert answer == asked.answer and shown and asked.context in shown[0]
            seen["answered"] += 1
        elif shown:
            # An unanswered question's passage, a near passage (the other item's) or a near miss (the
            # asked passage's sentences without the answer), whole; the answer only where it is unasked.
            rest = " ".join(x for x in split_sentences(asked.context) if asked.answer not in x)
            assert any(q.context in shown[0] for q in items) or rest in shown[0]
            assert question in asked.unanswered or asked.answer not in shown[0]
            seen["not found, passage shown"] += 1
    assert seen["answered"] > 50 and seen["not found, passage shown"] > 50
    digest = hashlib.sha256()
    plain = sampler(8)
    for _ in range(100):
        ex = plain.sample(3, scoring_share=0.0)
        digest.update(repr((ex.chunks, ex.question_ids, ex.answer_ids)).encode())
    assert digest.hexdigest() == "7ad404de00ced8039f86cb8fa71736c723434042a809f7aef023109c0499fc4a"
    with pytest.raises(ValueError, match="filled_context_share"):
        sampler(0, filled_context_share=2.0)


def test_written_page_share_reads_a_passage_among_its_documents_other_passages():
    """With `written_page_share` 1, a written passage asked about (answerable, or for an unanswered
    question) stands whole between the passages its document has before and after it, in the file's
    order, cut to the chunk around it; beside an unanswered question stands no passage naming one of
    its subject words ("daemon" here). Another document's passages never stand beside it."""
    first = WrittenQuestion("written-b/tool", "Tool reads its settings from /etc/tool.conf at start.", "/etc/tool.conf",
                            ("where are settings read from?",), "identifier")
    asked = WrittenQuestion("written-b/tool", "Tool waits 30 seconds before it retries.", "30 seconds",
                            ("how long between retries?",), "number", ("how many retries before the daemon quits?",))
    last = WrittenQuestion("written-b/tool", "The daemon writes one line per request to its access log.",
                           "one line per request", ("what does the access log hold?",), "phrase")
    other = WrittenQuestion("written-a/other", "Other keeps 12 log files.", "12 log files",
                            ("how many logs are kept?",), "number")
    items = [first, asked, last, other]
    layout = make_layout(BUNDLED_MODEL, model_config(TOK))
    page = f"{first.context} {asked.context} {last.context}"
    for chunk in (CHUNK, 24):
        sampler = TaskSampler(_text_corpus(training_items(items)), lambda s: TOK.encode(s).ids, TOK.decode, layout,
                              chunk, 64, seed=9, task_weights={"written_qa": 1}, written_not_found_share=0.0,
                              written_unanswered_share=0.5, written_page_share=1.0)
        seen = {"answered": 0, "unanswered": 0}
        for _ in range(200):
            ex = sampler.sample(2, scoring_share=0.0)
            question = TOK.decode(ex.question_ids)
            answer = _answer(ex, layout)
            item = next(q for q in items if question in q.questions + q.unanswered)
            shown = next(TOK.decode(c) for c in ex.chunks if item.context in TOK.decode(c))
            assert "Other keeps" not in shown or item is other
            if item is other:
                continue
            assert len(TOK.encode(shown).ids) <= chunk - 1
            if question in item.unanswered:
                seen["unanswered"] += 1
                assert answer == "not found" and "daemon" not in shown
                if chunk == CHUNK:
                    assert shown.strip() == f"{first.context} {asked.context}"
            else:
                seen["answered"] += 1
                assert answer == item.answer
                if chunk == CHUNK:
                    assert shown.strip() == page
                else:  # a window of the page around the passage: what it has of the page, in order
                    at = page.index(item.context)
                    assert len(TOK.encode(shown).ids) == chunk - 1 and shown.strip() in page[max(0, at - 60):]
        assert seen["answered"] > 50 and seen["unanswered"] > 8
    with pytest.raises(ValueError, match="written_page_share"):
        TaskSampler(_text_corpus(training_items(items)), lambda s: TOK.encode(s).ids, TOK.decode, layout, CHUNK,
                    64, seed=0, task_weights={"written_qa": 1}, written_page_share=-1.0)
