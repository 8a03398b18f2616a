"""Which chunks a question's predictive scorer sees: all of them, or the top M by BM25.

Scoring every chunk costs a forward pass over every chunk: minutes a question on a CPU for a
300-page PDF, and the largest term at 1M tokens on a GPU. The prefilter keeps M candidates
(storage.chunk_index ranks them by BM25), so the scorer's cost is bounded by M whatever the
documents' size. A question whose words match fewer than M chunks (a paraphrase) gets the rest of
its M filled with chunks spread evenly over the documents, so the scorer still sees every part of
them at a coarse stride.
"""

from __future__ import annotations

from collections.abc import Sequence

PREFILTER_ALL = 0  # the setting's value that scores every chunk (the method as published)


def candidate_chunks(hits: Sequence[tuple[int, int]], num_chunks: Sequence[int], m: int | None
                     ) -> list[list[int]]:
    """Per document, the chunk ordinals to score, in document order.

    hits: (document index, chunk ordinal), best BM25 match first; num_chunks: chunks per document;
    m: how many candidates in all (None or PREFILTER_ALL: every chunk), raised to the number of
    documents with chunks, since every document asked about gets at least one candidate (the
    middle chunk of one that no hit reached). Ties in the fill go to the earlier document and
    chunk, so the choice is a pure function of its inputs."""
    total = sum(num_chunks)
    present = [d for d, n in enumerate(num_chunks) if n > 0]
    m = max(m, len(present)) if m else m
    if not m or total <= m:
        return [list(range(n)) for n in num_chunks]
    chosen: list[set[int]] = [set() for _ in num_chunks]
    taken = 0
    for doc, ordinal in hits:
        if not (0 <= ordinal < num_chunks[doc]) or ordinal in chosen[doc]:
            continue
        unreached = sum(1 for d in present if not chosen[d] and d != doc)
        if m - taken <= unreached:  # the rest of the budget is kept for documents without a hit
            continue
        chosen[doc].add(ordinal)
        taken += 1
    for d in present:
        if not chosen[d]:
            chosen[d].add(num_chunks[d] // 2)
            taken += 1
    if taken < m:
        # The pool's chunks in order; take every stride-th one not already chosen.
        pool = [(d, j) for d, n in enumerate(num_chunks) for j in range(n) if j not in chosen[d]]
        need = m - taken
        stride = len(pool) / need
        for i in range(need):
            d, j = pool[int(i * stride)]
            chosen[d].add(j)
    return [sorted(c) for c in chosen]


def bm25_priors(hits: Sequence[tuple[int, int, float]], candidates: Sequence[Sequence[int]]) -> list[list[float]]:
    """Per document and candidate chunk (as `candidate_chunks` gives them), its BM25 relevance as a
    share of the best hit's: 1.0 for the best match, 0.0 for a chunk no question word reached (the
    even fill). hits: (document index, chunk ordinal, FTS5 bm25 score; lower is better, negative
    for a match). What the predictive score is fused with (engine.method.scoring.fuse_scores)."""
    relevance = {(d, o): -score for d, o, score in hits if score < 0}
    best = max(relevance.values(), default=0.0)
    return [[relevance.get((d, o), 0.0) / best if best > 0 else 0.0 for o in chosen]
            for d, chosen in enumerate(candidates)]


def prefilter(hits: Sequence[tuple[int, int, float]], num_chunks: Sequence[int], m: int
              ) -> tuple[list[list[int]], list[list[float]]]:
    """Per document, the candidates (`candidate_chunks`) and their BM25 priors (`bm25_priors`) from
    (document index, chunk ordinal, bm25) hits, best first: the store's rule and the evaluation's."""
    chosen = candidate_chunks([(d, o) for d, o, _ in hits], num_chunks, m)
    return chosen, bm25_priors(hits, chosen)
