"""Where a cached question's time goes on the GPU: kernel tables for scoring and for the decode steps.

    python scripts/profile_question.py --shape dream-7b --context 32768 --out profile/   # needs CUDA

Random weights at the real shape, one prefilled document, the bench's question and decoding rule
(tools/bench.py). For each variant of the decode step (eager layer halves, compiled ones) it answers
twice untimed (compilation, graph capture), once timed (the trace's phases), then once under
torch.profiler with the profiler started after the first decode step, so the table holds decode
steps only. Scoring (`score_document`) is profiled on its own (compiled layer halves); prefill,
the draft and scoring are also timed with eager and with compiled (dynamic-shape) layer halves, and
as the engine runs them (passes kept across questions, captured graphs on CUDA). `--sections`
picks some of scoring, decode, kv_build, first (a new document's first question in a warmed-up
engine: prefill and the first three questions timed by phase, then one profile of a first
question). `--decode-compile-mode` compiles the decode step's fixed-shape halves with another
torch.compile mode (an experiment; the app uses the default). Writes `<variant>.txt` kernel tables and `summary.json`
(phases, kernels per step, GPU-busy ms per step against wall ms).
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from engine import AnswerParams, SamplingParams
from engine.attention import full_mask, select_backend
from engine.decode.static import build_static_context
from engine.method.answer import (
    AnswerResult,
    AnswerTrace,
    answer_decoder,
    chunk_pool,
    gather_selected,
    score_chunks,
    select_chunks,
    stream_answer,
)
from engine.method.chunk_scorer import draft_pseudo_labels, kept_draft_pass, score_document, scoring_rows
from engine.method.prefill import PREFILL_TOKEN_BUDGET, prefill_document
from engine.model.compiled_layers import EagerOnFailure
from engine.model.weights import random_model
from engine.runner import Runner
from tools.bench import BENCH_SCORING, SHAPES, matmul_flops_per_token, random_question
from tools.kernel_profile import kernel_summary

SECTIONS = ("prefill", "scoring", "decode", "kv_build", "first")


def _seconds(fn, sync, reps: int) -> float:
    sync()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - t) / reps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="dream-7b", choices=sorted(SHAPES))
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--answer", type=int, default=32)
    ap.add_argument("--chunk-size", type=int, default=512)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--out", type=Path, default=Path("profile"))
    ap.add_argument("--device", default="cuda", help="cpu only to smoke-test the script (with --shape tiny)")
    ap.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    ap.add_argument("--decode-compile-mode", default=None, help="e.g. max-autotune-no-cudagraphs")
    ap.add_argument("--prefill-compile-mode", default=None,
                    help="also time a prefill batch with the halves compiled in this mode (an experiment)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    sort_by = "self_device_time_total" if dev.type == "cuda" else "self_cpu_time_total"
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    cfg = SHAPES[args.shape]
    # As an engine runs it: compiled halves on CUDA; `eager` shares the weights with eager halves.
    runner = Runner.for_model(random_model(cfg, dev, dtype), select_backend(dev, dtype))
    eager = Runner(runner.model, runner.attention)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(8, cfg.vocab_size, (args.context,), generator=gen)
    prompt = random_question(cfg, gen)
    sampling = SamplingParams(decoder="low_confidence", gen_length=args.answer, block_length=min(32, args.answer),
                              steps=args.answer, stop_at_eos=False)
    scoring = BENCH_SCORING
    summary: dict = {"shape": args.shape, "context": args.context, "answer": args.answer,
                     "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
                     "torch": torch.__version__, "variants": {}}

    if args.decode_compile_mode:
        # The decode step's fixed-shape halves compiled in another mode; the other passes as the app runs them.
        runner = Runner(runner.model, runner.attention, fixed_layers=_layer_functions_in_mode(args.decode_compile_mode),
                        dynamic_layers=runner.dynamic_layers)
        summary["decode_compile_mode"] = args.decode_compile_mode
    prompt_ids = prompt.prefix_ids + prompt.query_ids
    draft = draft_pseudo_labels(runner, prompt_ids, scoring.draft_slots, scoring.draft_rounds)
    rows = scoring_rows(prompt.query_ids, prompt.question_span, draft, scoring.window, cfg.logits_shifted)
    if "prefill" in args.sections:
        summary["prefill"] = _profile_prefill(runner, tokens, args, sync, activities, sort_by)
        print("prefill", json.dumps(summary["prefill"], indent=1), flush=True)
    doc = prefill_document(runner, tokens, args.chunk_size)
    if "scoring" in args.sections:
        summary["scoring"] = _profile_scoring(runner, eager, doc, rows, scoring, prompt_ids, tokens, args, sync,
                                              activities, sort_by)
        print("scoring", json.dumps(summary["scoring"], indent=1), flush=True)
    if "decode" in args.sections:
        summary["variants"] = _profile_decode(runner, eager, doc, prompt, scoring, sampling, args, sync,
                                              activities, sort_by)
    if "kv_build" in args.sections:
        summary["kv_build"] = _profile_kv_build(runner, doc, prompt, rows, scoring, sampling, args, sync,
                                                activities, sort_by)
        print("kv_build", json.dumps(summary["kv_build"], indent=1), flush=True)
    if "first" in args.sections:
        del doc
        summary["first"] = _profile_first(runner, prompt, scoring, sampling, args, sync, activities, sort_by)
        print("first", json.dumps(summary["first"], indent=1), flush=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))


def _profile_prefill(runner: Runner, tokens, args, sync, activities, sort_by) -> dict:
    """The one-time chunked prefill: timed as the engine runs it, with other token budgets, one
    full batch with and without a key mask (whole chunks need none), optionally with the halves
    compiled in `--prefill-compile-mode`; one kernel table (`prefill.txt`), whose GEMM time gives
    the matmuls' own rate."""
    cfg, dev = runner.cfg, runner.device
    flops = matmul_flops_per_token(cfg) * args.context
    out: dict = {"matmul_tflop": flops / 1e12}
    for budget in (PREFILL_TOKEN_BUDGET, 2 * PREFILL_TOKEN_BUDGET):
        run = partial(prefill_document, runner, tokens, args.chunk_size, token_budget=budget)
        run()  # shapes of this budget compiled and allocated
        s = _seconds(run, sync, 3)
        out[f"budget_{budget}"] = {"s": s, "tflops": flops / s / 1e12}
        print("prefill budget", budget, out[f"budget_{budget}"], flush=True)
    b = min(PREFILL_TOKEN_BUDGET, args.context) // args.chunk_size  # one full batch
    ids = tokens[:b * args.chunk_size].view(b, args.chunk_size).to(dev)
    positions = torch.arange(args.chunk_size, device=dev).expand(b, -1)
    all_valid = torch.ones(b, args.chunk_size, dtype=torch.bool, device=dev)
    batch_flops = matmul_flops_per_token(cfg) * ids.numel()
    variants = [("no_mask", full_mask(), runner), ("key_valid_mask", full_mask(key_valid=all_valid), runner)]
    if args.prefill_compile_mode:
        in_mode = Runner(runner.model, runner.attention,
                         dynamic_layers=_layer_functions_in_mode(args.prefill_compile_mode))
        variants.append((args.prefill_compile_mode, full_mask(), in_mode))
    for name, mask, variant in variants:
        forward = partial(variant.forward, ids, positions, mask)
        t = time.perf_counter()
        forward()
        sync()
        first = time.perf_counter() - t
        s = _seconds(forward, sync, 5)
        out[f"batch_{name}"] = {"ms": 1000 * s, "tflops": batch_flops / s / 1e12, "first_call_s": first}
        print("prefill batch", name, out[f"batch_{name}"], flush=True)
    prof = _profile_once(partial(prefill_document, runner, tokens, args.chunk_size), args.out / "prefill", sync,
                         activities, sort_by)
    gemm_ms = prof["by_kind"].get("gemm", {}).get("ms_per_step", 0.0)
    prof["gemm_tflops"] = flops / (gemm_ms / 1000) / 1e12 if gemm_ms else None
    out["profile"] = prof
    return out


