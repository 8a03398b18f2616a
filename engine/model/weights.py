"""Loading a local Hugging Face checkpoint folder: config, special tokens and safetensors weights.

Explicit name maps (checkpoint name -> our parameter name) for each family; strict checks: every
parameter loaded, nothing unexpected, every shape right, or one error that lists all problems.
The model is built on the meta device and each tensor is read straight to its target device and
dtype, so the weights are never held twice.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import safe_open

from engine.model.config import ModelConfig, model_config_from_hf
from engine.model.transformer import DiffusionLM

logger = logging.getLogger(__name__)

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Weights at rest in int8 (`save_weights(..., quantize=True)`): each matrix as int8 with one scale
# per output row beside it, under its name plus this suffix; w = q * scale[:, None], |q| <= 127.
INT8_SCALE_SUFFIX = ".int8_scale"


class CheckpointError(RuntimeError):
    """A checkpoint folder is missing files or holds tensors that do not fit the config."""


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from None


def read_special_tokens(folder: Path) -> dict[str, int]:
    """Token string -> id for the tokenizer's added/special tokens, from whichever files exist."""
    tokens: dict[str, int] = {}
    tok_json = folder / "tokenizer.json"
    if tok_json.exists():
        for entry in _read_json(tok_json).get("added_tokens", []):
            tokens[entry["content"]] = int(entry["id"])
    added = folder / "added_tokens.json"
    if added.exists():
        tokens.update({k: int(v) for k, v in _read_json(added).items()})
    tok_cfg = folder / "tokenizer_config.json"
    if tok_cfg.exists():
        for idx, entry in _read_json(tok_cfg).get("added_tokens_decoder", {}).items():
            tokens[entry["content"]] = int(idx)
    return tokens


