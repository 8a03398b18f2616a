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
    choose_commits_together,
    cut_at_stop,
    decides_without_noise,
    defer_early_stops,
    prediction_rows,
    step_limit,
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
    (`run_blocks`) or batched with other questions' requests (`engine.scheduler`); a driver may
    instead decide the step itself where `decided_together` (`decide_together`)."""

    decoder: Decoder
    block: int
    answer: torch.Tensor  # [gen_length] long, on the device
    slots: torch.Tensor  # [M] long
    masked: tuple[int, ...]  # the same slots, on the host
    params: SamplingParams
    plan: StepPlan

    @property
    def decided_together(self) -> bool:
        """Whether a driver may answer with a DecidedStep: the rule needs no generator and no
        look at the host canvas (`end_after_text` does)."""
        return decides_without_noise(self.params) and not self.params.end_after_text


@dataclass(frozen=True)
class BlockDone:
    """The loop's `block` is settled and another follows: its decoder's `block_done` (the finished
    block's KV joining the context) is due. A driver that runs it, batched with other questions'
    work (`engine.decode.static.StaticBatch.step`), answers BlockRefreshed; any other answer (None)
    and the loop runs it itself."""

    decoder: Decoder
    block: int
    answer: torch.Tensor  # [gen_length] long, on the device


@dataclass(frozen=True)
class BlockRefreshed:
    """A driver's answer to BlockDone: the decoder's context holds the finished block already."""


@dataclass(frozen=True)
class DecidedStep:
    """A driver's answer to a LogitsRequest whose step it decided (with other questions' steps,
    `decide_together`): per masked slot whether it is committed and its token. The driver has
    written the committed tokens into the request's answer tensor."""

    commit: list[bool]
    tokens: list[int]