def _layer_functions_in_mode(mode: str):
    """Experiment: the halves compiled with torch.compile `mode` (fixed shapes; new functions, so
    dynamo's caches of the app's halves are not touched)."""
    from engine.model.transformer import Block, LayerFunctions

    def inputs(block, h, cos, sin):
        return block.attention_inputs(h, cos, sin)

    def finish(block, h, attn):
        return block.finish(h, attn)

    return LayerFunctions(
        EagerOnFailure(torch.compile(inputs, dynamic=False, fullgraph=True, mode=mode), Block.attention_inputs),
        EagerOnFailure(torch.compile(finish, dynamic=False, fullgraph=True, mode=mode), Block.finish))


def _profile_scoring(runner: Runner, eager: Runner, doc, rows, scoring, prompt_ids, tokens, args, sync, activities,
                     sort_by) -> dict:
    """Draft and scoring timed with eager and compiled (dynamic-shape) layer halves, prefill too;
    one kernel table of compiled scoring by GPU time (`scoring.txt`) and by host time
    (`scoring_cpu.txt`)."""
    out = {}
    flops = matmul_flops_per_token(runner.cfg) * args.context
    variants = [("eager", eager)] + ([("compiled_dynamic", runner)] if runner.compiled else [])
    for name, variant in variants:
        t = time.perf_counter()
        score_document(variant, doc, rows, scoring, keep_passes=False)
        first = time.perf_counter() - t
        prefill_s = _seconds(partial(prefill_document, variant, tokens, args.chunk_size), sync, 2)
        draft_s = _seconds(partial(draft_pseudo_labels, variant, prompt_ids, scoring.draft_slots, scoring.draft_rounds),
                           sync, 5)
        scoring_s = _seconds(partial(score_document, variant, doc, rows, scoring, keep_passes=False), sync, 5)
        out[name] = {"first_scoring_s": first, "prefill_s": prefill_s, "prefill_tflops": flops / prefill_s / 1e12,
                     "draft_s": draft_s, "scoring_s": scoring_s, "scored_rows": doc.num_chunks * rows.ids.numel()}
        print(name, out[name], flush=True)
    # As the engine runs them: passes kept across questions (captured graphs on CUDA).
    draft_pass = kept_draft_pass(runner, len(prompt_ids), scoring.draft_slots, scoring.draft_rounds)
    kept = partial(score_document, runner, doc, rows, scoring)
    t = time.perf_counter()
    draft_pass([prompt_ids])
    kept()
    sync()
    out["kept_passes"] = {"first_draft_and_scoring_s": time.perf_counter() - t,
                          "draft_s": _seconds(partial(draft_pass, prompt_ids), sync, 5),
                          "scoring_s": _seconds(kept, sync, 5)}
    print("kept_passes", out["kept_passes"], flush=True)
    out.update(_profile_once(partial(score_document, runner, doc, rows, scoring, keep_passes=False),
                             args.out / "scoring", sync, activities, sort_by))
    return out


