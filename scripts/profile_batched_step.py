"""Where a scheduled question's time goes at a real model's shape, random weights (GPU).

Prints each question's preparation by phase (draft, scoring, selection, context build) for 16
questions on 16 different documents, then the batched static decode step (fixed buffers, a
captured CUDA graph) for 1 to 16 questions at once, then a whole scheduler step of all of them,
twice: with each question's own sampling and commit after the batched forward, and with the
questions' steps decided together (`engine.decode.loop.decide_together`, what the scheduler runs);
then the peak GPU memory.

With `--profile DIR`, also where the GPU's time goes (torch.profiler, kernels grouped by kind, a
table each in DIR): the preparation of one question and of all of them as the scheduler shares it
(the batched draft, the shared scoring passes, the shared question pass), and the batched step's
forward at one row and at all rows, eager (kernel by kernel) and as its captured graph replays.
A 4K context (8 chunks of 512) scores as many chunks as the bench's `--prefilter 8`.

    python scripts/profile_batched_step.py [--shape dream-7b] [--context 32768] [--questions 16] [--block-length 8]
    python scripts/profile_batched_step.py --context 4096 --questions 8 --profile profile/   # needs CUDA
    python scripts/profile_batched_step.py --device cpu --shape tiny --context 2048   # the CPU's
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from engine import AnswerParams, SamplingParams
from engine.attention import select_backend
from engine.decode.loop import BlockDone, LogitsRequest, decode_blocks
from engine.decode.static import StaticBatch, batch_rows
from engine.method.answer import (
    DraftedQuestion,
    choose_chunks,
    draft_answers,
    prepare_answer,
    question_scoring_rows,
    score_questions,
    start_answer,
    static_contexts,
)
from engine.method.prefill import prefill_document
from engine.model.weights import random_model
from engine.runner import Runner
from tools.bench import BENCH_SCORING, SHAPES, random_question
from tools.kernel_profile import kernel_summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="dream-7b", choices=sorted(SHAPES))
    parser.add_argument("--context", type=int, default=32768)
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--block-length", type=int, default=32, help="answer slots a step recomputes (of 32)")
    parser.add_argument("--profile", type=Path, default=None, help="also write kernel profiles here (CUDA)")
    args = parser.parse_args()
    device, cfg, n = torch.device(args.device), SHAPES[args.shape], args.questions
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    runner = Runner.for_model(random_model(cfg, device, dtype), select_backend(device, dtype), device.type == "cuda")
    gen = torch.Generator().manual_seed(0)
    docs = [prefill_document(runner, torch.randint(8, cfg.vocab_size, (args.context,), generator=gen), 512)
            for _ in range(n)]
    prompts = [random_question(cfg, gen) for _ in range(n)]
    sampling = SamplingParams(decoder="low_confidence", gen_length=32, block_length=args.block_length, steps=32,
                              stop_at_eos=False)
    params = AnswerParams(top_k=4, kv_mode="static", scoring=BENCH_SCORING, sampling=sampling,
                          static_layout="contiguous")
    for _ in range(2):  # the first round compiles and captures
        _sync(device)
        start = time.perf_counter()
        prepared = [prepare_answer(runner, None, [docs[i]], prompts[i], params) for i in range(n)]
        _sync(device)
        per_question = (time.perf_counter() - start) / n
    phases = {k: round(sum(p.trace.timings[k] for p in prepared) / n * 1000, 1) for k in prepared[0].trace.timings}
    print(f"prepare per question {per_question * 1000:.1f} ms; phases (ms) {phases}", flush=True)
    requests = [next(decode_blocks(p.decoder, cfg, p.sampling, p.generator, device)) for p in prepared]
    print("context lengths", sorted({r.decoder.ctx.key_valid.shape[1] for r in requests}))
    size = 1
    while size <= n:
        batch = StaticBatch(runner)
        for _ in range(3):
            batch.slot_logits(requests[:size])
        _sync(device)
        start = time.perf_counter()
        for _ in range(20):
            batch.slot_logits(requests[:size])
        _sync(device)
        print(f"batched graphed step n={size}: {(time.perf_counter() - start) * 50:.2f} ms a step", flush=True)
        batch.clear()
        size *= 2
    for decide in (False, True):
        loops = [decode_blocks(p.decoder, cfg, p.sampling, p.generator, device) for p in prepared]
        requests = [next(loop) for loop in loops]
        batch, step_s, own_s = StaticBatch(runner), 0.0, 0.0
        for step in range(24):  # 4 untimed, then 20 timed
            _sync(device)
            start = time.perf_counter()
            replies = batch.step(requests, decide=decide)
            _sync(device)
            middle = time.perf_counter()
            requests = [_next_request(loop, reply) for loop, reply in zip(loops, replies, strict=True)]
            _sync(device)
            if step >= 4:
                step_s, own_s = step_s + middle - start, own_s + time.perf_counter() - middle
        batch.clear()
        how = "decided together: batched forward and decisions" if decide else "batched forward"
        print(f"scheduler step n={n}: {how} {step_s * 50:.2f} ms, then each question's own work "
              f"(sampling and commit, or its host bookkeeping) {own_s * 50:.2f} ms a step", flush=True)
    if args.profile is not None:
        _profile(args.profile, runner, docs, prompts, params, prepared)
    if device.type == "cuda":
        print(f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")


@torch.inference_mode()
def _profile(out: Path, runner: Runner, docs: list, prompts: list, params: AnswerParams, prepared: list) -> None:
    """Kernel profiles of the preparation (one question, then all as the scheduler shares it) and
    of the batched step's forward (one row, all rows); `summary.json` and a table each in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    device, n, summary = runner.device, len(docs), {}
    for size in sorted({1, n}):
        drafted = [DraftedQuestion(p, d) for p, d in zip(prompts[:size], draft_answers(
            runner, prompts[:size], [params] * size), strict=True)]
        rows = [question_scoring_rows(runner, q.prompt, q.draft, params) for q in drafted]
        scoring = [([doc], r, params.scoring) for doc, r in zip(docs[:size], rows, strict=True)]
        scores = score_questions(runner, scoring)
        chosen = [choose_chunks(runner, None, [doc], q, params, None, None, s)
                  for doc, q, s in zip(docs[:size], drafted, scores, strict=True)]

        def contexts(size=size, chosen=chosen):
            built = static_contexts(runner, [([d], c, params) for d, c in zip(docs[:size], chosen, strict=True)]) \
                if size > 1 else [None]
            return [start_answer(runner, [d], c, params, b) for d, c, b in zip(docs[:size], chosen, built, strict=True)]

        phases = {"draft": lambda size=size: draft_answers(runner, prompts[:size], [params] * size),
                  "scoring": lambda scoring=scoring: score_questions(runner, scoring),
                  "question pass": contexts}
        for phase, fn in phases.items():
            summary[f"prepare {size}: {phase}"] = _profiled(out, f"prepare{size}-{phase.replace(' ', '-')}", fn, device)
    requests = [next(decode_blocks(p.decoder, runner.cfg, p.sampling, p.generator, device)) for p in prepared]
    for size in sorted({1, n}):
        batch = StaticBatch(runner)
        batch.slot_logits(requests[:size])  # places the rows, captures the graph
        forward = batch._step._forwards[batch_rows(size)]
        summary[f"step {size} rows: eager"] = _profiled(out, f"step{size}-eager", forward.call.fn, device)
        summary[f"step {size} rows: graph"] = _profiled(out, f"step{size}-graph", forward.call, device)
        batch.clear()
    (out / "summary.json").write_text(json.dumps(summary, indent=1))


