"""Model configuration: one frozen dataclass for both diffusion-LM families.

`model_config_from_hf` turns a Hugging Face `config.json` (plus the generation config and the
tokenizer's special tokens, when known) into a `ModelConfig`. It is a pure function of dicts; reading
the files is `engine.model.weights.read_model_config`'s job.

Families (see shared/docs/reference/MODELS.md):
- "dream" (`model_type` "Dream"): Qwen2 field names, q/k/v biases, logits **shifted** (the token at
  position i is predicted from the hidden state at i - 1).
- "llada" (`model_type` "llada"): OLMo-style field names, no biases, logits **in place**, RoPE
  applied in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FAMILIES = ("dream", "llada")


class ConfigError(ValueError):
    """A checkpoint's config cannot be turned into a ModelConfig (the message names the field)."""


@dataclass(frozen=True, slots=True)
class ModelConfig:
    family: str  # "dream" | "llada"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    # Linear position interpolation factor (positions are divided by it); 1.0 means none.
    rope_scaling_factor: float = 1.0
    # LLaDA upcasts q/k to fp32 for RoPE; Dream applies it in the activation dtype.
    rope_in_fp32: bool = False
    qkv_bias: bool = False
    tie_word_embeddings: bool = False
    # True for Dream: logits at row i predict the token at i + 1.
    logits_shifted: bool = False
    max_position_embeddings: int = 4096
    mask_token_id: int = 0
    bos_token_id: int = 0
    eos_token_id: int = 0
    # End-of-turn token of the chat template (Dream <|im_end|>, LLaDA <|eot_id|>), if any.
    eot_token_id: int | None = None
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ConfigError(f"unknown model family {self.family!r}; expected one of {FAMILIES}")
        positive = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                    "num_kv_heads", "head_dim")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.rope_scaling_factor <= 0:
            raise ConfigError(f"rope scaling factor must be positive, got {self.rope_scaling_factor}")
        ids = {"mask_token_id": self.mask_token_id, "bos_token_id": self.bos_token_id,
               "eos_token_id": self.eos_token_id, "eot_token_id": self.eot_token_id,
               "pad_token_id": self.pad_token_id}
        for name, value in ids.items():
            if value is not None and not 0 <= value < self.vocab_size:
                raise ConfigError(f"{name}={value} is outside the vocabulary (size {self.vocab_size})")
        if self.pad_token_id is not None and self.pad_token_id == self.mask_token_id:
            raise ConfigError("pad_token_id must differ from mask_token_id")

    @property
    def gqa_groups(self) -> int:
        """Query heads served by one KV head."""
        return self.num_heads // self.num_kv_heads

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Tokens that end an answer: EOS and, if the template has one, end-of-turn."""
        ids = [self.eos_token_id]
        if self.eot_token_id is not None and self.eot_token_id != self.eos_token_id:
            ids.append(self.eot_token_id)
        return tuple(ids)

    def kv_bytes_per_token(self, bytes_per_element: int = 2) -> int:
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * bytes_per_element


# Token strings by family, looked up in the tokenizer's vocabulary when the config lacks the id.
_SPECIAL_TOKEN_NAMES = {
    "dream": {"bos": "<|beginoftext|>", "eot": "<|im_end|>", "mask": "<|mask|>",
              "eos": "<|endoftext|>"},
    "llada": {"bos": "<|startoftext|>", "eot": "<|eot_id|>", "mask": "<|mdm_mask|>",
              "eos": "<|endoftext|>"},
}


def _require(cfg: dict[str, Any], key: str, model_type: str) -> Any:
    if key not in cfg or cfg[key] is None:
        raise ConfigError(f"config.json (model_type {model_type!r}) is missing the field {key!r}")
    return cfg[key]


def _rope_theta_and_scaling(cfg: dict[str, Any], model_type: str) -> tuple[float, float]:
    """Reads rope theta and linear scaling from either the legacy or the transformers-5 layout."""
    params = cfg.get("rope_parameters") or {}
    theta = cfg.get("rope_theta", params.get("rope_theta"))
    if theta is None:
        raise ConfigError(f"config.json (model_type {model_type!r}) is missing the field 'rope_theta'")
    scaling = cfg.get("rope_scaling") or (params if params.get("rope_type") else None)
    factor = 1.0
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind == "linear":
            factor = float(scaling["factor"])
        elif kind != "default":
            raise ConfigError(
                f"rope_scaling type {kind!r} is not supported (supported: default, linear); "
                "position-dependent schemes would make cached chunk keys depend on the context")
    return float(theta), factor


def _token_id(explicit: Any, special_tokens: dict[str, int], name: str) -> int | None:
    if isinstance(explicit, list):
        explicit = explicit[0] if explicit else None
    if explicit is not None:
        return int(explicit)
    return special_tokens.get(name)


def model_config_from_hf(
    config: dict[str, Any],
    generation_config: dict[str, Any] | None = None,
    special_tokens: dict[str, int] | None = None,
) -> ModelConfig:
    """Builds a ModelConfig from a Hugging Face config.json dict.

    `special_tokens` maps token strings to ids (from the tokenizer files); it supplies the BOS and
    end-of-turn ids, which the model configs do not carry.
    """
    generation_config = generation_config or {}
    special_tokens = special_tokens or {}
    model_type = config.get("model_type")
    if model_type is None:
        raise ConfigError("config.json has no 'model_type' field")
    if model_type == "Dream" or model_type.lower() == "dream":
        return _dream_config(config, generation_config, special_tokens)
    if model_type.lower() == "llada":
        return _llada_config(config, generation_config, special_tokens)
    raise ConfigError(f"unknown model_type {model_type!r}; supported: 'Dream', 'llada'")


def _dream_config(cfg: dict, gen: dict, special: dict[str, int]) -> ModelConfig:
    mt = "Dream"
    names = _SPECIAL_TOKEN_NAMES["dream"]
    hidden = int(_require(cfg, "hidden_size", mt))
    heads = int(_require(cfg, "num_attention_heads", mt))
    theta, factor = _rope_theta_and_scaling(cfg, mt)
    if cfg.get("use_sliding_window"):
        raise ConfigError("Dream config sets use_sliding_window; sliding-window attention is not supported")
    eos = _token_id(cfg.get("eos_token_id"), special, names["eos"])
    if eos is None:
        raise ConfigError(f"config.json (model_type {mt!r}) is missing the field 'eos_token_id'")
    mask = _token_id(cfg.get("mask_token_id"), special, names["mask"])
    if mask is None:
        raise ConfigError(f"config.json (model_type {mt!r}) is missing the field 'mask_token_id'")
    # The tokenizer's <|beginoftext|> is Dream's BOS; config.bos_token_id is <|endoftext|>.
    bos = special.get(names["bos"], _token_id(cfg.get("bos_token_id"), special, names["eos"]))
    return ModelConfig(
        family="dream",
        vocab_size=int(_require(cfg, "vocab_size", mt)),
        hidden_size=hidden,
        intermediate_size=int(_require(cfg, "intermediate_size", mt)),
        num_layers=int(_require(cfg, "num_hidden_layers", mt)),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        rms_norm_eps=float(_require(cfg, "rms_norm_eps", mt)),
        rope_theta=theta,
        rope_scaling_factor=factor,
        rope_in_fp32=False,
        qkv_bias=True,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        logits_shifted=True,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        mask_token_id=mask,
        bos_token_id=bos if bos is not None else eos,
        eos_token_id=eos,
        eot_token_id=special.get(names["eot"]),
        pad_token_id=_token_id(cfg.get("pad_token_id"), special, names["eos"]),
    )


def _llada_config(cfg: dict, gen: dict, special: dict[str, int]) -> ModelConfig:
    mt = "llada"
    names = _SPECIAL_TOKEN_NAMES["llada"]
    d_model = int(_require(cfg, "d_model", mt))
    heads = int(_require(cfg, "n_heads", mt))
    theta, factor = _rope_theta_and_scaling(cfg, mt)
    if cfg.get("include_bias") or cfg.get("alibi") or cfg.get("attention_layer_norm"):
        raise ConfigError("LLaDA config uses include_bias, alibi or attention_layer_norm, "
                          "which this engine does not implement")
    if cfg.get("block_type", "llama") != "llama":
        raise ConfigError(f"LLaDA block_type {cfg.get('block_type')!r} is not supported (only 'llama')")
    vocab = int(cfg.get("embedding_size") or _require(cfg, "vocab_size", mt))
    mask = _token_id(cfg.get("mask_token_id"), special, names["mask"])
    if mask is None:
        raise ConfigError(f"config.json (model_type {mt!r}) is missing the field 'mask_token_id'")
    eos = _token_id(cfg.get("eos_token_id"), special, names["eos"])
    if eos is None:
        raise ConfigError(f"config.json (model_type {mt!r}) is missing the field 'eos_token_id'")
    bos = _token_id(gen.get("bos_token_id", cfg.get("bos_token_id")), special, names["bos"])
    hidden_mlp = cfg.get("mlp_hidden_size") or int(cfg.get("mlp_ratio", 4) * d_model)
    return ModelConfig(
        family="llada",
        vocab_size=vocab,
        hidden_size=d_model,
        intermediate_size=int(hidden_mlp),
        num_layers=int(_require(cfg, "n_layers", mt)),
        num_heads=heads,
        num_kv_heads=int(cfg.get("n_kv_heads") or heads),
        head_dim=d_model // heads,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
        rope_theta=theta,
        rope_scaling_factor=factor,
        rope_in_fp32=bool(cfg.get("rope_full_precision", True)),
        qkv_bias=bool(cfg.get("include_qkv_bias", False)),
        tie_word_embeddings=bool(cfg.get("weight_tying", False)),
        logits_shifted=False,
        max_position_embeddings=int(cfg.get("max_sequence_length", 4096)),
        mask_token_id=mask,
        bos_token_id=bos if bos is not None else eos,
        eos_token_id=eos,
        eot_token_id=special.get(names["eot"]),
        pad_token_id=_token_id(cfg.get("pad_token_id"), special, names["eos"]),
    )


# Real shapes, for benchmarks with random weights (no download needed). Token ids from MODELS.md.
KNOWN_CONFIGS: dict[str, ModelConfig] = {
    "dream-7b": ModelConfig(
        family="dream", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
        num_layers=28, num_heads=28, num_kv_heads=4, head_dim=128, rms_norm_eps=1e-6,
        rope_theta=1e6, qkv_bias=True, logits_shifted=True, max_position_embeddings=131072,
        mask_token_id=151666, bos_token_id=151665, eos_token_id=151643, eot_token_id=151645,
        pad_token_id=151643),
    "llada-8b": ModelConfig(
        family="llada", vocab_size=126464, hidden_size=4096, intermediate_size=12288,
        num_layers=32, num_heads=32, num_kv_heads=32, head_dim=128, rms_norm_eps=1e-5,
        rope_theta=5e5, rope_in_fp32=True, max_position_embeddings=4096,
        mask_token_id=126336, bos_token_id=126080, eos_token_id=126081, eot_token_id=126348,
        pad_token_id=126081),
}
