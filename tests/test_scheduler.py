"""Continuous batching of questions (engine/scheduler.py, engine.decode.static.StaticBatch)."""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch

from engine import AnswerParams, SamplingParams
from engine.decode.loop import (
    BlockDone,
    BlockRefreshed,
    DecidedStep,
    DecodeStep,
    LogitsRequest,
    decode_blocks,
    run_blocks,
)
from engine.decode.sampling import StepPlan
from engine.decode.static import StaticBatch, StaticDecoder
from engine.method.answer import AnswerResult, prepare_answer
from engine.scheduler import AnswerScheduler, FairTurns, QueueFull, RecentSeconds, gathered_enough
from tests.tiny_inputs import asked_together, doc_ids


def _params(gen_length: int = 16, block_length: int = 8, top_k: int = 3, **kw) -> AnswerParams:
    return AnswerParams(top_k=top_k, sampling=SamplingParams(gen_length=gen_length, block_length=block_length,
                                                             stop_at_eos=False, **kw))


def _documents(engine, count: int):
    # Odd lengths and chunk counts, so the batched contexts differ in length and need padding.
    return [engine.prefill(doc_ids(37 + 23 * i, 300, seed=10 + i), chunk_size=16) for i in range(count)]


@pytest.mark.parametrize("family", ["dream", "llada"])
def test_batched_step_logits_match_each_decoder_alone(engines, family):
    engine = engines[family]
    runner = engine.runner
    questions = ["What is it?", "Who signed the quay contract in the spring?", "When?"]
    prepared = [prepare_answer(runner, engine.tokenizer, [doc], q, _params(top_k=1 + i))
                for i, (doc, q) in enumerate(zip(_documents(engine, 3), questions, strict=True))]
    loops = [decode_blocks(p.decoder, runner.cfg, p.sampling, p.generator, runner.device) for p in prepared]
    requests = [next(loop) for loop in loops]
    assert all(StaticBatch.accepts(r.decoder) for r in requests)
    lengths = {r.decoder.ctx.key_valid.shape[1] for r in requests}
    assert len(lengths) == 3  # three context lengths: the batch pads
    batched = StaticBatch(runner).slot_logits(requests)
    for request, logits in zip(requests, batched, strict=True):
        alone = request.decoder.slot_logits(request.block, request.answer, request.slots)
        assert logits.shape == alone.shape
        torch.testing.assert_close(logits, alone, atol=2e-5, rtol=1e-4)  # fp32 on the CPU


def _drive_together(runner, loops) -> list:
    """Steps the loops as the scheduler does: one `StaticBatch.step` for all still decoding, each
    question leaving once done; returns their outcomes and how many decisions were batched."""
    batch, outcomes, decided = StaticBatch(runner), [None] * len(loops), 0
    requests = {i: next(loop) for i, loop in enumerate(loops)}
    while requests:
        order = list(requests)
        replies = batch.step([requests[i] for i in order])
        decided += sum(isinstance(r, DecidedStep) for r in replies)
        for i, reply in zip(order, replies, strict=True):
            item = loops[i].send(reply)
            try:
                while not isinstance(item, LogitsRequest):
                    item = loops[i].send(None)
                requests[i] = item
            except StopIteration as done:
                outcomes[i] = done.value
                del requests[i]
    batch.clear()
    return outcomes, decided


@pytest.mark.parametrize("family", ["dream", "llada"])
def test_steps_decided_in_one_batch_equal_each_question_alone(engines, family):
    """Questions of every noise-free rule, several commits a step (two blocks each; a low threshold,
    scheduled rules over half the slots' steps), and one sampled question whose step is its own,
    stepped in one batch: each answer and step count is the question's alone."""
    engine = engines[family]
    runner = engine.runner
    rules = [dict(decoder="threshold", threshold=0.05), dict(decoder="low_confidence", steps=8),
             dict(decoder="maskgit_plus", steps=8), dict(decoder="topk_margin", steps=8),
             dict(decoder="entropy", steps=8), dict(decoder="low_confidence", steps=8, temperature=0.7)]
    docs = _documents(engine, len(rules))
    prepared = [prepare_answer(runner, engine.tokenizer, [doc], f"Which berth is number {i}?", _params(**rule))
                for i, (doc, rule) in enumerate(zip(docs, rules, strict=True))]
    outcomes, decided = _drive_together(
        runner, [decode_blocks(p.decoder, runner.cfg, p.sampling, p.generator, runner.device) for p in prepared])
    assert decided > 0
    for i, (doc, rule) in enumerate(zip(docs, rules, strict=True)):
        again = prepare_answer(runner, engine.tokenizer, [doc], f"Which berth is number {i}?", _params(**rule))
        steps = run_blocks(again.decoder, runner.cfg, again.sampling, again.generator, runner.device)
        try:
            while True:
                next(steps)
        except StopIteration as done:
            alone = done.value
        assert outcomes[i].canvas == alone.canvas, rule
        assert outcomes[i].steps == alone.steps, rule
    assert any(o.steps < 16 for o in outcomes[:-1])  # some steps committed several slots


