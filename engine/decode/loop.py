"""The block-wise diffusion loop, and the two baseline ways of computing its logits.

`run_blocks` owns the decoding rule: blocks in order, inside a block the sampler commits masked
slots until none is left, stop once an end token is settled. Where the logits come from is a
`StepRunner`'s business:
- `DenseRunner`: the vanilla loop, the whole sequence recomputed at every step (how the official
  Dream / LLaDA samplers run; the `dense` baseline);
- `FastDLLMRunner`: Fast-dLLM's dual cache, one full forward at each block start, then only the
  block's tokens against the cached prompt and suffix KV (the `fastdllm` baseline);
- `engine.decode.static.StaticRunner`: the method, decoding over static cached chunk KV.
All share the same rule, so their step counts are comparable.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Protocol

import torch

from engine.attention import AttentionBackend, full_mask
from engine.decode.sampling import (
    SamplingParams,
    StepPlan,
    answer_is_settled,
    choose_commits,
    cut_at_stop,
    prediction_rows,
)
from engine.model.config import ModelConfig
from engine.model.transformer import DiffusionLM, LayerFunctions


@dataclass(frozen=True)
class DecodeStep:
    """One denoising step: which answer slots (0-based within the answer) got which tokens."""

    step: int
    block: int
    positions: tuple[int, ...]
    tokens: tuple[int, ...]
    masked_left: int


@dataclass(frozen=True)
class DecodeOutcome:
    answer_ids: list[int]  # cut before the first stop token
    canvas: list[int]  # the whole answer canvas as decoded (masks where decoding stopped early)
    steps: int
    forward_passes: int
    stopped_early: bool


class StepRunner(Protocol):
    forward_passes: int

    def block_start(self, block: int, answer: torch.Tensor) -> None: ...

    def slot_logits(self, block: int, answer: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Logits [M, V] predicting the masked answer slots `slots` ([M], 0-based in the answer)."""

    def block_done(self, block: int, answer: torch.Tensor) -> None: ...


def run_blocks(runner: StepRunner, cfg: ModelConfig, params: SamplingParams,
               generator: torch.Generator | None, device: torch.device
               ) -> Generator[DecodeStep, None, DecodeOutcome]:
    """Decodes `params.gen_length` answer slots block by block with `params.decoder`.

    The canvas lives on the device (the runners read it) and is mirrored on the host; each step
    synchronises once, to copy back which slots it committed. Everything the loop decides from
    (masked slots, stop tokens) is read from the mirror, so the GPU is not drained more than that.
    """
    mask_id = cfg.mask_token_id
    answer = torch.full((params.gen_length,), mask_id, dtype=torch.long, device=device)
    canvas = [mask_id] * params.gen_length  # host mirror of `answer`
    step, stopped_early = 0, False
    for block in range(params.num_blocks):
        lo, hi = block * params.block_length, (block + 1) * params.block_length
        runner.block_start(block, answer)
        masked = [i for i in range(lo, hi) if canvas[i] == mask_id]
        masked_at_start = len(masked)
        step_in_block = 0
        while masked:
            slots = torch.tensor(masked, device=device)  # [M]
            logits = runner.slot_logits(block, answer, slots)
            plan = StepPlan(step_in_block, params.steps_per_block, masked_at_start)
            chosen, tokens = choose_commits(logits, params, plan, generator)
            answer[slots] = torch.where(chosen, tokens, answer[slots])
            commit, new = torch.stack((chosen.long(), tokens)).tolist()  # the step's one synchronisation
            positions = tuple(p for p, c in zip(masked, commit, strict=True) if c)
            committed = tuple(t for t, c in zip(new, commit, strict=True) if c)
            for pos, tok in zip(positions, committed, strict=True):
                canvas[pos] = tok
            masked = [p for p, c in zip(masked, commit, strict=True) if not c]
            yield DecodeStep(step=step, block=block, positions=positions, tokens=committed,
                             masked_left=canvas.count(mask_id))
            step += 1
            step_in_block += 1
            if params.stop_at_eos and answer_is_settled(canvas, mask_id, cfg.stop_token_ids):
                stopped_early = mask_id in canvas
                break
        if stopped_early:
            break
        if block < params.num_blocks - 1:
            runner.block_done(block, answer)
    return DecodeOutcome(answer_ids=cut_at_stop(canvas, cfg.stop_token_ids), canvas=canvas,
                         steps=step, forward_passes=runner.forward_passes,
                         stopped_early=stopped_early)


def block_logits(model: DiffusionLM, attention: AttentionBackend, ids: torch.Tensor, positions: torch.Tensor,
                 mask, past, slots: torch.Tensor, anchor: torch.Tensor | None,
                 layer_fns: LayerFunctions | None = None) -> torch.Tensor:
    """Logits [M, V] for block slots `slots` ([M], 0-based in the block) from one block forward.

    For a shifted-logit model, slot 0 is predicted by the row before the block, whose logits
    (`anchor`, [V]) were computed with that row's KV; every other slot by the block row before it.
    """
    frame = prediction_rows(slots + 1, model.cfg.logits_shifted)  # frame row 0 = the row before the block
    out = model(ids, positions, mask, attention, past=past, logits_rows=(frame - 1).clamp_min(0), return_kv=False,
                layer_fns=layer_fns)
    return slot_logits_from_rows(out.logits[0], slots, anchor, model.cfg.logits_shifted)


