"""Continuous batching of questions: one thread steps every active question's answer at once.

A question is submitted with its documents' KV, or a loader of them (run on loader threads while
the others decode: see `_load`). While others decode, it waits on the queue for more newcomers to
share its preparation, as long as `gathered_enough` says. It runs on the scheduler's thread in
three parts: its draft, run
in one batched pass with the other questions taken off the queue at the same time
(`engine.method.answer.draft_answers`); once its documents are loaded, its preparation (chunk
scoring, selection, the context its answer is decoded over), between two steps of the questions
already decoding, with up to `max_prepare` other newcomers whose chunks are scored, and whose
question passes over their contexts run, in shared passes (`engine.method.answer.score_questions`,
`static_contexts`; if one fails, each question runs its own); then its decode steps. At each step
the scheduler takes one LogitsRequest from every question being decoded, answers the
StaticDecoders' together in one batched forward (`StaticBatch`: each row over its own chunks and
answer; a captured CUDA graph per batch size), where the rule allows decides their commits in one
batched call too (`decide_together`), answers any other decoder alone, and hands each question its
DecodeStep. A question whose block is settled has that block's KV refreshed as a row of the same
forward (`BlockDone`), so questions of several blocks batch their refreshes with the others' steps.
A question joins between steps, once prepared, and leaves when its answer is settled, so short
answers never wait for long ones; a question that reads its chunks alone after
(AnswerParams.reads_chunks_alone) posts its JointAnswer and stays in the batch for the lone
readings' steps. Greedy answers are the same tokens as the question alone gives
(tests/test_scheduler.py), up to the floating-point order of a batched matmul.

The paged GPU layout shares one set of buffers (`engine.decode.paged`) and steps alone, so only a
question prepared while no other is decoding or waiting takes it; the others take the contiguous
layout and batch (a paged question beside a batch would cost a forward of its own every step).

Model work of other kinds (a document's prefill) takes turns with the steps through `turn()`, a
first-come-first-served lock, so an ingest and the questions interleave instead of one starving.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from engine.decode.loop import BlockDone, BlockRefreshed, DecidedStep, DecodeStep, LogitsRequest
from engine.decode.paged import release_pages
from engine.decode.static import StaticBatch
from engine.method.answer import (
    CACHED_KV_MODES,
    AnswerParams,
    AnswerResult,
    BuiltContext,
    ChosenChunks,
    ChunkScores,
    DraftedQuestion,
    JointAnswer,
    PreparedAnswer,
    ReadsAlone,
    choose_chunks,
    draft_answers,
    question_prompt,
    question_scoring_rows,
    score_questions,
    start_answer,
    static_contexts,
    uses_paged_layout,
)
from engine.method.kv_cache import DocumentKV
from engine.runner import Runner

logger = logging.getLogger(__name__)
T = TypeVar("T")


def gathered_enough(waits_s: Sequence[float], decoding: int, preparation_s: float, places: int) -> bool:
    """Whether newcomers waiting for `waits_s` seconds are prepared now, or wait a step longer for
    others to join their preparation.

    Preparing stalls each of the `decoding` questions for about `preparation_s`; most of that is
    paid once a preparation however many it takes (a draft, a scoring pass and a question pass,
    each reading every weight), so a newcomer that joins one saves the decoding questions a stall.
    The newcomers are prepared once their waits add up to the stall they cause (`decoding` x
    `preparation_s`), at once when none is decoding, and as soon as no other could join them
    (`places`: newcomers one preparation can take). Under Poisson arrivals near capacity,
    preparing every arrival at once costs the GPU more in preparations than it has
    (tools/scheduler_sim.py); this rule lowers p95 latency at every load simulated."""
    if not waits_s:
        return False
    return decoding == 0 or len(waits_s) >= places or sum(waits_s) >= decoding * preparation_s


class RecentSeconds:
    """How long recent runs of one kind of work took, by the number of questions each took."""

    def __init__(self, kept: int = 5) -> None:
        self.kept = kept
        self._by_count: dict[int, collections.deque[float]] = {}

    def record(self, count: int, seconds: float) -> None:
        self._by_count.setdefault(count, collections.deque(maxlen=self.kept)).append(seconds)

    def expected(self, count: int) -> float:
        """The shortest of the recent runs of the nearest count (the first run of a count often
        holds a graph capture, so an average would hold newcomers far too long early on); 0
        before any run."""
        if not self._by_count:
            return 0.0
        nearest = min(self._by_count, key=lambda c: (abs(c - count), c))
        return min(self._by_count[nearest])


class QueueFull(RuntimeError):
    """More questions wait than the scheduler takes (`max_waiting`); try again shortly."""


class SchedulerStopped(RuntimeError):
    """The scheduler was closed (the server is stopping), or stopped on an error of its own."""


class FairTurns:
    """A lock granted in the order it was asked for (threading.Lock is not fair: a thread that
    releases and re-takes it at once can keep it from a waiting one forever)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._tickets: collections.deque[object] = collections.deque()
        self._held = False

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        ticket = object()
        with self._cond:
            self._tickets.append(ticket)
            try:
                while self._held or self._tickets[0] is not ticket:
                    self._cond.wait()
            except BaseException:  # interrupted while waiting: its ticket must not block the others
                self._tickets.remove(ticket)
                self._cond.notify_all()
                raise
            self._tickets.popleft()
            self._held = True
        try:
            yield
        finally:
            with self._cond:
                self._held = False
                self._cond.notify_all()