def host_to_device(values: list, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A small host list as a tensor on `device`, without waiting for the device: on CUDA through
    pinned memory and a non-blocking copy (the caching host allocator keeps the block until the
    copy is done). Why: a copy from pageable memory synchronises the stream, so a step's decisions,
    made right after its batched forward was launched, would wait for that forward before their
    first kernel is even queued, and their launches would then run while the GPU idles."""
    t = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def decide_together(requests: list[LogitsRequest], block_logits: torch.Tensor, rows: list[int],
                    anchors: list[torch.Tensor | None], shifted: bool) -> list[DecidedStep]:
    """The steps of several questions decided at once from a batched block forward: one batched
    decision per rule over the masked slots, the answers written in one batched copy, one
    synchronisation for all (alone, each question costs a dozen small launches and a
    synchronisation of its own).

    requests: all `decided_together`, of one block length S; block_logits: [R, S, V], row `rows[n]`'s
    slot j predicting slot j of request n's block (for a shifted model slot 0 takes `anchors[n]`,
    [V], as in `slot_logits_from_rows`). Each DecidedStep is what `choose_commits` gives the request
    alone.
    """
    device, block_length = block_logits.device, block_logits.shape[1]
    width = max(len(r.masked) for r in requests)
    # [N, width] block slots of each request's masked ones, a row padded with its first masked slot
    # (a pad is not a candidate, and is given that slot's decision below, so it writes the same).
    local = [[p - r.block * block_length for p in r.masked] for r in requests]
    index = host_to_device([slots + slots[:1] * (width - len(slots)) for slots in local], device)
    candidates = host_to_device([[True] * len(slots) + [False] * (width - len(slots)) for slots in local], device)
    logits = block_logits[host_to_device(rows, device)[:, None], index]  # [N, width, V]
    if shifted and any(r.masked[0] == r.block * block_length for r in requests):
        stacked = torch.stack([a if a is not None else block_logits[row, 0]  # no anchor: the row's own
                               for a, row in zip(anchors, rows, strict=True)])  # [N, V]
        logits = slot_logits_from_rows(logits, index, stacked, shifted)
    limits = [step_limit(r.params, r.plan, len(r.masked)) for r in requests]
    rules = list(dict.fromkeys(r.params.decoder for r in requests))
    if len(rules) == 1:
        commit, tokens = choose_commits_together(logits, candidates, rules[0],
                                                 host_to_device(limits, device, torch.float32))
    else:  # questions of several rules in one batch: a decision per rule, put back in request order
        groups = [[i for i, r in enumerate(requests) if r.params.decoder == rule] for rule in rules]
        parts = [choose_commits_together(logits[g], candidates[g], rule,
                                         host_to_device([limits[i] for i in g], device, torch.float32))
                 for rule, g in zip(rules, groups, strict=True)]
        order = host_to_device([i for g in groups for i in g], device).argsort()
        commit = torch.cat([c for c, _ in parts])[order]
        tokens = torch.cat([t for _, t in parts])[order]
    commit = torch.where(candidates, commit, commit[:, :1])
    blocks = [r.answer[r.block * block_length:(r.block + 1) * block_length] for r in requests]  # views
    current = torch.stack(blocks)  # [N, S]
    written = current.scatter(1, index, torch.where(commit, tokens, current.gather(1, index)))
    torch._foreach_copy_(blocks, list(written.unbind(0)))  # one launch for all the answers on CUDA
    decided = torch.stack((commit.long(), tokens)).tolist()  # the step's one synchronisation
    return [DecidedStep([bool(c) for c in decided[0][i][:len(r.masked)]], decided[1][i][:len(r.masked)])
            for i, r in enumerate(requests)]


def decode_blocks(decoder: Decoder, cfg: ModelConfig, params: SamplingParams,
                  generator: torch.Generator | None, device: torch.device
                  ) -> Generator[LogitsRequest | DecodeStep | BlockDone,
                                 torch.Tensor | DecidedStep | BlockRefreshed | None, DecodeOutcome]:
    """Decodes `params.gen_length` answer slots block by block with `params.decoder`.

    Before each step it yields a LogitsRequest and takes the logits sent back, or the DecidedStep of
    a driver that decided the step and wrote the answer itself (`decide_together`); after it, the
    DecodeStep (send None to go on). Between two blocks it yields BlockDone: the decoder's
    `block_done` runs inside unless the driver answers that it ran it. `block_start` runs inside.
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
            slots = host_to_device(masked, device)  # [M]
            plan = StepPlan(step_in_block, params.steps_per_block, masked_at_start)
            request = LogitsRequest(decoder, block, answer, slots, tuple(masked), params, plan)
            reply = yield request
            if isinstance(reply, DecidedStep):  # decided, and written, by the driver
                assert request.decided_together, "a step decided outside the loop for a rule that needs it"
                commit, new = reply.commit, reply.tokens
            else:
                chosen, tokens = choose_commits(reply, params, plan, generator)
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
            refreshed = yield BlockDone(decoder, block, answer)
            if not isinstance(refreshed, BlockRefreshed):  # the driver left it to the loop
                decoder.block_done(block, answer)
    return DecodeOutcome(answer_ids=cut_at_stop(canvas, cfg.stop_token_ids), canvas=canvas,
                         steps=step, forward_passes=decoder.forward_passes,
                         stopped_early=stopped_early)


def drive_alone(loop: Generator, before_request: Callable[[], None] | None = None) -> Generator:
    """Drives a question's loop (`decode_blocks`, `PreparedAnswer.steps`) alone: each LogitsRequest
    is answered by its own decoder, `before_request` called first (an error the decoder raises is
    thrown into the loop, which may absorb it); a BlockDone is left to the loop; every other item is
    yielded. Returns the loop's value."""
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
        elif not isinstance(item, BlockDone):
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
    """logits [..., M, V] of the block rows that predict `slots` ([..., M], 0-based in the block); for
    a shifted model slot 0 takes the anchor ([..., V], the row before the block) instead."""
    if not shifted or anchor is None:
        return logits
    return torch.where((slots == 0)[..., None], anchor.unsqueeze(-2), logits)
