"""`docqa bench`: the KV modes side by side on random-weight models at real shapes (no download).

For each context length and answer length, every mode answers the same random-token question over
the same random-token document with the same rule: one token committed per step (LLaDA's schedule
with steps = answer length, stop at EOS off), so random weights cannot change the step count.
Phases come from the answer trace (draft, scoring, selection, kv_build, decode); `prefill` is the
one-time chunked prefill of static/joint; "cached" is a second question on the already prefilled
document. Where `dense` would take too long, a few of its steps are timed and the rest
extrapolated (marked in the table).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from engine import KNOWN_CONFIGS, AnswerParams, SamplingParams, ScoringParams
from engine.answer import stream_answer
from engine.attention import select_backend
from engine.config import ModelConfig
from engine.decode import DecodeStep
from engine.prefill import prefill_document
from engine.prompting import QuestionPrompt
from engine.weights import random_model

TINY = replace(KNOWN_CONFIGS["llada-8b"], vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
               num_heads=4, num_kv_heads=2, head_dim=16, mask_token_id=3, bos_token_id=0, eos_token_id=1,
               eot_token_id=2, pad_token_id=1)
SHAPES: dict[str, ModelConfig] = {"dream-7b": KNOWN_CONFIGS["dream-7b"], "llada-8b": KNOWN_CONFIGS["llada-8b"],
                                  "tiny": TINY}


@dataclass
class BenchRow:
    shape: str
    mode: str
    context: int
    answer: int
    prefill_s: float
    first_question_s: float  # prefill (static/joint) + the whole answer
    cached_question_s: float  # the answer alone, document already prefilled
    decode_step_ms: float
    steps: int
    phases: dict[str, float]
    peak_gib: float
    extrapolated: bool


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _question(cfg: ModelConfig, gen: torch.Generator) -> QuestionPrompt:
    ids = torch.randint(8, cfg.vocab_size, (40,), generator=gen).tolist()
    return QuestionPrompt(prefix_ids=[cfg.bos_token_id] + ids[:10], query_ids=ids[10:], question_span=(2, 26))


def _answer(model, attention, doc, prompt, params, max_steps: int | None):
    """Runs one answer; with max_steps, stops after that many steps and extrapolates."""
    device = model.embed_tokens.weight.device
    _sync(device)
    start = time.perf_counter()
    steps, step_start, result = 0, None, None
    for event in stream_answer(model, attention, None, [doc], prompt, params):
        if isinstance(event, DecodeStep):
            if step_start is None:
                _sync(device)
                step_start = time.perf_counter()
            steps += 1
            if max_steps is not None and steps >= max_steps:
                break
        else:
            result = event
    _sync(device)
    total = time.perf_counter() - start
    if result is None:  # stopped early: extrapolate the decode to every step
        per_step = (time.perf_counter() - step_start) / max(steps - 1, 1)
        gen = params.sampling.gen_length
        return total + per_step * (gen - steps), per_step, gen, {"decode": per_step * gen}, True
    decode = result.trace.timings.get("decode", 0.0)
    return total, decode / max(result.trace.steps, 1), result.trace.steps, dict(result.trace.timings), False


def run(shape: str, contexts: list[int], answers: list[int], modes: list[str], device: str | None,
        chunk_size: int, top_k: int, dense_budget_s: float, progress=print) -> list[BenchRow]:
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    cfg = SHAPES[shape]
    model = random_model(cfg, dev, dtype)
    attention = select_backend(dev, dtype)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for context in contexts:
        tokens = torch.randint(8, cfg.vocab_size, (context,), generator=gen)
        prompt = _question(cfg, gen)
        for answer in answers:
            sampling = SamplingParams(decoder="low_confidence", gen_length=answer, block_length=min(32, answer),
                                      steps=answer, stop_at_eos=False)
            for mode in modes:
                if dev.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(dev)
                _sync(dev)
                t = time.perf_counter()
                doc = prefill_document(model, attention, tokens, chunk_size)
                _sync(dev)
                prefill_s = time.perf_counter() - t if mode in ("static", "joint") else 0.0
                params = AnswerParams(top_k=top_k, kv_mode=mode, scoring=ScoringParams(scorer="self_information",
                                                                                        llada_folds=4),
                                      sampling=sampling)
                max_steps = None
                if mode == "dense":  # time one step first, then decide whether to extrapolate
                    probe = replace(sampling, gen_length=min(32, answer), block_length=min(32, answer),
                                    steps=min(32, answer))
                    _, per_step, *_ = _answer(model, attention, doc, prompt, replace(params, sampling=probe), 2)
                    if per_step * answer > dense_budget_s:
                        max_steps = 3
                total, step_s, steps, phases, extrapolated = _answer(model, attention, doc, prompt, params, max_steps)
                peak = torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else 0.0
                row = BenchRow(shape, mode, context, answer, prefill_s, prefill_s + total, total, 1000 * step_s, steps,
                               phases, peak, extrapolated)
                rows.append(row)
                progress(f"{shape} {mode:>8} ctx {context:>7} ans {answer:>4}: first {row.first_question_s:8.3f} s, "
                         f"cached {row.cached_question_s:8.3f} s, step {row.decode_step_ms:8.2f} ms"
                         + (" (extrapolated)" if extrapolated else ""))
                del doc
    return rows


def table(rows: list[BenchRow]) -> str:
    """Markdown: seconds per question and speed-ups over dense, per context and answer length."""
    out = ["| shape | context | answer | mode | prefill s | first question s | cached question s | step ms "
           "| cached vs dense |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        dense = next((d for d in rows if d.mode == "dense" and (d.shape, d.context, d.answer)
                      == (r.shape, r.context, r.answer)), None)
        speedup = f"{dense.cached_question_s / r.cached_question_s:.1f}x" if dense else "-"
        mark = " (extrapolated)" if r.extrapolated else ""
        out.append(f"| {r.shape} | {r.context} | {r.answer} | {r.mode} | {r.prefill_s:.3f} | "
                   f"{r.first_question_s:.3f}{mark} | {r.cached_question_s:.3f}{mark} | {r.decode_step_ms:.2f} | "
                   f"{speedup} |")
    return "\n".join(out) + "\n"


def write(rows: list[BenchRow], out_dir: Path, meta: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench.json").write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=1))
    (out_dir / "bench.md").write_text(table(rows))
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
