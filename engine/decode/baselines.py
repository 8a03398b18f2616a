"""The two baselines that decode over the whole text, with no chunking (`dense`, `fastdllm`).

Both are `engine.decode.loop.Decoder`s, so they run under the same loop and rule as the method.
"""

from __future__ import annotations

from collections.abc import Generator

import torch

from engine.attention import full_mask
from engine.decode.loop import DecodeOutcome, DecodeStep, block_logits, run_blocks
from engine.decode.sampling import SamplingParams, prediction_rows
from engine.runner import Runner


class DenseDecoder:
    """Every step recomputes [prompt | whole answer canvas] with full bidirectional attention."""

    def __init__(self, runner: Runner, prompt_ids: torch.Tensor) -> None:
        self.runner = runner
        self.prompt = prompt_ids.to(runner.device)
        self.forward_passes = 0

    def block_start(self, block: int, answer: torch.Tensor) -> None:
        pass

    def block_done(self, block: int, answer: torch.Tensor) -> None:
        pass

    def slot_logits(self, block: int, answer: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        seq = torch.cat((self.prompt, answer))[None]
        positions = torch.arange(seq.shape[1], device=seq.device)[None]
        rows = prediction_rows(self.prompt.numel() + slots, self.runner.cfg.logits_shifted)
        out = self.runner.forward(seq, positions, full_mask(), logits_rows=rows, return_kv=False)
        self.forward_passes += 1
        return out.logits[0]


class FastDLLMDecoder:
    """Fast-dLLM dual cache: a full forward over [prompt | canvas] at each block start gives the
    block's first logits and every position's KV; later steps forward only the block's tokens,
    attending to the cached prompt, finished blocks and (stale) future masks."""

    def __init__(self, runner: Runner, prompt_ids: torch.Tensor, block_length: int) -> None:
        self.runner = runner
        self.prompt = prompt_ids.to(runner.device)
        self.block_length = block_length
        self.forward_passes = 0
        self._first_logits: torch.Tensor | None = None  # [G, V] aligned to answer slots
        self._anchor: torch.Tensor | None = None  # [V] row before the block (shifted models)
        self._past = None
        self._key_valid: torch.Tensor | None = None  # [1, n + block] over [cached sequence | fresh block]

    def block_start(self, block: int, answer: torch.Tensor) -> None:
        cfg, p = self.runner.cfg, self.prompt.numel()
        seq = torch.cat((self.prompt, answer))[None]
        positions = torch.arange(seq.shape[1], device=seq.device)[None]
        lo, hi = p + block * self.block_length, p + (block + 1) * self.block_length
        rows = prediction_rows(torch.arange(lo, hi, device=seq.device), cfg.logits_shifted)
        out = self.runner.forward(seq, positions, full_mask(), logits_rows=rows)
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
        anchor = self._anchor if self.runner.cfg.logits_shifted else None
        return block_logits(self.runner, answer[None, lo:lo + self.block_length], self._block_pos,
                            full_mask(key_valid=self._key_valid), self._past, slots - lo, anchor)


def dense_decode(runner: Runner, prompt_ids: torch.Tensor, params: SamplingParams,
                 generator: torch.Generator | None) -> Generator[DecodeStep, None, DecodeOutcome]:
    """The vanilla loop: decodes after `prompt_ids` ([P] long), recomputing everything each step."""
    return run_blocks(DenseDecoder(runner, prompt_ids), runner.cfg, params, generator, runner.device)