def _profile_decode(runner: Runner, eager: Runner, doc, prompt, scoring, sampling, args, sync, activities,
                    sort_by) -> dict:
    """Decode steps with eager and with compiled layer halves: phases of a whole question, then one
    kernel table of its steps (`<variant>.txt`)."""
    variants = {}
    params = AnswerParams(top_k=args.top_k, scoring=scoring, sampling=sampling)
    for variant, variant_runner in (("eager_layers", eager), ("compiled_layers", runner)):
        t = time.perf_counter()
        for _ in range(2):
            result = [e for e in stream_answer(variant_runner, None, [doc], prompt, params)][-1]
        warm_s = time.perf_counter() - t
        sync()
        t = time.perf_counter()
        result = [e for e in stream_answer(variant_runner, None, [doc], prompt, params)][-1]
        sync()
        total = time.perf_counter() - t
        assert isinstance(result, AnswerResult)
        events = stream_answer(variant_runner, None, [doc], prompt, params)
        next(events)  # everything up to and including the first step
        sync()
        prof = profile(activities=activities)
        prof.start()
        t = time.perf_counter()
        steps = sum(1 for e in events if not isinstance(e, AnswerResult))
        sync()
        wall = time.perf_counter() - t
        prof.stop()
        (args.out / f"{variant}.txt").write_text(prof.key_averages().table(sort_by=sort_by, row_limit=40))
        kernels = kernel_summary(prof, steps)
        variants[variant] = {
            "static_layout": result.trace.static_layout, "first_two_questions_s": warm_s, "question_s": total,
            "phases": result.trace.timings,
            "step_ms_profiled_wall": 1000 * wall / steps, "steps_profiled": steps,
            "gpu_busy_ms_per_step": sum(k["ms_per_step"] for k in kernels.values()),
            "kernels_per_step": sum(k["kernels_per_step"] for k in kernels.values()), "by_kind": kernels}
        print(variant, json.dumps(variants[variant], indent=1), flush=True)
    return variants


