"""`docqa-tools bench --concurrency N`: many users at once through the question scheduler.

N random-token documents are prefilled once (random weights at a real shape, nothing downloaded);
then, through one `engine.scheduler.AnswerScheduler` as the app runs one:

- `single`: one question alone, several times (the latency every other figure is compared with);
- `burst`: N questions on the N documents submitted at the same instant: the wall time until the
  last answer (serialised, it would be about N x single);
- `closed`: N users, each asking its own document again as soon as its answer arrives: throughput
  (questions a second) at N concurrent users;
- `poisson`: questions arriving at random (exponential gaps) at `load` x the closed-loop throughput,
  each on one of the N documents in turn: p50 and p95 latency from arrival to answer.

Each question's answer follows the rule of `docqa-tools bench` (a fixed number of tokens committed a
step, one unless `tokens_per_step` says more; stop at EOS off), so random weights cannot change the
step count. With `prefilter` M each question scores only the M chunks BM25 ranks first over a
synthetic index (`tools.bench`): the search is made once, since every user asks the same random
question, and each question's loader, on the scheduler's loader threads as the app's, cuts its
document to those chunks. The batch sizes the scheduler ran steps at are counted per phase.

With `documents_on="host"` the documents' KV is held in host memory (pinned) and each question's
loader hands its document (with a prefilter, only the M candidates) to the scheduler, which copies
it to the GPU, as for the app's documents outside the pool's GPU tier: N documents then need not
fit the GPU.
"""

from __future__ import annotations

import dataclasses
import json
import random
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from engine import AnswerParams, ScoringParams
from engine.attention import select_backend
from engine.method.answer import AnswerResult
from engine.method.kv_cache import DocumentKV, take_chunks
from engine.method.prefill import prefill_document
from engine.model.weights import random_model
from engine.runner import Runner
from engine.scheduler import AnswerScheduler
from tools.bench import BENCH_SCORING, SHAPES, answer_sampling, candidate_ordinals, random_question, synthetic_index


@dataclass
class LoadPhase:
    name: str
    questions: int
    wall_s: float
    throughput_qps: float
    p50_s: float
    p95_s: float
    batch_sizes: dict[int, int]  # steps run at each batch size
    peak_gib: float | None = None  # peak GPU memory allocated during the phase (the documents' KV included)
    prepared_together: dict[int, int] | None = None  # preparations by the newcomers they took at once
    # Mean seconds of each phase of a question's trace; a pass shared by several questions counts
    # whole for each (what a question waited, not what it cost).
    phase_s: dict[str, float] | None = None


DOCUMENTS_ON = ("device", "host")  # where the bench holds the documents' KV


def _on_host(doc: DocumentKV) -> DocumentKV:
    """The document's KV moved to host memory, pinned where CUDA is (copies to the GPU overlap)."""
    host = doc.to("cpu")
    if torch.cuda.is_available():
        host = dataclasses.replace(host, keys=host.keys.pin_memory(), values=host.values.pin_memory())
    return host


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


class _Phase:
    """Times questions submitted to the scheduler from any thread."""

    def __init__(self, scheduler: AnswerScheduler, name: str) -> None:
        self.scheduler, self.name = scheduler, name
        self.latencies: list[float] = []
        self.timings: list[dict[str, float]] = []
        self._lock = threading.Lock()
        scheduler.batch_sizes.clear()
        scheduler.prepared_together.clear()
        self.cuda = scheduler.runner.device.type == "cuda"
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(scheduler.runner.device)
        self.start = time.perf_counter()

    def ask(self, documents, prompt, params: AnswerParams) -> None:
        t = time.perf_counter()
        events = list(self.scheduler.submit(documents, prompt, params))
        if not isinstance(events[-1], AnswerResult):
            raise RuntimeError(f"a question ended without an answer: {events[-1]!r}")
        with self._lock:
            self.latencies.append(time.perf_counter() - t)
            self.timings.append(events[-1].trace.timings)

    def result(self) -> LoadPhase:
        wall = time.perf_counter() - self.start
        n = len(self.latencies)
        peak = torch.cuda.max_memory_allocated(self.scheduler.runner.device) / 2**30 if self.cuda else None
        phases = sorted({k for t in self.timings for k in t})
        return LoadPhase(self.name, n, wall, n / wall, statistics.median(self.latencies),
                         _percentile(self.latencies, 0.95), dict(sorted(self.scheduler.batch_sizes.items())), peak,
                         dict(sorted(self.scheduler.prepared_together.items())),
                         {k: statistics.fmean(t.get(k, 0.0) for t in self.timings) for k in phases})