def test_a_batch_keeps_rows_as_questions_come_and_go(engines):
    """Rows of the batched step are kept by their contexts: a question leaving frees its row for a
    newcomer, the others are not copied again; a batch that shrinks keeps its buffers, moving a
    question beyond the smaller forward's rows down, and grows back into them."""
    engine = engines["dream"]
    runner = engine.runner
    docs = _documents(engine, 4)
    prepared = [prepare_answer(runner, engine.tokenizer, [doc], f"Which pier is number {i}?", _params(top_k=1 + i % 3))
                for i, doc in enumerate(docs)]
    requests = [next(decode_blocks(p.decoder, runner.cfg, p.sampling, p.generator, runner.device)) for p in prepared]
    batch = StaticBatch(runner)

    def check(members):
        logits = batch.slot_logits([requests[i] for i in members])
        for i, got in zip(members, logits, strict=True):
            r = requests[i]
            torch.testing.assert_close(got, r.decoder.slot_logits(r.block, r.answer, r.slots), atol=2e-5, rtol=1e-4)

    check([0, 1, 2])  # three rows of a four-row step
    step = batch._step
    rows = {i: [j for j, m in enumerate(step.members) if m is requests[i].decoder.ctx] for i in (0, 1, 2)}
    check([2, 3, 1])  # 0 left and 3 joined: 3 takes 0's row, 1 and 2 keep theirs
    assert batch._step is step
    for i, row in ((3, rows[0]), (1, rows[1]), (2, rows[2])):
        assert [j for j, m in enumerate(step.members) if m is requests[i].decoder.ctx] == row
    assert rows[1] != [0]
    check([1])  # one question: the step's one-row forward, 1 moved down into row 0
    assert batch._step is step and step.members[0] is requests[1].decoder.ctx
    assert all(m is None for m in step.members[1:])  # the others' rows let go
    assert not step.valid[rows[1][0], :step.context_len].any()
    check([0, 3, 1, 2])  # grown back to four: the same buffers
    assert batch._step is step and step.members[0] is requests[1].decoder.ctx
    batch.clear()
    assert batch._step is None


def _to_block_done(loop) -> BlockDone:
    """Runs a decode loop alone (each step's logits from its own decoder) to its first BlockDone."""
    item = next(loop)
    while not isinstance(item, BlockDone):
        item = loop.send(item.decoder.slot_logits(item.block, item.answer, item.slots)
                         if isinstance(item, LogitsRequest) else None)
    return item