def slot_logits_from_rows(logits: torch.Tensor, slots: torch.Tensor, anchor: torch.Tensor | None,
                          shifted: bool) -> torch.Tensor:
    """logits [M, V] of the block rows that predict `slots` ([M], 0-based in the block); for a
    shifted model slot 0 takes the anchor ([V], the row before the block) instead."""
    if not shifted or anchor is None:
        return logits
    return torch.where((slots == 0)[:, None], anchor[None], logits)


class DenseRunner:
    """Every step recomputes [prompt | whole answer canvas] with full bidirectional attention."""

    def __init__(self, model: DiffusionLM, attention: AttentionBackend, prompt_ids: torch.Tensor,
                 layer_fns: LayerFunctions | None = None) -> None:
        self.model, self.attention, self.layer_fns = model, attention, layer_fns
        device = model.embed_tokens.weight.device
        self.prompt = prompt_ids.to(device)
        self.forward_passes = 0

    def block_start(self, block: int, answer: torch.Tensor) -> None:
        pass

    def block_done(self, block: int, answer: torch.Tensor) -> None:
        pass

    def slot_logits(self, block: int, answer: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        seq = torch.cat((self.prompt, answer))[None]
        positions = torch.arange(seq.shape[1], device=seq.device)[None]
        rows = prediction_rows(self.prompt.numel() + slots, self.model.cfg.logits_shifted)
        out = self.model(seq, positions, full_mask(), self.attention, logits_rows=rows, return_kv=False,
                         layer_fns=self.layer_fns)
        self.forward_passes += 1
        return out.logits[0]


class FastDLLMRunner:
    """Fast-dLLM dual cache: a full forward over [prompt | canvas] at each block start gives the
    block's first logits and every position's KV; later steps forward only the block's tokens,
    attending to the cached prompt, finished blocks and (stale) future masks."""

    def __init__(self, model: DiffusionLM, attention: AttentionBackend, prompt_ids: torch.Tensor,
                 block_length: int, layer_fns: LayerFunctions | None = None) -> None:
        self.model, self.attention, self.layer_fns = model, attention, layer_fns
        device = model.embed_tokens.weight.device
        self.prompt = prompt_ids.to(device)
        self.block_length = block_length
        self.forward_passes = 0
        self._first_logits: torch.Tensor | None = None  # [G, V] aligned to answer slots
        self._anchor: torch.Tensor | None = None  # [V] row before the block (shifted models)
        self._past = None
        self._key_valid: torch.Tensor | None = None  # [1, n + block] over [cached sequence | fresh block]

    def block_start(self, block: int, answer: torch.Tensor) -> None:
        cfg, p = self.model.cfg, self.prompt.numel()
        seq = torch.cat((self.prompt, answer))[None]
        positions = torch.arange(seq.shape[1], device=seq.device)[None]
        lo, hi = p + block * self.block_length, p + (block + 1) * self.block_length
        rows = prediction_rows(torch.arange(lo, hi, device=seq.device), cfg.logits_shifted)
        out = self.model(seq, positions, full_mask(), self.attention, logits_rows=rows, layer_fns=self.layer_fns)
        self.forward_passes += 1
        self._first_logits = out.logits[0]
        self._anchor = out.logits[0, 0]
        # Keys are position-stamped (post-RoPE), so attending to the cached [prefix | block | suffix]
        # with the block's stale slots masked, plus the fresh block, equals overwriting the block's
        # slots in place. Masking instead of cutting the block out keeps no second copy of the
        # whole sequence's KV (64 GiB for LLaDA-8B at 128K tokens).
        self._past = out.kv
        n = seq.shape[1]
        stale = (torch.arange(n, device=seq.device) >= lo) & (torch.arange(n, device=seq.device) < hi)
        self._key_valid = torch.cat((~stale, torch.ones(hi - lo, dtype=torch.bool, device=seq.device)))[None]
        self._block_pos = positions[:, lo:hi]

    def block_done(self, block: int, answer: torch.Tensor) -> None:
        pass

    def slot_logits(self, block: int, answer: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        lo = block * self.block_length
        if self._first_logits is not None:
            first, self._first_logits = self._first_logits, None
            return first[slots - lo]
        self.forward_passes += 1
        anchor = self._anchor if self.model.cfg.logits_shifted else None
        return block_logits(self.model, self.attention, answer[None, lo:lo + self.block_length], self._block_pos,
                            full_mask(key_valid=self._key_valid), self._past, slots - lo, anchor, self.layer_fns)


def dense_decode(model: DiffusionLM, attention: AttentionBackend, prompt_ids: torch.Tensor,
                 params: SamplingParams, generator: torch.Generator | None
                 ) -> Generator[DecodeStep, None, DecodeOutcome]:
    """The vanilla loop: decodes after `prompt_ids` ([P] long), recomputing everything each step."""
    device = model.embed_tokens.weight.device
    return run_blocks(DenseRunner(model, attention, prompt_ids), model.cfg, params, generator, device)
