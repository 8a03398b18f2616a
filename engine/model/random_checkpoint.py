"""Writes small random checkpoints in the exact on-disk formats of Dream and LLaDA.

Used by the tests (parity against transformers, loader errors) and by `docqa-tools make-random-model`
for trying the pipeline before real weights are at hand. Everything is built offline: the
tokenizer is a byte-level BPE trained here on a built-in text.

Dream layout: config.json (model_type "Dream", Qwen2 fields), vocab.json + merges.txt +
added_tokens.json + tokenizer_config.json (tokenizer_class "DreamTokenizer", no tokenizer.json),
Qwen2 tensor names, sharded safetensors + index.
LLaDA layout: config.json (model_type "llada", OLMo fields), tokenizer.json +
tokenizer_config.json (PreTrainedTokenizerFast), `model.transformer.*` tensor names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from engine.model.config import ModelConfig
from engine.model.weights import random_state_dict, save_weights

# Qwen2's pre-tokenizer split pattern (contractions, letters, single digits, punctuation, spaces).
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
               r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

DREAM_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|beginoftext|>", "<|mask|>"]
LLADA_SPECIALS = ["<|startoftext|>", "<|endoftext|>", "<|mdm_mask|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eot_id|>"]

# Qwen2.5-style template: a default system turn, <|im_start|>role\ncontent<|im_end|>\n, no BOS.
DREAM_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# LLaMA-3 style: BOS once, headers, trimmed content, <|eot_id|> per turn.
LLADA_CHAT_TEMPLATE = (
    "{{- bos_token }}{%- for m in messages %}"
    "{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim }}"
    "{{- '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)

_CORPUS_WORDS = tuple((
    "the a an of to in and or is was are were be been it this that with for on at by from as "
    "document page chunk question answer model token diffusion mask cache key value number city "
    "river mountain report table figure section chapter summary result method data year month "
    "day time people work first second third new old large small long short high low good bad "
    "what which who where when why how many much one two three four five six seven eight nine "
    "ten "
).split())


def _training_text(seed: int) -> list[str]:
    gen = torch.Generator().manual_seed(seed)
    lines = []
    for _ in range(600):
        n = int(torch.randint(4, 16, (1,), generator=gen))
        idx = torch.randint(0, len(_CORPUS_WORDS), (n,), generator=gen).tolist()
        num = int(torch.randint(0, 100000, (1,), generator=gen))
        lines.append(" ".join(_CORPUS_WORDS[i] for i in idx).capitalize() + f" {num}.")
    lines.append("Hello, world! It's 2026; UUIDs look like 3f2a-9c1b. Don't panic?")
    return lines


def train_byte_bpe(vocab_size: int, seed: int = 0) -> Tokenizer:
    """A byte-level BPE with Qwen2's normaliser and pre-tokenizer, trained on a built-in text."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_training_text(seed), trainer=trainer)
    return tok


@dataclass(frozen=True)
class TinyShape:
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    bpe_vocab: int = 400


def _padded_vocab(n: int, multiple: int = 64) -> int:
    return (n + multiple - 1) // multiple * multiple


def write_random_checkpoint(folder: str | Path, family: str, shape: TinyShape = TinyShape(),
                            seed: int = 0, max_shard_bytes: int = 200_000,
                            std: float = 0.05) -> ModelConfig:
    """Writes a random checkpoint of `family` ("dream" or "llada") into `folder`; returns its config."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = train_byte_bpe(shape.bpe_vocab, seed)
    specials = DREAM_SPECIALS if family == "dream" else LLADA_SPECIALS
    tok.add_special_tokens(specials)
    ids = {s: tok.token_to_id(s) for s in specials}
    vocab = _padded_vocab(tok.get_vocab_size())  # like Dream, embedding rows beyond the tokenizer
    if family == "dream":
        cfg = ModelConfig(
            family="dream", vocab_size=vocab, hidden_size=shape.hidden_size,
            intermediate_size=shape.intermediate_size, num_layers=shape.num_layers,
            num_heads=shape.num_heads, num_kv_heads=shape.num_kv_heads,
            head_dim=shape.hidden_size // shape.num_heads, rms_norm_eps=1e-6, rope_theta=1e6,
            qkv_bias=True, logits_shifted=True, max_position_embeddings=2048,
            mask_token_id=ids["<|mask|>"], bos_token_id=ids["<|beginoftext|>"],
            eos_token_id=ids["<|endoftext|>"], eot_token_id=ids["<|im_end|>"],
            pad_token_id=ids["<|endoftext|>"])
        _write_dream_files(folder, cfg, tok, ids)
    elif family == "llada":
        cfg = ModelConfig(
            family="llada", vocab_size=vocab, hidden_size=shape.hidden_size,
            intermediate_size=shape.intermediate_size, num_layers=shape.num_layers,
            num_heads=shape.num_heads, num_kv_heads=shape.num_heads,
            head_dim=shape.hidden_size // shape.num_heads, rms_norm_eps=1e-5, rope_theta=5e5,
            rope_in_fp32=True, max_position_embeddings=4096,
            mask_token_id=ids["<|mdm_mask|>"], bos_token_id=ids["<|startoftext|>"],
            eos_token_id=ids["<|endoftext|>"], eot_token_id=ids["<|eot_id|>"],
            pad_token_id=ids["<|endoftext|>"])
        _write_llada_files(folder, cfg, tok, ids)
    else:
        raise ValueError(f"unknown family {family!r}; expected 'dream' or 'llada'")
    write_random_weights(folder, cfg, seed=seed, max_shard_bytes=max_shard_bytes, std=std)
    return cfg


def write_random_weights(folder: Path, cfg: ModelConfig, seed: int = 0,
                         max_shard_bytes: int = 200_000, std: float = 0.05) -> None:
    """Random weights under the checkpoint's own tensor names, in bf16 shards with an index."""
    save_weights(folder, cfg, random_state_dict(cfg, seed, std), max_shard_bytes)


