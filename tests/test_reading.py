"""Each selected chunk read alone (engine/method/reading.py, AnswerParams.read_chunks_alone)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine import AnswerParams, AnswerResult, JointAnswer, ReadsAlone, SamplingParams
from engine.decode.loop import DecodeStep
from engine.decode.static import StaticBatch, StaticDecoder
from engine.method.answer import LoneReadings, prepare_answer
from engine.method.kv_cache import take_chunks
from engine.method.reading import (
    abstains,
    choose_lone_reading,
    confirmation_settled,
    confirmed,
    confirmed_answer,
    confirms,
    first_confirming,
    gathered_values,
    gathers,
    lone_readings_settled,
    with_values,
)
from engine.scheduler import AnswerScheduler
from tests.tiny_inputs import asked_together, doc_ids


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
    ("Ada Lovelace", ["not found", "Ada"], None),  # a name the joint reading gave in full
    ("10", ["1", "not found"], 0),  # compared word by word: "1" is not a part of "10"
])
def test_the_one_lone_reading_that_answers_is_taken(joint, alone, chosen):
    assert choose_lone_reading(joint, alone, "not found") == chosen


def test_two_answering_lone_readings_settle_the_choice():
    assert not lone_readings_settled(["not found", "59"], "not found")
    assert lone_readings_settled(["59", "not found", "60"], "not found")
    assert choose_lone_reading("59", ["59", "not found", "60", "not found"], "not found") is None


@pytest.mark.parametrize(("joint", "lone", "agree"), [
    ("9364", "9364", True),
    ("9364.", " 9364", True),  # punctuation and spacing are not words
    ("Owen Rossi, Jonas Abara", "Owen Rossi", True),  # one value of a list gathered from two chunks
    ("6773976, 9184285, 6400223", "9184285, 6773976", True),  # a chunk's two values in its own order
    ("7, 8 and 9", "9; 4", True),
    ("1,840 euros", "1,500 euros", False),  # a comma inside a number is not a list
    ("7, 8", "9, 4", False),
    ("Ada", "Ada Lovelace", True),  # a name the joint reading cut short
    ("10", "1", False),  # word by word: "1" is not a part of "10"
    ("6940", "9364", False),  # the joint reading took a neighbour's value
    ("not found", "not found", False),  # two refusals confirm no answer
    ("9364", "not found", False),
    ("", "", False),
])
def test_a_lone_reading_confirms_the_joint_answer_where_their_words_agree(joint, lone, agree):
    assert confirms(joint, lone, "not found") is agree


def test_a_confirmed_answer_is_the_joint_one_unless_the_lone_reading_gives_it_in_full():
    assert confirmed_answer("glass house", "the glass house") == "the glass house"
    assert confirmed_answer("7, 8, 9", "8") == "7, 8, 9" and confirmed_answer("9364", "9364.") == "9364"
    assert confirmed_answer("7, 8, 9", "9, 7") == "7, 8, 9"


def test_the_joint_answer_is_confirmed_by_any_lone_reading_and_settled_by_the_first():
    assert confirmed("59", ["not found", "60", "59"], "not found")
    assert first_confirming("1, 2", ["not found", "2", "1, 2"], "not found") == 1
    assert not confirmed("59", ["not found", "60"], "not found") and not confirmed("59", [], "not found")
    assert not confirmation_settled("59", ["not found", "60"], "not found")  # a third chunk may confirm it
    assert confirmation_settled("59", ["59"], "not found")
    assert confirmation_settled("not found", [], "not found")  # nothing can confirm a refusal: none is read


@pytest.mark.parametrize(("joint", "alone", "passages", "added"), [
    # the joint reading listed three of four values, repeating one; the fourth chunk alone gives it
    ("5496338, 8089004, 9180076, 9180076", ["5496338, 5496338", "not found", "7675088, 7675088"],
     ["is: 5496338.", "plain text", "for x is: 7675088."], [(2, "7675088")]),
    ("Owen Rossi and Ada Lee", ["Ada Lee", "Jonas Abara"], ["Ada Lee", "chair: Jonas Abara."], [(1, "Jonas Abara")]),
    ("7, 8", ["9", "9; 10"], ["9", "10 and 9"], [(0, "9"), (1, "10")]),  # each value once, in reading order
    ("7, 8, and 9", ["9", "10"], ["9", "10"], [(1, "10")]),  # the Oxford comma's "and 9" is the value 9
    ("7, 8", ["9"], ["the value is 99"], []),  # a value its chunk does not hold (made up) is never added
    ("7, 8", ["840"], ["costs 1,840 euros"], []),  # numbers compared whole
    ("7, 8", ["1,84"], ["costs 1,840 euros"], []),  # a value cut short
    ("7, 8", ["Jonas Abara"], ["chair: Jonas Abara"], []),  # not of the list's shape
    ("7, 8", ["Not found."], ["7"], []),
    ("1,840", ["1,500"], ["1,500"], []),  # one value (a comma inside a number): no list to complete
    ("March 5, 2021", ["April 2, 2020"], ["April 2, 2020"], []),  # a date: values of unlike shapes
    ("Greenwich Village, New York City", ["Manhattan"], ["Manhattan"], []),  # a place, not a list
    ("10th and 11th centuries", ["1966"], ["in 1966"], []),
    ("59", ["60"], ["60"], []),
    ("not found", ["60"], ["60"], []),
])
def test_a_confirmed_list_answer_gains_the_values_chunks_alone_hold(joint, alone, passages, added):
    assert gathered_values(joint, alone, passages, "not found") == added


def test_only_like_values_make_a_list_and_a_completed_list_gives_each_value_once():
    assert gathers("7, 8", "not found") and gathers("Ada Lee and Owen Rossi", "not found")
    assert gathers("7, 8, and 9", "not found") and gathers("7, 7", "not found") is False
    assert not gathers("1,840", "not found") and not gathers("Ada Lee", "not found")
    assert not gathers("March 5, 2021", "not found") and not gathers("not found", "not found")
    assert with_values("5496338, 8089004, 8089004.", ["7675088"]) == "5496338, 8089004, 7675088"
    assert with_values("7, 8, and 9", ["10"]) == "7, 8, 9, 10"
    assert with_values("7, 8, 8", []) == "7, 8, 8"  # nothing added: the answer as it was


def test_a_list_answer_reads_every_chunk_alone():
    """Confirmed by the first chunk, a list answer still reads the others, which may add a value."""
    lone = LoneReadings([], None, None, AnswerParams(read_chunks_alone=True, confirm_with_lone_reading=True,
                                                     abstain_answer="not found"))
    assert not lone.settled("7, 8", ["7"]) and lone.settled("7", ["7"]) and lone.settled("not found", [])


def test_confirming_needs_the_lone_readings():
    with pytest.raises(ValueError, match="confirm_with_lone_reading needs read_chunks_alone"):
        AnswerParams(confirm_with_lone_reading=True, abstain_answer="not found")
    AnswerParams(read_chunks_alone=True, confirm_with_lone_reading=True, abstain_answer="not found")


def test_reading_alone_needs_the_abstain_answer():
    with pytest.raises(ValueError, match="abstain_answer"):
        AnswerParams(read_chunks_alone=True)
    AnswerParams(read_chunks_alone=True, abstain_answer="not found")


def _ask(engine, top_k=2):
    doc = engine.prefill(doc_ids(70, 200, seed=8), chunk_size=16)
    sampling = SamplingParams(gen_length=8, block_length=8, stop_at_eos=False)
    return doc, "What is the code?", AnswerParams(top_k=top_k, sampling=sampling, read_chunks_alone=True,
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


def test_reading_stops_once_two_chunks_answer_alone(engines):
    """With every lone reading answering (the random model never says "(none)"), the third of three
    chunks is not read: it could not change the choice."""
    engine = engines["dream"]
    doc, question, params = _ask(engine, top_k=3)
    result = engine.answer(doc, question, params)
    assert len(result.trace.selected) == 3 and len(result.trace.lone_answers) == 2
    assert result.trace.answered_from is None


def test_an_answer_no_chunk_alone_confirms_is_the_abstain_answer(engines):
    """With confirm_with_lone_reading, three chunks chosen: the random LLaDA's joint answer shares no
    words with any chunk read alone (this seed), so every chunk is read (none settles it) and the
    abstain answer is given, the joint answer kept in the trace; a joint answer that abstains reads
    no chunk alone."""
    engine = engines["llada"]
    doc, question, params = _ask(engine, top_k=3)
    plain = engine.answer(doc, question, params)
    confirming = dataclasses.replace(params, confirm_with_lone_reading=True)
    result = engine.answer(doc, question, confirming)
    assert len(result.trace.lone_answers) == 3 and not confirmed(plain.text, result.trace.lone_answers, "(none)")
    assert result.text == "(none)" and result.trace.unconfirmed == plain.text and result.trace.answered_from is None
    assert engine.tokenizer.decode(result.answer_ids) == "(none)"
    refusing = engine.answer(doc, question, dataclasses.replace(confirming, abstain_answer=plain.text))
    assert refusing.text == plain.text and refusing.trace.lone_answers == [] and refusing.trace.unconfirmed is None


def test_the_first_chunk_alone_that_confirms_the_answer_ends_the_lone_readings(engines):
    """The random Dream's first chunk read alone gives the joint answer's words and more (this seed):
    it confirms it, the other two chunks are not read, and its fuller reading is given, cited from
    that chunk."""
    engine = engines["dream"]
    doc, question, params = _ask(engine, top_k=3)
    plain = engine.answer(doc, question, params)
    result = engine.answer(doc, question, dataclasses.replace(params, confirm_with_lone_reading=True))
    assert len(plain.trace.lone_answers) == 2 and plain.trace.answered_from is None  # two answered: the joint stands
    assert result.trace.lone_answers == plain.trace.lone_answers[:1] and result.trace.unconfirmed is None
    assert confirms(plain.text, result.trace.lone_answers[0], "(none)") and result.trace.answered_from == 0
    lone = engine.answer(take_chunks(doc, [result.trace.selected[0].chunk]), question,
                         dataclasses.replace(params, top_k=1, read_chunks_alone=False))
    assert result.text == confirmed_answer(plain.text, lone.text) == lone.text != plain.text
    assert result.answer_ids == lone.answer_ids


def test_lone_readings_hold_a_copy_of_their_chunks_not_the_documents(engines):
    engine = engines["llada"]
    doc, question, params = _ask(engine)
    prepared = prepare_answer(engine.runner, engine.tokenizer, [doc], question, params)
    assert len(prepared.lone.chunks) == 2
    for chunk in prepared.lone.chunks:
        assert chunk.num_chunks == 1
        assert chunk.keys.untyped_storage().nbytes() == chunk.keys.numel() * chunk.keys.element_size()


def _failing_after(monkeypatch, owner, method: str, calls: int):
    """`owner.method` (a decoder's `slot_logits`, a batch's `step`) raising out-of-memory from call
    `calls` + 1 on: the lone readings' first step, after a joint answer of `calls` steps."""
    real, count = getattr(owner, method), [0]

    def failing(self, *args):
        count[0] += 1
        if count[0] > calls:
            raise torch.OutOfMemoryError("out of memory in a lone reading")
        return real(self, *args)
    monkeypatch.setattr(owner, method, failing)


