"""Predictive chunk scoring: the model passes (draft, scoring, token relevance).

1. Draft: a short context-free diffusion pass over [prefix, query] + D mask slots guesses the
   answer's first tokens (pseudo-labels); the most confident R + 1 are committed.
2. Scoring: for every chunk, the scored rows u = query + draft attend to that chunk's cached KV
   (positions continue the chunk's local ones). Dream (shifted logits): rows are causal among
   themselves and each target is scored from the row before it, an AR likelihood. LLaDA (in
   place): masked likelihood, targets hidden in folds (leave-one-out by default).
   Score = mean log-likelihood of the question's tokens and the committed draft tokens.
   The same pass records the attention mass the last W query rows put on each chunk's BOS.
3. Token relevance (only for the selected chunks): per layer and KV head, how much attention the
   last W query rows pay to each chunk token; `engine.scoring.select_kept_tokens` turns it into
   the top-B kept tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention import AttentionBackend, dense_mask, full_mask
from engine.decode import block_logits
from engine.kv_cache import DocumentKV
from engine.model import AttentionCapture, DiffusionLM, LayerFunctions
from engine.sampling import propose
from engine.scoring import (
    SCORERS,
    attention_mass,
    causal_target_rows,
    chunk_token_relevance,
    gather_log_probs,
    masking_folds,
    mean_over_targets,
)


@dataclass(frozen=True)
class ScoringParams:
    scorer: str = "draft_self_information"
    draft_slots: int = 4  # D
    draft_rounds: int = 1  # R: commits R + 1 draft tokens
    window: int = 8  # W: last query rows used for anchors and token relevance
    llada_folds: int | None = None  # None: leave-one-out; k: k strided folds (cheaper)
    attention_layers: int = 4  # the "attention" scorer averages the last this many layers
    max_rows: int = 2048  # bound on query rows per scoring forward (batching)

    def __post_init__(self) -> None:
        if self.scorer not in SCORERS:
            raise ValueError(f"unknown scorer {self.scorer!r}; choose from {', '.join(SCORERS)}")
        if self.draft_slots < 1 or self.draft_rounds < 0 or self.draft_rounds >= self.draft_slots:
            raise ValueError("need draft_slots >= 1 and 0 <= draft_rounds < draft_slots")
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if self.llada_folds is not None and self.llada_folds < 1:
            raise ValueError(f"llada_folds must be >= 1 or None, got {self.llada_folds}")


@dataclass(frozen=True)
class Draft:
    tokens: torch.Tensor  # [D] long, uncommitted slots hold the mask id
    committed: torch.Tensor  # [D] bool


@dataclass(frozen=True)
class ScoringRows:
    """The rows every chunk is scored with: query (+ draft) tokens and which of them are targets."""

    ids: torch.Tensor  # [n] long
    targets: torch.Tensor  # [n] bool
    window: torch.Tensor  # [W] long, row indices of the last W query tokens


@dataclass
class DocumentScores:
    scores: torch.Tensor  # [N] fp32
    anchors: torch.Tensor  # [N, L] fp32: attention mass on the chunk's BOS, window rows, mean over heads


def _device(model: DiffusionLM) -> torch.device:
    return model.embed_tokens.weight.device


@torch.inference_mode()
def draft_pseudo_labels(model: DiffusionLM, attention: AttentionBackend, prompt_ids: list[int],
                        slots: int, rounds: int, layer_fns: LayerFunctions | None = None) -> Draft:
    """Context-free guess of the answer's first tokens (3 small forwards for D=4, R=1; `layer_fns`:
    the layers' halves around attention, default eager)."""
    cfg, device = model.cfg, _device(model)
    n = len(prompt_ids)
    x = torch.tensor(prompt_ids, device=device)[None]
    ctx = model(x, torch.arange(n, device=device)[None], full_mask(), attention,
                logits_rows=torch.tensor([n - 1], device=device), layer_fns=layer_fns)
    anchor = ctx.logits[0, 0]  # predicts slot 0 for a shifted-logit model
    block = torch.full((1, slots), cfg.mask_token_id, device=device)
    positions = torch.arange(n, n + slots, device=device)[None]
    committed = torch.zeros(slots, dtype=torch.bool, device=device)
    for _ in range(rounds + 1):
        masked = torch.nonzero(~committed)[:, 0]  # slot indices
        logits = block_logits(model, attention, block, positions, full_mask(), ctx.kv, masked,
                              anchor if cfg.logits_shifted else None, layer_fns)
        proposal = propose(logits, 0.0, None, None, None)
        pick = torch.argmax(proposal.confidence)
        if cfg.logits_shifted and bool(masked[0] == 0):
            pick = torch.tensor(0, device=device)  # slot 0 follows the prompt: commit it first
        block[0, masked[pick]] = proposal.tokens[pick]
        committed[masked[pick]] = True
    return Draft(tokens=block[0].cpu(), committed=committed.cpu())


