"""One model at work: what every forward of the method needs, in one object.

A `Runner` holds the weights (`DiffusionLM`), the attention backend the model is given, the
layers' halves around attention (compiled on CUDA, eager elsewhere; `engine.model.compiled_layers`)
and the passes kept from one question to the next (fixed-address buffers and their captured CUDA
graphs: the draft, the scoring passes, the paged decode context). The method's phases take a runner
instead of `model, attention, layer functions`; the model itself still does not know which backend
or which halves run.

One runner per loaded model and process (an `Engine` makes it); the kept passes are not shared
across threads, so callers serialise questions on one runner (`app.service.DocQA` does).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

import torch
from torch import nn

from engine.attention import AttentionBackend, MaskSpec
from engine.attention.split_kv import kernel_native, kernel_usable
from engine.model.compiled_layers import compiled_layer_functions
from engine.model.config import ModelConfig
from engine.model.transformer import AttentionCapture, DiffusionLM, LayerFunctions, LayerKV, ModelOutput

T = TypeVar("T")


class Runner:
    """`Runner.for_model(model, attention)` picks the layer halves for the model's device.

    `fixed_layers` run forwards whose shapes never change between calls (the paged decode step),
    `dynamic_layers` all others (prefill, scoring, the question's pass, contiguous decoding); None
    runs the eager methods. `module` is what is called for a forward when it is not the model
    itself (a DistributedDataParallel wrapper while training on several ranks).
    """

    def __init__(self, model: DiffusionLM, attention: AttentionBackend,
                 fixed_layers: LayerFunctions | None = None, dynamic_layers: LayerFunctions | None = None,
                 module: nn.Module | None = None) -> None:
        self.model, self.attention = model, attention
        self.fixed_layers, self.dynamic_layers = fixed_layers, dynamic_layers
        self.module = module if module is not None else model
        # kind -> key -> kept object, least recently used first (dicts keep insertion order).
        self._kept: dict[str, dict[Hashable, object]] = {}

    @classmethod
    def for_model(cls, model: DiffusionLM, attention: AttentionBackend, compile_layers: bool = True) -> Runner:
        """Compiled halves on CUDA when `compile_layers` (the first forwards of each shape kind pay
        the compilation), eager on the CPU, where Inductor's kernels do not pay off."""
        if compile_layers and model.embed_tokens.weight.device.type == "cuda":
            return cls(model, attention, fixed_layers=compiled_layer_functions(dynamic=False),
                       dynamic_layers=compiled_layer_functions(dynamic=True))
        return cls(model, attention)

    @property
    def cfg(self) -> ModelConfig:
        return self.model.cfg

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    @property
    def compiled(self) -> bool:
        return self.fixed_layers is not None or self.dynamic_layers is not None

    @property
    def uses_graphs(self) -> bool:
        """Kept passes are captured as CUDA graphs (on CUDA only)."""
        return self.device.type == "cuda"

    @property
    def split_kv_native(self) -> bool:
        """The split-KV Triton kernel runs compiled here (CUDA with Triton): the paged route pays off."""
        return kernel_native(self.device, self.cfg.head_dim)

    @property
    def split_kv_usable(self) -> bool:
        """The split-KV kernel runs at all (natively, or under Triton's interpreter on the CPU)."""
        return kernel_usable(self.device, self.cfg.head_dim)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: MaskSpec, *,
                past: Sequence[LayerKV] | Sequence | None = None, logits_rows: torch.Tensor | str | None = None,
                capture: AttentionCapture | None = None, return_kv: bool = True,
                fixed_shape: bool = False) -> ModelOutput:
        """One forward of the model (see `DiffusionLM.forward`) with this runner's backend and
        halves; `fixed_shape`: the caller replays this exact shape (it takes the fixed halves)."""
        return self.module(input_ids, position_ids, mask, self.attention, past=past, logits_rows=logits_rows,
                           capture=capture, return_kv=return_kv,
                           layer_fns=self.fixed_layers if fixed_shape else self.dynamic_layers)

    def kept(self, kind: str, key: Hashable, limit: int, make: Callable[[], T],
             fits: Callable[[T], bool] | None = None) -> T:
        """The object kept under (`kind`, `key`) if there is one (and `fits(it)`), else `make()`,
        kept there. It becomes the most recently used of its kind; beyond `limit` of a kind the
        least recently used are dropped (each may hold a captured graph and its buffers)."""
        store = self._kept.setdefault(kind, {})
        item = store.pop(key, None)
        if item is None or (fits is not None and not fits(item)):
            item = make()
        store[key] = item
        while len(store) > limit:
            store.pop(next(iter(store)))
        return item

    def kept_items(self, kind: str) -> dict[Hashable, object]:
        """The objects kept of one kind, by key (the dict itself: deleting from it forgets them)."""
        return self._kept.setdefault(kind, {})

    def forget(self) -> None:
        """Drops every kept pass (after an out-of-memory error, to free what they hold)."""
        self._kept.clear()
