"""The bidirectional diffusion transformer shared by Dream and LLaDA.

Pre-norm blocks: RMSNorm (fp32 normalise, cast, then times the weight), attention with rotate-half
RoPE and GQA, SwiGLU MLP. Family differences are config fields (q/k/v bias, RoPE precision, tied
head), never forks. Parameter names follow HF Qwen2/Llama; `engine.model.weights` maps checkpoints onto
them.

The forward pass takes explicit per-token positions, a `MaskSpec`, optional past KV to attend to,
and the attention backend to use; it returns the new tokens' KV (keys after RoPE) and logits only
for the rows asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionBackend, MaskSpec, attention_probs
from engine.attention.masks import select_query_rows
from engine.model.config import ModelConfig
from engine.model.rope import apply_rope, rope_cos_sin

LayerKV = tuple[torch.Tensor, torch.Tensor]  # (keys after RoPE, values), each [B, Hkv, T, D]


@runtime_checkable
class AttendingCache(Protocol):
    """A layer's past that attends by itself: `attend(q [B, Hq, T, D], k_new, v_new [B, Hkv, T, D],
    scale) -> out [B, Hq, T, D]` over the past and the new keys together."""

    def attend(self, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, scale: float) -> torch.Tensor: ...


@dataclass(frozen=True)
class AttentionCapture:
    """Which attention probabilities to record: some layers, some query rows (indices into Tq)."""

    layers: tuple[int, ...]
    query_rows: torch.Tensor  # [R] long
    # Applied to each captured layer's probabilities before they are kept, when only a summary of
    # them is needed (keeps [B, Hq, R, Tk] fp32 per layer from piling up).
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None


@dataclass
class ModelOutput:
    logits: torch.Tensor | None  # [B, R, V] for the rows asked for, else None
    kv: list[LayerKV] | None  # per layer, the new tokens' KV only (not the past)
    # layer -> fp32 probabilities [B, Hq, R, Tk] over [past | new] keys, for captured layers
    attention: dict[int, torch.Tensor] = field(default_factory=dict)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class SelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        q_dim, kv_dim = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, q_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv_dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(q_dim, cfg.hidden_size, bias=False)
        # Set by `fuse`: [q; k; v] in one matrix (not saved; the three weights become views of it).
        self.register_buffer("qkv_weight", None, persistent=False)
        self.register_buffer("qkv_bias", None, persistent=False)

    def fuse(self) -> None:
        """One matmul for q, k and v (see DiffusionLM.fuse_projections)."""
        self.qkv_weight = _fuse_linears(self.q_proj, self.k_proj, self.v_proj, "weight")
        if self.cfg.qkv_bias:
            self.qkv_bias = _fuse_linears(self.q_proj, self.k_proj, self.v_proj, "bias")

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [B, T, hidden] -> q [B, Hq, T, D], k, v [B, Hkv, T, D], q and k after RoPE."""
        cfg = self.cfg
        b, t, _ = x.shape
        if self.qkv_weight is not None:
            q_dim, kv_dim = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
            q, k, v = F.linear(x, self.qkv_weight, self.qkv_bias).split((q_dim, kv_dim, kv_dim), dim=-1)
            # A view of v would keep the whole [B, T, q + 2 kv] output alive in any KV the caller
            # keeps (q and k get fresh tensors from RoPE): for LLaDA's fastdllm at 128K tokens,
            # 4 GiB a layer instead of 2.
            v = v.contiguous()
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(b, t, cfg.num_heads, cfg.head_dim).transpose(1, 2)
        k = k.view(b, t, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
        v = v.view(b, t, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
        return apply_rope(q, cos, sin, cfg.rope_in_fp32), apply_rope(k, cos, sin, cfg.rope_in_fp32), v

    def attend(self, q, k, v, mask: MaskSpec, attention: AttentionBackend, past: LayerKV | AttendingCache | None,
               capture_rows: torch.Tensor | None):
        """Attention of q over [past | new keys] -> (out [B, Hq, T, D], fp32 probs of the captured rows)."""
        scale = self.cfg.head_dim ** -0.5
        if isinstance(past, AttendingCache):
            # A cache that runs its own attention (engine.decode.paged: pages read in place and
            # the new KV written into it); it covers the whole key set, so no mask applies.
            assert capture_rows is None, "attention capture needs a concatenated past"
            return past.attend(q, k, v, scale), None
        if past is not None:
            k = torch.cat((past[0], k), dim=2)
            v = torch.cat((past[1], v), dim=2)
        out, _ = attention(q, k, v, mask, scale, return_lse=False)
        probs = None
        if capture_rows is not None:
            # Recomputed explicitly for the few captured rows: backends need not expose probs.
            row_mask = select_query_rows(mask, capture_rows, q.shape[2], k.shape[2])
            probs = attention_probs(q[:, :, capture_rows], k, row_mask, scale)
        return out, probs


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.register_buffer("gate_up_weight", None, persistent=False)  # set by `fuse`: [gate; up]

    def fuse(self) -> None:
        """One matmul for gate and up (see DiffusionLM.fuse_projections)."""
        self.gate_up_weight = _fuse_linears(self.gate_proj, self.up_proj, None, "weight")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_weight is not None:
            gate, up = F.linear(x, self.gate_up_weight).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.silu(gate) * up)


def _fuse_linears(a: nn.Linear, b: nn.Linear, c: nn.Linear | None, name: str) -> torch.Tensor:
    """Concatenates the linears' `name` tensors along the output dim and makes each linear's own
    parameter a view of the result, so fusing adds no memory and loading a state dict afterwards
    still updates the fused tensor."""
    parts = [getattr(m, name) for m in (a, b, c) if m is not None]
    fused = torch.cat([p.detach() for p in parts], dim=0)
    start = 0
    for m, p in zip((a, b, c), parts, strict=False):
        setattr(m, name, nn.Parameter(fused[start:start + p.shape[0]], requires_grad=p.requires_grad))
        start += p.shape[0]
    return fused


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = SelfAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg)

    def attention_inputs(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """The layer up to attention: norm, q/k/v projections, RoPE (see SelfAttention.project)."""
        return self.self_attn.project(self.input_layernorm(h), cos, sin)

    def finish(self, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The layer after attention: h [B, T, hidden], attn [B, Hq, T, D] -> the next h."""
        b, _, t, _ = attn.shape
        h = h + self.self_attn.o_proj(attn.transpose(1, 2).reshape(b, t, -1))
        return h + self.mlp(self.post_attention_layernorm(h))

    def forward(self, h, cos, sin, mask, attention, past, capture_rows, fns: LayerFunctions | None = None):
        fns = fns or EAGER_LAYER
        q, k, v = fns.attention_inputs(self, h, cos, sin)
        out, probs = self.self_attn.attend(q, k, v, mask, attention, past, capture_rows)
        return fns.finish(self, h, out), (k, v), probs


@dataclass(frozen=True)
class LayerFunctions:
    """How a Block runs its two halves around attention: the eager methods, or compiled versions of
    them (engine.model.compiled_layers). Both take the Block as their first argument."""

    attention_inputs: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    finish: Callable[..., torch.Tensor]


EAGER_LAYER = LayerFunctions(Block.attention_inputs, Block.finish)


class DiffusionLM(nn.Module):
    """Bidirectional transformer LM; see the module docstring."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        mask: MaskSpec,
        attention: AttentionBackend,
        past: Sequence[LayerKV] | None = None,
        logits_rows: torch.Tensor | str | None = None,
        capture: AttentionCapture | None = None,
        return_kv: bool = True,
        layer_fns: LayerFunctions | None = None,
    ) -> ModelOutput:
        """One forward pass.

        input_ids, position_ids: [B, T] (positions are explicit; nothing is assumed contiguous).
        mask: over keys [past | new] ([B, Tq=T, Tk=Tp+T]).
        past: per layer (k after RoPE, v), [B, Hkv, Tp, D], attended to but not recomputed, or an
            AttendingCache per layer.
        logits_rows: [R] or [B, R] row indices into T, "all", or None for no logits.
        layer_fns: the layers' halves around attention (default: eager).
        """
        cfg = self.cfg
        if past is not None and len(past) != cfg.num_layers:
            raise ValueError(f"past has {len(past)} layers, the model {cfg.num_layers}")
        h = self.embed_tokens(input_ids)  # [B, T, hidden]
        cos, sin = rope_cos_sin(position_ids, cfg.head_dim, cfg.rope_theta, cfg.rope_scaling_factor)
        new_kv: list[LayerKV] = []
        captured: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            rows = capture.query_rows if capture is not None and i in capture.layers else None
            h, kv, probs = layer(h, cos, sin, mask, attention, past[i] if past else None, rows, layer_fns)
            if return_kv:
                new_kv.append(kv)
            if probs is not None:
                captured[i] = probs if capture.reduce is None else capture.reduce(probs)
        return ModelOutput(logits=self._logits(h, logits_rows), kv=new_kv if return_kv else None,
                           attention=captured)

    def fuse_projections(self) -> None:
        """For inference: q/k/v and gate/up each run as one matmul (fewer, larger GEMMs; a decode
        step at 32 rows reads the weights once either way, but small GEMMs waste bandwidth).

        The separate weights stay as parameters (views into the fused tensors): names, state
        dicts and checkpoints are unchanged. Call it after the weights are on their device: moving
        the model afterwards would copy the views and the fused tensors apart.
        """
        for layer in self.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()

    def _logits(self, h: torch.Tensor, rows: torch.Tensor | str | None) -> torch.Tensor | None:
        if rows is None:
            return None
        if isinstance(rows, str):
            if rows != "all":
                raise ValueError(f"logits_rows must be a tensor, 'all' or None, not {rows!r}")
            picked = h
        elif rows.dim() == 1:
            picked = h[:, rows]
        else:
            picked = torch.gather(h, 1, rows[..., None].expand(-1, -1, h.shape[-1]))
        return self.lm_head(self.norm(picked))  # norm is per-row, so norm-after-gather is exact