@pytest.mark.parametrize("driver", ["alone", "scheduler"])
def test_a_failed_lone_reading_leaves_the_joint_answer_unchecked(engines, monkeypatch, driver):
    """The lone readings' step fails (in `stream_answer`, or in the scheduler's batched forward): the
    answer over all chunks is given, marked unchecked, and a later question runs as before."""
    engine = engines["dream"]
    doc, question, params = _ask(engine)
    joint = engine.answer(doc, question, dataclasses.replace(params, read_chunks_alone=False))
    checked = engine.answer(doc, question, params)
    with monkeypatch.context() as patch:
        if driver == "alone":
            _failing_after(patch, StaticDecoder, "slot_logits", joint.trace.steps)
            result = engine.answer(doc, question, params)
        else:
            _failing_after(patch, StaticBatch, "step", joint.trace.steps)
            scheduler = AnswerScheduler(engine.runner, engine.tokenizer, max_batch=4)
            try:
                events = list(scheduler.submit([doc], question, params))
            finally:
                scheduler.close()
            assert [type(e) for e in events if not isinstance(e, DecodeStep)] == [ReadsAlone, JointAnswer, AnswerResult]
            result = events[-1]
    assert (result.text, result.answer_ids) == (joint.text, joint.answer_ids)
    assert result.trace.lone_failed and result.trace.lone_answers == [] and result.trace.answered_from is None
    again = engine.answer(doc, question, params)
    assert (again.text, again.trace.lone_answers, again.trace.lone_failed) == \
        (checked.text, checked.trace.lone_answers, False)


