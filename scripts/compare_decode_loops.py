"""The queued decoding loop against the synchronous one, same process, same question, same commits.

    python scripts/compare_decode_loops.py --shape dream-7b --context 32768   # needs CUDA for real numbers

Random weights at the real shape. "low_confidence" with one commit per step takes the queued loop
(engine.decode.decode_queued); "threshold" with tau = 1.0 commits exactly the most confident slot
each step too (no random-weight probability reaches 1.0), through the synchronous loop. Both run
alternately, several times, over the same cached document (paged route, graphs reused); prints the
decode phase per step and checks that both committed the same answer.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from app.bench import SHAPES, _question
from engine import AnswerParams, SamplingParams, ScoringParams
from engine.answer import AnswerResult, stream_answer
from engine.attention import select_backend
from engine.compiled_layers import layer_functions_for
from engine.paged_decode import PagedDecodeCache
from engine.prefill import prefill_document
from engine.weights import random_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="dream-7b", choices=sorted(SHAPES))
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--answer", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    cfg = SHAPES[args.shape]
    model = random_model(cfg, dev, dtype)
    attention = select_backend(dev, dtype)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(8, cfg.vocab_size, (args.context,), generator=gen)
    doc = prefill_document(model, attention, tokens, 512, layer_fns=layer_functions_for(dev, True, dynamic=True))
    prompt = _question(cfg, gen)
    cache = PagedDecodeCache()
    block = min(32, args.answer)
    loops = {
        "queued": SamplingParams(decoder="low_confidence", gen_length=args.answer, block_length=block,
                                 steps=args.answer, stop_at_eos=False),
        "synchronous": SamplingParams(decoder="threshold", threshold=1.0, gen_length=args.answer,
                                      block_length=block, stop_at_eos=False),
    }
    step_ms: dict[str, list[float]] = {name: [] for name in loops}
    answers: dict[str, list[int]] = {}
    for rep in range(args.repeats + 1):  # the first round compiles and captures
        for name, sampling in loops.items():
            params = AnswerParams(top_k=4, sampling=sampling, scoring=ScoringParams(scorer="self_information"))
            result = [e for e in stream_answer(model, attention, None, [doc], prompt, params, cache)][-1]
            assert isinstance(result, AnswerResult)
            answers[name] = result.answer_ids
            if rep:
                step_ms[name].append(1000 * result.trace.timings["decode"] / result.trace.steps)
    summary = {name: {"median_step_ms": statistics.median(v), "all": [round(x, 3) for x in v]}
               for name, v in step_ms.items()}
    summary["same_answer"] = answers["queued"] == answers["synchronous"]
    print(json.dumps({"shape": args.shape, "context": args.context, "answer": args.answer, **summary}, indent=1))


if __name__ == "__main__":
    main()