def _threads(targets) -> None:
    threads = [threading.Thread(target=t) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def run(shape: str, concurrency: int, context: int, answer: int, device: str | None, chunk_size: int, top_k: int,
        rounds: int = 4, poisson_questions: int = 64, load: float = 0.8, max_batch: int | None = None,
        progress=print, seed: int = 0, scoring: ScoringParams = BENCH_SCORING, prefilter: int = 0,
        tokens_per_step: int = 1, max_prepare: int = 8, block_length: int = 32,
        documents_on: str = "device", gather: bool = True) -> list[LoadPhase]:
    if documents_on not in DOCUMENTS_ON:
        raise ValueError(f"documents_on must be one of {DOCUMENTS_ON}, got {documents_on!r}")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    cfg = SHAPES[shape]
    runner = Runner.for_model(random_model(cfg, dev, dtype), select_backend(dev, dtype), True)
    gen = torch.Generator().manual_seed(seed)

    def prefilled() -> DocumentKV:  # one at a time to the host: N documents need not fit the GPU
        doc = prefill_document(runner, torch.randint(8, cfg.vocab_size, (context,), generator=gen), chunk_size)
        return _on_host(doc) if documents_on == "host" else doc
    docs = [prefilled() for _ in range(concurrency)]
    prompts = [random_question(cfg, gen) for _ in range(concurrency)]
    documents_gib = sum(d.keys.nbytes + d.values.nbytes for d in docs) / 2**30
    params = AnswerParams(top_k=top_k, kv_mode="static", scoring=scoring,
                          sampling=answer_sampling(answer, tokens_per_step, block_length))
    if prefilter:
        conn, question = synthetic_index(docs[0].num_chunks, gen)
        chosen = candidate_ordinals(conn, question, docs[0].num_chunks, prefilter)
        conn.close()

        pin = documents_on == "host" and dev.type == "cuda"

        def documents(i: int):  # (in host memory too: the scheduler's loader copies them to the device)
            return lambda: [take_chunks(docs[i], chosen, pin=pin)]
    elif documents_on == "host":
        def documents(i: int):
            return lambda: [docs[i]]
    else:
        def documents(i: int):
            return [docs[i]]
    scheduler = AnswerScheduler(runner, None, max_batch=max_batch or concurrency,
                                max_waiting=max(64, concurrency + poisson_questions), max_prepare=max_prepare,
                                gather=gather)
    phases: list[LoadPhase] = []

    def report(phase: LoadPhase) -> None:
        phases.append(phase)
        progress(f"{shape} {phase.name:>8} x{phase.questions:<4}: wall {phase.wall_s:7.3f} s, "
                 f"{phase.throughput_qps:6.2f} q/s, p50 {phase.p50_s:6.3f} s, p95 {phase.p95_s:6.3f} s, "
                 f"batch sizes {phase.batch_sizes}, prepared together {phase.prepared_together}, "
                 f"phases (mean s, a shared pass whole for each of its questions) "
                 + ", ".join(f"{k} {v:.4f}" for k, v in (phase.phase_s or {}).items())
                 + (f", peak {phase.peak_gib:.1f} GiB (documents {documents_gib:.1f}"
                    f"{' on the host' if documents_on == 'host' else ''})" if phase.peak_gib else ""))

    try:
        # Warm-up, untimed: compilation, the allocator's growth to a full batch, and the CUDA graphs
        # of every batch size a phase can meet. The passes pad their rows to a power of two, and a
        # burst's questions may be prepared in two groups, so each power of two up to N is asked
        # together twice (some passes are captured only when seen a second time): a capture inside
        # a timed phase moved "N at once" by half a question's time. One question alone is the
        # first size (it may take another layout, compiled and captured on its own). The smaller
        # sizes come again after the largest: a larger shared scoring pass grows the runner's
        # scoring staging, which drops the passes (and graphs) over the smaller one.
        sizes = sorted({1 << k for k in range(concurrency.bit_length())} | {concurrency})
        for n in sizes + sizes[:-1]:
            for _ in range(2):
                _threads([lambda i=i: list(scheduler.submit(documents(i), prompts[i], params)) for i in range(n)])
        single = _Phase(scheduler, "single")
        for i in range(min(concurrency, 4)):
            single.ask(documents(i), prompts[i], params)
        report(single.result())

        burst = _Phase(scheduler, "burst")
        _threads([lambda i=i: burst.ask(documents(i), prompts[i], params) for i in range(concurrency)])
        report(burst.result())

        closed = _Phase(scheduler, "closed")
        _threads([lambda i=i: [closed.ask(documents(i), prompts[i], params) for _ in range(rounds)]
                  for i in range(concurrency)])
        capacity = closed.result()
        report(capacity)

        rate = load * capacity.throughput_qps
        poisson = _Phase(scheduler, f"poisson@{load:.0%}")
        arrivals = random.Random(seed)
        askers = []
        for k in range(poisson_questions):
            i = k % concurrency
            askers.append(threading.Thread(target=poisson.ask, args=(documents(i), prompts[i], params)))
            askers[-1].start()
            time.sleep(arrivals.expovariate(rate))
        for t in askers:
            t.join()
        report(poisson.result())
    finally:
        scheduler.close()
    return phases


def write(phases: list[LoadPhase], out_dir: Path, meta: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "concurrency.json").write_text(json.dumps({"meta": meta, "phases": [asdict(p) for p in phases]},
                                                         indent=1))


def table(phases: list[LoadPhase]) -> str:
    single = next((p.p50_s for p in phases if p.name == "single"), None)
    lines = ["| phase | questions | wall s | q/s | p50 s | p95 s | p95 / single | peak GiB | batch sizes (steps) "
             "| prepared together (times) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for p in phases:
        ratio = f"{p.p95_s / single:.2f}" if single else "-"
        sizes = ", ".join(f"{k}: {v}" for k, v in p.batch_sizes.items())
        together = ", ".join(f"{k}: {v}" for k, v in (p.prepared_together or {}).items())
        peak = f"{p.peak_gib:.1f}" if p.peak_gib is not None else "-"
        lines.append(f"| {p.name} | {p.questions} | {p.wall_s:.3f} | {p.throughput_qps:.2f} | {p.p50_s:.3f} | "
                     f"{p.p95_s:.3f} | {ratio} | {peak} | {sizes} | {together} |")
    return "\n".join(lines)

