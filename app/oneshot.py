"""The model without a library: generating from a prompt, and answering over texts prefilled in
memory (the CLI's `docqa generate` and `docqa answer`). Nothing is stored."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from app.defaults import BUNDLED_MODEL, answer_params, model_defaults
from app.kv_service import prefill_text
from engine import Engine, SamplingParams
from engine.decode.loop import DecodeStep

# (step, block, tokens committed in it, masked slots left)
StepFn = Callable[[int, int, int, int], None]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Generation:
    text: str
    tokens: int
    steps: int
    forward_passes: int
    seconds: float


@dataclass(frozen=True)
class TextCitation:
    """A chunk an answer was read from: which text, where in its tokens, its score and its words."""

    text_index: int  # into the texts given
    chunk: int
    token_start: int
    token_end: int
    score: float
    snippet: str


@dataclass(frozen=True)
class TextAnswer:
    text: str
    steps: int
    forward_passes: int
    timings: dict[str, float]  # seconds per phase
    citations: list[TextCitation]


def generate(prompt: str, model_dir: Path | None = None, *, device: str | None = None, dtype: str | None = None,
             attention: str | None = None, use_chat_template: bool = True, on_step: StepFn | None = None,
             **sampling) -> Generation:
    """Dense diffusion decoding after `prompt`; `sampling`: SamplingParams fields (None keeps the
    generation defaults: threshold decoding at 0.9, 64 tokens in blocks of 32)."""
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    given = {k: v for k, v in sampling.items() if v is not None}
    params = SamplingParams(**({"decoder": "threshold", "gen_length": 64, "block_length": 32, "threshold": 0.9}
                               | given))
    engine = Engine.from_pretrained(model_dir or BUNDLED_MODEL, device=device,
                                    dtype=DTYPES[dtype] if dtype else None, attention=attention)
    for event in engine.stream_generate(prompt, params, use_chat_template=use_chat_template):
        if isinstance(event, DecodeStep):
            if on_step is not None:
                on_step(event.step, event.block, len(event.tokens), event.masked_left)
        else:
            return Generation(event.text, len(event.answer_ids), event.steps, event.forward_passes, event.seconds)
    raise AssertionError("the decode loop ended without a result")


def answer_texts(question: str, texts: Sequence[str], model_dir: Path | None = None, *, device: str | None = None,
                 chunk_size: int | None = None, sampling: dict | None = None, **overrides) -> TextAnswer:
    """Prefills `texts` in memory (the app's chunking) and answers `question` over them with the
    model's defaults; `overrides`: ModelDefaults fields (None keeps the model's), `sampling`:
    further SamplingParams fields (steps, temperature, top_p, top_k, seed)."""
    model_dir = model_dir or BUNDLED_MODEL
    defaults = model_defaults(model_dir)
    params = answer_params(defaults, **overrides)
    if sampling:
        params = replace(params, sampling=replace(params.sampling, **sampling))
    engine = Engine.from_pretrained(model_dir, device=device)
    docs = [prefill_text(engine, text, chunk_size or defaults.chunk_size)[0] for text in texts]
    result = engine.answer(docs, question, params)
    trace = result.trace
    citations = []
    for ref, score in zip(trace.selected, trace.selected_scores, strict=True):
        doc = docs[ref.document]
        start, n = int(doc.content_starts[ref.chunk]), int(doc.lengths[ref.chunk]) - 1
        words = engine.tokenizer.decode(doc.tokens[ref.chunk, 1:1 + n].tolist())
        citations.append(TextCitation(ref.document, ref.chunk, start, start + n, score, " ".join(words.split())))
    return TextAnswer(result.text, trace.steps, trace.forward_passes, dict(trace.timings), citations)
