"""Per-model defaults (a model folder's docqa.json) and the bundled model's location."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields, replace
from pathlib import Path

from engine import AnswerParams, SamplingParams, ScoringParams

BUNDLED_MODEL = Path(__file__).resolve().parents[1] / "models" / "docqa-tiny"


@dataclass(frozen=True)
class ModelDefaults:
    chunk_size: int = 512
    top_k: int = 4
    auto_k: bool = False
    score_margin: float | None = None  # see engine.method.scoring.select_within_margin; 0 or None: no margin rule
    coverage_gain: float | None = None  # see engine.method.scoring.select_by_coverage; 0 or None: off
    token_budget: int = 0
    scorer: str = "draft_self_information"
    llada_folds: int | None = None
    gen_length: int = 64
    block_length: int = 32
    decoder: str = "threshold"
    threshold: float = 0.9
    # The answer's end is committed only after text committed at an earlier step
    # (engine.decode.sampling.defer_early_stops).
    end_after_text: bool = False
    kv_mode: str = "static"
    position_mode: str = "continuous"
    # Chunks the predictive scorer sees, the top ones by BM25 (app.prefilter); 0: every chunk.
    prefilter_chunks: int = 64
    # The same on a CPU, where each candidate costs a CPU's time (None: prefilter_chunks).
    prefilter_chunks_cpu: int | None = None
    # Nats the best BM25 match adds to its chunk's score before selection (others in proportion,
    # app.prefilter.bm25_priors); 0: the predictive scorer alone decides.
    bm25_weight: float = 0.0
    # Below this best selected score (nats) the answer carries the "the documents may not contain
    # this" warning; None: no warning.
    weak_score: float | None = None
    # The model copies its answers from the passages (a lookup reader): an answer that none of the
    # chosen passages contains is then flagged as possibly made up (app.grounding).
    extractive_answers: bool = False
    # What the model answers when its passages lack the fact ("not found"); None: it has no such answer.
    abstain_answer: str | None = None
    # Also read each chosen chunk alone and answer with the one that alone does not abstain
    # (engine.method.reading; static mode without re-selection); needs abstain_answer.
    read_chunks_alone: bool = False
    # With read_chunks_alone: give an answer only where a chosen chunk read alone confirms it, else
    # "not found" (engine.method.reading.confirmed); a confirmed list of like values is completed
    # with the values the other chunks give alone and hold (engine.method.reading.gathered_values).
    confirm_with_lone_reading: bool = False


# What each default does, in a sentence a user reads (the Settings tab lists them with their values).
FIELD_HELP: dict[str, str] = {
    "chunk_size": "Tokens per chunk C (BOS included). Each chunk is encoded once, alone; a change re-encodes "
                  "every document.",
    "top_k": "How many chunks the answer is decoded over (at most; the margin and coverage rules may keep fewer).",
    "auto_k": "Whether K is chosen per question instead of fixed.",
    "score_margin": "Keep only chunks scoring within this many nats of the best (off: 0 or empty).",
    "coverage_gain": "Also keep a chunk when it explains more of the question's tokens by at least this many nats "
                     "a token (off: 0 or empty).",
    "token_budget": "Tokens kept per chosen chunk and per layer and head, the most attended (B; 0 keeps all).",
    "scorer": "How chunks are scored: how well each explains the question (and a short draft answer).",
    "llada_folds": "Masked-likelihood folds per chunk score for models without shifted logits (LLaDA family).",
    "gen_length": "Answer length in tokens (the canvas that is denoised); the answer stops at its end token.",
    "block_length": "Tokens denoised together, block after block.",
    "decoder": "The denoising rule: 'threshold' commits every slot whose confidence passes the threshold.",
    "threshold": "Confidence a slot needs to be committed in a step (at least one is committed each step).",
    "end_after_text": "Decide where the answer ends only after its last words are decoded (a number is not cut "
                      "after its first digit); about one more step an answer.",
    "kv_mode": "'static' decodes over the cached chunk KV as stored; 'joint' re-encodes the chosen chunks "
               "with the question first (slower, for models not trained on chunks).",
    "position_mode": "Where chosen chunks are placed: 'continuous' one after another, 'reuse' at their stored "
                     "positions, 'absolute' at their place in the document.",
    "prefilter_chunks": "Chunks the scorer sees: the best by BM25 keyword search (0: every chunk).",
    "prefilter_chunks_cpu": "The same on a CPU, where each scored chunk costs more time.",
    "bm25_weight": "Nats the best keyword match adds to its chunk's score before selection (0: the scorer alone).",
    "weak_score": "Below this best score (nats) the answer warns that the documents may not contain it.",
    "extractive_answers": "The model copies answers from the passages: an answer none of them contains is flagged.",
    "abstain_answer": "What the model answers when the chosen passages do not hold the fact.",
    "read_chunks_alone": "Static mode: also read each chosen passage alone; where exactly one of them alone "
                         "holds an answer, that answer is given (and that passage cited first).",
    "confirm_with_lone_reading": "With read_chunks_alone: give an answer only where a chosen passage read alone "
                                 "gives it too; otherwise say it was not found. A confirmed list also gets the "
                                 "values other passages give alone and contain.",
}


def model_defaults(folder: Path | None) -> ModelDefaults:
    """The model's recommended settings (docqa.json), falling back to the method's defaults."""
    if folder is None or not (Path(folder) / "docqa.json").exists():
        return ModelDefaults()
    data = json.loads((Path(folder) / "docqa.json").read_text())
    known = {f.name for f in fields(ModelDefaults)}
    return ModelDefaults(**{k: v for k, v in data.items() if k in known})


# The ModelDefaults fields a question's AnswerParams come from (`answer_params`); the others are
# the app's (chunking, the prefilter, warnings).
ANSWER_FIELDS = ("top_k", "auto_k", "score_margin", "coverage_gain", "token_budget", "bm25_weight", "kv_mode",
                 "position_mode", "scorer", "llada_folds", "decoder", "threshold", "gen_length", "block_length",
                 "end_after_text", "read_chunks_alone", "abstain_answer", "confirm_with_lone_reading")


def parse_overrides(items: list[str], allowed: tuple[str, ...] = ANSWER_FIELDS) -> dict[str, object]:
    """Pure: ["bm25_weight=4", "top_k=2"] -> {field: value}, each value of its ModelDefaults field's
    type (a rule with an "off" value takes 0, as in `answer_params`); only the `allowed` fields.
    ValueError names a bad item."""
    kinds = {f.name: str(f.type) for f in fields(ModelDefaults) if f.name in allowed}
    out: dict[str, object] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name, text = name.strip(), text.strip()
        if not sep or name not in kinds:
            raise ValueError(f"{item!r}: expected NAME=VALUE with NAME one of {', '.join(kinds)}")
        kind = kinds[name]
        try:
            if kind.startswith("bool"):
                if text.lower() not in ("true", "false", "1", "0"):
                    raise ValueError("expected true or false")
                out[name] = text.lower() in ("true", "1")
            elif kind.startswith("int"):
                out[name] = int(text)
            elif kind.startswith("float"):
                out[name] = float(text)
            else:
                out[name] = text
        except ValueError as e:
            raise ValueError(f"{item!r}: {name} is {kind} ({e})") from None
    return out


def prefilter_for(defaults: ModelDefaults, device_type: str) -> int:
    """The model's M for a device: its CPU value on a CPU when it has one."""
    if device_type == "cpu" and defaults.prefilter_chunks_cpu is not None:
        return defaults.prefilter_chunks_cpu
    return defaults.prefilter_chunks