@pytest.mark.parametrize("family", ["dream", "llada"])
def test_a_block_refreshed_as_a_row_of_the_batch_equals_its_refresh_alone(engines, family):
    """One question's finished block refreshed in the same forward as two others' steps: its
    context (KV, valid keys, a shifted model's anchor) is what `block_done` alone makes, its row
    keeps the grown context, and the others' logits are theirs alone."""
    engine = engines[family]
    runner = engine.runner
    docs = _documents(engine, 3)

    def prepared(i):
        return prepare_answer(runner, engine.tokenizer, [docs[i]], f"Which berth is number {i}?", _params(top_k=1 + i))

    twin = [prepared(0), prepared(0)]  # the same question twice: one refreshed alone, one in the batch
    done = [_to_block_done(decode_blocks(p.decoder, runner.cfg, p.sampling, p.generator, runner.device)) for p in twin]
    assert torch.equal(done[0].answer, done[1].answer)
    twin[0].decoder.block_done(done[0].block, done[0].answer)
    others = [prepared(i) for i in (1, 2)]
    requests = [next(decode_blocks(p.decoder, runner.cfg, p.sampling, p.generator, runner.device)) for p in others]
    batch = StaticBatch(runner)
    replies = batch.step([requests[0], done[1], requests[1]], decide=False)
    assert isinstance(replies[1], BlockRefreshed)
    alone, batched = twin[0].decoder.ctx, twin[1].decoder.ctx
    assert torch.equal(alone.key_valid, batched.key_valid) and alone.answer_start == batched.answer_start
    for (ka, va), (kb, vb) in zip(alone.kv, batched.kv, strict=True):
        torch.testing.assert_close(kb, ka, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(vb, va, atol=2e-5, rtol=1e-4)
    if runner.cfg.logits_shifted:
        torch.testing.assert_close(batched.anchor_logits, alone.anchor_logits, atol=2e-5, rtol=1e-4)
    else:
        assert batched.anchor_logits is None
    assert any(m is batched for m in batch._step.members)  # its row holds the grown context
    for request, logits in zip(requests, (replies[0], replies[2]), strict=True):
        torch.testing.assert_close(logits, request.decoder.slot_logits(request.block, request.answer, request.slots),
                                   atol=2e-5, rtol=1e-4)
    nxt = done[1].decoder  # its next block's step over the kept row: the logits the alone twin gets
    answer = done[1].answer
    slots = torch.arange(8, 16)
    got = batch.slot_logits([LogitsRequest(nxt, 1, answer, slots, tuple(range(8, 16)), twin[1].sampling,
                                           StepPlan(0, 8, 8))])[0]
    torch.testing.assert_close(got, twin[0].decoder.slot_logits(1, done[0].answer, slots), atol=2e-5, rtol=1e-4)
    batch.clear()


def test_a_failed_refresh_is_its_own_questions_error_and_a_full_row_is_let_go(engines, monkeypatch):
    """Growing a refreshed context fails (out of memory, say): that BlockDone's reply is the error,
    its row is let go, and the question stepped beside it has its logits. A block that would not
    fit after its row's context (a step just long enough) lets the row go, to be copied whole."""
    from engine.decode.static import _BatchedStep

    engine = engines["dream"]
    runner = engine.runner
    docs = _documents(engine, 2)
    prepared = [prepare_answer(runner, engine.tokenizer, [docs[i]], f"Which berth is number {i}?", _params())
                for i in range(2)]
    done = _to_block_done(decode_blocks(prepared[0].decoder, runner.cfg, prepared[0].sampling, prepared[0].generator,
                                        runner.device))
    other = next(decode_blocks(prepared[1].decoder, runner.cfg, prepared[1].sampling, prepared[1].generator,
                               runner.device))
    before = done.decoder.ctx

    def out_of_memory(self, block_kv, anchor_logits):
        raise torch.OutOfMemoryError("no room for the grown context")
    with monkeypatch.context() as patch:
        patch.setattr(StaticDecoder, "take_block", out_of_memory)
        batch = StaticBatch(runner)
        replies = batch.step([other, done], decide=False)
    assert isinstance(replies[1], torch.OutOfMemoryError) and done.decoder.ctx is before
    assert not any(m is before for m in batch._step.members)
    torch.testing.assert_close(replies[0], other.decoder.slot_logits(other.block, other.answer, other.slots),
                               atol=2e-5, rtol=1e-4)
    batch.clear()

    ctx = done.decoder.ctx
    tight = _BatchedStep(runner, 1, ctx.key_valid.shape[1], 8, ctx.kv[0][0])  # no room for one more block
    row = tight.place([ctx])[0]
    tight([row], done.answer[None, :8], ctx.answer_start + torch.arange(8)[None])
    done.decoder.take_block(tight.block_kv(row), None)
    tight.grow(row, ctx, done.decoder.ctx)
    assert tight.members[row] is None and not tight.valid[row, :tight.context_len].any()
    with pytest.raises(ValueError, match="does not hold"):
        tight.grow(row, ctx, done.decoder.ctx)


@pytest.mark.parametrize("family", ["dream", "llada"])
def test_scheduled_answers_equal_the_questions_alone(engines, family, monkeypatch):
    """Five questions at once over five documents, two answer lengths (so some leave the batch
    before others) and two blocks each: the same greedy tokens and steps as each alone; their
    blocks are refreshed in the batched forward, never one by one."""
    engine = engines[family]
    docs = _documents(engine, 5)
    asks = [(docs[i], f"Question {i}: what is the code of pier {i}?", _params(gen_length=16 if i % 2 else 8))
            for i in range(5)]
    alone = [engine.answer(doc, q, p) for doc, q, p in asks]

    def refreshed_alone(self, block, answer):
        raise AssertionError("a scheduled question's block was refreshed on its own")
    monkeypatch.setattr(StaticDecoder, "block_done", refreshed_alone)
    # Held while they arrive: the scheduler drafts the first (at most) and waits for the model, so
    # the rest are prepared together, their chunks scored in shared passes.
    events, scheduler = asked_together(engine, asks, max_batch=8)
    for each in events:
        assert all(isinstance(e, DecodeStep) for e in each[:-1]) and isinstance(each[-1], AnswerResult)
    assert max(scheduler.batch_sizes) > 1  # they did share steps
    assert max(scheduler.prepared_together) > 1  # and scoring passes
    for a, b in zip(alone, [e[-1] for e in events], strict=True):
        assert b.answer_ids == a.answer_ids and b.text == a.text
        assert [(r.document, r.chunk) for r in b.trace.selected] == [(r.document, r.chunk) for r in a.trace.selected]
        assert b.trace.steps == a.trace.steps


def test_a_question_that_reselects_at_a_blocks_end_is_refreshed_by_its_own_loop(engines):
    """A question re-selecting its chunks after each block (reselect_every) is never refreshed by
    the batch (its block's end is its own pass over a new selection), beside one that is: both
    answers as alone."""
    engine = engines["llada"]
    docs = _documents(engine, 2)
    asks = [(docs[0], "Which pier is it?", dataclasses.replace(_params(gen_length=16), reselect_every=1)),
            (docs[1], "And the date?", _params(gen_length=16))]
    alone = [engine.answer(doc, q, p) for doc, q, p in asks]
    decoder = prepare_answer(engine.runner, engine.tokenizer, [docs[0]], asks[0][1], asks[0][2]).decoder
    assert decoder.on_block_done is not None and StaticBatch.accepts(decoder) and not StaticBatch.refreshes(decoder)
    events, scheduler = asked_together(engine, asks, max_batch=4)
    assert max(scheduler.batch_sizes) > 1
    for a, b in zip(alone, [e[-1] for e in events], strict=True):
        assert b.answer_ids == a.answer_ids and b.trace.steps == a.trace.steps


def test_an_error_or_a_cancel_ends_only_its_own_question(engines):
    engine = engines["llada"]
    docs = _documents(engine, 2)
    scheduler = AnswerScheduler(engine.runner, engine.tokenizer)
    try:
        calls = []

        def stop_at_third_check() -> None:
            calls.append(1)
            if len(calls) >= 3:
                raise TimeoutError("past its budget")

        failing = scheduler.submit([docs[0]], "What?", _params(), interrupt_check=stop_at_third_check)
        cancelled = scheduler.submit([docs[1]], "What?", _params())
        fine = scheduler.submit([docs[1]], "Who?", _params())
        cancelled.cancel()
        with pytest.raises(TimeoutError, match="past its budget"):
            list(failing)
        assert list(cancelled) == []  # no result, no error
        assert isinstance(list(fine)[-1], AnswerResult)
        with pytest.raises(ValueError, match="empty"):  # a question that cannot start says why
            list(scheduler.submit([], "What?", _params()))
        assert scheduler.load() == (0, 0)
    finally:
        scheduler.close()


def test_a_full_queue_refuses_at_once(engines):
    engine = engines["llada"]
    doc = _documents(engine, 1)[0]
    scheduler = AnswerScheduler(engine.runner, engine.tokenizer, max_batch=1, max_waiting=1)
    try:
        with scheduler.turn():  # the model is busy: nothing is admitted meanwhile
            first = scheduler.submit([doc], "What?", _params())
            second = None
            for _ in range(50):  # the first is taken off the queue (then waits for its turn)
                try:
                    second = scheduler.submit([doc], "Who?", _params())
                    break
                except QueueFull:
                    threading.Event().wait(0.02)
            assert second is not None
            with pytest.raises(QueueFull):
                scheduler.submit([doc], "When?", _params())
        assert isinstance(list(first)[-1], AnswerResult) and isinstance(list(second)[-1], AnswerResult)
    finally:
        scheduler.close()


def test_fair_turns_are_granted_in_the_order_asked():
    turns, done = FairTurns(), []

    def worker(i: int) -> None:
        with turns.turn():
            done.append(i)

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    with turns.turn():
        for w in workers:
            w.start()
            threading.Event().wait(0.05)  # each asks after the one before, while the lock is held
    for w in workers:
        w.join(timeout=10)
    assert done == list(range(6))


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["dream", "llada"])
def test_scheduled_answers_equal_the_questions_alone_on_the_gpu(family, dream_dir, llada_dir):
    """As on the CPU, on CUDA: the question alone decodes paged (split-KV, CUDA graphs); in the
    batch one decodes paged and the others batched over padded contiguous contexts. fp32, so that
    greedy choices cannot flip on a rounding difference between the two paths."""
    from engine import Engine

    engine = Engine.from_pretrained(dream_dir if family == "dream" else llada_dir, device="cuda", dtype=torch.float32)
    docs = [engine.prefill(doc_ids(37 + 23 * i, 300, seed=10 + i), chunk_size=16) for i in range(6)]
    asks = [(docs[i], f"Question {i}: what is the code of pier {i}?", _params(gen_length=16 if i % 2 else 8))
            for i in range(6)]
    alone = [engine.answer(doc, q, p) for doc, q, p in asks]
    events, scheduler = asked_together(engine, asks, max_batch=8)  # all six admitted together
    assert max(scheduler.batch_sizes) > 2
    results = [e[-1] for e in events]
    layouts = {r.trace.static_layout for r in results}
    assert {"paged", "contiguous"} <= layouts or layouts == {"contiguous"}
    for a, b in zip(alone, results, strict=True):
        assert b.answer_ids == a.answer_ids


