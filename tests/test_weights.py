import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.model.config import ConfigError
from engine.model.random_checkpoint import TinyShape, write_random_checkpoint
from engine.model.weights import INDEX_FILE, CheckpointError, load_model, read_model_config


@pytest.fixture
def dream_copy(dream_dir, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(dream_dir, dst)
    return dst


def _shards(folder):
    return sorted(folder.glob("model-*.safetensors"))


def test_sharded_checkpoint_loads_every_tensor(family_dir):
    _, folder = family_dir
    assert len(_shards(folder)) >= 2, "fixture should exercise the shard index"
    model = load_model(folder)
    assert not any(p.is_meta for p in model.parameters())
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_bf16_on_request(dream_dir):
    model = load_model(dream_dir, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_missing_shard_is_named(dream_copy):
    victim = _shards(dream_copy)[-1]
    victim.unlink()
    with pytest.raises(CheckpointError, match=victim.name):
        load_model(dream_copy)


def test_wrong_shape_is_listed(dream_copy):
    shard = _shards(dream_copy)[0]
    tensors = load_file(str(shard))
    name = next(n for n in tensors if n.endswith("k_proj.weight"))
    tensors[name] = torch.zeros(3, 5, dtype=torch.bfloat16)
    save_file(tensors, str(shard))
    with pytest.raises(CheckpointError, match=rf"{name}: file \(3, 5\)"):
        load_model(dream_copy)


def test_missing_and_unexpected_tensors_are_listed(dream_copy):
    index = json.loads((dream_copy / INDEX_FILE).read_text())
    shard = _shards(dream_copy)[0]
    tensors = load_file(str(shard))
    gone = next(iter(tensors))
    del tensors[gone]
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.zeros(8)
    save_file(tensors, str(shard))
    del index["weight_map"][gone]
    index["weight_map"]["model.layers.0.self_attn.rotary_emb.inv_freq"] = shard.name
    (dream_copy / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(CheckpointError) as err:
        load_model(dream_copy)
    assert f"missing tensors (1): {gone}" in str(err.value)
    assert "unexpected tensors (1): model.layers.0.self_attn.rotary_emb.inv_freq" in str(err.value)


def test_unknown_model_type(dream_copy):
    cfg = json.loads((dream_copy / "config.json").read_text())
    cfg["model_type"] = "mamba"
    (dream_copy / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="unknown model_type 'mamba'"):
        read_model_config(dream_copy)


def test_missing_folder_and_missing_weights(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        read_model_config(tmp_path / "nope")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        read_model_config(tmp_path)


def test_no_weight_files(dream_copy):
    for f in _shards(dream_copy):
        f.unlink()
    (dream_copy / INDEX_FILE).unlink()
    with pytest.raises(CheckpointError, match="neither model.safetensors nor"):
        load_model(dream_copy)


def test_single_file_llada_with_tied_head(tmp_path):
    folder = tmp_path / "tied"
    cfg = write_random_checkpoint(folder, "llada", TinyShape(num_layers=1), max_shard_bytes=10**9)
    assert len(_shards(folder)) == 1
    shard = _shards(folder)[0]
    tensors = load_file(str(shard))
    del tensors["model.transformer.ff_out.weight"]
    shard.unlink()
    (folder / INDEX_FILE).unlink()
    save_file(tensors, str(folder / "model.safetensors"))
    conf = json.loads((folder / "config.json").read_text())
    conf["weight_tying"] = True
    (folder / "config.json").write_text(json.dumps(conf))
    model = load_model(folder)
    assert model.lm_head.weight is model.embed_tokens.weight
    assert model.cfg.tie_word_embeddings and model.cfg.num_layers == cfg.num_layers


def test_fused_projections_compute_what_the_separate_ones_do(family_dir):
    """load_model fuses q/k/v and gate/up; names, state dict and outputs are those of the unfused model."""
    from engine.attention import full_mask, select_backend
    from engine.model.transformer import DiffusionLM

    _, folder = family_dir
    fused = load_model(folder)
    assert all(layer.self_attn.qkv_weight is not None and layer.mlp.gate_up_weight is not None
               for layer in fused.layers)
    plain = DiffusionLM(fused.cfg).eval()
    plain.load_state_dict(fused.state_dict())  # the same keys: nothing fused is saved
    ids = torch.randint(0, fused.cfg.vocab_size, (2, 11))
    pos = torch.arange(11).expand(2, 11)
    backend = select_backend("cpu", torch.float32)
    with torch.inference_mode():
        out_fused = fused(ids, pos, full_mask(), backend, logits_rows="all").logits
        out_plain = plain(ids, pos, full_mask(), backend, logits_rows="all").logits
    torch.testing.assert_close(out_fused, out_plain, atol=1e-5, rtol=1e-5)
    # The separate weights are views of the fused ones: loading a state dict updates both.
    state = {k: torch.zeros_like(v) if k.endswith("k_proj.weight") else v for k, v in fused.state_dict().items()}
    fused.load_state_dict(state)
    kv_rows = slice(fused.cfg.num_heads * fused.cfg.head_dim, None)
    assert fused.layers[0].self_attn.qkv_weight[kv_rows][: fused.cfg.num_kv_heads * fused.cfg.head_dim].abs().sum() == 0


def test_a_loaded_model_saves_again(family_dir, tmp_path):
    """A loaded model (q/k/v and gate/up are views of fused matrices) saves and loads back unchanged."""
    from engine.model.weights import save_weights

    _, folder = family_dir
    model = load_model(folder, dtype=torch.bfloat16)
    out = tmp_path / "again"
    shutil.copytree(folder, out, ignore=shutil.ignore_patterns("*.safetensors", INDEX_FILE))
    save_weights(out, model.cfg, model.state_dict())
    again = load_model(out, dtype=torch.bfloat16)
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_kept_kv_of_a_fused_model_owns_its_memory(family_dir):
    """The KV a forward returns must not keep the fused q/k/v output alive (3x the memory for MHA)."""
    from engine.attention import full_mask, select_backend

    _, folder = family_dir
    model = load_model(folder)
    ids = torch.randint(0, model.cfg.vocab_size, (1, 9))
    with torch.inference_mode():
        out = model(ids, torch.arange(9)[None], full_mask(), select_backend("cpu", torch.float32))
    for k, v in out.kv:
        for t in (k, v):
            assert t.untyped_storage().nbytes() == t.numel() * t.element_size()


def _int8_copy(folder, out):
    from engine.model.weights import save_weights

    model = load_model(folder, dtype=torch.float32)
    shutil.copytree(folder, out, ignore=shutil.ignore_patterns("*.safetensors", INDEX_FILE))
    save_weights(out, model.cfg, model.state_dict(), quantize=True)
    return model


def test_int8_weights_load_within_half_a_step_of_the_originals(family_dir, tmp_path):
    from engine.model.weights import INT8_SCALE_SUFFIX

    family, folder = family_dir
    original = _int8_copy(folder, tmp_path / "int8")
    stored = {k: v for shard in _shards(tmp_path / "int8") for k, v in load_file(str(shard)).items()}
    assert any(v.dtype == torch.int8 for v in stored.values())
    scaled = [k[: -len(INT8_SCALE_SUFFIX)] for k in stored if k.endswith(INT8_SCALE_SUFFIX)]
    assert scaled and all(stored[k].dtype == torch.int8 for k in scaled)
    bf16_bytes = sum(p.numel() * 2 for p in original.state_dict().values())
    assert sum(p.stat().st_size for p in _shards(tmp_path / "int8")) < 0.56 * bf16_bytes
    again = load_model(tmp_path / "int8", dtype=torch.float32)
    for (name, a), (_, b) in zip(original.state_dict().items(), again.state_dict().items(), strict=True):
        if a.dim() == 2:
            step = a.abs().amax(dim=1, keepdim=True) / 127
            assert ((a - b).abs() <= step / 2 + 1e-7).all(), name
        else:
            assert torch.equal(a.to(torch.bfloat16).float(), b), name
    from engine import Engine

    ids = torch.randint(3, original.cfg.vocab_size, (2, 37))  # an odd length
    ref = Engine.from_pretrained(folder, device="cpu").logits(ids)
    got = Engine.from_pretrained(tmp_path / "int8", device="cpu").logits(ids)
    assert (ref - got).abs().max() < 0.05 * ref.abs().max(), family


def test_int8_weights_without_their_scales_are_named(dream_dir, tmp_path):
    from engine.model.weights import INT8_SCALE_SUFFIX

    _int8_copy(dream_dir, tmp_path / "int8")
    shard = _shards(tmp_path / "int8")[0]
    tensors = load_file(str(shard))
    name = next(k for k in tensors if k.endswith(INT8_SCALE_SUFFIX))
    del tensors[name]
    save_file(tensors, str(shard), metadata={"format": "pt"})
    index = json.loads((tmp_path / "int8" / INDEX_FILE).read_text())
    del index["weight_map"][name]
    (tmp_path / "int8" / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="stored in int8 but its scales"):
        load_model(tmp_path / "int8")