def answer_params(defaults: ModelDefaults, **overrides) -> AnswerParams:
    """AnswerParams from model defaults; `overrides` (ModelDefaults field names, None = keep) win.
    A score margin or coverage gain of 0 turns that rule off. An answer length
    that the model's block length does not divide is decoded in the largest block that divides both
    (a 96-token answer with 64-token blocks: blocks of 32); a block length given explicitly is kept."""
    d = replace(defaults, **{k: v for k, v in overrides.items() if v is not None})
    if overrides.get("block_length") is None:
        d = replace(d, block_length=math.gcd(d.gen_length, d.block_length))
    return AnswerParams(
        top_k=d.top_k, auto_k=d.auto_k, score_margin=d.score_margin or None, coverage_gain=d.coverage_gain or None,
        token_budget=d.token_budget, prior_weight=d.bm25_weight, kv_mode=d.kv_mode, position_mode=d.position_mode,
        scoring=ScoringParams(scorer=d.scorer, llada_folds=d.llada_folds),
        sampling=SamplingParams(decoder=d.decoder, threshold=d.threshold, gen_length=d.gen_length,
                                block_length=d.block_length, end_after_text=d.end_after_text),
        read_chunks_alone=d.read_chunks_alone, abstain_answer=d.abstain_answer,
        # confirmation is a rule of the lone readings: turning them off turns it off
        confirm_with_lone_reading=d.confirm_with_lone_reading and d.read_chunks_alone)
