"""The bundled model: its files, its defaults, and that it answers from a document on the CPU."""

from __future__ import annotations

import json

import pytest

from app.defaults import BUNDLED_MODEL, answer_params, model_defaults
from engine import Engine
from engine.model.weights import read_model_config
from training.tasks import REPEAT_HAYSTACK


def test_bundled_files_fit_the_size_limits():
    weights = sorted(BUNDLED_MODEL.glob("*.safetensors"))
    assert len(weights) >= 2
    assert all(p.stat().st_size <= 15_000_000 for p in weights)
    assert sum(p.stat().st_size for p in weights) <= 32_000_000  # int8 with per-row scales at rest
    cfg = read_model_config(BUNDLED_MODEL)
    # LLaDA-style: in-place prediction, grouped-query attention with KV heads from n_kv_heads.
    assert cfg.family == "llada" and not cfg.logits_shifted and cfg.num_heads % cfg.num_kv_heads == 0
    assert 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2 <= 6 * 1024  # KV bytes a token in bf16
    assert json.loads((BUNDLED_MODEL / "config.json").read_text())["n_kv_heads"] == cfg.num_kv_heads
    assert json.loads((BUNDLED_MODEL / "tokenizer_config.json").read_text())["chat_template"]
    d = model_defaults(BUNDLED_MODEL)
    assert d.chunk_size == 128 and d.scorer == "self_information"
    # The whole answer in one block, as it was trained (fewer misread lists).
    assert d.block_length == d.gen_length == 64


def test_block_length_divides_the_asked_answer_length():
    d = model_defaults(BUNDLED_MODEL)
    assert answer_params(d).sampling.block_length == 64
    assert answer_params(d, gen_length=96).sampling.block_length == 32  # 64 does not divide 96
    assert answer_params(d, gen_length=128).sampling.block_length == 64
    assert answer_params(d, gen_length=128, block_length=32).sampling.block_length == 32  # asked for
    with pytest.raises(ValueError, match="multiple of block_length"):
        answer_params(d, gen_length=96, block_length=64)  # asked for, so not changed


@pytest.fixture(scope="module")
def engine():
    return Engine.from_pretrained(BUNDLED_MODEL, device="cpu")


@pytest.mark.parametrize("key,value,depth", [("quiet-harbor", "4729135", 0.3), ("amber-falcon", "8316402", 0.8)])
@pytest.mark.parametrize("mode", ["static", "joint"])
def test_finds_a_needle_in_a_4k_haystack(engine, key, value, depth, mode):
    filler = [REPEAT_HAYSTACK] * 50  # about 4,000 tokens
    filler.insert(int(depth * len(filler)), f"One of the special magic numbers for {key} is: {value}.")
    doc = engine.prefill_text(" ".join(filler), model_defaults(BUNDLED_MODEL).chunk_size)
    question = f"What is the special magic number for {key} mentioned in the provided text?"
    result = engine.answer(doc, question, answer_params(model_defaults(BUNDLED_MODEL), kv_mode=mode))
    assert result.text == value
    holding = [i for i in range(doc.num_chunks)
               if value[:3] in engine.tokenizer.decode(doc.tokens[i, 1:int(doc.lengths[i])].tolist())]
    assert any(r.chunk in holding for r in result.trace.selected)


@pytest.mark.parametrize("key,values", [("quiet-harbor", ["5285656", "7015227", "9892593", "1486626"]),
                                        ("misty-canyon", ["7388057", "2710846", "5183075", "1220019"])])
def test_a_list_answer_holds_every_value_the_chosen_chunks_state(engine, key, values):
    """Four values of one key in four chunks: here the reading over all four lists three (repeating
    one), and the chunks read alone give the fourth (engine.method.reading.gathered_values). Should a
    retrained model list all four at once, `gathered_from` is empty and these cases no longer test
    the gathering: pick others (a haystack as below, other keys) where it does."""
    filler = [REPEAT_HAYSTACK] * 50
    for j, value in enumerate(values):
        filler.insert(int((0.15 + 0.22 * j) * len(filler)), f"One of the special magic numbers for {key} is: {value}.")
    doc = engine.prefill_text(" ".join(filler), model_defaults(BUNDLED_MODEL).chunk_size)
    question = f"What are all the special magic numbers for {key} mentioned in the provided text?"
    result = engine.answer(doc, question, answer_params(model_defaults(BUNDLED_MODEL)))
    given = result.text.split(", ")
    assert sorted(given) == sorted(values)  # each value once
    assert result.trace.gathered_from and result.trace.answered_from is not None
    for i in result.trace.gathered_from:  # each added value is one its chunk gave alone
        assert set(result.trace.lone_answers[i].split(", ")) <= set(values)
