"""Model code and the method. Knows nothing of files of documents, SQLite or Gradio."""

from engine.config import KNOWN_CONFIGS, ConfigError, ModelConfig
from engine.engine import Engine, GenerationResult
from engine.sampling import DECODERS, SamplingParams

__all__ = ["DECODERS", "KNOWN_CONFIGS", "ConfigError", "Engine", "GenerationResult", "ModelConfig",
           "SamplingParams"]
