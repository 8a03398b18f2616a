"""Scratch profile: prepare phases and the batched (graphed) step at Dream-7B's shape."""
import time, torch
from engine import AnswerParams, SamplingParams
from engine.attention import select_backend
from engine.decode.loop import decode_blocks
from engine.decode.static import StaticBatch
from engine.method.answer import prepare_answer
from engine.method.prefill import prefill_document
from engine.model.weights import random_model
from engine.runner import Runner
from tools.bench import BENCH_SCORING, SHAPES, random_question

dev = torch.device("cuda"); cfg = SHAPES["dream-7b"]
runner = Runner.for_model(random_model(cfg, dev, torch.bfloat16), select_backend(dev, torch.bfloat16), True)
gen = torch.Generator().manual_seed(0)
docs = [prefill_document(runner, torch.randint(8, cfg.vocab_size, (32768,), generator=gen), 512) for _ in range(16)]
prompts = [random_question(cfg, gen) for _ in range(16)]
sampling = SamplingParams(decoder="low_confidence", gen_length=32, block_length=32, steps=32, stop_at_eos=False)
params = AnswerParams(top_k=4, kv_mode="static", scoring=BENCH_SCORING, sampling=sampling, static_layout="contiguous")
def sync(): torch.cuda.synchronize()
for rep in range(2):
    sync(); t = time.perf_counter()
    prepared = [prepare_answer(runner, None, [docs[i]], prompts[i], params) for i in range(16)]
    sync(); prep = (time.perf_counter() - t) / 16
phases = {k: round(sum(p.trace.timings[k] for p in prepared) / 16 * 1000, 1) for k in prepared[0].trace.timings}
print(f"prepare per question {prep*1000:.1f} ms; phases (ms) {phases}", flush=True)
loops = [decode_blocks(p.decoder, cfg, p.sampling, p.generator, dev) for p in prepared]
reqs = [next(l) for l in loops]
print("context lengths", sorted({r.decoder.ctx.key_valid.shape[1] for r in reqs}))
for n in (1, 2, 4, 8, 16):
    batch = StaticBatch(runner)
    for _ in range(3): batch.slot_logits(reqs[:n])
    sync(); t = time.perf_counter()
    for _ in range(20): batch.slot_logits(reqs[:n])
    sync(); ms = (time.perf_counter()-t)*50
    print(f"batched graphed step n={n}: {ms:.2f} ms a step", flush=True)
    batch.clear()
print("max memory GiB", torch.cuda.max_memory_allocated() / 2**30)
