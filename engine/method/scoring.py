"""Chunk relevance, selection and token sparsity as pure functions of tensors.

The model passes that produce the logits and attention live in `engine.method.chunk_scorer`; everything
here is arithmetic on their outputs, testable with hand-made tensors.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SCORERS = ("draft_self_information", "self_information", "attention", "none")
LIKELIHOOD_SCORERS = ("draft_self_information", "self_information")  # score = mean log p of the targets


def gather_log_probs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log p(tokens) under logits: logits [..., V], tokens [...] -> [...] fp32."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens[..., None])[..., 0]


def mean_over_targets(log_probs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean log-likelihood per row over its target positions: [b, n] and bool [b, n] -> [b].

    A row with no finite target scores -inf (never selected before a scored chunk).
    """
    lp = torch.where(targets, log_probs, torch.zeros_like(log_probs))
    count = targets.sum(-1)
    score = lp.sum(-1) / count.clamp_min(1)
    bad = (count == 0) | ~torch.isfinite(score)
    return torch.where(bad, torch.full_like(score, float("-inf")), score)


def causal_target_rows(targets: torch.Tensor) -> torch.Tensor:
    """Rows whose (shifted) logits predict each target: target t is predicted by row t - 1.

    targets: bool [n] over the scored rows; target 0 cannot be scored (its predictor is the chunk's
    last token, whose logits are not recomputed) and must be False.
    """
    if bool(targets[0]):
        raise ValueError("the first scored row cannot be a target under causal scoring")
    return torch.nonzero(targets)[:, 0] - 1


def masking_folds(targets: torch.Tensor, folds: int | None) -> torch.Tensor:
    """Which targets each masked-likelihood pass hides: bool [F, n].

    folds=None: leave-one-out (one pass per target, the exact estimator). folds=k: k passes,
    pass r hides every target whose rank among the targets is r mod k (a cheaper estimator that
    conditions each target on the k-1 of every k targets left visible).
    """
    idx = torch.nonzero(targets)[:, 0]
    n_folds = idx.numel() if folds is None else min(folds, max(idx.numel(), 1))
    plan = torch.zeros(max(n_folds, 1), targets.numel(), dtype=torch.bool)
    for rank, pos in enumerate(idx.tolist()):
        plan[rank % n_folds, pos] = True
    return plan