def test_a_prefill_and_questions_take_turns(engines):
    """A long prefill (one chunk a batch) taking turns batch by batch lets a question asked during
    it be answered long before it ends, and the prefill goes on meanwhile (neither starves)."""
    from app.kv_service import in_turns

    engine = engines["llada"]
    doc = _documents(engine, 1)[0]
    scheduler = AnswerScheduler(engine.runner, engine.tokenizer)
    chunks = engine.chunk(doc_ids(400, 300, seed=3), chunk_size=8)  # one BOS and 7 tokens a chunk
    batches_done: list[int] = []
    answered_at: list[int] = []
    try:
        started = threading.Event()

        def prefill() -> None:
            for i, _ in enumerate(in_turns(engine.prefill_stream(chunks, token_budget=8), scheduler.turn)):
                batches_done.append(i)
                started.set()

        worker = threading.Thread(target=prefill)
        worker.start()
        assert started.wait(60)
        result = list(scheduler.submit([doc], "What is it?", _params(gen_length=8)))[-1]
        answered_at.append(len(batches_done))
        worker.join(120)
    finally:
        scheduler.close()
    assert isinstance(result, AnswerResult)
    assert chunks.num_chunks > 50 and len(batches_done) == chunks.num_chunks
    assert 1 <= answered_at[0] < chunks.num_chunks  # answered while the prefill was still running


