"""The vanilla dense diffusion loop: the whole sequence recomputed at every step.

This is how the official Dream / LLaDA samplers run and the `dense` baseline of the benchmarks.
It is a generator: it yields a `DecodeStep` per denoising step and returns the `DecodeOutcome`.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass

import torch

from engine.attention import AttentionBackend, full_mask
from engine.config import ModelConfig
from engine.model import DiffusionLM
from engine.sampling import (
    SamplingParams,
    StepPlan,
    answer_is_settled,
    choose_commits,
    cut_at_stop,
    prediction_rows,
)


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


def dense_decode(model: DiffusionLM, attention: AttentionBackend, prompt_ids: torch.Tensor,
                 params: SamplingParams, generator: torch.Generator | None
                 ) -> Generator[DecodeStep, None, DecodeOutcome]:
    """Decodes `params.gen_length` tokens after `prompt_ids` ([P] long), recomputing everything."""
    cfg: ModelConfig = model.cfg
    device = model.embed_tokens.weight.device
    p, g = prompt_ids.numel(), params.gen_length
    canvas = torch.full((1, p + g), cfg.mask_token_id, dtype=torch.long, device=device)
    canvas[0, :p] = prompt_ids.to(device)
    positions = torch.arange(p + g, device=device)[None]
    mask = full_mask()
    step = forwards = 0
    stopped_early = False
    for block in range(params.num_blocks):
        lo, hi = p + block * params.block_length, p + (block + 1) * params.block_length
        masked_at_start = int((canvas[0, lo:hi] == cfg.mask_token_id).sum())
        step_in_block = 0
        while (canvas[0, lo:hi] == cfg.mask_token_id).any():
            slots = lo + torch.nonzero(canvas[0, lo:hi] == cfg.mask_token_id)[:, 0]  # [M]
            rows = prediction_rows(slots, cfg.logits_shifted)
            out = model(canvas, positions, mask, attention, logits_rows=rows, return_kv=False)
            forwards += 1
            plan = StepPlan(step_in_block, params.steps_per_block, masked_at_start)
            chosen, tokens = choose_commits(out.logits[0], params, plan, generator)
            canvas[0, slots[chosen]] = tokens[chosen]
            yield DecodeStep(step=step, block=block,
                             positions=tuple((slots[chosen] - p).tolist()),
                             tokens=tuple(tokens[chosen].tolist()),
                             masked_left=int((canvas[0, p:] == cfg.mask_token_id).sum()))
            step += 1
            step_in_block += 1
            if params.stop_at_eos and answer_is_settled(canvas[0, p:], cfg.mask_token_id,
                                                        cfg.stop_token_ids):
                stopped_early = bool((canvas[0, p:] == cfg.mask_token_id).any())
                break
        if stopped_early:
            break
    answer = canvas[0, p:].tolist()
    return DecodeOutcome(answer_ids=cut_at_stop(answer, cfg.stop_token_ids), canvas=answer,
                         steps=step, forward_passes=forwards, stopped_early=stopped_early)
