"""Where a scheduled question's time goes at a real model's shape, random weights (GPU).

Prints each question's preparation by phase (draft, scoring, selection, context build) for 16
questions on 16 different documents, then the batched static decode step (fixed buffers, a
captured CUDA graph) for 1 to 16 questions at once, then a whole scheduler step of all of them,
twice: with each question's own sampling and commit after the batched forward, and with the
questions' steps decided together (`engine.decode.loop.decide_together`, what the scheduler runs);
then the peak GPU memory.

    python scripts/profile_batched_step.py [--shape dream-7b] [--context 32768] [--questions 16] [--block-length 8]
    python scripts/profile_batched_step.py --device cpu --shape tiny --context 2048   # the CPU's
"""

from __future__ import annotations

import argparse
import time

import torch

from engine import AnswerParams, SamplingParams
from engine.attention import select_backend
from engine.decode.loop import BlockDone, LogitsRequest, decode_blocks
from engine.decode.static import StaticBatch
from engine.method.answer import prepare_answer
from engine.method.prefill import prefill_document
from engine.model.weights import random_model
from engine.runner import Runner
from tools.bench import BENCH_SCORING, SHAPES, random_question


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="dream-7b", choices=sorted(SHAPES))
    parser.add_argument("--context", type=int, default=32768)
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--block-length", type=int, default=32, help="answer slots a step recomputes (of 32)")
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
    if device.type == "cuda":
        print(f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")


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
