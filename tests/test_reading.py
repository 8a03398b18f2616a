"""Each selected chunk read alone (engine/method/reading.py, AnswerParams.read_chunks_alone)."""

from __future__ import annotations

import dataclasses

import pytest

from engine import AnswerParams, SamplingParams
from engine.method.kv_cache import take_chunks
from engine.method.reading import abstains, choose_lone_reading
from engine.scheduler import AnswerScheduler
from tests.tiny_inputs import doc_ids


def test_abstaining_ignores_case_spacing_and_a_full_stop():
    assert abstains("Not found.", "not found") and abstains("  not   FOUND ", "not found") and abstains("", "x")
    assert not abstains("not found here", "not found") and not abstains("9364", "not found")


@pytest.mark.parametrize(("joint", "alone", "chosen"), [
    ("6940", ["not found", "9364", "not found"], 1),  # the joint reading took a neighbour's value
    ("not found", ["not found", "59"], 1),  # the joint reading missed the fact one chunk states
    ("9364", ["not found", "9364"], 1),  # agreeing: the same answer either way
    ("Owen Rossi, Jonas Abara", ["Owen Rossi", "not found"], None),  # a list completed from two chunks
    ("1, 2", ["1", "2"], None),  # values spread over chunks: the joint reading stands
    ("blue", ["not found", "not found."], None),  # no chunk alone answers: the joint reading stands
    ("not found", ["Not found", "not found"], None),
])
def test_the_one_lone_reading_that_answers_is_taken(joint, alone, chosen):
    assert choose_lone_reading(joint, alone, "not found") == chosen


def test_reading_alone_needs_the_abstain_answer():
    with pytest.raises(ValueError, match="abstain_answer"):
        AnswerParams(read_chunks_alone=True)
    AnswerParams(read_chunks_alone=True, abstain_answer="not found")


def _ask(engine):
    doc = engine.prefill(doc_ids(70, 200, seed=8), chunk_size=16)
    sampling = SamplingParams(gen_length=8, block_length=8, stop_at_eos=False)
    return doc, "What is the code?", AnswerParams(top_k=2, sampling=sampling, read_chunks_alone=True,
                                                  abstain_answer="(none)")


@pytest.mark.parametrize("family", ["dream", "llada"])
def test_each_lone_reading_is_the_answer_over_that_chunk_alone_and_one_is_taken(engines, family):
    """The trace's lone answers are what the question answers over each selected chunk alone; with
    the abstain answer set to one of the two, the other is the answer."""
    engine = engines[family]
    doc, question, params = _ask(engine)
    first = engine.answer(doc, question, params)
    lone = first.trace.lone_answers
    assert len(lone) == len(first.trace.selected) == 2 and first.trace.answered_from is None
    single = dataclasses.replace(params, top_k=1, read_chunks_alone=False)
    for ref, text in zip(first.trace.selected, lone, strict=True):
        assert engine.answer(take_chunks(doc, [ref.chunk]), question, single).text == text
    assert "lone_readings" in first.trace.timings
    # The first lone reading made the model's "abstain" answer: the second alone answers.
    assert lone[0] and lone[0] != lone[1] and first.text not in lone, (first.text, lone)  # this seed's texts
    again = engine.answer(doc, question, dataclasses.replace(params, abstain_answer=lone[0]))
    assert again.trace.lone_answers == lone and again.trace.answered_from == 1
    assert again.text == lone[1] != first.text


def test_a_scheduled_question_reads_its_chunks_alone_as_one_asked_alone(engines):
    engine = engines["llada"]
    doc, question, params = _ask(engine)
    alone = engine.answer(doc, question, params)
    scheduler = AnswerScheduler(engine.runner, engine.tokenizer, max_batch=4)
    try:
        result = list(scheduler.submit([doc], question, params))[-1]
    finally:
        scheduler.close()
    assert result.text == alone.text and result.answer_ids == alone.answer_ids
    assert result.trace.lone_answers == alone.trace.lone_answers
    assert result.trace.answered_from == alone.trace.answered_from