def test_a_question_stopped_while_it_waits_never_runs(engines):
    engine = engines["llada"]
    doc = _documents(engine, 1)[0]
    scheduler = AnswerScheduler(engine.runner, engine.tokenizer, max_batch=1, max_waiting=4)

    def past_budget() -> None:
        raise TimeoutError("past its budget")

    try:
        with scheduler.turn():  # the model is busy: the first waits for its turn, the second in the queue
            first = scheduler.submit([doc], "What?", _params())
            waiting = scheduler.submit([doc], "Who?", _params())
            with pytest.raises(TimeoutError, match="past its budget"):  # the asker's check runs while it waits
                list(waiting.events(check=past_budget, every_s=0.05))
        assert isinstance(list(first)[-1], AnswerResult)
        assert list(waiting) == []  # dropped from the queue: no result, no error
        for _ in range(100):
            if scheduler.load() == (0, 0) and scheduler._pending == 0:
                break
            threading.Event().wait(0.02)
        assert scheduler.load() == (0, 0) and scheduler._pending == 0
        assert scheduler.batch_sizes == {1: sum(scheduler.batch_sizes.values())}  # only the first ran
    finally:
        scheduler.close()


def test_a_dropped_batched_step_is_freed_at_once(engines):
    """A batched step the runner drops goes at once, not at the garbage collector's next run: its
    buffers (gigabytes at a real model's shape) must not pile up as batch sizes change."""
    import gc
    import weakref

    engine = engines["llada"]
    runner = engine.runner
    prepared = prepare_answer(runner, engine.tokenizer, _documents(engine, 1), "What is it?", _params())
    request = next(decode_blocks(prepared.decoder, runner.cfg, prepared.sampling, prepared.generator, runner.device))
    batch = StaticBatch(runner)
    batch.slot_logits([request])
    step = weakref.ref(batch._step)
    gc.disable()
    try:
        batch.clear()
        runner.kept_items("batched static step").clear()
        assert step() is None
    finally:
        gc.enable()