def _profile_kv_build(runner: Runner, doc, prompt, rows, scoring, sampling, args, sync, activities, sort_by) -> dict:
    """The kv_build phase of a cached question (paged route, buffers reused), timed whole and by part
    (`static_context_ms`: what the contiguous route builds instead), and one kernel table of it
    (`kv_build.txt`): how much is GPU work and how much host time."""
    params = AnswerParams(top_k=args.top_k, scoring=scoring, sampling=sampling)
    chosen = select_chunks(score_chunks(runner, [doc], rows, scoring), None, params)
    pool = chunk_pool([doc])
    refs = [pool[i] for i in chosen.tolist()]
    trace = AnswerTrace(candidates=pool, scores=[], selected=refs, selected_scores=[], kept_tokens=[],
                        anchors_scoring=torch.zeros(0), anchors_decode=None, draft_ids=[], timings={})
    whole = partial(answer_decoder, runner, [doc], prompt, rows, refs, params, trace)
    gathered = partial(gather_selected, runner, [doc], refs, rows, params, len(prompt.prefix_ids))
    chunks, _, query_start = gathered()
    static_ctx = partial(build_static_context, runner, prompt, chunks, query_start)
    prefix_ids = torch.tensor(prompt.prefix_ids, device=doc.keys.device)[None]
    prefix = torch.inference_mode()(partial(runner.forward, prefix_ids,
                                            torch.arange(prefix_ids.shape[1], device=prefix_ids.device)[None],
                                            full_mask()))
    for _ in range(3):
        whole()
    out = {name: 1000 * _seconds(fn, sync, 5) for name, fn in
           (("kv_build_ms", whole), ("gather_selected_ms", gathered), ("static_context_ms", static_ctx),
            ("prefix_forward_ms", prefix))}
    out.update(_profile_once(whole, args.out / "kv_build", sync, activities, sort_by))
    return out


def _profile_first(runner: Runner, prompt, scoring, sampling, args, sync, activities, sort_by) -> dict:
    """A new document's first question in a warmed-up engine: one runner throughout, as an engine
    keeps one. Document A warms up (two questions); B and C are new documents of the same length:
    their prefill and first, second and third questions are timed by phase, and C's first question
    is profiled (`first_question.txt`, by GPU time; `first_question_cpu.txt`, by host time)."""
    cfg = runner.cfg
    gen = torch.Generator().manual_seed(1)
    params = AnswerParams(top_k=args.top_k, scoring=scoring, sampling=sampling)

    def prefill():
        tokens = torch.randint(8, cfg.vocab_size, (args.context,), generator=gen)
        sync()
        t = time.perf_counter()
        doc = prefill_document(runner, tokens, args.chunk_size)
        sync()
        return doc, time.perf_counter() - t

    def ask(doc, question=None):
        question = question or random_question(cfg, gen)
        sync()
        t = time.perf_counter()
        result = [e for e in stream_answer(runner, None, [doc], question, params)][-1]
        sync()
        return {"s": time.perf_counter() - t, "phases": result.trace.timings}

    out = {}
    doc, out["prefill_a_s"] = prefill()
    ask(doc)
    ask(doc)
    del doc
    doc, out["prefill_b_s"] = prefill()
    for name in ("first", "second", "third"):
        out[name] = ask(doc)
        print(name, out[name], flush=True)
    del doc
    doc, out["prefill_c_s"] = prefill()
    question = random_question(cfg, gen)
    out["profiled_first"] = _profile_once(lambda: ask(doc, question), args.out / "first_question", sync, activities,
                                          sort_by)
    return out


def _profile_once(fn, stem: Path, sync, activities, sort_by) -> dict:
    """One call of fn under torch.profiler: `<stem>.txt` (by GPU time) and `<stem>_cpu.txt` (by host
    time) kernel tables, and the wall time against the GPU-busy time."""
    sync()
    with profile(activities=activities) as prof:
        t = time.perf_counter()
        fn()
        sync()
        wall_ms = 1000 * (time.perf_counter() - t)
    stem.with_name(stem.name + ".txt").write_text(prof.key_averages().table(sort_by=sort_by, row_limit=50))
    stem.with_name(stem.name + "_cpu.txt").write_text(prof.key_averages().table(sort_by="cpu_time_total",
                                                                                row_limit=50))
    kernels = kernel_summary(prof, 1)
    return {"profiled_wall_ms": wall_ms, "gpu_busy_ms": sum(k["ms_per_step"] for k in kernels.values()),
            "kernels": sum(k["kernels_per_step"] for k in kernels.values()), "by_kind": kernels}


if __name__ == "__main__":
    main()
