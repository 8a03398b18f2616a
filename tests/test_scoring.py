"""Selection from scores: kept tokens, coverage, automatic K, margins (engine/method/scoring.py)."""

from __future__ import annotations

import torch

from engine.method.scoring import auto_top_k, select_by_coverage, select_kept_tokens, select_within_margin


def test_kept_tokens_keep_bos_and_respect_budget():
    g = torch.Generator().manual_seed(0)
    relevance = torch.rand(3, 2, 4, 20, generator=g)
    relevance[..., 0] = -5.0  # BOS has the lowest relevance and is still kept
    lengths = torch.tensor([20, 20, 5])
    kept, valid = select_kept_tokens(relevance, lengths, budget=8, pool_kernel=1)
    assert kept.shape == (3, 2, 4, 8) and valid.shape == (3, 8)
    assert (kept[..., 0] == 0).all()
    assert (kept[:2].diff(dim=-1) > 0).all(), "ascending, distinct offsets"
    assert valid[2].tolist() == [True] * 5 + [False] * 3  # short chunk: all 5 tokens, 3 padding slots
    assert sorted(kept[2, 0, 0, :5].tolist()) == [0, 1, 2, 3, 4]
    top = torch.topk(relevance[0, 1, 2, 1:], 7).indices + 1
    assert sorted(kept[0, 1, 2, 1:].tolist()) == sorted(top.tolist())
    everything, all_valid = select_kept_tokens(relevance, lengths, budget=0)
    assert everything.shape[-1] == 20 and all_valid[0].all()


def test_maxpool_smoothing_keeps_neighbours():
    relevance = torch.zeros(1, 1, 1, 30)
    relevance[..., 15] = 1.0  # one hot spot: smoothing spreads it to its neighbours
    kept, _ = select_kept_tokens(relevance, torch.tensor([30]), budget=8, pool_kernel=7)
    assert kept[0, 0, 0].tolist() == [0, 12, 13, 14, 15, 16, 17, 18]


def test_select_by_coverage_keeps_complementary_chunks_not_decoys():
    # Question tokens: two of shared wording, then two keys. Chunk 3 explains the wording and the
    # first key (the best); chunk 0 is a decoy (the wording only) that scores above chunk 5,
    # which explains the second key; chunk 1 is haystack.
    token_scores = torch.tensor([[0.0, 0.0, -0.5, -5.0],  # 0: decoy, mean -1.375
                                 [-4.0, -4.0, -5.0, -5.0],  # 1: haystack
                                 [-3.0, -3.0, -5.0, -5.0],  # 2: haystack
                                 [-0.1, -0.1, -0.1, -5.0],  # 3: best, mean -1.325
                                 [-4.0, -4.0, -5.0, -5.0],  # 4: haystack
                                 [-0.6, -0.6, -5.0, -0.1]])  # 5: the second key, mean -1.575
    scores = token_scores.mean(1)
    assert select_by_coverage(scores, token_scores, 4, 0.1).tolist() == [3, 5]  # document order
    assert select_by_coverage(scores, token_scores, 4, 0.01).tolist() == [0, 3, 5]  # the decoy adds 0.05
    assert select_by_coverage(scores, token_scores, 1, 0.1).tolist() == [3]  # K caps it
    assert select_by_coverage(scores, token_scores, 4, 0.1, pool=2).tolist() == [3]  # 5 is third by score
    assert select_by_coverage(scores, token_scores, 4, 100.0).tolist() == [3]  # the best is always kept
    # A margin keeps near-best chunks that add nothing (a second value for the same key) as well.
    assert select_by_coverage(scores, token_scores, 4, 0.1, margin=0.1).tolist() == [0, 3, 5]
    assert select_by_coverage(scores, token_scores, 4, 100.0, margin=0.3).tolist() == [0, 3, 5]
    assert select_by_coverage(torch.zeros(0), torch.zeros(0, 4), 4, 0.1).numel() == 0


def test_auto_top_k_cuts_at_the_largest_drop():
    assert auto_top_k(torch.tensor([-1.0, -0.1, -1.1, -0.2, -1.2])) == 2  # -0.2 -> -1.0 is the drop
    assert auto_top_k(torch.tensor([-0.1, -5.0, -5.1]), k_min=2) == 2
    assert auto_top_k(torch.tensor([-0.1, float("-inf"), -3.0]), k_max=8) == 1  # failed chunks never count
    assert auto_top_k(torch.tensor([-0.1])) == 1


def test_select_within_margin_drops_far_chunks_keeps_the_best_and_document_order():
    scores = torch.tensor([-1.5, -0.02, -1.1, -1.6, -0.4, -1.2])
    assert select_within_margin(scores, 4, 0.5).tolist() == [1, 4]  # -1.1 and -1.2 are > 0.5 below
    assert select_within_margin(scores, 4, 2.0).tolist() == [1, 2, 4, 5]  # K still caps it
    assert select_within_margin(scores, 1, 2.0).tolist() == [1]
    assert select_within_margin(scores, 4, 1e-9).tolist() == [1]  # the best is always kept
    assert select_within_margin(torch.zeros(0), 4, 0.5).numel() == 0


def test_the_margin_reads_the_scorers_own_scores_when_selection_ranks_fused_ones():
    # Two copies of one fact (a list's values in two chunks) explain the question equally well
    # (-1.0 and -1.1 nats a token); a keyword prior of 10 nats puts 3 nats between them. Ranked by
    # the fused scores, the margin of 0.5 on the scorer's own still keeps both; on the fused, one.
    own = torch.tensor([-1.0, -4.0, -1.1, -5.0])
    fused = own + 10 * torch.tensor([1.0, 0.2, 0.7, 0.0])
    tokens = torch.tensor([[-1.0, -1.0], [-4.0, -4.0], [-1.1, -1.1], [-5.0, -5.0]])
    assert select_within_margin(fused, 3, 0.5, margin_scores=own).tolist() == [0, 2]
    assert select_within_margin(fused, 3, 0.5).tolist() == [0]
    assert select_by_coverage(fused, tokens, 3, 0.1, margin=0.5, margin_scores=own).tolist() == [0, 2]
    assert select_by_coverage(fused, tokens, 3, 0.1, margin=0.5).tolist() == [0]