def test_a_failed_shared_pass_lets_each_question_run_its_own(engines, monkeypatch):
    """When the passes shared by the newcomers fail (say, out of memory), no question fails for
    it: each scores its chunks and builds its context alone, and answers as it would alone."""
    import engine.scheduler as scheduler_module

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("no room for the shared pass")

    engine = engines["dream"]
    docs = _documents(engine, 3)
    asks = [(docs[i], f"Which berth is number {i}?", _params()) for i in range(3)]
    alone = [engine.answer(doc, q, p) for doc, q, p in asks]
    monkeypatch.setattr(scheduler_module, "score_questions", out_of_memory)
    monkeypatch.setattr(scheduler_module, "static_contexts", out_of_memory)
    events, scheduler = asked_together(engine, asks, max_batch=8)  # they arrive, and are prepared, together
    assert max(scheduler.prepared_together) > 1
    for a, b in zip(alone, [e[-1] for e in events], strict=True):
        assert isinstance(b, AnswerResult) and b.answer_ids == a.answer_ids


def test_questions_arriving_during_a_draft_are_prepared_with_it(engines, monkeypatch):
    """A burst whose first question is already being drafted when the others arrive is prepared
    in one set of shared passes, not split at its first arrival; each answers as it would alone."""
    import engine.scheduler as scheduler_module

    engine = engines["dream"]
    docs = _documents(engine, 4)
    asks = [(docs[i], f"Which berth is number {i}?", _params()) for i in range(4)]
    alone = [engine.answer(doc, q, p) for doc, q, p in asks]
    scheduler = AnswerScheduler(engine.runner, engine.tokenizer, max_batch=8)
    handles, real_draft = [], scheduler_module.draft_answers

    def draft_while_the_rest_arrive(*args, **kwargs):
        if len(handles) == 1:  # the first question's draft: the other three arrive now
            handles.extend(scheduler.submit([doc], q, p) for doc, q, p in asks[1:])
        return real_draft(*args, **kwargs)
    monkeypatch.setattr(scheduler_module, "draft_answers", draft_while_the_rest_arrive)
    try:
        handles.append(scheduler.submit([asks[0][0]], asks[0][1], asks[0][2]))
        events = [list(h) for h in handles]
    finally:
        scheduler.close()
    assert scheduler.prepared_together == {4: 1}
    for a, b in zip(alone, [e[-1] for e in events], strict=True):
        assert isinstance(b, AnswerResult) and b.answer_ids == a.answer_ids


def test_a_slow_load_does_not_pause_the_questions_decoding(engines):
    """A question whose documents take long to load (a disk read, a prefill) is loaded on a loader
    thread: the question already decoding goes on and finishes meanwhile. Both answer as alone."""
    engine = engines["llada"]
    docs = _documents(engine, 2)
    asks = [(docs[0], "What is the code of pier 4?", _params(gen_length=16)),
            (docs[1], "Who keeps the key?", _params(gen_length=8))]
    alone = [engine.answer(doc, q, p) for doc, q, p in asks]
    first_done, loaded_on = threading.Event(), []

    def slow_loader():
        loaded_on.append(threading.current_thread().name)
        # On the scheduler's thread this would wait out its 60 s: nothing would step meanwhile.
        loaded_on.append(first_done.wait(60))
        return [docs[1]]

    # (prepared at its first step, not gathered: its load must overlap the first's decoding)
    scheduler = AnswerScheduler(engine.runner, engine.tokenizer, max_batch=4, gather=False)
    try:
        first = iter(scheduler.submit([docs[0]], asks[0][1], asks[0][2]))
        first_events = [next(first)]  # its first step: it is decoding
        second = scheduler.submit(slow_loader, asks[1][1], asks[1][2])
        first_events += list(first)
        first_done.set()
        second_events = list(second)
    finally:
        scheduler.close()
    assert loaded_on[0].startswith("answer-loader") and loaded_on[1] is True
    for a, b in zip(alone, [first_events[-1], second_events[-1]], strict=True):
        assert isinstance(b, AnswerResult) and b.answer_ids == a.answer_ids