_DONE = object()
# A question's documents, or what loads them once the question is taken off the queue (or held
# there for the next gathering): a loader keeps the KV of the questions waiting further back off
# the device, so its memory grows with `max_prepare`, not the queue. A loader runs on a loader
# thread, so a slow one (a disk read, a prefill) never pauses the decoding questions; it may return
# the KV in host memory (the scheduler copies it to the device). Its GPU work runs on the
# scheduler's copy stream, beside the steps; the graph captures are thread-local
# (engine.cuda_graphs), so work on another thread cannot void them.
Documents = Sequence[DocumentKV] | Callable[[], Sequence[DocumentKV]]
LOADER_THREADS = 2  # one question's host gather and copy overlap another's


@dataclass
class QuestionHandle:
    """One submitted question: iterate it for its DecodeSteps (after ReadsAlone where it reads its
    chunks alone, then its JointAnswer), then its AnswerResult. An error of the question (its `interrupt_check` raising
    included) is raised from the iteration."""

    _events: queue.Queue = field(default_factory=queue.Queue)
    _cancelled: threading.Event = field(default_factory=threading.Event)
    _wake_scheduler: Callable[[], None] = lambda: None  # so the scheduler lets go of it at once

    def cancel(self) -> None:
        """Stops the question at its next step (or before it starts); the model is freed of it."""
        self._cancelled.set()
        self._wake_scheduler()

    def __iter__(self) -> Iterator[DecodeStep | ReadsAlone | JointAnswer | AnswerResult]:
        return self.events()

    def events(self, check: Callable[[], None] | None = None, every_s: float = 0.25
               ) -> Iterator[DecodeStep | ReadsAlone | JointAnswer | AnswerResult]:
        """The question's events; `check` (the asker's: cancelled? past its budget?) is called every
        `every_s` while none arrives, so a question still waiting for its place can be stopped,
        and what it raises ends the question."""
        try:
            while True:
                try:
                    item = self._events.get(timeout=every_s if check is not None else None)
                except queue.Empty:
                    check()
                    continue
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:  # the asker stopped listening: the question stops too
            self.cancel()


@dataclass(eq=False)  # compared by identity: its fields hold tensors
class _Submitted:
    documents: Documents
    question: object
    params: AnswerParams
    chunk_priors: Sequence[Sequence[float]] | None
    interrupt_check: Callable[[], None] | None
    handle: QuestionHandle
    submitted_at: float = field(default_factory=time.perf_counter)


