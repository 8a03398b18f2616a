"""`docqa-tools bench`: the KV modes side by side on random-weight models at real shapes (no download).

For each context length and answer length, every mode answers the same random-token question over
the same random-token document with the same rule: one token committed per step (LLaDA's schedule
with steps = answer length, stop at EOS off), so random weights cannot change the step count.
Phases come from the answer trace (draft, scoring, selection, kv_build, decode); `prefill` is the
one-time chunked prefill of static/joint; "first" is prefill + the first question; "cached" is a
second, different question on the already prefilled document (the steady state: static reuses the
first question's decode buffers and CUDA graphs); phases and steps are the cached question's,
`first_phases` the first question's. One `Runner` serves the whole run, as one serves an engine's
life in the app: what does not depend on the document (the draft's graph, the prefix's KV) is made
once, in the warm-up.
Where `dense` would take too long, a few of its steps are timed and the rest
extrapolated (marked in the table).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from app.prefilter import candidate_chunks
from engine import CACHED_KV_MODES, KNOWN_CONFIGS, AnswerParams, SamplingParams, ScoringParams
from engine.attention import select_backend
from engine.decode.loop import DecodeStep
from engine.method.answer import stream_answer
from engine.method.kv_cache import DocumentKV, take_chunks
from engine.method.prefill import PREFILL_TOKEN_BUDGET, chunks_per_batch, prefill_document
from engine.method.prompting import QuestionPrompt
from engine.model.config import ModelConfig
from engine.model.weights import random_model
from engine.runner import Runner
from storage.chunk_index import index_texts, search

TINY = replace(KNOWN_CONFIGS["llada-8b"], vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
               num_heads=4, num_kv_heads=2, head_dim=16, mask_token_id=3, bos_token_id=0, eos_token_id=1,
               eot_token_id=2, pad_token_id=1)
SHAPES: dict[str, ModelConfig] = {"dream-7b": KNOWN_CONFIGS["dream-7b"], "llada-8b": KNOWN_CONFIGS["llada-8b"],
                                  "tiny": TINY}
# The app's scorer (a context-free draft, then the likelihood of question + draft under each chunk).
# LLaDA's masked likelihood runs 4 strided folds here, not the app's leave-one-out default
# (one fold per target: about 8x the scoring rows); `docqa-tools bench --llada-folds 0` measures that.
BENCH_SCORING = ScoringParams(scorer="draft_self_information", llada_folds=4)


@dataclass
class BenchRow:
    shape: str
    mode: str
    context: int
    answer: int
    prefill_s: float
    first_question_s: float  # prefill (static/joint) + the first question
    cached_question_s: float  # a second question, document already prefilled
    decode_step_ms: float
    steps: int
    phases: dict[str, float]
    first_phases: dict[str, float]  # the first question's (prefill not included)
    peak_gib: float
    extrapolated: bool
    static_layout: str  # "paged" (split-KV + CUDA graph) or "contiguous"; "-" for other modes
    prefill_tflops: float  # matmul TFLOP/s of the one-time chunked prefill (static / joint)
    prefilter: int = 0  # BM25 candidates the scorer saw (0: every chunk); phases then include "bm25"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_question(cfg: ModelConfig, gen: torch.Generator) -> QuestionPrompt:
    """A random 30-token query after a fixed 11-token prefix: in the app the prefix (BOS,
    instruction, chat header; engine.method.prompting) is the same for every question, the query is not."""
    prefix = torch.randint(8, cfg.vocab_size, (10,), generator=torch.Generator().manual_seed(7)).tolist()
    query = torch.randint(8, cfg.vocab_size, (30,), generator=gen).tolist()
    return QuestionPrompt(prefix_ids=[cfg.bos_token_id] + prefix, query_ids=query, question_span=(2, 26))


def _answer(runner: Runner, doc: DocumentKV, prompt: QuestionPrompt, params: AnswerParams, max_steps: int | None):
    """Runs one answer; with max_steps, stops after that many steps and scales the time linearly
    to the whole answer (every step, and every block, of dense and fastdllm costs the same)."""
    device = runner.device
    _sync(device)
    start = time.perf_counter()
    steps, result = 0, None
    for event in stream_answer(runner, None, [doc], prompt, params):
        if isinstance(event, DecodeStep):
            steps += 1
            if max_steps is not None and steps >= max_steps:
                break
        else:
            result = event
    _sync(device)
    total = time.perf_counter() - start
    if result is None:
        gen = params.sampling.gen_length
        total *= gen / steps
        return total, total / gen, gen, {"decode": total}, True, "-"
    decode = result.trace.timings.get("decode", 0.0)
    return (total, decode / max(result.trace.steps, 1), result.trace.steps, dict(result.trace.timings), False,
            result.trace.static_layout if params.kv_mode == "static" else "-")


def _warm_up(runner: Runner, modes: list[str], chunk_size: int, top_k: int, gen: torch.Generator,
             scoring: ScoringParams) -> None:
    """One untimed question per mode on a document of one full prefill batch: cuBLAS, Triton and
    torch.compile compilation, the allocator's growth to a prefill batch's activations and lazy
    initialisation happen here, not in the first timed context."""
    cfg = runner.cfg
    chunks = max(top_k + 1, chunks_per_batch(chunk_size, PREFILL_TOKEN_BUDGET))
    doc = prefill_document(runner, torch.randint(8, cfg.vocab_size, (chunk_size * chunks,), generator=gen), chunk_size)
    sampling = answer_sampling(32)
    for mode in modes:
        params = AnswerParams(top_k=top_k, kv_mode=mode, sampling=sampling, scoring=scoring)
        _answer(runner, doc, random_question(cfg, gen), params, 2 if mode == "dense" else None)


def synthetic_index(num_chunks: int, gen: torch.Generator, words_per_chunk: int = 350, vocabulary: int = 20000):
    """An FTS5 index over `num_chunks` chunk texts of Zipf-distributed pseudo-words (word frequencies
    like a language's: a few in every chunk, most rare), and a question of such words: what the
    prefilter's BM25 search costs at this many chunks (the random-token KV has no text)."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    codes = torch.randint(0, 26, (vocabulary, 7), generator=gen).tolist()
    words = ["".join(letters[c] for c in code[: 2 + i % 6]) + str(i % 10) for i, code in enumerate(codes)]
    zipf = 1.0 / torch.arange(1, vocabulary + 1, dtype=torch.float64)
    drawn = torch.multinomial(zipf, num_chunks * words_per_chunk, replacement=True, generator=gen)
    drawn = drawn.view(num_chunks, words_per_chunk).tolist()
    conn = index_texts([" ".join(words[w] for w in row) for row in drawn])
    question = " ".join(words[w] for w in torch.multinomial(zipf, 10, generator=gen).tolist())
    return conn, question


def answer_sampling(answer: int, tokens_per_step: int = 1, block_length: int = 32) -> SamplingParams:
    """The benchmarks' decoding: `tokens_per_step` tokens committed at each step (by confidence),
    blocks of at most `block_length`, EOS never ends an answer early."""
    block = min(block_length, answer)
    if block < 1 or answer % block:
        raise ValueError(f"the block of {block} tokens must divide the answer of {answer}")
    if tokens_per_step < 1 or block % tokens_per_step:
        raise ValueError(f"tokens per step ({tokens_per_step}) must divide the block of {block} tokens")
    return SamplingParams(decoder="low_confidence", gen_length=answer, block_length=block,
                          steps=answer // tokens_per_step, stop_at_eos=False)


def candidate_ordinals(conn, question: str, num_chunks: int, m: int) -> list[int]:
    """The chunks the app's prefilter keeps for `question`: BM25's best M, filled as the app fills them."""
    hits = search(conn, question, [0], m)
    return candidate_chunks([(0, h.ordinal) for h in hits], [num_chunks], m)[0]


def _prefiltered(doc: DocumentKV, conn, question: str, m: int) -> tuple[DocumentKV, float]:
    """The document cut to the prefilter's M candidates (BM25 over the synthetic index, filled as
    the app fills them), and the seconds the search and the cut took."""
    device = doc.keys.device
    _sync(device)
    start = time.perf_counter()
    chosen = candidate_ordinals(conn, question, doc.num_chunks, m)
    given = doc if len(chosen) == doc.num_chunks else take_chunks(doc, chosen)  # as the app: no copy of all
    _sync(device)
    return given, time.perf_counter() - start


def matmul_flops_per_token(cfg: ModelConfig) -> float:
    """2 x the parameters a token passes through in the layers (attention scores excluded)."""
    attn = cfg.hidden_size * cfg.head_dim * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)
    return 2.0 * cfg.num_layers * (attn + 3 * cfg.hidden_size * cfg.intermediate_size)


def run(shape: str, contexts: list[int], answers: list[int], modes: list[str], device: str | None,
        chunk_size: int, top_k: int, dense_budget_s: float, progress=print,
        compile_layers: bool = True, scoring: ScoringParams = BENCH_SCORING,
        prefilters: tuple[int, ...] = (0,)) -> list[BenchRow]:
    """`prefilters`: BM25 candidate counts M the selecting modes (static, joint) run with; 0 scores
    every chunk. With M > 0 both questions score only M chunks (phase "bm25": the search over a
    synthetic FTS5 index of as many chunks, and the cut)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    cfg = SHAPES[shape]
    # As an engine's: decode buffers, graphs and the prefix's KV kept across questions.
    runner = Runner.for_model(random_model(cfg, dev, dtype), select_backend(dev, dtype), compile_layers)
    gen = torch.Generator().manual_seed(0)
    _warm_up(runner, modes, chunk_size, top_k, gen, scoring)
    rows = []
    for context in contexts:
        tokens = torch.randint(8, cfg.vocab_size, (context,), generator=gen)
        prompt, second = random_question(cfg, gen), random_question(cfg, gen)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        _sync(dev)
        t = time.perf_counter()
        doc = prefill_document(runner, tokens, chunk_size)  # once, for every mode
        _sync(dev)
        prefill_s = time.perf_counter() - t
        prefill_tflops = matmul_flops_per_token(cfg) * doc.num_chunks * chunk_size / prefill_s / 1e12
        progress(f"{shape} prefill ctx {context}: {prefill_s:.3f} s, {prefill_tflops:.0f} TFLOP/s in the matmuls")
        # Its own generator: the tokens and questions of later contexts stay those of a run without it.
        index = synthetic_index(doc.num_chunks, torch.Generator().manual_seed(context)) if any(prefilters) else None
        dense_step_s = None
        # The method's modes first; the baselines then run without the document's KV resident
        # (they need only its tokens), as a deployment of them would: at 128K tokens LLaDA-8B's
        # KV alone is 64 GiB, and fastdllm's own full-length KV would not fit beside it.
        ordered = [m for m in modes if m in CACHED_KV_MODES] + [m for m in modes if m not in CACHED_KV_MODES]
        runs = [(mode, m) for mode in ordered for m in (prefilters if mode in CACHED_KV_MODES else (0,))]
        for mode, m in runs:
            if mode not in CACHED_KV_MODES and doc.keys.shape[-1]:
                doc = _without_kv(doc)
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
            for answer in answers:
                sampling = answer_sampling(answer)
                if dev.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(dev)
                params = AnswerParams(top_k=top_k, kv_mode=mode, scoring=scoring, sampling=sampling)
                label = f"{mode}+bm25@{m}" if m else mode
                max_steps = None
                if mode == "dense":  # time two steps once per context, then decide whether to extrapolate
                    if dense_step_s is None:
                        probe = replace(sampling, gen_length=min(32, answer), block_length=min(32, answer),
                                        steps=min(32, answer))
                        _, dense_step_s, *_ = _answer(runner, doc, prompt, replace(params, sampling=probe), 2)
                    if dense_step_s * answer > dense_budget_s:
                        max_steps = 2
                elif mode == "fastdllm" and answer > 32 and context * answer > 32768 * 64:
                    max_steps = 32  # one whole block (its full forward and its steps), then x blocks
                try:
                    given, bm25_s = _prefiltered(doc, *index, m) if m else (doc, 0.0)
                    total, step_s, steps, phases, extrapolated, layout = _answer(runner, given, prompt, params,
                                                                                 max_steps)
                    first, first_phases = total + bm25_s, phases | ({"bm25": bm25_s} if m else {})
                    if mode in CACHED_KV_MODES:  # the steady state: a second, different question
                        given, bm25_s = _prefiltered(doc, *index, m) if m else (doc, 0.0)
                        total, step_s, steps, phases, extrapolated, layout = _answer(runner, given, second, params,
                                                                                     max_steps)
                        total, phases = total + bm25_s, phases | ({"bm25": bm25_s} if m else {})
                    del given
                except torch.OutOfMemoryError:  # a mode that does not fit is reported, the others still run
                    progress(f"{shape} {label:>8} ctx {context:>7} ans {answer:>4}: out of memory (no row)")
                    runner.forget()  # frees what the failed question left kept
                    if dev.type == "cuda":
                        torch.cuda.empty_cache()
                    continue
                peak = torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else 0.0
                own_prefill = prefill_s if mode in CACHED_KV_MODES else 0.0
                row = BenchRow(shape, label, context, answer, own_prefill, own_prefill + first, total, 1000 * step_s,
                               steps, phases, first_phases, peak, extrapolated, layout,
                               prefill_tflops if own_prefill else 0.0, m)
                rows.append(row)
                progress(f"{shape} {label:>8} ctx {context:>7} ans {answer:>4}: first {row.first_question_s:8.3f} s, "
                         f"cached {row.cached_question_s:8.3f} s, step {row.decode_step_ms:8.2f} ms"
                         + (" (extrapolated)" if extrapolated else "") + (f" [{layout}]" if layout != "-" else ""))
        del doc
    return sorted(rows, key=lambda r: (r.context, r.answer, modes.index(r.mode.split("+")[0]), r.prefilter))


def _without_kv(doc: DocumentKV) -> DocumentKV:
    """The document's tokens with its KV dropped (zero-width tensors): what dense and fastdllm use."""
    layers, n, hkv, c, _ = doc.keys.shape
    empty = doc.keys.new_empty(layers, n, hkv, c, 0)
    return replace(doc, keys=empty, values=empty)


def table(rows: list[BenchRow]) -> str:
    """Markdown: seconds per question and speed-ups over dense and fastdllm, per context and answer."""
    out = ["| shape | context | answer | mode | prefill s | first question s | cached question s | step ms "
           "| cached vs dense | first vs dense | cached vs fastdllm |", "|---|---|---|---|---|---|---|---|---|---|---|"]

    def ratio(r: BenchRow, mode: str, attr: str) -> str:
        base = next((b for b in rows if b.mode == mode and (b.shape, b.context, b.answer)
                     == (r.shape, r.context, r.answer)), None)
        return f"{base.cached_question_s / getattr(r, attr):.1f}x" if base else "-"

    for r in rows:
        mark = " (extrapolated)" if r.extrapolated else ""
        mode = r.mode + (f" ({r.static_layout})" if r.static_layout != "-" else "")
        out.append(f"| {r.shape} | {r.context} | {r.answer} | {mode} | {r.prefill_s:.3f} | "
                   f"{r.first_question_s:.3f}{mark} | {r.cached_question_s:.3f}{mark} | {r.decode_step_ms:.2f} | "
                   f"{ratio(r, 'dense', 'cached_question_s')} | {ratio(r, 'dense', 'first_question_s')} | "
                   f"{ratio(r, 'fastdllm', 'cached_question_s')} |")
    return "\n".join(out) + "\n\n" + phase_table(rows)


PHASES = ("bm25", "draft", "scoring", "selection", "kv_build", "decode")


def phase_table(rows: list[BenchRow]) -> str:
    """Markdown: each phase of the cached question in ms (the first question's in brackets where it
    differs by more than 1 ms), the prefill's matmul rate and the peak memory."""
    phases = PHASES if any(r.prefilter for r in rows) else tuple(p for p in PHASES if p != "bm25")
    out = ["| shape | context | answer | mode | " + " | ".join(f"{p} ms" for p in phases)
           + " | prefill TFLOP/s | peak GiB |", "|---" * (len(phases) + 6) + "|"]

    def cell(r: BenchRow, phase: str) -> str:
        if phase not in r.phases:
            return "-"
        cached, first = 1000 * r.phases[phase], 1000 * r.first_phases.get(phase, r.phases[phase])
        return f"{cached:.1f}" + (f" ({first:.1f})" if abs(first - cached) > 1.0 else "")

    for r in rows:
        mode = r.mode + (" (extrapolated)" if r.extrapolated else "")
        tflops = f"{r.prefill_tflops:.0f}" if r.prefill_tflops else "-"
        out.append(f"| {r.shape} | {r.context} | {r.answer} | {mode} | " + " | ".join(cell(r, p) for p in phases)
                   + f" | {tflops} | {r.peak_gib:.1f} |")
    return "\n".join(out) + "\n"


def write(rows: list[BenchRow], out_dir: Path, meta: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench.json").write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=1))
    (out_dir / "bench.md").write_text(table(rows))
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: bench.png not drawn (bench.json and bench.md are written)")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for (mode, answer) in sorted({(r.mode, r.answer) for r in rows}):
        pts = sorted((r.context, r.cached_question_s) for r in rows if r.mode == mode and r.answer == answer)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{mode}, {answer} tokens")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context tokens")
    ax.set_ylabel("seconds per question (document cached)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "bench.png", dpi=100)
    plt.close(fig)