def test_documents_are_loaded_at_most_max_prepare_ahead(engines):
    """Loads run ahead of preparation for at most `max_prepare` questions (what bounds the memory
    of documents loaded and not yet decoded, whatever the queue); a question cancelled while its
    documents load ends with nothing and frees its place for the next."""
    engine = engines["llada"]
    doc = _documents(engine, 1)[0]
    gate, started = threading.Event(), []

    def gated_loader():
        started.append(1)
        assert gate.wait(60)
        return [doc]

    scheduler = AnswerScheduler(engine.runner, engine.tokenizer, max_batch=8, max_prepare=1)
    try:
        cancelled = scheduler.submit(gated_loader, "What?", _params(gen_length=8))
        others = [scheduler.submit(gated_loader, q, _params(gen_length=8)) for q in ("Who?", "When?")]
        for _ in range(50):  # the three are taken off the queue, their loads waiting on the gate
            threading.Event().wait(0.02)
        assert len(started) == 1  # two loader threads, but one question loaded ahead
        cancelled.cancel()
        gate.set()
        assert list(cancelled) == []  # no result, no error
        assert all(isinstance(list(h)[-1], AnswerResult) for h in others)
        assert len(started) == 3 and scheduler.load() == (0, 0) and scheduler._pending == 0
    finally:
        scheduler.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_documents_in_host_memory_answer_as_resident_ones_on_the_gpu(dream_dir):
    """Loaders that return the KV in host memory (pageable and pinned): the scheduler copies it to
    the GPU on its copy stream, and the answers are those over the documents on the GPU."""
    from engine import Engine

    engine = Engine.from_pretrained(dream_dir, device="cuda", dtype=torch.float32)
    docs = [engine.prefill(doc_ids(37 + 23 * i, 300, seed=10 + i), chunk_size=16) for i in range(4)]
    asks = [(docs[i], f"Question {i}: what is the code of pier {i}?", _params()) for i in range(4)]
    resident, _ = asked_together(engine, asks, max_batch=8)
    on_host = [d.to("cpu") for d in docs]
    on_host[1] = dataclasses.replace(on_host[1], keys=on_host[1].keys.pin_memory(),
                                     values=on_host[1].values.pin_memory())
    scheduler = AnswerScheduler(engine.runner, engine.tokenizer, max_batch=8)
    try:
        handles = [scheduler.submit(lambda d=d: [d], q, p) for d, (_, q, p) in zip(on_host, asks, strict=True)]
        loaded = [list(h) for h in handles]
    finally:
        scheduler.close()
    for a, b in zip(resident, loaded, strict=True):
        assert isinstance(b[-1], AnswerResult) and b[-1].answer_ids == a[-1].answer_ids


def test_a_question_left_while_its_documents_load_does_not_hold_up_the_others(engines):
    """Two questions prepared together; the first one's load hangs (a stuck disk) and its asker
    leaves: the second is prepared and answered at once, not when the stuck load ends."""
    engine = engines["llada"]
    doc = _documents(engine, 1)[0]
    stuck = threading.Event()

    def hanging_loader():
        stuck.wait(120)
        return [doc]

    scheduler = AnswerScheduler(engine.runner, engine.tokenizer, max_batch=4, max_prepare=2)
    answered: list = []
    try:
        with scheduler.turn():  # both are taken off the queue together
            left = scheduler.submit(hanging_loader, "What?", _params(gen_length=8))
            other = scheduler.submit([doc], "Who?", _params(gen_length=8))
        for _ in range(25):  # both drafted; the first one's load hangs
            threading.Event().wait(0.02)
        left.cancel()
        listener = threading.Thread(target=lambda: answered.extend(other))
        listener.start()
        listener.join(60)
        assert answered and isinstance(answered[-1], AnswerResult)
        assert not stuck.is_set() and list(left) == []
    finally:
        stuck.set()
        scheduler.close()


def test_newcomers_are_gathered_until_their_waits_cover_the_stall_they_cause():
    """gathered_enough: preparing stalls every decoding question for the preparation's time; the
    newcomers go once their summed waits reach that, at once with none decoding or no place left."""
    assert not gathered_enough([], decoding=0, preparation_s=0.05, places=8)  # nobody to prepare
    assert gathered_enough([0.0], decoding=0, preparation_s=0.05, places=8)  # an idle GPU: at once
    assert not gathered_enough([0.02], decoding=4, preparation_s=0.05, places=8)  # 0.02 < 4 x 0.05
    assert not gathered_enough([0.1, 0.09], decoding=4, preparation_s=0.05, places=8)  # 0.19 < 0.2
    assert gathered_enough([0.1, 0.1], decoding=4, preparation_s=0.05, places=8)  # 0.2: as long as the stall
    assert gathered_enough([0.2], decoding=4, preparation_s=0.05, places=8)
    assert gathered_enough([0.0, 0.0], decoding=12, preparation_s=0.05, places=2)  # no other could join
    assert gathered_enough([0.0], decoding=3, preparation_s=0.0, places=8)  # no measured cost yet


