"""A discrete-event simulation of the question scheduler's policy under Poisson arrivals.

What it answers: how p50 / p95 latency respond to when newcomers are prepared (each step whoever
has arrived, or gathered by `engine.scheduler.gathered_enough`), given what a preparation and a
batched step cost. The costs are parameters; the defaults are the H100 measurements at Dream-7B's
shape, 32K documents, M = 8 candidates (docs/PERFORMANCE.md, 2026-12-06):

    draft          13.5 ms for one question, + 0.49 ms for each other prepared with it
    scoring        34.7 ms for one alone (eager; --single-scoring-ms 14 for the staged graphs),
                   14 ms + 10.64 ms a question when two or more share the passes
    question pass   9.9 ms for one, + 3.9 ms for each other
    decode step     7.1 ms at one row, + 0.59 ms a row

An answer is `--steps` steps; a question joins the batch once prepared and leaves after its last
step; as in the scheduler's loop, every preparation is followed by a step of the questions
decoding. It models the GPU as one queue of work (no overlap of preparation and steps), and
neither loads nor block boundaries. It is a guide to the policy, not a measurement: the bench
(`docqa-tools bench --concurrency N`) measures.

    python -m tools.scheduler_sim --rates 4 10 16 21
"""

from __future__ import annotations

import argparse
import random
import statistics
from dataclasses import dataclass

from engine.scheduler import gathered_enough


@dataclass(frozen=True)
class Costs:
    """Milliseconds of GPU time of each part of the work (see the module's docstring)."""

    draft_ms: float = 13.5
    draft_each_ms: float = 0.49
    single_scoring_ms: float = 34.7
    shared_scoring_ms: float = 14.0
    shared_scoring_each_ms: float = 10.64
    question_pass_ms: float = 9.9
    question_pass_each_ms: float = 3.9
    step_ms: float = 7.1
    step_each_row_ms: float = 0.59

    def preparation_ms(self, count: int) -> float:
        scoring = (self.single_scoring_ms if count == 1
                   else self.shared_scoring_ms + self.shared_scoring_each_ms * (count - 1))
        return (self.draft_ms + self.draft_each_ms * (count - 1) + scoring
                + self.question_pass_ms + self.question_pass_each_ms * (count - 1))

    def step(self, rows: int) -> float:
        return self.step_ms + self.step_each_row_ms * (rows - 1)


@dataclass(frozen=True)
class Latencies:
    p50_ms: float
    p95_ms: float
    mean_prepared_together: float


def simulate(costs: Costs, rate_per_s: float, gather: bool, steps: int = 16, questions: int = 4000,
             warmup: int = 200, max_batch: int = 16, max_prepare: int = 8, seed: int = 0) -> Latencies:
    """Latencies of `questions` Poisson arrivals at `rate_per_s` (the first `warmup` left out)."""
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    for _ in range(questions):
        t += rng.expovariate(rate_per_s / 1000.0)
        arrivals.append(t)
    now, next_arrival = 0.0, 0
    waiting: list[float] = []  # arrival times
    decoding: list[list[float]] = []  # [arrival time, steps left]
    latencies: list[float] = []
    prepared_together: list[int] = []
    while len(latencies) < questions:
        while next_arrival < questions and arrivals[next_arrival] <= now:
            waiting.append(arrivals[next_arrival])
            next_arrival += 1
        places = min(max_batch - len(decoding), max_prepare)
        taken = waiting[:max(0, places)]
        ready = bool(taken) and (not gather or gathered_enough(
            [(now - a) / 1000.0 for a in taken], len(decoding), costs.preparation_ms(len(taken)) / 1000.0, places))
        if ready:  # as the scheduler's loop: a preparation, then a step of all decoding
            now += costs.preparation_ms(len(taken))
            prepared_together.append(len(taken))
            decoding += [[a, steps] for a in taken]
            waiting = waiting[len(taken):]
        if decoding:
            now += costs.step(len(decoding))
            for question in decoding:
                question[1] -= 1
            latencies += [now - a for a, left in decoding if left == 0]
            decoding = [q for q in decoding if q[1] > 0]
        elif not ready:
            now = max(now, arrivals[next_arrival])
    kept = sorted(latencies[warmup:])
    return Latencies(statistics.median(kept), kept[int(0.95 * (len(kept) - 1))],
                     statistics.fmean(prepared_together))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[4, 10, 16, 21.15],
                        help="arrivals a second (21.15: 80%% of the 26.44 q/s closed loop at 16 users, H100)")
    parser.add_argument("--single-scoring-ms", type=float, default=Costs.single_scoring_ms)
    parser.add_argument("--steps", type=int, default=16, help="steps an answer takes (32 tokens, 2 a step)")
    parser.add_argument("--questions", type=int, default=4000)
    args = parser.parse_args(argv)
    costs = Costs(single_scoring_ms=args.single_scoring_ms)
    alone = costs.preparation_ms(1) + args.steps * costs.step(1)
    print(f"one question alone: {alone:.0f} ms")
    print("| arrivals / s | policy | p50 ms | p95 ms | p95 / alone | prepared together (mean) |")
    print("|---|---|---|---|---|---|")
    for rate in args.rates:
        for gather in (False, True):
            got = simulate(costs, rate, gather, steps=args.steps, questions=args.questions)
            print(f"| {rate:g} | {'gathered' if gather else 'at once'} | {got.p50_ms:.0f} | {got.p95_ms:.0f} "
                  f"| {got.p95_ms / alone:.2f} | {got.mean_prepared_together:.1f} |")


if __name__ == "__main__":
    main()
