"""The block-wise diffusion loop.

`run_blocks` owns the decoding rule: blocks in order, inside a block the sampler commits masked
slots until none is left, stop once an end token is settled. Where the logits come from is a
`Decoder`'s business:
- `engine.decode.baselines.DenseDecoder`: the vanilla loop, the whole sequence recomputed at every
  step (how the official Dream / LLaDA samplers run; the `dense` baseline);
- `engine.decode.baselines.FastDLLMDecoder`: Fast-dLLM's dual cache (the `fastdllm` baseline);
- `engine.decode.static.StaticDecoder`: the method, decoding over static cached chunk KV, and
  `engine.decode.paged.PagedStaticDecoder`, the same over the document's pages in place.
All share the same rule, so their step counts are comparable.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Protocol

import torch

from engine.decode.sampling import (
    SamplingParams,
    StepPlan,
    answer_is_settled,
    choose_commits,
    cut_at_stop,
    defer_early_stops,
    prediction_rows,
)
from engine.model.config import ModelConfig
from engine.runner import Runner


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


class Decoder(Protocol):
    forward_passes: int

    def block_start(self, block: int, answer: torch.Tensor) -> None: ...

    def slot_logits(self, block: int, answer: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Logits [M, V] predicting the masked answer slots `slots` ([M], 0-based in the answer)."""

    def block_done(self, block: int, answer: torch.Tensor) -> None: ...


@dataclass(frozen=True)
class LogitsRequest:
    """What a decoding loop needs before its next step: the logits [M, V] of `slots` ([M], 0-based
    in the answer) of `block`, from `decoder`. Whoever drives `decode_blocks` answers it, alone
    (`run_blocks`) or batched with other questions' requests (`engine.scheduler`)."""

    decoder: Decoder
    block: int
    answer: torch.Tensor  # [gen_length] long, on the device
    slots: torch.Tensor  # [M] long


def decode_blocks(decoder: Decoder, cfg: ModelConfig, params: SamplingParams,
                  generator: torch.Generator | None, device: torch.device
                  ) -> Generator[LogitsRequest | DecodeStep, torch.Tensor | None, DecodeOutcome]:
    """Decodes `params.gen_length` answer slots block by block with `params.decoder`.

    Before each step it yields a LogitsRequest and takes the logits sent back; after it, the
    DecodeStep (send None to go on). The decoder's `block_start` and `block_done` run inside.
    The canvas lives on the device (the decoders read it) and is mirrored on the host; each step
    synchronises once, to copy back which slots it committed. Everything the loop decides from
    (masked slots, stop tokens) is read from the mirror, so the GPU is not drained more than that.
    """
    mask_id = cfg.mask_token_id
    answer = torch.full((params.gen_length,), mask_id, dtype=torch.long, device=device)
    canvas = [mask_id] * params.gen_length  # host mirror of `answer`
    step, stopped_early = 0, False
    for block in range(params.num_blocks):
        lo, hi = block * params.block_length, (block + 1) * params.block_length
        decoder.block_start(block, answer)
        masked = [i for i in range(lo, hi) if canvas[i] == mask_id]
        masked_at_start = len(masked)
        step_in_block = 0
        while masked:
            slots = torch.tensor(masked, device=device)  # [M]
            logits = yield LogitsRequest(decoder, block, answer, slots)
            plan = StepPlan(step_in_block, params.steps_per_block, masked_at_start)
            chosen, tokens = choose_commits(logits, params, plan, generator)
            if params.end_after_text:  # decided on the host: the rule walks the slots in order
                commit, new = torch.stack((chosen.long(), tokens)).tolist()
                commit = defer_early_stops(masked, [bool(c) for c in commit], new, canvas, mask_id,
                                           cfg.stop_token_ids)
                chosen = torch.tensor(commit, device=device)
                answer[slots] = torch.where(chosen, tokens, answer[slots])
            else:
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
            decoder.block_done(block, answer)
    return DecodeOutcome(answer_ids=cut_at_stop(canvas, cfg.stop_token_ids), canvas=canvas,
                         steps=step, forward_passes=decoder.forward_passes,
                         stopped_early=stopped_early)


def drive_alone(loop: Generator, before_request: Callable[[], None] | None = None) -> Generator:
    """Drives a question's loop (`decode_blocks`, `PreparedAnswer.steps`) alone: each LogitsRequest
    is answered by its own decoder, `before_request` called first (an error the decoder raises is
    thrown into the loop, which may absorb it); every other item is yielded. Returns the loop's
    value."""
    reply: torch.Tensor | BaseException | None = None
    while True:
        try:
            item = loop.throw(reply) if isinstance(reply, BaseException) else loop.send(reply)
        except StopIteration as done:
            return done.value
        reply = None
        if isinstance(item, LogitsRequest):
            if before_request is not None:
                before_request()
            try:
                reply = item.decoder.slot_logits(item.block, item.answer, item.slots)
            except Exception as exc:  # noqa: BLE001 - the loop decides what an error ends
                reply = exc
        else:
            yield item


def run_blocks(decoder: Decoder, cfg: ModelConfig, params: SamplingParams,
               generator: torch.Generator | None, device: torch.device
               ) -> Generator[DecodeStep, None, DecodeOutcome]:
    """`decode_blocks` for one question alone: each step's logits come from its decoder."""
    return (yield from drive_alone(decode_blocks(decoder, cfg, params, generator, device)))


def block_logits(runner: Runner, ids: torch.Tensor, positions: torch.Tensor, mask, past, slots: torch.Tensor,
                 anchor: torch.Tensor | None) -> torch.Tensor:
    """Logits [M, V] for block slots `slots` ([M], 0-based in the block) from one block forward.

    For a shifted-logit model, slot 0 is predicted by the row before the block, whose logits
    (`anchor`, [V]) were computed with that row's KV; every other slot by the block row before it.
    """
    shifted = runner.cfg.logits_shifted
    frame = prediction_rows(slots + 1, shifted)  # frame row 0 = the row before the block
    out = runner.forward(ids, positions, mask, past=past, logits_rows=(frame - 1).clamp_min(0), return_kv=False)
    return slot_logits_from_rows(out.logits[0], slots, anchor, shifted)


def slot_logits_from_rows(logits: torch.Tensor, slots: torch.Tensor, anchor: torch.Tensor | None,
                          shifted: bool) -> torch.Tensor:
    """logits [M, V] of the block rows that predict `slots` ([M], 0-based in the block); for a
    shifted model slot 0 takes the anchor ([V], the row before the block) instead."""
    if not shifted or anchor is None:
        return logits
    return torch.where((slots == 0)[:, None], anchor[None], logits)