def test_recent_seconds_are_the_shortest_of_the_nearest_count():
    times = RecentSeconds(kept=3)
    assert times.expected(4) == 0.0  # nothing run yet
    for seconds in (0.9, 0.2, 0.3):  # the first run held a graph capture
        times.record(1, seconds)
    assert times.expected(1) == 0.2
    times.record(1, 0.4)
    times.record(1, 0.5)  # 0.9 and 0.2 dropped: the last three are all slower now
    assert times.expected(1) == 0.3
    times.record(5, 0.5)
    assert times.expected(2) == 0.3 and times.expected(4) == 0.5 and times.expected(3) == 0.3  # a tie: the fewer
    assert times.expected(16) == 0.5


@pytest.mark.parametrize("preparation_s", [0.0, 1e6])
def test_a_newcomer_is_held_while_its_wait_is_short_of_the_stall_it_causes(engines, monkeypatch, preparation_s):
    """A question arriving while another decodes: with a preparation expected to cost nothing it
    joins the batch at once; with one expected to cost more than any wait it is held until the
    first is done (nothing decoding: taken at once). Both answer as alone either way."""
    monkeypatch.setattr(RecentSeconds, "expected", lambda self, count: preparation_s)
    engine = engines["llada"]
    docs = _documents(engine, 2)
    asks = [(docs[0], "What is the code of pier 4?", _params(gen_length=64, block_length=8)),
            (docs[1], "Who keeps the key?", _params(gen_length=8))]
    alone = [engine.answer(doc, q, p) for doc, q, p in asks]
    scheduler = AnswerScheduler(engine.runner, engine.tokenizer, max_batch=4)
    try:
        first = iter(scheduler.submit([docs[0]], asks[0][1], asks[0][2]))
        first_events = [next(first)]  # decoding
        second_events = list(scheduler.submit([docs[1]], asks[1][1], asks[1][2]))
        first_events += list(first)
    finally:
        scheduler.close()
    assert sum(isinstance(e, DecodeStep) for e in first_events) == 64
    assert max(scheduler.batch_sizes) == (2 if preparation_s == 0.0 else 1)  # shared steps, or none
    for a, b in zip(alone, [first_events[-1], second_events[-1]], strict=True):
        assert isinstance(b, AnswerResult) and b.answer_ids == a.answer_ids


def test_a_held_newcomers_documents_load_while_it_waits(engines, monkeypatch):
    """Newcomers held on the queue while another question decodes have their documents loaded
    meanwhile (on a loader thread, within max_prepare), so a document in host memory is ready when
    they are taken; one whose asker leaves while held ends with nothing and frees its load. The
    answers are those of the questions alone."""
    monkeypatch.setattr(RecentSeconds, "expected", lambda self, count: 1e6)  # held while any decodes
    engine = engines["llada"]
    docs = _documents(engine, 2)
    asks = [(docs[0], "What is the code of pier 4?", _params(gen_length=64, block_length=8)),
            (docs[1], "Who keeps the key?", _params(gen_length=8))]
    alone = [engine.answer(doc, q, p) for doc, q, p in asks]
    waiting_at_load, waited = [], []
    gate, both_asked, loaded = threading.Event(), threading.Event(), threading.Event()
    # (three places: two waiting do not fill them, so they stay held while the first decodes)
    scheduler = AnswerScheduler(engine.runner, engine.tokenizer, max_batch=4, max_prepare=3)

    def loader():
        waiting_at_load.append(scheduler.load()[1])  # questions still on the queue as it loads
        loaded.set()
        return [docs[1]]

    def first_waits_for_the_load():  # on the scheduler's thread: the first cannot end before the load
        if both_asked.is_set() and not waited:
            waited.append(loaded.wait(30))  # (once: without early loads the test fails, not hangs)

    def gated_loader():
        gate.wait(60)
        return [docs[1]]

    try:
        first = iter(scheduler.submit([docs[0]], asks[0][1], asks[0][2],
                                      interrupt_check=first_waits_for_the_load))
        first_events = [next(first)]  # decoding
        second = scheduler.submit(loader, asks[1][1], asks[1][2])
        left = scheduler.submit(gated_loader, "When?", _params(gen_length=8))
        both_asked.set()
        assert loaded.wait(30)
        left.cancel()
        gate.set()
        first_events += list(first)
        second_events = list(second)
        assert list(left) == []
    finally:
        scheduler.close()
    # Loaded while held (taken first, it would find the queue empty), and once only.
    assert len(waiting_at_load) == 1 and waiting_at_load[0] >= 1
    assert max(scheduler.batch_sizes) == 1  # held: never decoded beside the first
    assert not scheduler._loads and scheduler._pending == 0
    for a, b in zip(alone, [first_events[-1], second_events[-1]], strict=True):
        assert isinstance(b, AnswerResult) and b.answer_ids == a.answer_ids
