import json

import pytest

from engine.model.config import KNOWN_CONFIGS, ConfigError, ModelConfig, model_config_from_hf
from engine.model.weights import read_model_config


def _dream_json():
    return {"model_type": "Dream", "hidden_size": 3584, "intermediate_size": 18944,
            "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
            "rms_norm_eps": 1e-6, "rope_theta": 1e6, "rope_scaling": None, "vocab_size": 152064,
            "bos_token_id": 151643, "eos_token_id": 151643, "pad_token_id": 151643,
            "mask_token_id": 151666, "tie_word_embeddings": False,
            "max_position_embeddings": 131072}


def _llada_json():
    return {"model_type": "llada", "d_model": 4096, "n_layers": 32, "n_heads": 32,
            "n_kv_heads": 32, "mlp_hidden_size": 12288, "rms_norm_eps": 1e-5, "rope_theta": 5e5,
            "rope_full_precision": True, "vocab_size": 126464, "embedding_size": 126464,
            "weight_tying": False, "eos_token_id": 126081, "pad_token_id": 126081,
            "mask_token_id": 126336, "max_sequence_length": 4096, "include_qkv_bias": False}


def test_dream_fields_and_token_ids():
    special = {"<|beginoftext|>": 151665, "<|im_end|>": 151645, "<|endoftext|>": 151643}
    cfg = model_config_from_hf(_dream_json(), {}, special)
    assert cfg == KNOWN_CONFIGS["dream-7b"]
    assert cfg.head_dim == 128 and cfg.gqa_groups == 7 and cfg.logits_shifted and cfg.qkv_bias
    assert cfg.stop_token_ids == (151643, 151645)
    assert cfg.kv_bytes_per_token() == 57344


def test_llada_fields_and_token_ids():
    special = {"<|eot_id|>": 126348}
    cfg = model_config_from_hf(_llada_json(), {"bos_token_id": 126080}, special)
    assert cfg == KNOWN_CONFIGS["llada-8b"]
    assert not cfg.logits_shifted and cfg.rope_in_fp32 and not cfg.qkv_bias
    assert cfg.kv_bytes_per_token() == 524288


def test_unknown_model_type_is_named():
    with pytest.raises(ConfigError, match="unknown model_type 'gpt2'"):
        model_config_from_hf({"model_type": "gpt2"})


@pytest.mark.parametrize("field", ["hidden_size", "num_hidden_layers", "rope_theta",
                                   "mask_token_id"])
def test_missing_dream_field_is_named(field):
    cfg = _dream_json()
    del cfg[field]
    with pytest.raises(ConfigError, match=field):
        model_config_from_hf(cfg)


@pytest.mark.parametrize("field", ["d_model", "n_layers", "n_heads"])
def test_missing_llada_field_is_named(field):
    cfg = _llada_json()
    del cfg[field]
    with pytest.raises(ConfigError, match=field):
        model_config_from_hf(cfg)


def test_rope_scaling_linear_and_transformers5_layout():
    cfg = _dream_json() | {"rope_scaling": {"type": "linear", "factor": 4.0}}
    assert model_config_from_hf(cfg).rope_scaling_factor == 4.0
    cfg = _dream_json()
    del cfg["rope_theta"]
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 123.0}
    assert model_config_from_hf(cfg).rope_theta == 123.0
    with pytest.raises(ConfigError, match="yarn"):
        model_config_from_hf(_dream_json() | {"rope_scaling": {"type": "yarn", "factor": 4.0}})


def test_invalid_values_rejected():
    with pytest.raises(ConfigError, match="multiple of num_kv_heads"):
        ModelConfig(family="dream", vocab_size=10, hidden_size=8, intermediate_size=8,
                    num_layers=1, num_heads=3, num_kv_heads=2, head_dim=4, rms_norm_eps=1e-6,
                    rope_theta=1e4)
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        ModelConfig(family="llada", vocab_size=10, hidden_size=8, intermediate_size=8,
                    num_layers=1, num_heads=2, num_kv_heads=2, head_dim=4, rms_norm_eps=1e-6,
                    rope_theta=1e4, mask_token_id=99)


def test_config_read_from_folder(dream_dir, llada_dir):
    d = read_model_config(dream_dir)
    tok_ids = json.loads((dream_dir / "added_tokens.json").read_text())
    assert d.family == "dream" and d.bos_token_id == tok_ids["<|beginoftext|>"]
    assert d.mask_token_id == tok_ids["<|mask|>"] and d.eot_token_id == tok_ids["<|im_end|>"]
    l_cfg = read_model_config(llada_dir)
    tok = json.loads((llada_dir / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    assert l_cfg.family == "llada" and l_cfg.bos_token_id == ids["<|startoftext|>"]
    assert l_cfg.eot_token_id == ids["<|eot_id|>"] and l_cfg.mask_token_id == ids["<|mdm_mask|>"]
