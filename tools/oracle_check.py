"""Reading without selection: needle questions answered over the chunks that hold the needles.

    python -m tools.oracle_check --model models/docqa-tiny --per-variant 10

Draws NIAH examples as the training does (K chunks, the needles among them, its wording and
haystacks; a seed the training runs do not use), prefills exactly those chunks and answers in
`static` mode with the model's defaults. With K chunks and top-K, every chunk is selected, so a
wrong answer is a reading error (a digit off, a decoy's value, a repeated value), never a
selection error. RULER scores (`docqa-tools eval`) mix both; this separates them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tokenizers import Tokenizer

from app.defaults import answer_params, model_defaults
from engine import Engine
from engine.model.weights import read_model_config
from training.tasks import NIAH_VARIANT_WEIGHTS
from training.train import CHUNK_SIZE, SamplerOptions, make_layout, task_sampler

SEED = 424242  # not a training seed (those are small integers times 1000 plus a worker id)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, default=Path("models/docqa-tiny"))
    ap.add_argument("--data", type=Path, default=Path(".train-data"), help="folder with training.prepare's corpus.pt")
    ap.add_argument("--per-variant", type=int, default=10)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--out", type=Path, default=None, help="JSON with every answer")
    args = ap.parse_args()
    tok = Tokenizer.from_file(str(args.model / "tokenizer.json"))
    cfg = read_model_config(args.model)
    layout = make_layout(args.model, cfg)
    engine = Engine.from_pretrained(args.model, device="cpu")
    params = answer_params(model_defaults(args.model), kv_mode="static", top_k=args.chunks, auto_k=False)
    rows, summary = [], {}
    for variant in NIAH_VARIANT_WEIGHTS:
        sampler = task_sampler(args.data / "corpus.pt", args.model, layout, SEED, SamplerOptions(
            task_weights={"niah": 1, "kv_retrieval": 0, "hotpot": 0, "which_document": 0},
            niah_variant_weights={v: float(v == variant) for v in NIAH_VARIANT_WEIGHTS}))
        scores = []
        for _ in range(args.per_variant):
            example = sampler.niah(args.chunks)
            # Chunks of C - 1 content tokens: prefill re-cuts them at the same places, BOS first.
            assert all(len(c) == CHUNK_SIZE - 1 for c in example.chunks)
            doc = engine.prefill([t for c in example.chunks for t in c], CHUNK_SIZE)
            gold = tok.decode([t for t in example.answer_ids if t != layout.eos]).strip()
            values = [v.strip() for v in gold.split(",")]
            answer = engine.answer(doc, tok.decode(example.question_ids), params).text.strip()
            score = sum(v in answer for v in values) / len(values)
            scores.append(score)
            rows.append({"variant": variant, "score": score, "answer": answer, "gold": gold})
            print(f"{variant:>10} {score:.2f} {answer[:70]!r} vs {gold[:70]!r}", flush=True)
        summary[variant] = 100 * sum(scores) / len(scores)
    summary["mean"] = sum(summary.values()) / len(summary)
    print(json.dumps({k: round(v, 1) for k, v in summary.items()}))
    if args.out:
        args.out.write_text(json.dumps({"model": str(args.model), "seed": SEED, "chunks": args.chunks,
                                        "summary": summary, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
