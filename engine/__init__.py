"""Model code and the method. Knows nothing of document files, SQLite or Gradio."""

from engine.answer import CACHED_KV_MODES, KV_MODES, AnswerParams, AnswerResult, AnswerTrace, ChunkRef
from engine.chunk_scorer import ScoringParams
from engine.config import KNOWN_CONFIGS, ConfigError, ModelConfig
from engine.engine import Engine, GenerationResult
from engine.kv_cache import DocumentKV
from engine.sampling import DECODERS, SamplingParams

__all__ = [
    "CACHED_KV_MODES", "DECODERS", "KNOWN_CONFIGS", "KV_MODES", "AnswerParams", "AnswerResult", "AnswerTrace",
    "ChunkRef", "ConfigError", "DocumentKV", "Engine", "GenerationResult", "ModelConfig", "SamplingParams",
    "ScoringParams",
]
