"""Numerical parity with the transformers reference models, on tiny random checkpoints.

Dream's tensors are Qwen2's, so `Qwen2ForCausalLM` run bidirectionally (a 4-D all-zeros additive
mask turns causality off) is its reference. LLaDA is a Llama block under other names, so
`LlamaForCausalLM` with the tensors renamed is its reference. Both in fp32, tolerance 1e-5.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file

from engine import Engine
from engine.attention import BACKENDS, dense_mask, full_mask

LLADA_TO_LLAMA = {
    "model.transformer.wte.weight": "model.embed_tokens.weight",
    "model.transformer.ln_f.weight": "model.norm.weight",
    "model.transformer.ff_out.weight": "lm_head.weight",
}
LLADA_BLOCK_TO_LLAMA = {
    "attn_norm": "input_layernorm", "q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj",
    "v_proj": "self_attn.v_proj", "attn_out": "self_attn.o_proj",
    "ff_norm": "post_attention_layernorm", "ff_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
    "ff_out": "mlp.down_proj",
}


def _all_tensors(folder):
    out = {}
    for f in sorted(folder.glob("model-*.safetensors")):
        out |= {k: v.float() for k, v in load_file(str(f)).items()}
    return out


def hf_reference(family: str, folder):
    cfg = json.loads((folder / "config.json").read_text())
    tensors = _all_tensors(folder)
    if family == "dream":
        hf_cfg = transformers.Qwen2Config(
            vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"], num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=cfg["num_attention_heads"],
            num_key_value_heads=cfg["num_key_value_heads"], rms_norm_eps=cfg["rms_norm_eps"],
            rope_theta=cfg["rope_theta"], tie_word_embeddings=False, use_sliding_window=False,
            max_position_embeddings=8192, attn_implementation="eager")
        model = transformers.Qwen2ForCausalLM(hf_cfg)
    else:
        hf_cfg = transformers.LlamaConfig(
            vocab_size=cfg["vocab_size"], hidden_size=cfg["d_model"],
            intermediate_size=cfg["mlp_hidden_size"], num_hidden_layers=cfg["n_layers"],
            num_attention_heads=cfg["n_heads"], num_key_value_heads=cfg["n_kv_heads"],
            rms_norm_eps=cfg["rms_norm_eps"], rope_theta=cfg["rope_theta"],
            attention_bias=False, mlp_bias=False, tie_word_embeddings=False,
            max_position_embeddings=8192, attn_implementation="eager")
        model = transformers.LlamaForCausalLM(hf_cfg)
        renamed = {}
        for name, t in tensors.items():
            if name in LLADA_TO_LLAMA:
                renamed[LLADA_TO_LLAMA[name]] = t
                continue
            _, _, _, n, part, _ = name.split(".")  # model.transformer.blocks.N.part.weight
            renamed[f"model.layers.{n}.{LLADA_BLOCK_TO_LLAMA[part]}.weight"] = t
        tensors = renamed
    model.load_state_dict(tensors, strict=True)
    return model.float().eval()


def hf_logits(model, ids: torch.Tensor, positions: torch.Tensor,
              allowed: torch.Tensor | None = None) -> torch.Tensor:
    """Logits [T, V] under a bidirectional (or `allowed` [T, T]) mask, via a 4-D additive mask."""
    t = ids.shape[-1]
    bias = torch.zeros(1, 1, t, t)
    if allowed is not None:
        bias = bias.masked_fill(~allowed, torch.finfo(torch.float32).min)
    with torch.no_grad():
        return model(input_ids=ids[None], position_ids=positions[None], attention_mask=bias,
                     use_cache=False).logits[0]


def _ids(engine, n, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, engine.config.vocab_size, (n,), generator=gen)


def _gappy_positions(n, seed):
    """Strictly increasing, non-contiguous positions with large gaps (like re-placed chunks)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.cumsum(torch.randint(1, 40, (n,), generator=gen), 0) + 1000


@pytest.fixture(scope="module")
def engines(dream_dir, llada_dir):
    return {
        "dream": (Engine.from_pretrained(dream_dir, device="cpu"), hf_reference("dream", dream_dir)),
        "llada": (Engine.from_pretrained(llada_dir, device="cpu"), hf_reference("llada", llada_dir)),
    }


@pytest.mark.parametrize("family", ["dream", "llada"])
@pytest.mark.parametrize("length", [37, 129])
@pytest.mark.parametrize("positions", ["default", "gappy"])
def test_logits_match_transformers(engines, family, length, positions):
    engine, ref = engines[family]
    ids = _ids(engine, length, seed=length)
    pos = torch.arange(length) if positions == "default" else _gappy_positions(length, length)
    ours = engine.logits(ids, None if positions == "default" else pos)[0]
    theirs = hf_logits(ref, ids, pos)
    diff = (ours - theirs).abs()
    assert diff.max() <= 1e-5, f"max {diff.max():.3e} mean {diff.mean():.3e}"


@pytest.mark.parametrize("family", ["dream", "llada"])
@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_cached_prefix_then_suffix_equals_one_forward(engines, family, backend):
    """Prefix encoded alone (it does not see the suffix), then the suffix over the cached prefix KV,
    equals one full forward under the same mask; checked against transformers too."""
    engine, ref = engines[family]
    model, attn = engine.model, BACKENDS[backend]
    t, p = 53, 31
    ids = _ids(engine, t, seed=7)
    pos = _gappy_positions(t, 7)
    allowed = torch.ones(t, t, dtype=torch.bool)
    allowed[:p, p:] = False  # the prefix never sees the suffix: its KV can be cached
    with torch.no_grad():
        full = model(ids[None], pos[None], dense_mask(allowed[None, None]), attn,
                     logits_rows="all").logits[0]
        prefix = model(ids[None, :p], pos[None, :p], full_mask(), attn, logits_rows="all")
        suffix = model(ids[None, p:], pos[None, p:], full_mask(), attn, past=prefix.kv,
                       logits_rows="all").logits[0]
    split = torch.cat((prefix.logits[0], suffix))
    assert (split - full).abs().max() <= 1e-5
    assert (full - hf_logits(ref, ids, pos, allowed)).abs().max() <= 1e-5


def test_logits_rows_select_without_full_canvas(engines):
    engine, _ = engines["llada"]
    ids = _ids(engine, 40, seed=3)
    pos = torch.arange(40)[None]
    rows = torch.tensor([0, 5, 39])
    with torch.no_grad():
        out = engine.model(ids[None], pos, full_mask(), engine.attention, logits_rows=rows)
        none = engine.model(ids[None], pos, full_mask(), engine.attention)
    assert out.logits.shape == (1, 3, engine.config.vocab_size)
    assert none.logits is None
    assert (out.logits[0] - engine.logits(ids)[0, rows]).abs().max() <= 1e-6


def test_attention_capture_matches_explicit_probs(engines):
    engine, ref = engines["dream"]
    ids = _ids(engine, 24, seed=5)
    rows = torch.tensor([20, 23])
    from engine.model.transformer import AttentionCapture

    with torch.no_grad():
        out = engine.model(ids[None], torch.arange(24)[None], full_mask(), engine.attention,
                           capture=AttentionCapture(layers=(1,), query_rows=rows))
        hf = ref(input_ids=ids[None], attention_mask=torch.zeros(1, 1, 24, 24),
                 output_attentions=True, use_cache=False).attentions[1][0]
    assert set(out.attention) == {1}
    probs = out.attention[1][0]  # [Hq, R, Tk]
    assert probs.shape == (engine.config.num_heads, 2, 24)
    assert (probs - hf[:, rows]).abs().max() <= 1e-6
