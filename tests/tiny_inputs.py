"""Inputs the engine tests share: random token documents for the tiny checkpoints."""

from __future__ import annotations

import torch


def doc_ids(n: int, vocab_hi: int, seed: int = 0) -> torch.Tensor:
    """[n] long: tokens in [5, vocab_hi), past the tiny checkpoints' special tokens."""
    return torch.randint(5, vocab_hi, (n,), generator=torch.Generator().manual_seed(seed))
