"""`docqa-tools probe-denoising`: how well does a model know the language of a document it never saw?

Issue 20's reader fails before retrieval: given the very passage that holds an answer it reads it
wrong. Pretraining on real English is meant to teach the language first; this probe measures that
directly, without any question: the PDFs' text (eval-pdfs' sources, `tools.pdf_questions.SOURCES`)
is cut into windows laid out as the app's chunks (`[BOS] + chunk_size - 1` tokens at local
positions), a fixed share of each window's tokens is masked (seeded), and the model predicts them
in one bidirectional forward, as the first step of decoding an answer would. Reported by source
(held-out sources' text is not in the training corpus) and mask share: the masked tokens' top-1
accuracy and mean cross-entropy (nats).

A model that reads held-out prose well fills short gaps in it; a template learner does not. The
numbers compare checkpoints of one tokenizer only (a cross-entropy over another vocabulary is
another scale).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from tools.pdf_questions import SOURCES, PdfSource, known_sources, read_pdf

MASK_SHARES = (0.15, 0.5)
WINDOWS_PER_SOURCE = 48
BATCH = 16


@dataclass(frozen=True)
class DenoisingRow:
    source: str
    held_out: bool
    mask_share: float
    windows: int
    masked_tokens: int
    accuracy: float  # masked tokens predicted exactly (top-1)
    cross_entropy: float  # mean over masked tokens, nats


def text_windows(token_ids: Sequence[int], chunk_size: int, bos: int, count: int, seed: int) -> torch.Tensor:
    """Pure: up to `count` windows [count, chunk_size] of `[bos] + chunk_size - 1` consecutive
    tokens, drawn without overlap at random (seeded) from the text's consecutive runs."""
    width = chunk_size - 1
    starts = list(range(0, len(token_ids) - width + 1, width))
    picked = sorted(random.Random(seed).sample(starts, min(count, len(starts))))
    if not picked:
        return torch.empty(0, chunk_size, dtype=torch.long)
    return torch.tensor([[bos, *token_ids[s:s + width]] for s in picked], dtype=torch.long)


def masked_positions(windows: torch.Tensor, share: float, gen: torch.Generator) -> torch.Tensor:
    """Pure: a bool mask [N, C] of `round(share * (C - 1))` positions a window, BOS never among
    them, drawn with `gen`."""
    n, c = windows.shape
    count = max(1, round(share * (c - 1)))
    order = torch.rand(n, c - 1, generator=gen).argsort(dim=1)[:, :count] + 1  # [N, count], past the BOS
    masked = torch.zeros(n, c, dtype=torch.bool)
    masked.scatter_(1, order, True)
    return masked


@torch.inference_mode()
def denoise(engine, windows: torch.Tensor, masked: torch.Tensor, batch: int = BATCH) -> tuple[int, int, float]:
    """(masked tokens, right, summed cross-entropy) of the engine's one-forward predictions of
    `windows`' masked tokens."""
    mask_id = engine.config.mask_token_id
    total = right = 0
    ce_sum = 0.0
    for i in range(0, len(windows), batch):
        ids, where = windows[i:i + batch].to(engine.device), masked[i:i + batch].to(engine.device)
        noisy = torch.where(where, torch.full_like(ids, mask_id), ids)
        logits = engine.logits(noisy)  # [B, C, V], on the device: only the masked rows leave it
        if engine.config.logits_shifted:  # (Dream: row i predicts token i + 1; row 0 is BOS, never masked)
            logits = logits.roll(1, dims=1)
        picked, truth = logits[where].float(), ids[where]  # [masked, V], [masked]
        total += len(truth)
        right += int((picked.argmax(-1) == truth).sum())
        ce_sum += float(F.cross_entropy(picked, truth, reduction="sum"))
    return total, right, ce_sum


def probe(model_dir: Path, sources: Sequence[str], shares: Sequence[float] = MASK_SHARES,
          windows_per_source: int = WINDOWS_PER_SOURCE, seed: int = 0, device: str | None = None,
          catalogue: dict[str, PdfSource] = SOURCES) -> list[DenoisingRow]:
    from app.defaults import model_defaults
    from app.ingest import extract_pdf
    from engine.engine import Engine

    names = known_sources(sources, catalogue)
    # Read before the model loads: a missing package is a clear error at once.
    texts = {name: extract_pdf(read_pdf(catalogue[name])).text for name in names}
    engine = Engine.from_pretrained(model_dir, device=device)
    chunk_size = model_defaults(model_dir).chunk_size
    rows = []
    for name in names:
        ids = engine.tokenizer(texts[name], add_special_tokens=False)["input_ids"]
        windows = text_windows(ids, chunk_size, engine.config.bos_token_id, windows_per_source, seed)
        for share in shares:
            gen = torch.Generator().manual_seed(seed)
            masked = masked_positions(windows, share, gen)
            total, right, ce_sum = denoise(engine, windows, masked)
            rows.append(DenoisingRow(name, catalogue[name].held_out, share, len(windows), total,
                                     right / max(total, 1), ce_sum / max(total, 1)))
    return rows


def summarize(rows: Sequence[DenoisingRow]) -> str:
    """A markdown table, one line a source and mask share, then the held-out and seen sources pooled."""
    lines = ["| source | held out | masked | windows | accuracy | cross-entropy |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.source} | {'yes' if r.held_out else 'no'} | {r.mask_share:.0%} | {r.windows} | "
                     f"{r.accuracy:.1%} | {r.cross_entropy:.3f} |")
    for held_out in (True, False):
        for share in sorted({r.mask_share for r in rows}):
            group = [r for r in rows if r.held_out == held_out and r.mask_share == share]
            tokens = sum(r.masked_tokens for r in group)
            if not tokens:
                continue
            acc = sum(r.accuracy * r.masked_tokens for r in group) / tokens
            ce = sum(r.cross_entropy * r.masked_tokens for r in group) / tokens
            lines.append(f"| **{'held-out' if held_out else 'seen'} sources** | | {share:.0%} | "
                         f"{sum(r.windows for r in group)} | **{acc:.1%}** | {ce:.3f} |")
    return "\n".join(lines)


def write(rows: Sequence[DenoisingRow], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "rows.jsonl").write_text("".join(json.dumps(asdict(r)) + "\n" for r in rows))
    (out / "summary.md").write_text(summarize(rows) + "\n")