def chunk_token_relevance(probs: torch.Tensor, chunk_len: int, kv_heads: int) -> torch.Tensor:
    """Query-to-chunk attention per chunk token and KV head, summed over query rows.

    probs: [b, Hq, R, Tk] with the chunk's keys first (Tk >= chunk_len). Query heads are averaged
    within their GQA group (KV head j serves query heads j*g .. j*g+g-1). -> [b, Hkv, chunk_len].
    """
    b, hq, r, _ = probs.shape
    per_token = probs[..., :chunk_len].sum(2)  # [b, Hq, C]
    return per_token.view(b, kv_heads, hq // kv_heads, chunk_len).mean(2)


def maxpool_along_chunk(scores: torch.Tensor, kernel: int) -> torch.Tensor:
    """Max-pool with stride 1 and same-length output along the last axis (smooths spans)."""
    if kernel <= 1:
        return scores
    shape = scores.shape
    flat = scores.reshape(-1, 1, shape[-1])
    pooled = F.max_pool1d(flat, kernel, stride=1, padding=kernel // 2)
    return pooled[..., :shape[-1]].reshape(shape)


def select_kept_tokens(relevance: torch.Tensor, lengths: torch.Tensor, budget: int,
                       pool_kernel: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-B tokens per chunk, layer and KV head; BOS (offset 0) always kept.

    relevance: [K, L, Hkv, C] fp32; lengths: [K] valid tokens per chunk. Returns
    (kept [K, L, Hkv, B'] long, ascending offsets; valid [K, B'] bool) with B' = min(B, C), or B' = C
    (everything kept) when budget is 0. A chunk with fewer than B' valid tokens keeps all of them;
    its extra slots point at offset 0 and are marked invalid, so tensors stay rectangular.
    """
    k, layers, hkv, c = relevance.shape
    keep = c if budget <= 0 else min(budget, c)
    offsets = torch.arange(c, device=relevance.device)
    valid_tok = offsets[None, :] < lengths[:, None].to(relevance.device)  # [K, C]
    scores = maxpool_along_chunk(relevance, pool_kernel)
    scores = scores.masked_fill(~valid_tok[:, None, None, :], float("-inf"))
    scores[..., 0] = float("inf")  # BOS, the chunk's attention anchor, is always kept
    top = torch.topk(scores, keep, dim=-1).indices  # [K, L, Hkv, B']
    n_valid = lengths.to(relevance.device).clamp(max=keep)  # [K]
    slot_valid = torch.arange(keep, device=relevance.device)[None, :] < n_valid[:, None]  # [K, B']
    # topk puts valid tokens first (invalid ones are -inf); send the invalid slots to offset 0.
    top = torch.where(slot_valid[:, None, None, :], top, torch.zeros_like(top))
    sort_key = torch.where(slot_valid[:, None, None, :], top, torch.full_like(top, c))
    order = torch.argsort(sort_key, dim=-1)
    return torch.gather(top, -1, order), slot_valid


def fuse_scores(scores: torch.Tensor, priors: torch.Tensor | None, weight: float) -> torch.Tensor:
    """scores [N] + weight x priors [N]: the predictive score (nats a token for the likelihood
    scorers) with a prior relevance in [0, 1] (the app's: BM25 as a share of the best match) worth
    up to `weight` nats. Unchanged without priors or with weight 0."""
    if priors is None or weight == 0.0:
        return scores
    if priors.shape != scores.shape:
        raise ValueError(f"{priors.numel()} priors for {scores.numel()} chunk scores")
    return scores + weight * priors.to(scores.device, scores.dtype)


def select_top_chunks(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k best chunks (ties go to the earlier chunk), returned in document order."""
    n = scores.numel()
    k = min(max(k, 0), n)
    order = torch.sort(-scores.float(), stable=True).indices  # descending, stable
    return torch.sort(order[:k]).values


def select_within_margin(scores: torch.Tensor, k: int, margin: float,
                         margin_scores: torch.Tensor | None = None) -> torch.Tensor:
    """The k best chunks (`select_top_chunks`) less those whose `margin_scores` (default `scores`)
    fall more than `margin` below the best one's (the best is always kept), in document order.
    With likelihood scores (mean log-probability a target token) the margin is in nats a token: a
    chunk that explains the question that much worse than the best is left out rather than read (a
    decoy that shares the question's wording but not its key, say). Ranked by scores fused with a
    keyword prior, the margin still reads the scorer's own: the prior's gaps are no likelihood."""
    chosen = select_top_chunks(scores, k)
    if chosen.numel() == 0:
        return chosen
    judged = (scores if margin_scores is None else margin_scores)[chosen].float()
    return chosen[judged >= judged.max() - margin]


def select_by_coverage(scores: torch.Tensor, token_scores: torch.Tensor, k: int, min_gain: float,
                       margin: float | None = None, pool: int | None = None,
                       margin_scores: torch.Tensor | None = None) -> torch.Tensor:
    """Up to k chunks that together explain the question, in document order.

    scores [N] (the mean of each row of token_scores), token_scores [N, T]: log p of each target
    token given one chunk. The best chunk is kept; then, in score order among the `pool` best
    (default 2k), each chunk that raises the question's per-token best log-likelihood by more than
    `min_gain` nats a token on average, or (with a `margin`) scores within `margin` of the best.
    A chunk explaining another part of the question (one of several asked keys) is kept however
    low its mean; one that only repeats the question's wording (a decoy sharing it but not its
    key) adds nothing; the margin keeps second copies of the same fact (several values for one
    key), which add nothing either but score as well as the best. The margin compares
    `margin_scores` (default `scores`): where `scores` are fused with a keyword prior, the
    scorer's own, since a prior of several nats would leave such copies out (a list's values).
    """
    n = scores.numel()
    k = min(max(k, 0), n)
    if k == 0:
        return torch.zeros(0, dtype=torch.long)
    order = torch.sort(-scores.float(), stable=True).indices[: pool or 2 * k]
    ts = token_scores.float()
    judged = (scores if margin_scores is None else margin_scores).float()
    top = float(judged[order[0]])
    kept = [int(order[0])]
    best = ts[order[0]].clone()  # [T]: per token, the best log-likelihood among the kept chunks
    for c in order[1:].tolist():
        if len(kept) == k:
            break
        better = torch.maximum(best, ts[c])
        if (better - best).mean() > min_gain or (margin is not None and float(judged[c]) >= top - margin):
            kept.append(c)
            best = better
    return torch.sort(torch.tensor(kept)).values


def auto_top_k(scores: torch.Tensor, k_min: int = 1, k_max: int = 8) -> int:
    """Picks K at the largest drop in the sorted scores.

    Scores sorted descending s_1 >= s_2 >= ...; K is the i in [k_min, k_max] (capped at N) that
    maximises the gap s_i - s_{i+1}, the smallest such i on ties: keep the chunks that clearly beat
    the rest. With N <= k_min every chunk is kept. -inf scores (failed chunks) are never counted.
    """
    finite = scores[torch.isfinite(scores)].float()
    n = finite.numel()
    if n <= k_min:
        return max(n, 0)
    s = torch.sort(finite, descending=True).values
    hi = min(k_max, n - 1)
    if hi < k_min:
        return min(k_max, n)
    gaps = s[k_min - 1:hi] - s[k_min:hi + 1]  # gap after position i, for i = k_min..hi
    return k_min + int(torch.argmax(gaps))
