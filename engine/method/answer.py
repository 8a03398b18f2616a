"""Answering a question over prefilled documents: draft, score, select, place, decode.

`stream_answer` yields `DecodeStep`s while the answer is denoised, then one `AnswerResult` whose
trace says what was chosen and why (scores, kept tokens, BOS anchor attention, timings). Its
phases are public functions of `(runner, documents, params)`, for profiling and tests:
`draft_answer`, `score_chunks`, `select_chunks`, `gather_selected`, `answer_decoder`.
`prepare_answer` (everything before the decode steps) is `choose_chunks` then `start_answer`; the
scheduler runs several questions' phases together in between (`draft_answers`, `score_questions`,
`static_contexts`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from engine.decode.baselines import DenseDecoder, FastDLLMDecoder
from engine.decode.loop import (
    BlockDone,
    BlockRefreshed,
    DecidedStep,
    DecodeStep,
    LogitsRequest,
    decode_blocks,
    drive_alone,
)
from engine.decode.paged import PagedStaticDecoder, paged_decoder, release_pages
from engine.decode.sampling import SamplingParams
from engine.decode.static import (
    FixedContext,
    QuestionContextRequest,
    SelectedChunks,
    StaticDecoder,
    batch_rows,
    build_joint_context,
    build_static_context,
    build_static_contexts,
)
from engine.method.chunk_scorer import (
    DocumentScores,
    Draft,
    ScoringJob,
    ScoringParams,
    ScoringRows,
    chunk_relevance,
    kept_draft_pass,
    score_document,
    score_documents_together,
    scoring_rows,
)
from engine.method.kv_cache import POSITION_MODES, DocumentKV, chunk_deltas, gather_kept_tokens, take_chunks
from engine.method.prompting import DEFAULT_INSTRUCTION, QuestionPrompt, build_question_prompt
from engine.method.reading import (
    abstains,
    choose_lone_reading,
    confirmation_settled,
    confirmed_answer,
    first_confirming,
    gathered_values,
    gathers,
    lone_readings_settled,
    with_values,
)
from engine.method.scoring import (
    LIKELIHOOD_SCORERS,
    auto_top_k,
    fuse_scores,
    select_by_coverage,
    select_kept_tokens,
    select_top_chunks,
    select_within_margin,
)
from engine.runner import Runner

logger = logging.getLogger(__name__)

# The modes that read the documents' cached chunk KV (and so score and select chunks), then the
# baselines that run over the whole text with no chunking.
CACHED_KV_MODES = ("static", "joint")
BASELINE_KV_MODES = ("dense", "fastdllm")
KV_MODES = CACHED_KV_MODES + BASELINE_KV_MODES
STATIC_LAYOUTS = ("auto", "paged", "contiguous")


@dataclass(frozen=True)
class AnswerParams:
    top_k: int = 4  # K chunks kept; ignored when auto_k
    auto_k: bool = False  # pick K at the largest score drop, within [1, max_auto_k]
    max_auto_k: int = 8
    # Leave out selected chunks scoring more than this below the best (None: no margin rule; with
    # coverage_gain None too, all K are kept); see engine.method.scoring.select_within_margin.
    score_margin: float | None = None
    # Keep only chunks that add to what the kept ones explain of the question, by more than this
    # (nats a target token; None: off), or that score within score_margin of the best; see
    # engine.method.scoring.select_by_coverage. Likelihood scorers only.
    coverage_gain: float | None = None
    token_budget: int = 0  # B tokens kept per chunk, layer and KV head; 0 keeps all
    # Nats a chunk's prior relevance in [0, 1] (`chunk_priors` of stream_answer) is worth when it is
    # added to its score before selection (engine.method.scoring.fuse_scores); 0: the scorer alone.
    prior_weight: float = 0.0
    pool_kernel: int = 7
    kv_mode: str = "static"
    position_mode: str = "continuous"
    scoring: ScoringParams = field(default_factory=ScoringParams)
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(gen_length=32, block_length=32))
    reselect_every: int = 0  # re-score and re-select after every this many finished blocks (0: never)
    instruction: str = DEFAULT_INSTRUCTION
    use_chat_template: bool = True
    # How static decoding reads its context: "paged" = split-KV over the document's chunk pages with
    # the answer's KV written in place (CUDA graphs on CUDA); "contiguous" = the selected KV gathered
    # and concatenated (the reference route); "auto" = paged wherever it runs natively (CUDA with
    # Triton, one document already on the GPU, no re-selection), else contiguous.
    static_layout: str = "auto"
    # Also read each selected chunk alone (static mode without re-selection, when more than one is
    # selected: `reads_chunks_alone`) and answer with the one lone reading that does not abstain,
    # where there is exactly one (engine.method.reading): for small extractive readers, which read
    # one passage better than several. `abstain_answer` is what the model answers when its passages
    # lack the fact ("not found" for the bundled model).
    read_chunks_alone: bool = False
    abstain_answer: str | None = None
    # With read_chunks_alone: give the joint answer only where a chunk read alone confirms it
    # (engine.method.reading.confirmed), else the abstain answer; the lone readings then stop at the
    # first that confirms. For a reader that makes up answers where its passages lack the fact.
    confirm_with_lone_reading: bool = False

    def __post_init__(self) -> None:
        if self.kv_mode not in KV_MODES:
            raise ValueError(f"unknown kv_mode {self.kv_mode!r}; choose from {', '.join(KV_MODES)}")
        if self.position_mode not in POSITION_MODES:
            raise ValueError(f"unknown position_mode {self.position_mode!r}; choose from {', '.join(POSITION_MODES)}")
        if self.top_k < 1 and not self.auto_k:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.token_budget < 0 or self.token_budget == 1:
            raise ValueError("token_budget must be 0 (keep all) or >= 2 (BOS + at least one token)")
        if self.reselect_every < 0:
            raise ValueError("reselect_every must be >= 0")
        if not self.prior_weight >= 0:
            raise ValueError(f"prior_weight must be >= 0, got {self.prior_weight}")
        if self.score_margin is not None and not self.score_margin > 0:
            raise ValueError(f"score_margin must be > 0 or None, got {self.score_margin}")
        if self.coverage_gain is not None:
            if not self.coverage_gain > 0:
                raise ValueError(f"coverage_gain must be > 0 or None, got {self.coverage_gain}")
            if self.scoring.scorer not in LIKELIHOOD_SCORERS:
                raise ValueError(f"coverage_gain needs a likelihood scorer ({', '.join(LIKELIHOOD_SCORERS)}), "
                                 f"not {self.scoring.scorer!r}")
        if self.static_layout not in STATIC_LAYOUTS:
            raise ValueError(f"unknown static_layout {self.static_layout!r}; choose from {', '.join(STATIC_LAYOUTS)}")
        if self.read_chunks_alone and not self.abstain_answer:
            raise ValueError("read_chunks_alone needs the model's abstain_answer (what it says when a passage "
                             "lacks the fact)")
        if self.confirm_with_lone_reading and not self.read_chunks_alone:
            raise ValueError("confirm_with_lone_reading needs read_chunks_alone (the readings that confirm)")

    @property
    def reads_chunks_alone(self) -> bool:
        """Whether a question that selects more than one chunk also reads each alone: asked for,
        and in static mode without re-selection (the chunks read are then the answer's)."""
        return self.read_chunks_alone and self.kv_mode == "static" and self.reselect_every == 0


@dataclass(frozen=True)
class ChunkRef:
    document: int  # index into the documents passed to `answer`
    chunk: int  # chunk index within that document


@dataclass
class AnswerTrace:
    candidates: list[ChunkRef]
    scores: list[float]  # per candidate, the scorer's: higher = more relevant
    selected: list[ChunkRef]  # placement (document) order
    selected_scores: list[float]  # the scorer's, per selected chunk
    kept_tokens: list[list[int]]  # per selected chunk and token: how many (layer, head) pairs keep it
    anchors_scoring: torch.Tensor  # [N, L] attention mass on each candidate's BOS while scoring
    anchors_decode: torch.Tensor | None  # [K, L] query attention mass on each selected chunk's BOS
    draft_ids: list[int]  # committed pseudo-label tokens
    timings: dict[str, float]  # seconds per phase
    steps: int = 0
    forward_passes: int = 0
    reselections: list[list[ChunkRef]] = field(default_factory=list)
    # Per candidate, the prior relevance fused into selection (empty without chunk_priors):
    # selection ranked scores + prior_weight x priors.
    priors: list[float] = field(default_factory=list)
    # Per selected chunk, that fused score: what the selection ranked it by, so the order to cite
    # the chunks in (empty: the scorer's own scores are the ranking).
    selected_fused_scores: list[float] = field(default_factory=list)
    static_layout: str = "contiguous"  # how static decoding read its context (see AnswerParams)
    # With AnswerParams.reads_chunks_alone: the selected chunks' answers read alone, in selected
    # order, up to the second that does not abstain (the rest cannot change the choice), or with
    # confirm_with_lone_reading up to the first that confirms the joint answer; and the index of
    # the one answered with (that confirmed it), or None where the joint reading stands.
    lone_answers: list[str] = field(default_factory=list)
    answered_from: int | None = None
    lone_failed: bool = False  # the lone readings failed (an error, logged): the joint answer stands unchecked
    # With AnswerParams.confirm_with_lone_reading: the joint answer that no lone reading confirmed,
    # given as the abstain answer instead (None: confirmed, abstained, or not checked).
    unconfirmed: str | None = None
    # With confirm_with_lone_reading, a confirmed list answer: the lone readings (indices into
    # lone_answers) whose values it was completed with (engine.method.reading.gathered_values).
    gathered_from: list[int] = field(default_factory=list)


@dataclass
class AnswerResult:
    text: str
    answer_ids: list[int]
    trace: AnswerTrace
    stopped_early: bool = False


@dataclass(frozen=True)
class ReadsAlone:
    """First event of a question that will read its chunks alone (AnswerParams.reads_chunks_alone,
    more than one chunk selected): the answer its DecodeSteps build may still be replaced whole."""


@dataclass(frozen=True)
class JointAnswer:
    """A question's answer over all its selected chunks, settled; each chunk is read alone next
    (AnswerParams.reads_chunks_alone), which may replace it. Whoever waits on the question can give
    this answer where the lone readings do not finish (a time budget)."""

    result: AnswerResult


@dataclass
class ChunkScores:
    """Every candidate chunk's score, in `chunk_pool` order."""

    scores: torch.Tensor  # [N] fp32, higher = more relevant
    anchors: torch.Tensor  # [N, L] fp32: attention mass on each chunk's BOS while scoring
    token_scores: torch.Tensor | None  # [N, T] fp32 per scored target token (likelihood scorers), else None
    seconds: float = 0.0  # a pass shared with other questions: its time (the trace reports it as this one's)


class _Clock:
    def __init__(self, device: torch.device) -> None:
        self.device, self.timings = device, {}

    def lap(self, phase: str, start: float) -> float:
        if self.device.type == "cuda":  # this thread's stream: not the scheduler's loads beside it
            torch.cuda.current_stream(self.device).synchronize()
        now = time.perf_counter()
        self.timings[phase] = self.timings.get(phase, 0.0) + now - start
        return now


def chunk_pool(documents: Sequence[DocumentKV]) -> list[ChunkRef]:
    """Every chunk of the documents, in order: what scores and selections index."""
    return [ChunkRef(d, c) for d, doc in enumerate(documents) for c in range(doc.num_chunks)]


def _ordinals(documents: Sequence[DocumentKV], refs: Sequence[ChunkRef]) -> list[int]:
    """Each ref's index in `chunk_pool(documents)`."""
    offsets = [0]
    for doc in documents:
        offsets.append(offsets[-1] + doc.num_chunks)
    return [offsets[r.document] + r.chunk for r in refs]


MAX_DRAFT_BATCH = 16  # questions drafted in one batched pass at most


@dataclass(frozen=True)
class DraftedQuestion:
    """A question's prompt and its draft (None when its scorer reads none), drafted beforehand:
    the scheduler drafts the questions it admits together (`draft_answers`)."""

    prompt: QuestionPrompt
    draft: Draft | None
    seconds: float = 0.0  # the batched draft pass's time (the trace reports it as the question's draft)


def question_prompt(runner: Runner, tokenizer, question: str | QuestionPrompt, params: AnswerParams) -> QuestionPrompt:
    """The question's token layout (a QuestionPrompt is taken as it is)."""
    if isinstance(question, QuestionPrompt):
        return question
    return build_question_prompt(tokenizer, question, runner.cfg.bos_token_id, params.instruction,
                                 params.use_chat_template)


def draft_answer(runner: Runner, prompt: QuestionPrompt, params: AnswerParams) -> Draft | None:
    """The draft's pseudo-labels when the scorer reads them, else None (one kept pass per padded
    prompt length: a captured graph on CUDA)."""
    return draft_answers(runner, [prompt], [params])[0]


def draft_answers(runner: Runner, prompts: Sequence[QuestionPrompt], params: Sequence[AnswerParams]
                  ) -> list[Draft | None]:
    """`draft_answer` of several questions: those of one draft shape in one batched pass (up to
    MAX_DRAFT_BATCH a pass; rows padded to a power of two, so few batch sizes are captured)."""
    drafts: list[Draft | None] = [None] * len(prompts)
    groups: dict[tuple[int, int], list[int]] = {}
    for i, p in enumerate(params):
        if p.scoring.scorer == "draft_self_information" and p.kv_mode not in BASELINE_KV_MODES:
            groups.setdefault((p.scoring.draft_slots, p.scoring.draft_rounds), []).append(i)
    for (slots, rounds), members in groups.items():
        for lo in range(0, len(members), MAX_DRAFT_BATCH):
            part = members[lo:lo + MAX_DRAFT_BATCH]
            ids = [prompts[i].prefix_ids + prompts[i].query_ids for i in part]
            drafted = kept_draft_pass(runner, max(map(len, ids)), slots, rounds, batch_rows(len(part)))(ids)
            for i, draft in zip(part, drafted, strict=True):
                drafts[i] = draft
    return drafts


def question_scoring_rows(runner: Runner, prompt: QuestionPrompt, draft: Draft | None,
                          params: AnswerParams) -> ScoringRows:
    """The rows the question scores every chunk with (its query, and its draft's tokens)."""
    return scoring_rows(prompt.query_ids, prompt.question_span, draft, params.scoring.window,
                        runner.cfg.logits_shifted)


def score_chunks(runner: Runner, documents: Sequence[DocumentKV], rows: ScoringRows, params: ScoringParams,
                 interrupt_check: Callable[[], None] | None = None) -> ChunkScores:
    """Scores every chunk of every document (the runner keeps the passes across questions)."""
    return _joined(runner, [score_document(runner, doc, rows, params, interrupt_check) for doc in documents])


def score_questions(runner: Runner, questions: Sequence[tuple[Sequence[DocumentKV], ScoringRows, ScoringParams]],
                    interrupt_checks: Sequence[Callable[[], None] | None] | None = None) -> list[ChunkScores | None]:
    """`score_chunks` of several questions (documents, rows, params each), all their chunks in
    shared batched passes (`score_documents_together`); a question alone takes `score_chunks`'
    kept passes (captured graphs for the documents that stay resident). A question whose
    interrupt check raises before one of its shared passes leaves the rest and gets None (alone,
    the check's error is raised)."""
    checks = list(interrupt_checks or [None] * len(questions))
    start = time.perf_counter()
    if len(questions) == 1:
        scored: list[ChunkScores | None] = [score_chunks(runner, *questions[0], checks[0])]
    else:
        jobs = [ScoringJob(doc, rows, params, check)
                for (documents, rows, params), check in zip(questions, checks, strict=True) for doc in documents]
        per_job = iter(score_documents_together(runner, jobs))
        scored = []
        for documents, _, _ in questions:
            per_doc = [next(per_job) for _ in documents]
            scored.append(None if any(d is None for d in per_doc) else _joined(runner, per_doc))
    if runner.device.type == "cuda":
        torch.cuda.current_stream(runner.device).synchronize()
    seconds = time.perf_counter() - start
    return [None if s is None else dataclasses.replace(s, seconds=seconds) for s in scored]


def _joined(runner: Runner, per_doc: list[DocumentScores]) -> ChunkScores:
    """The documents' scores as one ChunkScores, in `chunk_pool` order."""
    if not per_doc:
        return ChunkScores(torch.zeros(0), torch.zeros(0, runner.cfg.num_layers), None)
    by_token = [s.token_scores for s in per_doc]
    return ChunkScores(scores=torch.cat([s.scores for s in per_doc]), anchors=torch.cat([s.anchors for s in per_doc]),
                       token_scores=torch.cat(by_token) if all(t is not None for t in by_token) else None)


def select_chunks(scored: ChunkScores, priors: torch.Tensor | None, params: AnswerParams) -> torch.Tensor:
    """Pure: the chosen candidates' indices ([K] long, by fused score). Selection sees the scores
    fused with the priors; the trace keeps the scorer's own (what a weak-score warning reads: a
    prior of 1 on the best BM25 match would hide that no chunk explains the question)."""
    if scored.scores.numel() == 0:
        return torch.zeros(0, dtype=torch.long)
    scores = fuse_scores(scored.scores, priors, params.prior_weight)
    k = auto_top_k(scores, 1, params.max_auto_k) if params.auto_k else params.top_k
    if params.coverage_gain is not None:  # the margin then keeps near-best chunks that add nothing
        return select_by_coverage(scores, scored.token_scores, k, params.coverage_gain, params.score_margin,
                                  margin_scores=scored.scores)
    if params.score_margin is not None:
        return select_within_margin(scores, k, params.score_margin, margin_scores=scored.scores)
    return select_top_chunks(scores, k)


def gather_selected(runner: Runner, documents: Sequence[DocumentKV], refs: list[ChunkRef], rows: ScoringRows,
                    params: AnswerParams, prefix_len: int, stack_kv: bool = True
                    ) -> tuple[SelectedChunks, list[list[int]], int]:
    """The selected chunks ready to place: their KV stacked (unless `stack_kv` is False: the paged
    route reads it in place), token selection applied, their positions. Also returns, per chunk and
    token, how many (layer, KV head) pairs keep it, and where the query starts."""
    cfg = runner.cfg
    keys = values = None
    if stack_kv:
        keys = torch.stack([documents[r.document].keys[:, r.chunk] for r in refs], 1)  # [L, K, Hkv, C, D]
        values = torch.stack([documents[r.document].values[:, r.chunk] for r in refs], 1)
    tokens = torch.stack([documents[r.document].tokens[r.chunk] for r in refs])
    lengths = torch.stack([documents[r.document].lengths[r.chunk] for r in refs])
    c = tokens.shape[1]
    kept = None
    valid = torch.arange(c)[None, :] < lengths[:, None]
    counts = [[cfg.num_layers * cfg.num_kv_heads] * int(n) for n in lengths]
    if params.token_budget > 0 and params.token_budget < c:
        relevance = torch.cat([chunk_relevance(runner, documents[r.document], torch.tensor([r.chunk]), rows)
                               for r in refs])  # [K, L, Hkv, C]
        kept, valid = select_kept_tokens(relevance, lengths, params.token_budget, params.pool_kernel)
        if params.kv_mode == "static" and stack_kv:
            keys, values = gather_kept_tokens(keys, kept), gather_kept_tokens(values, kept)
        counts = []
        for j, n in enumerate(lengths.tolist()):
            hits = torch.zeros(c, dtype=torch.long)
            live = kept[j][..., valid[j]].flatten()
            hits.scatter_add_(0, live, torch.ones_like(live))
            counts.append(hits[:n].tolist())
    total = sum(d.num_chunks for d in documents)
    starts, query_start = chunk_deltas(params.position_mode, prefix_len, c, torch.tensor(_ordinals(documents, refs)),
                                       total)
    chunks = SelectedChunks(keys=keys, values=values, valid=valid, starts=starts, tokens=tokens,
                            lengths=lengths, kept=kept)
    return chunks, counts, query_start


def _dense_prompt(prompt: QuestionPrompt, documents: Sequence[DocumentKV], bos_id: int) -> torch.Tensor:
    """[prefix | BOS + document content, per document | query]: the unchunked baseline prompt."""
    parts = [torch.tensor(prompt.prefix_ids)]
    for doc in documents:
        parts += [torch.tensor([bos_id]), doc.content_ids()]
    parts.append(torch.tensor(prompt.query_ids))
    return torch.cat(parts)


class LoneReading(NamedTuple):
    """One selected chunk's answer read alone."""

    text: str
    ids: list[int]
    chunk_ids: list[int]  # the chunk's own tokens (what a value it adds to a list must be written in)


@dataclass
class LoneReadings:
    """Each selected chunk read alone: the answer decoded over that chunk's static context and the
    question, the chunk placed first as if it were the whole document (in every position mode),
    contiguous layout, the sampler seeded as the joint answer's. Holds a copy of just the selected
    chunks' KV, not their documents, each let go once read."""

    chunks: list[DocumentKV]  # per selected chunk (selected order), a document of that one chunk
    prompt: QuestionPrompt
    rows: ScoringRows
    params: AnswerParams

    @classmethod
    def of(cls, documents: Sequence[DocumentKV], chosen: ChosenChunks, params: AnswerParams) -> LoneReadings:
        return cls([take_chunks(documents[r.document], [r.chunk]) for r in chosen.refs], chosen.prompt,
                   chosen.rows, dataclasses.replace(params, static_layout="contiguous", reselect_every=0))

    def settled(self, joint: str, alone: list[str]) -> bool:
        """Whether the readings so far decide what is answered (the rest need not be read)."""
        if self.params.confirm_with_lone_reading:  # a list reads every chunk: each may add a value
            return not gathers(joint, self.params.abstain_answer) and \
                confirmation_settled(joint, alone, self.params.abstain_answer)
        return lone_readings_settled(alone, self.params.abstain_answer)

    def read(self, runner: Runner, tokenizer, trace: AnswerTrace, joint: str
             ) -> Generator[LogitsRequest | BlockDone, torch.Tensor | DecidedStep | BlockRefreshed | None,
                            list[LoneReading]]:
        """Decodes the chunks alone in selected order, yielding each step's LogitsRequest and each
        BlockDone (the caller answers them, alone or batched), until the readings settle what is
        answered given the `joint` answer (`settled`); returns the readings."""
        readings: list[LoneReading] = []
        while self.chunks and not self.settled(joint, [reading.text for reading in readings]):
            chunk = self.chunks.pop(0)
            scratch = dataclasses.replace(trace, reselections=[])  # answer_decoder fills its kept tokens
            decoder = answer_decoder(runner, [chunk], self.prompt, self.rows, [ChunkRef(0, 0)], self.params, scratch)
            generator = torch.Generator(device=runner.device).manual_seed(self.params.sampling.seed)
            loop = decode_blocks(decoder, runner.cfg, self.params.sampling, generator, runner.device)
            reply = None
            while True:
                try:
                    item = loop.send(reply)
                except StopIteration as done:
                    ids = done.value.answer_ids
                    break
                # Its DecodeSteps are not the answer's: only the requests go out.
                reply = (yield item) if isinstance(item, (LogitsRequest, BlockDone)) else None
            readings.append(LoneReading(tokenizer.decode(ids, skip_special_tokens=True).strip(), ids,
                                        chunk.content_ids().tolist()))
        return readings


@dataclass
class PreparedAnswer:
    """A question with its chunks chosen and its context built, ready for its decode steps."""

    # None once the joint answer is settled (its context is let go before the lone readings)
    decoder: StaticDecoder | PagedStaticDecoder | DenseDecoder | FastDLLMDecoder | None
    sampling: SamplingParams
    generator: torch.Generator  # the sampler's, seeded by `sampling.seed`
    trace: AnswerTrace
    clock: _Clock
    decode_start: float  # perf_counter when decoding starts
    lone: LoneReadings | None = None  # each chunk read alone once the joint answer is settled
    paged: bool = field(init=False)  # its decoder holds the runner's page buffers (to release at its end)

    def __post_init__(self) -> None:
        self.paged = isinstance(self.decoder, PagedStaticDecoder)

    def steps(self, runner: Runner, tokenizer
              ) -> Generator[LogitsRequest | BlockDone | DecodeStep | JointAnswer,
                             torch.Tensor | DecidedStep | BlockRefreshed | None, AnswerResult]:
        """The question's decoding as a loop its driver answers (as `decode_blocks`): where chunks
        are read alone, ReadsAlone first; a LogitsRequest before each step, the DecodeStep after
        it, a BlockDone between two blocks; then, where chunks are read alone, the JointAnswer and
        the lone readings' LogitsRequests and BlockDones. Returns the AnswerResult.

        An error the driver throws in during the lone readings, or one of theirs, ends them: the
        joint answer stands, unchecked (`trace.lone_failed`, logged). Drivers stop the question
        (cancelled, past a budget) from outside."""
        lone = self.lone if tokenizer is not None else None
        if lone is not None:
            yield ReadsAlone()
        outcome = yield from decode_blocks(self.decoder, runner.cfg, self.sampling, self.generator, runner.device)
        if lone is not None:
            self.decoder = None  # the joint context: the lone readings need none of it
        t = self.clock.lap("decode", self.decode_start)
        self.trace.steps, self.trace.forward_passes = outcome.steps, outcome.forward_passes
        text = tokenizer.decode(outcome.answer_ids, skip_special_tokens=True).strip() if tokenizer is not None else ""
        result = AnswerResult(text=text, answer_ids=outcome.answer_ids, trace=self.trace,
                              stopped_early=outcome.stopped_early)
        if lone is None:
            return result
        joint_trace = dataclasses.replace(self.trace, timings=dict(self.trace.timings))  # the asker reads it
        yield JointAnswer(dataclasses.replace(result, trace=joint_trace))
        try:
            readings = yield from lone.read(runner, tokenizer, self.trace, text)
        except Exception as exc:  # noqa: BLE001 - a check that failed leaves the answer it checked
            logger.warning("reading the chosen chunks alone failed; the answer over all of them stands",
                           exc_info=True)
            if isinstance(exc, torch.OutOfMemoryError):  # what the kept passes hold may be what it lacked
                runner.forget()
            self.trace.lone_failed = True
            return result
        finally:
            self.clock.lap("lone_readings", t)
        self.trace.lone_answers = [reading.text for reading in readings]
        abstain = lone.params.abstain_answer
        if lone.params.confirm_with_lone_reading:
            # A confirmed answer is cited from the chunk that confirmed it; an unconfirmed one is
            # not given.
            self.trace.answered_from = first_confirming(text, self.trace.lone_answers, abstain)
            if self.trace.answered_from is None:
                if not abstains(text, abstain):
                    self.trace.unconfirmed = text
                result.text, result.answer_ids = abstain, tokenizer(abstain, add_special_tokens=False)["input_ids"]
                return result
            confirming = readings[self.trace.answered_from]
            if confirmed_answer(text, confirming.text) != text:
                result.text, result.answer_ids = confirming.text, confirming.ids
            # Where the joint answer is a list, every chunk was read alone (LoneReadings.settled).
            added = []
            if gathers(text, abstain):
                passages = [tokenizer.decode(r.chunk_ids, skip_special_tokens=True) for r in readings]
                added = gathered_values(result.text, self.trace.lone_answers, passages, abstain)
            if added:
                self.trace.gathered_from = sorted({i for i, _ in added})
                result.text = with_values(result.text, [value for _, value in added])
                result.answer_ids = tokenizer(result.text, add_special_tokens=False)["input_ids"]
            return result
        self.trace.answered_from = choose_lone_reading(text, self.trace.lone_answers, abstain)
        if self.trace.answered_from is not None:
            chosen = readings[self.trace.answered_from]
            result.text, result.answer_ids = chosen.text, chosen.ids
        return result


@dataclass
class ChosenChunks:
    """A question after its draft, chunk scoring and selection: what `start_answer` builds the
    context and decoder of (the scheduler builds several questions' contexts together between)."""

    prompt: QuestionPrompt
    rows: ScoringRows
    refs: list[ChunkRef]  # the selected chunks, by fused score
    priors: torch.Tensor | None  # [N] the candidates' prior relevance, or None
    trace: AnswerTrace
    clock: _Clock
    generator: torch.Generator  # the sampler's, seeded by `sampling.seed`


@dataclass(frozen=True)
class BuiltContext:
    """A question's static context built with other questions' (`static_contexts`)."""

    context: FixedContext
    kept_tokens: list[list[int]]  # per selected chunk and token: how many (layer, head) pairs keep it
    seconds: float  # the shared pass's time (the trace reports it as this question's)


@torch.inference_mode()
def choose_chunks(runner: Runner, tokenizer, documents: Sequence[DocumentKV],
                  question: str | QuestionPrompt | DraftedQuestion, params: AnswerParams = AnswerParams(),
                  interrupt_check: Callable[[], None] | None = None,
                  chunk_priors: Sequence[Sequence[float]] | None = None,
                  scored: ChunkScores | None = None) -> ChosenChunks:
    """The draft, the chunk scores and the selection (see `prepare_answer`)."""
    cfg = runner.cfg
    clock = _Clock(runner.device)
    t = time.perf_counter()
    if isinstance(question, DraftedQuestion):
        prompt, draft = question.prompt, question.draft
    else:
        prompt = question_prompt(runner, tokenizer, question, params)
        draft = draft_answer(runner, prompt, params)
    baseline = params.kv_mode in BASELINE_KV_MODES  # no chunking, nothing to score
    t = clock.lap("draft", t)
    if isinstance(question, DraftedQuestion):
        clock.timings["draft"] += question.seconds
    if interrupt_check is not None:
        interrupt_check()
    rows = question_scoring_rows(runner, prompt, draft, params)
    candidates = [] if baseline else chunk_pool(documents)
    priors = None if chunk_priors is None else torch.tensor([p for doc in chunk_priors for p in doc])  # [N]
    if baseline:
        scored = ChunkScores(torch.zeros(0), torch.zeros(0, cfg.num_layers), None)
    elif scored is None:
        scored = score_chunks(runner, documents, rows, params.scoring, interrupt_check)
    t = clock.lap("scoring", t)
    clock.timings["scoring"] += scored.seconds
    chosen = select_chunks(scored, priors, params)
    refs = [candidates[i] for i in chosen.tolist()]
    fused = fuse_scores(scored.scores, priors, params.prior_weight) if candidates else scored.scores
    generator = torch.Generator(device=runner.device).manual_seed(params.sampling.seed)
    trace = AnswerTrace(candidates=candidates, scores=scored.scores.tolist(), selected=refs,
                        priors=priors.tolist() if priors is not None and candidates else [],
                        selected_scores=[float(scored.scores[i]) for i in chosen.tolist()],
                        selected_fused_scores=[float(fused[i]) for i in chosen.tolist()], kept_tokens=[],
                        anchors_scoring=scored.anchors, anchors_decode=None,
                        draft_ids=draft.tokens[draft.committed].tolist() if draft is not None else [],
                        timings=clock.timings)
    clock.lap("selection", t)
    return ChosenChunks(prompt, rows, refs, priors, trace, clock, generator)


def static_contexts(runner: Runner, questions: Sequence[tuple[Sequence[DocumentKV], ChosenChunks, AnswerParams]]
                    ) -> list[BuiltContext | None]:
    """The first static context of each question (documents, chosen chunks, params) that decodes
    over gathered static KV (static mode, not the paged layout), built in shared question passes
    (`engine.decode.static.build_static_contexts`); None for the others (their `start_answer`
    builds their own)."""
    requests, members = [], []
    for i, (documents, chosen, params) in enumerate(questions):
        if params.kv_mode != "static" or not chosen.refs or params.static_layout == "paged" \
                or uses_paged_layout(runner, documents, params):
            continue
        chunks, counts, query_start = gather_selected(runner, documents, chosen.refs, chosen.rows, params,
                                                      len(chosen.prompt.prefix_ids))
        requests.append(QuestionContextRequest(chosen.prompt, chunks, query_start))
        members.append((i, counts))
    built: list[BuiltContext | None] = [None] * len(questions)
    if not requests:
        return built
    start = time.perf_counter()
    contexts = build_static_contexts(runner, requests)
    if runner.device.type == "cuda":
        torch.cuda.current_stream(runner.device).synchronize()
    seconds = time.perf_counter() - start
    for (i, counts), ctx in zip(members, contexts, strict=True):
        built[i] = BuiltContext(ctx, counts, seconds)
    return built


def start_answer(runner: Runner, documents: Sequence[DocumentKV], chosen: ChosenChunks, params: AnswerParams,
                 built: BuiltContext | None = None) -> PreparedAnswer:
    """The context the answer is decoded over (`built` when it was built already) and its decoder."""
    clock, t = chosen.clock, time.perf_counter()
    if params.kv_mode in BASELINE_KV_MODES:
        ids = _dense_prompt(chosen.prompt, documents, runner.cfg.bos_token_id)
        if params.kv_mode == "dense":
            decoder = DenseDecoder(runner, ids)
        else:
            decoder = FastDLLMDecoder(runner, ids, params.sampling.block_length)
    else:
        decoder = answer_decoder(runner, documents, chosen.prompt, chosen.rows, chosen.refs, params, chosen.trace,
                                 chosen.priors, built)
    t = clock.lap("kv_build", t)
    if built is not None:
        clock.timings["kv_build"] += built.seconds
    lone = LoneReadings.of(documents, chosen, params) if params.reads_chunks_alone and len(chosen.refs) > 1 else None
    return PreparedAnswer(decoder, params.sampling, chosen.generator, chosen.trace, clock, t, lone)


@torch.inference_mode()
def prepare_answer(runner: Runner, tokenizer, documents: Sequence[DocumentKV],
                   question: str | QuestionPrompt | DraftedQuestion,
                   params: AnswerParams = AnswerParams(), interrupt_check: Callable[[], None] | None = None,
                   chunk_priors: Sequence[Sequence[float]] | None = None,
                   scored: ChunkScores | None = None) -> PreparedAnswer:
    """Everything before the decode steps: the draft, the chunk scores, the selection and the
    context the answer is decoded over (see `stream_answer` for the other arguments). `scored`:
    the chunks' scores when they were computed already (`score_questions`, with other questions;
    from `question_scoring_rows` of the same draft)."""
    chosen = choose_chunks(runner, tokenizer, documents, question, params, interrupt_check, chunk_priors, scored)
    return start_answer(runner, documents, chosen, params)


@torch.inference_mode()
def stream_answer(runner: Runner, tokenizer, documents: Sequence[DocumentKV], question: str | QuestionPrompt,
                  params: AnswerParams = AnswerParams(), interrupt_check: Callable[[], None] | None = None,
                  chunk_priors: Sequence[Sequence[float]] | None = None) -> Iterator[DecodeStep | AnswerResult]:
    """Yields a DecodeStep per denoising step, then the AnswerResult.

    `chunk_priors`: per document, a relevance in [0, 1] for each of its chunks, added to the
    scores (`params.prior_weight` nats at 1) before selection; the app gives BM25's.

    `question` is text, or an already tokenized QuestionPrompt (benchmarks with random models use
    that and pass no tokenizer; the result's text is then empty). The runner keeps the passes and
    buffers one question leaves for the next. `interrupt_check` is called between the phases and
    the scoring passes, before any decode step, and before each step of the lone readings (which
    yield nothing); it raises to stop the question (the caller checks between the answer's decode
    steps itself, where this generator yields).
    """
    prepared = prepare_answer(runner, tokenizer, documents, question, params, interrupt_check, chunk_priors)
    joint_settled = False  # after it the lone readings yield nothing: the check runs before their steps

    def check() -> None:
        if joint_settled and interrupt_check is not None:
            interrupt_check()

    events = drive_alone(prepared.steps(runner, tokenizer), check)
    try:
        while True:
            try:
                item = next(events)
            except StopIteration as done:
                result = done.value
                break
            if isinstance(item, JointAnswer):
                joint_settled = True
            elif isinstance(item, DecodeStep):
                yield item
    finally:  # also when the caller stops listening mid-answer
        events.close()
        release_pages(runner)
    yield result


def uses_paged_layout(runner: Runner, documents: Sequence[DocumentKV], params: AnswerParams) -> bool:
    """Whether static decoding reads the pages in place (see AnswerParams.static_layout)."""
    if params.kv_mode != "static" or params.static_layout == "contiguous":
        return False
    single = len(documents) == 1 and params.reselect_every == 0
    if params.static_layout == "paged":
        if not single:
            raise ValueError("static_layout 'paged' serves one document without re-selection")
        return True
    return single and documents[0].device == runner.device and runner.split_kv_native


def answer_decoder(runner: Runner, documents: Sequence[DocumentKV], prompt: QuestionPrompt, rows: ScoringRows,
                   refs: list[ChunkRef], params: AnswerParams, trace: AnswerTrace,
                   priors: torch.Tensor | None = None, built: BuiltContext | None = None
                   ) -> StaticDecoder | PagedStaticDecoder:
    """Places the selected chunks and the question (the static or joint context, paged or
    contiguous; `built`: the static context, built already) and returns the decoder of the
    answer's steps, with re-selection per block when `params.reselect_every`. Fills the trace's
    kept tokens, BOS anchors and layout."""
    if not refs:
        raise ValueError("no chunk to answer from: the documents are empty")
    prefix_len = len(prompt.prefix_ids)
    sampling = params.sampling
    if uses_paged_layout(runner, documents, params):
        chunks, trace.kept_tokens, query_start = gather_selected(runner, documents, refs, rows, params, prefix_len,
                                                                 stack_kv=False)
        decoder, trace.anchors_decode = paged_decoder(runner, documents[0], [r.chunk for r in refs], chunks, prompt,
                                                      query_start, sampling.gen_length, sampling.block_length)
        trace.static_layout = "paged"
        return decoder

    def context_for(sel_refs: list[ChunkRef], extra_ids: list[int] | None = None
                    ) -> tuple[FixedContext, list[list[int]]]:
        joint = params.kv_mode == "joint" and extra_ids is None  # re-encodes the chunks' tokens
        chunks, counts, query_start = gather_selected(runner, documents, sel_refs, rows, params, prefix_len,
                                                      stack_kv=not joint)
        if joint:
            ctx = build_joint_context(runner, prompt, chunks, query_start, sampling.gen_length, sampling.block_length)
        else:
            ctx = build_static_context(runner, prompt, chunks, query_start, extra_ids)
        return ctx, counts

    ctx, trace.kept_tokens = (built.context, built.kept_tokens) if built is not None else context_for(refs)
    trace.anchors_decode = ctx.anchors
    answer_start = ctx.answer_start

    def reselect(block: int, answer: torch.Tensor) -> FixedContext | None:
        if (block + 1) % params.reselect_every:
            return None
        done = answer[:(block + 1) * sampling.block_length].tolist()
        # The partial answer plays the draft's part: the scored rows become query + answer so far.
        new_rows = dataclasses.replace(
            rows, ids=torch.cat((torch.tensor(prompt.query_ids), torch.tensor(done))),
            targets=torch.cat((rows.targets[:len(prompt.query_ids)], torch.ones(len(done), dtype=torch.bool))))
        new_chosen = select_chunks(score_chunks(runner, documents, new_rows, params.scoring), priors, params)
        pool = chunk_pool(documents)
        new_refs = [pool[i] for i in new_chosen.tolist()]
        trace.reselections.append(new_refs)
        new_ctx, _ = context_for(new_refs, extra_ids=done)
        return dataclasses.replace(new_ctx, answer_start=answer_start)

    return StaticDecoder(runner, ctx, sampling.block_length,
                         on_block_done=reselect if params.reselect_every > 0 else None)