def _dump(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False), encoding="utf-8")


def _write_dream_files(folder: Path, cfg: ModelConfig, tok: Tokenizer, ids: dict[str, int]) -> None:
    _dump(folder / "config.json", {
        "architectures": ["DreamModel"], "model_type": "Dream",
        "auto_map": {"AutoConfig": "configuration_dream.DreamConfig",
                     "AutoModel": "modeling_dream.DreamModel"},
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads, "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings, "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta, "rope_scaling": None, "sliding_window": None,
        "use_sliding_window": False, "tie_word_embeddings": False, "vocab_size": cfg.vocab_size,
        "bos_token_id": cfg.eos_token_id, "eos_token_id": cfg.eos_token_id,
        "pad_token_id": cfg.eos_token_id, "mask_token_id": cfg.mask_token_id,
        "attention_dropout": 0.0, "torch_dtype": "bfloat16",
    })
    _dump(folder / "generation_config.json", {
        "alg": "origin", "eps": 0.001, "steps": 512, "temperature": 0.0,
        "bos_token_id": cfg.eos_token_id, "eos_token_id": cfg.eos_token_id,
        "pad_token_id": cfg.eos_token_id})
    tok.model.save(str(folder))  # vocab.json + merges.txt (the BPE part only)
    _dump(folder / "added_tokens.json", {s: ids[s] for s in DREAM_SPECIALS})
    _dump(folder / "special_tokens_map.json", {
        "bos_token": "<|beginoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
        "mask_token": "<|mask|>", "additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    _dump(folder / "tokenizer_config.json", {
        "tokenizer_class": "DreamTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]},
        "add_bos_token": False, "model_max_length": 131072, "errors": "replace",
        "bos_token": "<|beginoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
        "mask_token": "<|mask|>", "unk_token": None, "clean_up_tokenization_spaces": False,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "added_tokens_decoder": {str(ids[s]): {"content": s, "special": True, "lstrip": False,
                                               "rstrip": False, "normalized": False,
                                               "single_word": False} for s in DREAM_SPECIALS},
        "chat_template": DREAM_CHAT_TEMPLATE,
    })


def llada_config_json(cfg: ModelConfig) -> dict:
    """LLaDA's config.json fields for `cfg` (OLMo names, as the official checkpoints have them)."""
    return {
        "architectures": ["LLaDAModelLM"], "model_type": "llada",
        "d_model": cfg.hidden_size, "n_layers": cfg.num_layers, "n_heads": cfg.num_heads,
        "n_kv_heads": cfg.num_kv_heads, "mlp_hidden_size": cfg.intermediate_size, "mlp_ratio": 4,
        "activation_type": "silu", "block_type": "llama", "block_group_size": 1,
        "layer_norm_type": "rms", "layer_norm_with_affine": True, "bias_for_layer_norm": False,
        "rms_norm_eps": cfg.rms_norm_eps, "attention_layer_norm": False, "include_bias": False,
        "include_qkv_bias": False, "rope": True, "rope_full_precision": True,
        "rope_theta": cfg.rope_theta, "alibi": False, "flash_attention": False,
        "max_sequence_length": cfg.max_position_embeddings, "vocab_size": cfg.vocab_size,
        "embedding_size": cfg.vocab_size, "weight_tying": cfg.tie_word_embeddings, "scale_logits": False,
        "input_emb_norm": False, "eos_token_id": cfg.eos_token_id,
        "pad_token_id": cfg.eos_token_id, "mask_token_id": cfg.mask_token_id,
        "precision": "amp_bf16", "use_cache": False, "init_device": "meta",
    }


def _write_llada_files(folder: Path, cfg: ModelConfig, tok: Tokenizer, ids: dict[str, int]) -> None:
    _dump(folder / "config.json", llada_config_json(cfg))
    _dump(folder / "generation_config.json", {"bos_token_id": cfg.bos_token_id,
                                              "eos_token_id": cfg.eos_token_id})
    tok.save(str(folder / "tokenizer.json"))
    _dump(folder / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False,
        "add_eos_token": False, "bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>", "model_max_length": 10**30,
        "clean_up_tokenization_spaces": False, "chat_template": LLADA_CHAT_TEMPLATE,
    })