def test_scheduled_questions_read_their_chunks_alone_as_each_asked_alone(engines):
    """Four questions over two documents in one batch, one answered from its second chunk alone
    (its abstain answer is its first chunk's lone reading), one with a longer answer, so that lone
    readings' rows share steps with another question's joint rows, one whose answer no chunk alone
    confirms (confirm_with_lone_reading): each as when asked alone."""
    engine = engines["llada"]
    doc, question, params = _ask(engine)
    other = engine.prefill(doc_ids(91, 260, seed=12), chunk_size=16)
    plain = engine.answer(doc, question, params)
    from_second = dataclasses.replace(params, abstain_answer=plain.trace.lone_answers[0])
    longer = dataclasses.replace(params, sampling=dataclasses.replace(params.sampling, gen_length=24))
    confirming = dataclasses.replace(params, confirm_with_lone_reading=True)
    asks = [(doc, question, from_second), (other, "Which pier is it?", params), (other, "And the date?", longer),
            (doc, question, confirming)]
    expected = [engine.answer(d, q, p) for d, q, p in asks]
    assert expected[0].trace.answered_from == 1 and expected[3].trace.unconfirmed == plain.text
    events, scheduler = asked_together(engine, asks, max_batch=4)
    assert max(scheduler.batch_sizes) == 4
    for got, want in zip(events, expected, strict=True):
        assert sum(isinstance(e, JointAnswer) for e in got) == sum(isinstance(e, ReadsAlone) for e in got) == 1
        result = got[-1]
        assert result.text == want.text and result.answer_ids == want.answer_ids
        assert result.trace.lone_answers == want.trace.lone_answers
        assert result.trace.answered_from == want.trace.answered_from
        assert result.trace.unconfirmed == want.trace.unconfirmed