def scoring_rows(query_ids: list[int], question_span: tuple[int, int], draft: Draft | None,
                 window: int, shifted: bool) -> ScoringRows:
    """Scored rows = query (+ draft); targets = the question's tokens and committed draft tokens."""
    ids = torch.tensor(query_ids, dtype=torch.long)
    targets = torch.zeros(len(query_ids), dtype=torch.bool)
    targets[question_span[0]:question_span[1]] = True
    if draft is not None:
        ids = torch.cat((ids, draft.tokens))
        targets = torch.cat((targets, draft.committed))
    if shifted:
        targets[0] = False  # its predictor is the chunk's last token, not recomputed here
    w = min(window, len(query_ids))
    return ScoringRows(ids=ids, targets=targets, window=torch.arange(len(query_ids) - w, len(query_ids)))


def _chunk_batches(n_chunks: int, rows_per_chunk: int, max_rows: int):
    step = max(1, max_rows // max(rows_per_chunk, 1))
    for start in range(0, n_chunks, step):
        yield start, min(n_chunks, start + step)


def _past(doc: DocumentKV, start: int, end: int, device: torch.device, repeat: int = 1):
    """Per-layer (k, v) of chunks [start, end), each repeated `repeat` times along the batch."""
    out = []
    for layer in range(doc.num_layers):
        k = doc.keys[layer, start:end].to(device, non_blocking=True)
        v = doc.values[layer, start:end].to(device, non_blocking=True)
        if repeat > 1:
            k, v = k.repeat_interleave(repeat, 0), v.repeat_interleave(repeat, 0)
        out.append((k, v))
    return out


def _rows_mask(lengths: torch.Tensor, c: int, n: int, causal: bool, device) -> torch.Tensor:
    """bool [b, 1, n, C + n]: every valid chunk key, then the rows (causal or full) among themselves."""
    chunk_keys = torch.arange(c, device=device)[None, :] < lengths.to(device)[:, None]  # [b, C]
    rows = torch.ones(n, n, dtype=torch.bool, device=device)
    if causal:
        rows = torch.tril(rows)
    b = lengths.numel()
    keys = chunk_keys[:, None, :].expand(b, n, c)
    return torch.cat((keys, rows[None].expand(b, n, n)), dim=-1)[:, None]


@torch.inference_mode()
def score_document(model: DiffusionLM, attention: AttentionBackend, doc: DocumentKV,
                   rows: ScoringRows, params: ScoringParams,
                   layer_fns: LayerFunctions | None = None) -> DocumentScores:
    """Scores every chunk of one document in batched passes over its cached KV (`layer_fns`: the
    layers' halves around attention, default eager)."""
    cfg, device = model.cfg, _device(model)
    n_chunks, c, n = doc.num_chunks, doc.chunk_size, rows.ids.numel()
    scores = torch.empty(n_chunks)
    anchors = torch.empty(n_chunks, cfg.num_layers)
    capture = AttentionCapture(layers=tuple(range(cfg.num_layers)), query_rows=rows.window.to(device))
    likelihood = params.scorer in ("draft_self_information", "self_information")
    folds = None
    if likelihood and not cfg.logits_shifted:
        folds = masking_folds(rows.targets, params.llada_folds)  # [F, n]
    copies = 1 if folds is None else folds.shape[0]
    for start, end in _chunk_batches(n_chunks, n * copies, params.max_rows):
        b = end - start
        lengths = doc.lengths[start:end]
        ids = rows.ids.to(device)[None].expand(b * copies, n).clone()
        if folds is not None:
            hidden = folds.to(device).repeat(b, 1)  # [b*F, n], fold f of every chunk
            ids[hidden] = cfg.mask_token_id
        pos = lengths.to(device).repeat_interleave(copies)[:, None] + torch.arange(n, device=device)
        mask = _rows_mask(lengths.repeat_interleave(copies), c, n, cfg.logits_shifted, device)
        logits_rows = None
        if likelihood and folds is None:
            logits_rows = causal_target_rows(rows.targets).to(device)
        elif likelihood:
            # Each fold reads only its hidden rows; pad to the same count with row 0 (ignored).
            per_fold = [torch.nonzero(f)[:, 0] for f in folds]
            width = max(r.numel() for r in per_fold)
            table = torch.stack([torch.cat((r, r.new_zeros(width - r.numel()))) for r in per_fold])
            logits_rows = table.to(device).repeat(b, 1)  # [b*F, width]
        out = model(ids, pos, dense_mask(mask), attention,
                    past=_past(doc, start, end, device, copies), logits_rows=logits_rows,
                    capture=capture, return_kv=False, layer_fns=layer_fns)
        probs = torch.stack([out.attention[layer] for layer in range(cfg.num_layers)], 1)
        probs = probs[::copies]  # [b, L, Hq, W, C + n], from the first fold (nothing hidden
        # in the window unless it holds a target)
        anchors[start:end] = probs[..., 0].mean(dim=(2, 3)).cpu()
        if params.scorer == "attention":
            chunk_keys = torch.arange(c + n, device=device)[None, :] < lengths.to(device)[:, None]
            chunk_keys[:, 0] = False  # BOS is a sink, not content
            last = probs[:, -params.attention_layers:]  # [b, l, Hq, W, Tk]
            mass = attention_mass(last.flatten(1, 2), chunk_keys)  # [b, l*Hq, W]
            scores[start:end] = mass.mean(dim=(1, 2)).cpu()
        elif params.scorer == "none":
            scores[start:end] = -torch.arange(start, end, dtype=torch.float32)
        elif folds is None:
            tgt = rows.ids[rows.targets].to(device)
            lp = gather_log_probs(out.logits, tgt[None].expand(b, -1))  # [b, T]
            scores[start:end] = mean_over_targets(lp, torch.ones_like(lp, dtype=torch.bool)).cpu()
        else:
            true = rows.ids.to(device)[logits_rows]  # [b*F, width] true tokens at the read rows
            lp = gather_log_probs(out.logits, true)
            read = torch.stack([torch.arange(width) < f.sum() for f in folds]).to(device).repeat(b, 1)
            lp = torch.where(read, lp, torch.zeros_like(lp)).view(b, copies * width)
            read = read.view(b, copies * width)
            scores[start:end] = mean_over_targets(lp, read).cpu()
    return DocumentScores(scores=scores, anchors=anchors)


@torch.inference_mode()
def chunk_relevance(model: DiffusionLM, attention: AttentionBackend, doc: DocumentKV,
                    chunk_ids: torch.Tensor, rows: ScoringRows, layer_fns: LayerFunctions | None = None
                    ) -> torch.Tensor:
    """Query-to-chunk attention per token, layer and KV head for some chunks: [k, L, Hkv, C] fp32."""
    cfg, device = model.cfg, _device(model)
    c, n = doc.chunk_size, rows.ids.numel()
    out_rel = torch.empty(chunk_ids.numel(), cfg.num_layers, cfg.num_kv_heads, c)
    capture = AttentionCapture(layers=tuple(range(cfg.num_layers)), query_rows=rows.window.to(device))
    for i, chunk in enumerate(chunk_ids.tolist()):
        lengths = doc.lengths[chunk:chunk + 1]
        pos = lengths.to(device)[:, None] + torch.arange(n, device=device)
        mask = _rows_mask(lengths, c, n, cfg.logits_shifted, device)
        out = model(rows.ids.to(device)[None], pos, dense_mask(mask), attention,
                    past=_past(doc, chunk, chunk + 1, device), capture=capture, return_kv=False,
                    layer_fns=layer_fns)
        for layer in range(cfg.num_layers):
            out_rel[i, layer] = chunk_token_relevance(out.attention[layer], c, cfg.num_kv_heads)[0].cpu()
    return out_rel