@dataclass(eq=False)
class _Active:
    submitted: _Submitted
    prepared: PreparedAnswer
    loop: object  # the PreparedAnswer.steps generator
    request: LogitsRequest | BlockDone | None = None  # what its loop waits for


@dataclass(eq=False)
class _Chosen:
    """A newcomer with its chunks chosen, its context not built yet."""

    submitted: _Submitted
    documents: Sequence[DocumentKV]
    params: AnswerParams  # the layout the scheduler gives it (see `_layout_for`)
    chunks: ChosenChunks


class AnswerScheduler:
    """Runs submitted questions, batching their decode steps (see the module's docstring).

    `max_batch`: questions decoded at once (more wait, prepared as others leave);
    `max_waiting`: questions that may wait beyond the batch's free places (waiting: submitted, not
    yet prepared), past which `submit` raises QueueFull;
    `max_prepare`: newcomers prepared between two steps, and questions whose documents are loaded
    (or loading) ahead of their preparation. More at once score in fewer, larger passes (one
    reading of the weights for all), and fill the batch sooner: with one a step, an answer of S
    steps caps the batch near S. Fewer keep the pause the decoding questions see between two steps
    short.
    `gather`: while questions are decoding, newcomers wait to be prepared together, as long as
    `gathered_enough` says (False: each step prepares whoever has arrived).
    """

    def __init__(self, runner: Runner, tokenizer, max_batch: int = 16, max_waiting: int = 64,
                 max_prepare: int = 8, gather: bool = True) -> None:
        if max_batch < 1 or max_waiting < 0 or max_prepare < 1:
            raise ValueError("max_batch and max_prepare must be >= 1 and max_waiting >= 0")
        self.runner, self.tokenizer = runner, tokenizer
        self.max_batch, self.max_waiting, self.max_prepare = max_batch, max_waiting, max_prepare
        self.gather = gather
        # Host seconds: on a GPU the question pass may still be running when a preparation returns,
        # so the expected stall is a little under the real one (the rule then gathers a little less).
        self._draft_times, self._preparation_times = RecentSeconds(), RecentSeconds()
        self.turns = FairTurns()
        self.batch_sizes: collections.Counter[int] = collections.Counter()  # forwards run at each row count
        self.prepared_together: collections.Counter[int] = collections.Counter()  # preparations by newcomers
        self._waiting: collections.deque[_Submitted] = collections.deque()
        # Taken off the queue and drafted, waiting for their scoring and context (up to max_prepare a step).
        self._admitting: list[tuple[_Submitted, DraftedQuestion]] = []
        self._preparing: list[tuple[_Submitted, DraftedQuestion]] = []  # taken from `_admitting` this step
        self._pending = 0  # submitted and not yet prepared: those in `_waiting` and those being admitted
        # Taken off the queue: loads not started yet (at most max_prepare run or wait to be prepared).
        self._to_load: collections.deque[_Submitted] = collections.deque()
        self._loads: dict[_Submitted, concurrent.futures.Future] = {}  # started, not yet prepared
        self._loader = concurrent.futures.ThreadPoolExecutor(LOADER_THREADS, thread_name_prefix="answer-loader")
        # Host-to-device copies of loaded documents run on their own stream, beside the steps.
        self._copy_stream = torch.cuda.Stream(runner.device) if runner.device.type == "cuda" else None
        self._active: list[_Active] = []
        self._batches: dict[int, StaticBatch] = {}  # by block length
        self._wake = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="answer-scheduler", daemon=True)
        self._thread.start()

    # ---- the askers' side ------------------------------------------------------------------------

    def submit(self, documents: Documents, question, params: AnswerParams | None = None,
               chunk_priors: Sequence[Sequence[float]] | None = None,
               interrupt_check: Callable[[], None] | None = None) -> QuestionHandle:
        """Queues a question (arguments as `engine.method.answer.stream_answer`); its events come
        from the returned handle. `interrupt_check` runs on the scheduler's thread before each of
        the question's phases and steps; what it raises ends the question with that error."""
        handle = QuestionHandle(_wake_scheduler=self._notify)
        with self._wake:
            if self._closed:
                raise SchedulerStopped("the question scheduler has stopped")
            free_slots = max(0, self.max_batch - len(self._active))
            if self._pending >= self.max_waiting + free_slots:
                raise QueueFull(f"{self._pending} questions are waiting")
            self._pending += 1
            self._waiting.append(_Submitted(documents, question, params or AnswerParams(), chunk_priors,
                                            interrupt_check, handle))
            self._wake.notify()
        return handle

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """Holds the model between two steps, for other model work (a prefill batch)."""
        with self.turns.turn():
            yield

    def load(self) -> tuple[int, int]:
        """(questions being decoded, questions waiting)."""
        with self._wake:
            return len(self._active), len(self._waiting)

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(timeout=30)
        self._loader.shutdown(wait=False, cancel_futures=True)

    # ---- the scheduler's thread ------------------------------------------------------------------

    def _run(self) -> None:
        try:
            with torch.inference_mode():  # thread-local: the askers' mode does not reach this thread
                self._serve()
        except BaseException as exc:  # noqa: BLE001 - a bug here must not leave askers waiting forever
            logger.exception("the answer scheduler stopped")
            stopped = SchedulerStopped(f"the question scheduler stopped on an error ({exc})")
            with self._wake:
                self._closed = True
            self._loader.shutdown(wait=False, cancel_futures=True)
            # (A question already answered ignores the extra event: its asker stopped at _DONE.)
            taken = [submitted for submitted, _ in self._admitting + self._preparing]
            taken += [s for s in list(self._to_load) + list(self._loads)
                      if not any(s is t for t in taken + list(self._waiting))]
            for submitted in [a.submitted for a in self._active] + list(self._waiting) + taken:
                submitted.handle._events.put(stopped)
            raise

    def _serve(self) -> None:
        while True:
            self._start_loads()  # (not under `_wake`: a load's done-callback takes it)
            with self._wake:
                while not self._closed and not self._has_work():
                    self._wake.wait()
                if self._closed:
                    break
                for submitted in [w for w in self._waiting if w.handle._cancelled.is_set()]:
                    self._waiting.remove(submitted)  # its asker left while it waited: it never runs
                    self._pending -= 1
                    load = self._loads.pop(submitted, None)  # (one started while it was held)
                    if load is not None:
                        load.cancel()
                    submitted.handle._events.put(_DONE)
                newcomers = self._take_waiting(self.max_batch) if self._gathered() else []
            while newcomers:
                self._start_loads(held=False)
                self._draft(newcomers)
                # Those who arrived during the draft are drafted too before the preparation, so a
                # burst is prepared in one set of shared passes, not split at its first arrivals.
                with self._wake:
                    newcomers = self._take_waiting(self.max_prepare)
            # Newcomers are prepared between two steps of the questions decoding, at most
            # max_prepare at a time, so that a burst of arrivals does not stall them for all of it.
            with self._wake:
                self._preparing = self._loaded_admitting()
            if self._preparing:
                self._admitting = [a for a in self._admitting if not any(a is p for p in self._preparing)]
                self._prepare(self._preparing)
                self._preparing = []
                self._start_loads()
            if self._active:
                with self.turns.turn():
                    self._step()
        for active in list(self._active):
            self._end(active, SchedulerStopped("the server is stopping"))
        for submitted in list(self._waiting) + [s for s, _ in self._admitting]:
            submitted.handle._events.put(SchedulerStopped("the server is stopping"))
        self._loader.shutdown(wait=False, cancel_futures=True)

    def _held_places(self) -> int:
        """How many waiting questions the next gathering takes off the queue (the caller holds `_wake`)."""
        return min(self.max_batch - len(self._active), self.max_prepare) - len(self._admitting)

    def _gathered(self) -> bool:
        """Whether the waiting newcomers are taken off the queue now (the caller holds `_wake`):
        see `gathered_enough`."""
        if not self.gather or not self._active or not self._waiting:
            return True  # (nobody waiting: nothing is taken, and no estimate is worth making each step)
        places = self._held_places()
        waiting = list(itertools.islice(self._waiting, max(0, places)))
        now, count = time.perf_counter(), len(waiting)
        expected = self._draft_times.expected(count) + self._preparation_times.expected(count)
        return gathered_enough([now - w.submitted_at for w in waiting], len(self._active), expected, places)

    def _has_work(self) -> bool:
        """Whether the thread has something to do (the caller holds `_wake`): questions to take off
        the queue, to step, or to prepare (`_loaded_admitting`)."""
        room = self.max_batch - len(self._active) - len(self._admitting)
        left = any(w.handle._cancelled.is_set() for w in self._waiting)  # to drop: its place is free
        return bool((self._waiting and room > 0) or left or self._active or self._loaded_admitting())

    def _loaded_admitting(self) -> list[tuple[_Submitted, DraftedQuestion]]:
        """The drafted questions to prepare now: those whose documents are loaded, in order, up to
        max_prepare. With no question decoding, the first max_prepare's loads are all waited for,
        so a burst is prepared together rather than in the order its loads finish. One its asker
        left is ready at once (its preparation ends it), whatever its load."""
        head = self._admitting[:self.max_prepare]
        loaded = [a for a in head if a[0].handle._cancelled.is_set()
                  or (a[0] in self._loads and self._loads[a[0]].done())]
        return loaded if self._active or len(loaded) == len(head) else []

    def _start_loads(self, held: bool = True) -> None:
        """Starts loading the documents of questions taken off the queue, in order, then (`held`)
        of those held on it that the next gathering takes (`_held_places`), while fewer than
        max_prepare are loading or loaded and not yet prepared. A held question's load overlaps its
        wait, so a document in host memory is on the device by the time the question is taken.
        (Not `held` while questions just taken are being drafted: not yet in `_admitting`, they
        would be counted as free places.)"""
        waiting = []
        if held:
            with self._wake:  # (askers append to the queue)
                waiting = [w for w in itertools.islice(self._waiting, max(0, self._held_places()))
                           if w not in self._loads and not w.handle._cancelled.is_set()]
        for submitted in [*self._to_load, *waiting]:
            if len(self._loads) >= self.max_prepare or self._closed:
                return
            try:
                future = self._loader.submit(self._load, submitted)
            except RuntimeError:  # the loaders were shut down: the server is stopping
                return
            if self._to_load and self._to_load[0] is submitted:
                self._to_load.popleft()
            self._loads[submitted] = future
            future.add_done_callback(lambda _: self._notify())

    def _notify(self) -> None:
        with self._wake:
            self._wake.notify()

    def _load(self, submitted: _Submitted) -> list[DocumentKV]:
        """On a loader thread: the question's documents, on the runner's device. Its GPU work (KV in
        host memory copied over, a pooled document cut to its candidates) runs on the copy stream,
        ordered after what the steps' stream was given so far (a prefill writing what it reads);
        this thread waits for it, the scheduler's goes on stepping."""
        device = self.runner.device
        steps_stream = torch.cuda.default_stream(device) if self._copy_stream is not None else None
        with torch.inference_mode():
            if submitted.handle._cancelled.is_set():
                return []  # its asker left: nothing loaded (its preparation ends it)
            on_copy_stream = contextlib.nullcontext()
            if steps_stream is not None:
                self._copy_stream.wait_stream(steps_stream)
                on_copy_stream = torch.cuda.stream(self._copy_stream)
            with on_copy_stream:
                docs = submitted.documents() if callable(submitted.documents) else submitted.documents
                # (asynchronous only to the GPU: a copy to the host must be whole when returned)
                docs = [d if d.device == device else d.to(device, non_blocking=steps_stream is not None)
                        for d in docs]
            if steps_stream is None:
                return docs
            self._copy_stream.synchronize()
            # Made on the copy stream, read on the steps': a tensor freed there must not be handed
            # back to the copy stream before the steps that read it are done.
            for d in docs:
                d.keys.record_stream(steps_stream)
                d.values.record_stream(steps_stream)
            return docs

    def _take_waiting(self, admitted: int) -> list[_Submitted]:
        """Takes waiting questions off the queue (the caller holds `_wake`) while the batch has
        room and fewer than `admitted` are being admitted."""
        room = min(self.max_batch - len(self._active), admitted) - len(self._admitting)
        taken = [self._waiting.popleft() for _ in range(max(0, min(room, len(self._waiting))))]
        self._to_load.extend(t for t in taken if t not in self._loads)  # (not one loaded while held)
        return taken

    def _draft(self, newcomers: list[_Submitted]) -> None:
        """The newcomers' prompts, and their drafts in one batched pass; each joins `_admitting`
        (a question whose prompt fails, e.g. an empty one, ends there with its error)."""
        prompts = self._each_still_asked(
            newcomers, lambda s: question_prompt(self.runner, self.tokenizer, s.question, s.params))
        if not prompts:
            return
        try:
            with self.turns.turn():
                start = time.perf_counter()
                drafts = draft_answers(self.runner, [p for _, p in prompts], [s.params for s, _ in prompts])
                seconds = time.perf_counter() - start
            self._draft_times.record(len(prompts), seconds)
        except BaseException as exc:  # noqa: BLE001 - a failed pass fails the questions it drafted
            for submitted, _ in prompts:
                self._fail(submitted, exc)
            with self._wake:
                self._pending -= len(prompts)
            return
        self._admitting += [(submitted, DraftedQuestion(prompt, draft, seconds))
                            for (submitted, prompt), draft in zip(prompts, drafts, strict=True)]

    def _each_still_asked(self, questions: list[_Submitted], work: Callable[[_Submitted], T]
                          ) -> list[tuple[_Submitted, T]]:
        """(question, work(question)) for each question its asker still waits for; one whose check
        or work raises ends there with that error, no longer pending."""
        kept = []
        for submitted in questions:
            try:
                self._check(submitted)
                kept.append((submitted, work(submitted)))
            except BaseException as exc:  # noqa: BLE001 - the question's error goes to its asker
                self._fail(submitted, exc)
                with self._wake:
                    self._pending -= 1
        return kept

    def _check(self, submitted: _Submitted) -> None:
        if submitted.handle._cancelled.is_set():
            raise _Cancelled()
        if submitted.interrupt_check is not None:
            submitted.interrupt_check()

    def _prepare(self, newcomers: list[tuple[_Submitted, DraftedQuestion]]) -> None:
        """Prepares the newcomers together over the documents their loads returned; each joins the
        batch (or ends with its error, a failed load's included)."""
        drafted = dict(newcomers)  # by identity: a _Submitted compares as itself
        loaded = [(submitted, drafted[submitted], documents) for submitted, documents in self._each_still_asked(
            list(drafted), lambda s: self._loads.pop(s).result())]
        if not loaded:
            return
        self.prepared_together[len(loaded)] += 1
        try:
            with self.turns.turn():
                start = time.perf_counter()
                self._prepare_loaded(loaded)
                self._preparation_times.record(len(loaded), time.perf_counter() - start)
        finally:
            with self._wake:
                self._pending -= len(loaded)

    def _prepare_loaded(self, loaded: list[tuple[_Submitted, DraftedQuestion, Sequence[DocumentKV]]]) -> None:
        """Scores the newcomers' chunks and builds their contexts in shared passes, selects each
        one's chunks and starts it. A shared pass that fails (say, out of memory) is not anyone's
        error: each question then scores or builds its own, and any error is its own."""
        try:
            scores = self._score_together(loaded)
        except BaseException as exc:  # noqa: BLE001 - each question scores alone instead
            self._shared_pass_failed("scoring", exc)
            scores = [None] * len(loaded)
        chosen: list[_Chosen] = []
        for (submitted, question, documents), scored in zip(loaded, scores, strict=True):
            try:
                self._check(submitted)
                params = self._layout_for(submitted.params, documents, len(loaded))
                picked = choose_chunks(self.runner, self.tokenizer, documents, question, params,
                                       lambda s=submitted: self._check(s), submitted.chunk_priors, scored)
                chosen.append(_Chosen(submitted, documents, params, picked))
            except BaseException as exc:  # noqa: BLE001 - the question's error goes to its asker
                self._fail(submitted, exc)
        built: list[BuiltContext | None] = [None] * len(chosen)
        if len(chosen) > 1:
            try:
                built = static_contexts(self.runner, [(c.documents, c.chunks, c.params) for c in chosen])
            except BaseException as exc:  # noqa: BLE001 - each question builds its own instead
                self._shared_pass_failed("question pass", exc)
        for c, context in zip(chosen, built, strict=True):
            try:
                self._start(c.submitted, start_answer(self.runner, c.documents, c.chunks, c.params, context))
            except BaseException as exc:  # noqa: BLE001 - the question's error goes to its asker
                self._fail(c.submitted, exc)

    def _shared_pass_failed(self, what: str, error: BaseException) -> None:
        logger.warning("a shared %s failed (%s); its questions run their own", what, error)
        if isinstance(error, torch.OutOfMemoryError):  # what the kept passes hold may be what it lacked
            self.runner.forget()

    def _score_together(self, loaded: list[tuple[_Submitted, DraftedQuestion, Sequence[DocumentKV]]]
                        ) -> list[ChunkScores | None]:
        """Each newcomer's chunk scores from passes shared by all of them, where two or more score
        chunks (None: the question scores its own, in `choose_chunks`)."""
        scoring = [i for i, (s, _, _) in enumerate(loaded) if s.params.kv_mode in CACHED_KV_MODES]
        scores: list[ChunkScores | None] = [None] * len(loaded)
        if len(scoring) < 2:
            return scores
        questions = [(loaded[i][2], question_scoring_rows(self.runner, loaded[i][1].prompt, loaded[i][1].draft,
                                                          loaded[i][0].params), loaded[i][0].params.scoring)
                     for i in scoring]
        checks = [lambda s=loaded[i][0]: self._check(s) for i in scoring]
        for i, scored in zip(scoring, score_questions(self.runner, questions, checks), strict=True):
            scores[i] = scored  # None if its asker stopped it: its own check then ends it
        return scores

    def _layout_for(self, params: AnswerParams, documents: Sequence[DocumentKV], together: int) -> AnswerParams:
        """`params`, contiguous where the paged layout would decode beside other questions: it steps
        alone (one set of page buffers, no batching), so beside any other question it would cost a
        forward of its own every step. `together`: the newcomers prepared now, this one included."""
        company = bool(self._active) or bool(self._admitting) or together > 1
        if company and params.static_layout != "contiguous" and params.kv_mode == "static" \
                and uses_paged_layout(self.runner, documents, params):
            return dataclasses.replace(params, static_layout="contiguous")
        return params

    def _start(self, submitted: _Submitted, prepared: PreparedAnswer) -> None:
        """The prepared question joins the questions being decoded."""
        self._active.append(_Active(submitted, prepared, prepared.steps(self.runner, self.tokenizer)))

    def _advance(self, active: _Active, reply: torch.Tensor | DecidedStep | BlockRefreshed | BaseException | None
                 ) -> bool:
        """Runs the question's loop to its next LogitsRequest (or BlockDone the batch refreshes),
        posting its other events (steps, the joint answer); False once done. An error as the reply
        is thrown into the loop: it ends the question there, or only its lone readings
        (`PreparedAnswer.steps`)."""
        while True:
            try:
                item = active.loop.throw(reply) if isinstance(reply, BaseException) else active.loop.send(reply)
            except StopIteration as done:
                self._end(active, None, done.value)
                return False
            reply = None
            if isinstance(item, LogitsRequest) or (isinstance(item, BlockDone) and StaticBatch.refreshes(item.decoder)):
                active.request = item
                return True
            if not isinstance(item, BlockDone):  # (a BlockDone not batched: the loop refreshes itself)
                active.submitted.handle._events.put(item)

    def _step(self) -> None:
        ready: list[_Active] = []
        for active in list(self._active):
            try:
                self._check(active.submitted)
                if active.request is None and not self._advance(active, None):
                    continue
                ready.append(active)
            except BaseException as exc:  # noqa: BLE001
                self._end(active, exc)
        if not ready:
            for batch in self._batches.values():
                batch.clear()
            self._batches.clear()
            return
        # Static decoders step together, one batch per block length (a batch of one too: its
        # forward is the captured one); any other decoder alone.
        by_block: dict[int, list[_Active]] = collections.defaultdict(list)
        alone = []
        for a in ready:
            if StaticBatch.accepts(a.request.decoder):
                by_block[a.request.decoder.block_length].append(a)
            else:
                alone.append(a)
        for block_length in [b for b in self._batches if b not in by_block]:
            self._batches.pop(block_length).clear()  # no question of it left: let go of their contexts
        for group in by_block.values():
            self.batch_sizes[len(group)] += 1
        if alone:
            self.batch_sizes[1] += len(alone)
        replies: list[tuple[_Active, torch.Tensor | DecidedStep | BlockRefreshed | BaseException | None]] = []
        for block_length, group in by_block.items():
            batch = self._batches.setdefault(block_length, StaticBatch(self.runner))
            try:
                replies += list(zip(group, batch.step([a.request for a in group]), strict=True))
            except BaseException as exc:  # noqa: BLE001 - a failed batch fails its questions
                batch.clear()
                replies += [(a, exc) for a in group]
        for a in alone:
            try:
                r = a.request
                if isinstance(r, BlockDone):  # (batched only; here it would be left to its loop)
                    replies.append((a, None))
                else:
                    replies.append((a, r.decoder.slot_logits(r.block, r.answer, r.slots)))
            except BaseException as exc:  # noqa: BLE001
                replies.append((a, exc))
        for active, reply in replies:
            active.request = None
            try:
                self._advance(active, reply)
            except BaseException as exc:  # noqa: BLE001
                self._end(active, exc)

    def _end(self, active: _Active, error: BaseException | None, result: AnswerResult | None = None) -> None:
        if active in self._active:
            self._active.remove(active)
        if error is not None:  # the asker hears first: a cleanup that fails must not leave it waiting
            self._fail(active.submitted, error)
        else:
            active.submitted.handle._events.put(result)
            active.submitted.handle._events.put(_DONE)
        try:
            active.loop.close()
            if active.prepared.paged:
                release_pages(self.runner)
        except Exception:  # noqa: BLE001 - logged; the other questions go on
            logger.exception("cleaning up after a question failed")

    def _fail(self, submitted: _Submitted, error: BaseException) -> None:
        load = self._loads.pop(submitted, None)
        if load is not None:
            load.cancel()  # one still running is dropped when it ends
        if submitted in self._to_load:
            self._to_load.remove(submitted)
        if isinstance(error, _Cancelled):
            submitted.handle._events.put(_DONE)
            return
        if isinstance(error, torch.OutOfMemoryError):  # what the kept passes hold may be what it lacked
            self.runner.forget()
        submitted.handle._events.put(error)


class _Cancelled(Exception):
    """The asker cancelled the question (its handle); it ends with no result and no error."""