@pytest.mark.gpu
def test_scheduled_lone_readings_equal_the_questions_alone_on_the_gpu(dream_dir):
    """On CUDA (the joint answer alone decodes paged, the lone readings contiguous; in the batch all
    contiguous, over captured graphs), fp32 so that greedy choices cannot flip on rounding: four
    questions, two of them answered from a chunk alone, as when each is asked alone."""
    from engine import Engine

    engine = Engine.from_pretrained(dream_dir, device="cuda", dtype=torch.float32)
    docs = [engine.prefill(doc_ids(37 + 23 * i, 300, seed=10 + i), chunk_size=16) for i in range(4)]
    sampling = SamplingParams(gen_length=8, block_length=8, stop_at_eos=False)
    params = AnswerParams(top_k=3, sampling=sampling, read_chunks_alone=True, abstain_answer="(none)")
    questions = [f"Question {i}: what is the code of pier {i}?" for i in range(4)]
    asks = []
    for i, (doc, q) in enumerate(zip(docs, questions, strict=True)):
        p = params
        if i % 2:  # its first lone reading as the abstain answer: the second chunk alone answers
            p = dataclasses.replace(params, abstain_answer=engine.answer(doc, q, params).trace.lone_answers[0])
        asks.append((doc, q, p))
    alone = [engine.answer(doc, q, p) for doc, q, p in asks]
    assert all(a.trace.lone_answers for a in alone)  # (answered from one: where its lone readings differ)
    events, scheduler = asked_together(engine, asks, max_batch=8)
    assert max(scheduler.batch_sizes) > 1
    for a, b in zip(alone, [e[-1] for e in events], strict=True):
        assert (b.text, b.answer_ids, b.trace.lone_answers, b.trace.answered_from) == \
            (a.text, a.answer_ids, a.trace.lone_answers, a.trace.answered_from)
