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


def model_defaults(folder: Path | None) -> ModelDefaults:
    """The model's recommended settings (docqa.json), falling back to the method's defaults."""
    if folder is None or not (Path(folder) / "docqa.json").exists():
        return ModelDefaults()
    data = json.loads((Path(folder) / "docqa.json").read_text())
    known = {f.name for f in fields(ModelDefaults)}
    return ModelDefaults(**{k: v for k, v in data.items() if k in known})


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
                                block_length=d.block_length))