def read_model_config(folder: str | Path) -> ModelConfig:
    """Builds the ModelConfig of a checkpoint folder (config.json + generation config + tokens)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"model folder {folder} does not exist or is not a folder")
    config = _read_json(folder / "config.json")
    gen_path = folder / "generation_config.json"
    generation = _read_json(gen_path) if gen_path.exists() else {}
    return model_config_from_hf(config, generation, read_special_tokens(folder))


def checkpoint_name_map(cfg: ModelConfig) -> dict[str, str]:
    """Checkpoint tensor name -> DiffusionLM parameter name, for every tensor the file must hold."""
    if cfg.family == "dream":  # Qwen2 names, identical to ours after the "model." prefix
        names = {
            "model.embed_tokens.weight": "embed_tokens.weight",
            "model.norm.weight": "norm.weight",
        }
        per_layer = {
            "input_layernorm.weight": "input_layernorm.weight",
            "self_attn.q_proj.weight": "self_attn.q_proj.weight",
            "self_attn.k_proj.weight": "self_attn.k_proj.weight",
            "self_attn.v_proj.weight": "self_attn.v_proj.weight",
            "self_attn.o_proj.weight": "self_attn.o_proj.weight",
            "post_attention_layernorm.weight": "post_attention_layernorm.weight",
            "mlp.gate_proj.weight": "mlp.gate_proj.weight",
            "mlp.up_proj.weight": "mlp.up_proj.weight",
            "mlp.down_proj.weight": "mlp.down_proj.weight",
        }
        if cfg.qkv_bias:
            per_layer |= {f"self_attn.{p}_proj.bias": f"self_attn.{p}_proj.bias" for p in "qkv"}
        layer_prefix, head = "model.layers.{i}.", "lm_head.weight"
    else:  # LLaDA: OLMo-style names; two different ff_out tensors (block MLP and LM head)
        names = {
            "model.transformer.wte.weight": "embed_tokens.weight",
            "model.transformer.ln_f.weight": "norm.weight",
        }
        per_layer = {
            "attn_norm.weight": "input_layernorm.weight",
            "q_proj.weight": "self_attn.q_proj.weight",
            "k_proj.weight": "self_attn.k_proj.weight",
            "v_proj.weight": "self_attn.v_proj.weight",
            "attn_out.weight": "self_attn.o_proj.weight",
            "ff_norm.weight": "post_attention_layernorm.weight",
            "ff_proj.weight": "mlp.gate_proj.weight",  # the SiLU-gated branch
            "up_proj.weight": "mlp.up_proj.weight",
            "ff_out.weight": "mlp.down_proj.weight",
        }
        if cfg.qkv_bias:
            per_layer |= {f"{p}_proj.bias": f"self_attn.{p}_proj.bias" for p in "qkv"}
        layer_prefix, head = "model.transformer.blocks.{i}.", "model.transformer.ff_out.weight"
    for i in range(cfg.num_layers):
        src, dst = layer_prefix.format(i=i), f"layers.{i}."
        names |= {src + k: dst + v for k, v in per_layer.items()}
    if not cfg.tie_word_embeddings:
        names[head] = "lm_head.weight"
    return names


def tied_head_name(cfg: ModelConfig) -> str:
    return "lm_head.weight" if cfg.family == "dream" else "model.transformer.ff_out.weight"


def weight_files(folder: Path) -> dict[str, Path]:
    """Tensor name -> file, from the shard index or the single safetensors file."""
    index = folder / INDEX_FILE
    if index.exists():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index} has no 'weight_map'")
        missing = sorted({f for f in weight_map.values() if not (folder / f).exists()})
        if missing:
            raise CheckpointError(f"{folder}: shard file(s) listed in {INDEX_FILE} are missing: "
                                  + ", ".join(missing))
        return {name: folder / f for name, f in weight_map.items()}
    single = folder / SINGLE_FILE
    if single.exists():
        with safe_open(str(single), framework="pt") as f:
            return {name: single for name in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
    raise CheckpointError(f"{folder} holds neither {SINGLE_FILE} nor {INDEX_FILE}")


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on GPU, fp32 on CPU."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def cpu_has_native_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU multiplies bf16 natively (AVX-512 BF16 or AMX): there a bf16 matmul runs
    2-2.5x an fp32 one; elsewhere it is emulated, and slower. False where it cannot be told."""
    try:
        flags = next((line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")), "")
    except OSError:
        return False
    return bool({"avx512_bf16", "amx_bf16"} & set(flags.split()))


def _assign_state(model: DiffusionLM, state: dict[str, torch.Tensor]) -> None:
    """Moves `state`'s tensors into a meta-built model (no copy), keeping a tied head tied."""
    tied = model.cfg.tie_word_embeddings
    if tied:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    model.load_state_dict(state, strict=True, assign=True)
    if tied:
        model.lm_head.weight = model.embed_tokens.weight


def load_model(folder: str | Path, cfg: ModelConfig | None = None,
               device: torch.device | str | None = None,
               dtype: torch.dtype | None = None) -> DiffusionLM:
    """Builds the model on meta, then loads every tensor strictly onto `device` in `dtype`."""
    folder = Path(folder)
    cfg = cfg or read_model_config(folder)
    device = torch.device(device or "cpu")
    dtype = dtype or default_dtype(device)
    with torch.device("meta"):
        model = DiffusionLM(cfg)
    expected = {name: p.shape for name, p in model.named_parameters()}
    name_map = checkpoint_name_map(cfg)
    files = weight_files(folder)
    ignorable = {tied_head_name(cfg)} if cfg.tie_word_embeddings else set()

    scales = {name for name in files if name.endswith(INT8_SCALE_SUFFIX)}
    missing = sorted(set(name_map) - set(files))
    unexpected = sorted(set(files) - set(name_map) - ignorable - scales)
    problems = []
    if missing:
        problems.append(f"missing tensors ({len(missing)}): " + ", ".join(missing[:20]))
    if unexpected:
        problems.append(f"unexpected tensors ({len(unexpected)}): " + ", ".join(unexpected[:20]))
    if problems:
        raise CheckpointError(f"{folder}: checkpoint does not match the {cfg.family} config: "
                              + "; ".join(problems))

    state: dict[str, torch.Tensor] = {}
    wrong_shape = []
    by_file: dict[Path, list[str]] = {}
    for src in name_map:
        by_file.setdefault(files[src], []).append(src)
    for path, names in by_file.items():
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for src in names:
                dst = name_map[src]
                shape = tuple(f.get_slice(src).get_shape())
                if shape != tuple(expected[dst]):
                    wrong_shape.append(f"{src}: file {shape}, expected {tuple(expected[dst])}")
                    continue
                tensor = f.get_tensor(src)
                if tensor.dtype == torch.int8:
                    tensor = _dequantize(tensor, src, files, folder)
                state[dst] = tensor.to(device=device, dtype=dtype)
    if wrong_shape:
        raise CheckpointError(f"{folder}: tensors with the wrong shape: " + "; ".join(wrong_shape))
    _assign_state(model, state)
    del state  # the model holds the tensors now; fusing then frees each separate weight as it goes
    leftover = [n for n, p in model.named_parameters() if p.is_meta]
    if leftover:
        raise CheckpointError(f"{folder}: parameters left unloaded: {', '.join(leftover)}")
    model.fuse_projections()
    model.eval()
    logger.info("loaded %s (%s, %d layers) on %s as %s", folder, cfg.family, cfg.num_layers,
                device, dtype)
    return model


def _dequantize(q: torch.Tensor, name: str, files: dict[str, Path], folder: Path) -> torch.Tensor:
    """fp32 weights from an int8 matrix and its per-row scales (see INT8_SCALE_SUFFIX)."""
    scale_name = name + INT8_SCALE_SUFFIX
    if scale_name not in files:
        raise CheckpointError(f"{folder}: {name} is stored in int8 but its scales ({scale_name}) are missing")
    with safe_open(str(files[scale_name]), framework="pt", device="cpu") as f:
        scale = f.get_tensor(scale_name).float()
    if scale.shape != (q.shape[0],):
        raise CheckpointError(f"{folder}: {scale_name} has shape {tuple(scale.shape)}, expected ({q.shape[0]},)")
    return q.float() * scale[:, None]


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8: (q int8 [out, in], scale fp32 [out]) with w ~ q * scale[:, None]; the
    rounding error of an entry is at most half its row's scale."""
    w = w.float()
    scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127.0
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def random_state_dict(cfg: ModelConfig, seed: int = 0, std: float = 0.05,
                      device: torch.device | str = "cpu",
                      dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Random parameters for DiffusionLM(cfg) by our parameter names, drawn on `device` in `dtype`.

    Norm weights are near 1, everything else N(0, std). For tests and for benchmarks at real shapes
    (speed does not depend on the weight values).
    """
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.device("meta"):
        shapes = {n: p.shape for n, p in DiffusionLM(cfg).named_parameters()}
    state = {}
    for name, shape in shapes.items():
        t = torch.randn(shape, generator=gen, device=device, dtype=dtype)
        is_norm = name.endswith("layernorm.weight") or name == "norm.weight"
        state[name] = t.mul_(0.1).add_(1.0) if is_norm else t.mul_(std)
    return state


def random_model(cfg: ModelConfig, device: torch.device | str, dtype: torch.dtype, seed: int = 0,
                 std: float = 0.02) -> DiffusionLM:
    """A DiffusionLM with random weights built directly on `device` in `dtype` (no fp32 copy)."""
    with torch.device("meta"):
        model = DiffusionLM(cfg)
    _assign_state(model, random_state_dict(cfg, seed, std, device, dtype))
    model.fuse_projections()
    return model.eval()


_FINGERPRINT_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                      "vocab.json", "merges.txt", "added_tokens.json", "special_tokens_map.json", INDEX_FILE)


def weight_file_digests(folder: str | Path, known: Mapping[str, list] | None = None) -> dict[str, list]:
    """The SHA-256 of each of the folder's safetensors files, keyed by resolved path, each entry
    `[size, mtime_ns, ctime_ns, inode, sha256]`. Hashing a 15 GB checkpoint takes tens of seconds,
    so an entry of `known` (digests kept from an earlier run) is reused while the file's size,
    times and inode are unchanged (a file rewritten in place changes its ctime, whatever its mtime
    is set back to)."""
    known = known or {}
    digests = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        st = path.stat()
        identity = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        key = str(path.resolve())
        entry = known.get(key)
        digests[key] = entry if isinstance(entry, list) and entry[:4] == identity else [*identity, _file_sha256(path)]
    return digests


def model_fingerprint(folder: str | Path, digests: Mapping[str, list] | None = None) -> str:
    """A stable id of a checkpoint: every byte of its config, tokenizer and weight files.

    Two checkpoints that differ anywhere never share KV caches or stored answers. `digests`: the
    weight files' digests from `weight_file_digests` (computed here when not given)."""
    import hashlib

    folder = Path(folder)
    if digests is None:
        digests = weight_file_digests(folder)
    h = hashlib.sha256(b"docqa-fingerprint-v2")
    for name in _FINGERPRINT_FILES:
        path = folder / name
        if path.exists():
            h.update(name.encode() + b"\0" + path.read_bytes())
    for path in sorted(folder.glob("*.safetensors")):
        size, *_, sha = digests[str(path.resolve())]
        h.update(f"{path.name}\0{size}\0{sha}\0".encode())
    return h.hexdigest()


def _file_sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            h.update(block)
    return h.hexdigest()


def save_weights(folder: str | Path, cfg: ModelConfig, state: dict[str, torch.Tensor],
                 max_shard_bytes: int = 15_000_000, dtype: torch.dtype = torch.bfloat16,
                 quantize: bool = False) -> list[Path]:
    """Writes our-named parameters under the checkpoint's own names: safetensors shards + index.
    `quantize`: matrices in int8 with per-row scales (`quantize_int8`, fp32 scales), vectors in
    `dtype`: a quarter of fp32's bytes, half of bf16's."""
    import json

    from safetensors.torch import save_file

    folder = Path(folder)
    tensors: dict[str, torch.Tensor] = {}
    for src, dst in checkpoint_name_map(cfg).items():
        t = state[dst].detach().to("cpu")
        if quantize and t.dim() == 2:
            tensors[src], tensors[src + INT8_SCALE_SUFFIX] = quantize_int8(t)
        else:
            tensors[src] = t.to(dtype).contiguous()
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes and not name.endswith(INT8_SCALE_SUFFIX):
            shards.append({})  # (a matrix's scales stay in its shard)
            size = 0
        shards[-1][name] = t
        size += nbytes
    weight_map, paths = {}, []
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(folder / fname), metadata={"format": "pt"})
        weight_map |= {name: fname for name in shard}
        paths.append(folder / fname)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (folder / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                                indent=2))
    return paths