def _profiled(out: Path, name: str, fn, device: torch.device, calls: int = 5) -> dict:
    """fn's wall time a call (after one untimed call), then its kernels by kind a call, profiled."""
    fn()
    _sync(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    _sync(device)
    wall_ms = (time.perf_counter() - start) / calls * 1000
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        _sync(device)
    (out / f"{name}.txt").write_text(prof.key_averages().table(sort_by="self_device_time_total", row_limit=40))
    kernels = kernel_summary(prof, calls)
    busy = sum(k["ms_per_step"] for k in kernels.values())
    print(f"{name}: wall {wall_ms:.2f} ms, GPU kernels {busy:.2f} ms: "
          + ", ".join(f"{kind} {k['ms_per_step']:.2f} ({k['kernels_per_step']:.0f})" for kind, k in
                      sorted(kernels.items(), key=lambda kv: -kv[1]["ms_per_step"])), flush=True)
    return {"wall_ms": round(wall_ms, 3), "kernels": kernels}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _next_request(loop, reply):
    """Sends the step's reply into a question's decode loop and runs it to its next LogitsRequest,
    or BlockDone (refreshed in the next batched step, as the scheduler does)."""
    item = loop.send(reply)
    while not isinstance(item, (LogitsRequest, BlockDone)):
        item = loop.send(None)
    return item


if __name__ == "__main__":
    main()
