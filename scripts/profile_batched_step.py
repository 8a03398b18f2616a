"""Where a scheduled question's time goes at a real model's shape, random weights (GPU).

Prints each question's preparation by phase (draft, scoring, selection, context build) for 16
questions on 16 different documents, then the batched static decode step (fixed buffers, a
captured CUDA graph) for 1 to 16 questions at once, then a whole scheduler step of all of them
(the batched forward, then each question's own sampling and commit), and the peak GPU memory.

    python scripts/profile_batched_step.py [--shape dream-7b] [--context 32768]
"""

from __future__ import annotations

import argparse
import time

import torch

from engine import AnswerParams, SamplingParams
from engine.attention import select_backend
from engine.decode.loop import LogitsRequest, decode_blocks
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
    args = parser.parse_args()
    device, cfg, n = torch.device("cuda"), SHAPES[args.shape], args.questions
    runner = Runner.for_model(random_model(cfg, device, torch.bfloat16), select_backend(device, torch.bfloat16), True)
    gen = torch.Generator().manual_seed(0)
    docs = [prefill_document(runner, torch.randint(8, cfg.vocab_size, (args.context,), generator=gen), 512)
            for _ in range(n)]
    prompts = [random_question(cfg, gen) for _ in range(n)]
    sampling = SamplingParams(decoder="low_confidence", gen_length=32, block_length=32, steps=32, stop_at_eos=False)
    params = AnswerParams(top_k=4, kv_mode="static", scoring=BENCH_SCORING, sampling=sampling,
                          static_layout="contiguous")
    for _ in range(2):  # the first round compiles and captures
        torch.cuda.synchronize()
        start = time.perf_counter()
        prepared = [prepare_answer(runner, None, [docs[i]], prompts[i], params) for i in range(n)]
        torch.cuda.synchronize()
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
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(20):
            batch.slot_logits(requests[:size])
        torch.cuda.synchronize()
        print(f"batched graphed step n={size}: {(time.perf_counter() - start) * 50:.2f} ms a step", flush=True)
        batch.clear()
        size *= 2
    loops = [decode_blocks(p.decoder, cfg, p.sampling, p.generator, device) for p in prepared]
    requests = [next(loop) for loop in loops]
    batch, forward_s, own_s = StaticBatch(runner), 0.0, 0.0
    for step in range(24):  # 4 untimed, then 20 timed
        torch.cuda.synchronize()
        start = time.perf_counter()
        logits = batch.slot_logits(requests)
        torch.cuda.synchronize()
        middle = time.perf_counter()
        requests = [_next_request(loop, reply) for loop, reply in zip(loops, logits, strict=True)]
        torch.cuda.synchronize()
        if step >= 4:
            forward_s, own_s = forward_s + middle - start, own_s + time.perf_counter() - middle
    print(f"scheduler step n={n}: batched forward {forward_s * 50:.2f} ms, the questions' own sampling and commit "
          f"{own_s * 50:.2f} ms a step", flush=True)
    print(f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")


def _next_request(loop, reply):
    """Sends the logits into a question's decode loop and runs it to its next LogitsRequest."""
    item = loop.send(reply)
    while not isinstance(item, LogitsRequest):
        item = loop.send(None)
    return item


if __name__ == "__main__":
    main()
