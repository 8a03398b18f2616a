"""Tokenizers load from the folder with no remote code and agree id for id with the trained one."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer

from engine.model.random_checkpoint import DREAM_SPECIALS, TinyShape, train_byte_bpe
from engine.model.tokenizer import TokenizerError, encode_prompt, load_tokenizer
from engine.model.weights import read_model_config

TEXTS = ["Hello world <|mask|> 123 it's   ÉTÉ café\n\nnew line", "  leading spaces\tand tabs",
         "Ünïcödé e\u0301 (NFC) 😀 and 3f2a-9c1b"]


def test_dream_vocab_merges_equal_qwen2_style_bpe(dream_dir):
    cfg = read_model_config(dream_dir)
    tok = load_tokenizer(dream_dir, cfg)
    reference = train_byte_bpe(TinyShape().bpe_vocab, seed=1)
    reference.add_special_tokens(DREAM_SPECIALS)
    for text in TEXTS:
        assert tok(text, add_special_tokens=False)["input_ids"] == reference.encode(text).ids
        assert tok.decode(reference.encode(text).ids) == reference.decode(
            reference.encode(text).ids, skip_special_tokens=False)
    assert tok.convert_tokens_to_ids("<|mask|>") == cfg.mask_token_id
    assert tok.bos_token_id == cfg.bos_token_id


def test_llada_tokenizer_json(llada_dir):
    cfg = read_model_config(llada_dir)
    tok = load_tokenizer(llada_dir, cfg)
    reference = Tokenizer.from_file(str(llada_dir / "tokenizer.json"))
    for text in TEXTS:
        assert tok(text, add_special_tokens=False)["input_ids"] == reference.encode(text).ids


def test_chat_templates(dream_dir, llada_dir):
    d_tok = load_tokenizer(dream_dir, read_model_config(dream_dir))
    text = d_tok.decode(encode_prompt(d_tok, "Hi there"))
    assert text == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")
    l_cfg = read_model_config(llada_dir)
    l_tok = load_tokenizer(llada_dir, l_cfg)
    ids = encode_prompt(l_tok, [{"role": "user", "content": " Hi there "}])
    assert ids[0] == l_cfg.bos_token_id and ids.count(l_cfg.bos_token_id) == 1
    assert l_tok.decode(ids) == ("<|startoftext|><|start_header_id|>user<|end_header_id|>\n\n"
                                 "Hi there<|eot_id|><|start_header_id|>assistant"
                                 "<|end_header_id|>\n\n")
    plain = encode_prompt(l_tok, "Hi", use_chat_template=False)
    assert l_cfg.bos_token_id not in plain


def test_missing_tokenizer_files(dream_dir, tmp_path):
    cfg = read_model_config(dream_dir)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({}))
    with pytest.raises(TokenizerError, match="neither tokenizer.json"):
        load_tokenizer(tmp_path, cfg)
