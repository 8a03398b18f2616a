"""Inputs the engine tests share: random token documents for the tiny checkpoints."""

from __future__ import annotations

import torch


def doc_ids(n: int, vocab_hi: int, seed: int = 0) -> torch.Tensor:
    """[n] long: tokens in [5, vocab_hi), past the tiny checkpoints' special tokens."""
    return torch.randint(5, vocab_hi, (n,), generator=torch.Generator().manual_seed(seed))


def asked_together(engine, asks, max_batch: int) -> tuple[list[list], object]:
    """Each (document, question, params) of `asks` submitted to a fresh AnswerScheduler while the
    model is held, so that they are admitted (and prepared) together; returns every question's
    events and the closed scheduler (its counters stay readable)."""
    from engine.scheduler import AnswerScheduler

    scheduler = AnswerScheduler(engine.runner, engine.tokenizer, max_batch=max_batch)
    try:
        with scheduler.turn():
            handles = [scheduler.submit([doc], q, p) for doc, q, p in asks]
        return [list(handle) for handle in handles], scheduler
    finally:
        scheduler.close()
