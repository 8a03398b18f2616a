"""Model code and the method. Knows nothing of document files, SQLite or Gradio."""

from engine.decode.sampling import DECODERS, SamplingParams
from engine.engine import Engine, GenerationResult
from engine.method.answer import (
    CACHED_KV_MODES,
    KV_MODES,
    AnswerParams,
    AnswerResult,
    AnswerTrace,
    ChunkRef,
    JointAnswer,
    ReadsAlone,
)
from engine.method.chunk_scorer import ScoringParams
from engine.method.kv_cache import DocumentKV
from engine.model.config import KNOWN_CONFIGS, ConfigError, ModelConfig

__all__ = [
    "CACHED_KV_MODES", "DECODERS", "KNOWN_CONFIGS", "KV_MODES", "AnswerParams", "AnswerResult", "AnswerTrace",
    "ChunkRef", "ConfigError", "DocumentKV", "Engine", "GenerationResult", "JointAnswer", "ModelConfig",
    "ReadsAlone", "SamplingParams", "ScoringParams",
]
