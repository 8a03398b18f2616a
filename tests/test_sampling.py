"""Decoding rules on hand-made logits."""

from __future__ import annotations

import math

import pytest
import torch

from engine.decode.sampling import (
    RULES_DECIDED_TOGETHER,
    SamplingParams,
    StepPlan,
    answer_is_settled,
    choose_commits,
    choose_commits_together,
    confidence_scores,
    cut_at_stop,
    decides_without_noise,
    defer_early_stops,
    dream_timesteps,
    dream_transfer_count,
    filter_logits,
    prediction_rows,
    propose,
    select_above_threshold,
    select_top_k,
    step_limit,
    uniform_transfer_schedule,
)


def logits_with_probs(rows: list[list[float]]) -> torch.Tensor:
    """Logits whose softmax is exactly the given probability rows."""
    return torch.log(torch.tensor(rows))


def test_threshold_commits_all_confident_and_at_least_one():
    conf = torch.tensor([0.95, 0.5, 0.91, 0.2])
    assert select_above_threshold(conf, 0.9).tolist() == [True, False, True, False]
    low = torch.tensor([0.3, 0.6, 0.1])
    assert select_above_threshold(low, 0.9).tolist() == [False, True, False]


def test_threshold_decoder_on_known_probabilities():
    logits = logits_with_probs([[0.92, 0.04, 0.04], [0.5, 0.3, 0.2], [0.05, 0.05, 0.9]])
    params = SamplingParams(decoder="threshold", threshold=0.9, gen_length=3, block_length=3)
    chosen, tokens = choose_commits(logits, params, StepPlan(0, 3, 3), None)
    assert chosen.tolist() == [True, False, True]
    assert tokens.tolist() == [0, 0, 2]


def _decided_alone(logits: torch.Tensor, params: SamplingParams, plan: StepPlan) -> tuple[list[bool], list[int]]:
    """The slow reference: the proposal, then the rule's selection over one question's slots, its
    count from the schedules themselves."""
    proposal = propose(logits, 0.0, None, None, None)
    m = logits.shape[0]
    last = plan.step_in_block == plan.steps_in_block - 1
    if params.decoder == "threshold":
        chosen = select_above_threshold(proposal.confidence, params.threshold)
    else:
        if params.decoder == "low_confidence":
            schedule = uniform_transfer_schedule(plan.masked_at_block_start, plan.steps_in_block)
            k = m if last else schedule[plan.step_in_block]
        else:
            ts = dream_timesteps(plan.steps_in_block, params.eps)
            k = dream_transfer_count(m, float(ts[plan.step_in_block]), float(ts[plan.step_in_block + 1]), last)
        chosen = select_top_k(confidence_scores(proposal, params.decoder, None), k)
    return chosen.tolist(), proposal.tokens.tolist()


@pytest.mark.parametrize("rule", RULES_DECIDED_TOGETHER)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_steps_decided_together_equal_each_decided_alone(rule, dtype):
    """Five questions' steps at once, their masked slots scattered over a 7-slot block (padding
    between them), each at another point of its block: each row commits what the reference
    commits over its own slots alone."""
    gen = torch.Generator().manual_seed(5)
    n, block, vocab = 5, 7, 37
    params = SamplingParams(decoder=rule, gen_length=14, block_length=7, steps=6, threshold=0.3)
    logits = (torch.randn(n, block, vocab, generator=gen) * 3).to(dtype)
    candidates = torch.rand(n, block, generator=gen) < 0.6
    candidates[:, 3] = True  # every row has one
    candidates[0] = True  # a full block
    plans = [StepPlan(i % 3, 3, block) for i in range(n)]  # first, middle and last steps of a block
    limits = torch.tensor([step_limit(params, plan, int(c.sum())) for plan, c in zip(plans, candidates, strict=True)])
    commit, tokens = choose_commits_together(logits, candidates, rule, limits)
    assert not commit[~candidates].any()
    for i in range(n):
        slots = candidates[i].nonzero()[:, 0]
        chosen, proposed = _decided_alone(logits[i, slots], params, plans[i])
        assert commit[i, slots].tolist() == chosen
        assert tokens[i, slots].tolist() == proposed
        alone = choose_commits(logits[i, slots], params, plans[i], None)  # the loop's own path
        assert alone[0].tolist() == chosen and alone[1].tolist() == proposed


@pytest.mark.parametrize("rule", ["low_confidence", "maskgit_plus"])
def test_equal_confidences_commit_the_earlier_slots_first(rule):
    """Slots all predicted with certainty (an end token's rows, often, in bf16): a ranked rule's k
    commits go to the first k, alone and batched alike, whatever the padding beside them."""
    logits = torch.full((2, 6, 5), -40.0)
    logits[..., 1] = 40.0  # p(x0) = 1.0 in fp32 for every slot
    candidates = torch.tensor([[True] * 6, [False, True, False, True, True, True]])
    params = SamplingParams(decoder=rule, gen_length=6, block_length=6, steps=3)
    plan = StepPlan(0, 3, 6)
    k = [int(step_limit(params, plan, int(c.sum()))) for c in candidates]
    assert k[0] >= 1 and k[1] >= 1
    commit, _ = choose_commits_together(logits, candidates, rule, torch.tensor(k, dtype=torch.float32))
    assert commit[0].tolist() == [i < k[0] for i in range(6)]
    assert commit[1].nonzero()[:, 0].tolist() == [1, 3, 4, 5][:k[1]]
    alone, _ = choose_commits(logits[0], params, plan, None)
    assert alone.tolist() == commit[0].tolist()


def test_only_noise_free_rules_are_decided_together():
    assert decides_without_noise(SamplingParams())
    assert not decides_without_noise(SamplingParams(temperature=0.5))
    assert not decides_without_noise(SamplingParams(decoder="random"))
    assert not decides_without_noise(SamplingParams(decoder="maskgit_plus", alg_temp=0.1))
    assert not decides_without_noise(SamplingParams(top_k=5))
    with pytest.raises(ValueError, match="not decided without noise"):
        choose_commits_together(torch.zeros(1, 2, 3), torch.ones(1, 2, dtype=torch.bool), "origin", torch.ones(1))


def test_uniform_schedule_counts():
    assert uniform_transfer_schedule(10, 4) == [3, 3, 2, 2]
    assert uniform_transfer_schedule(32, 32) == [1] * 32
    assert sum(uniform_transfer_schedule(7, 3)) == 7


def test_low_confidence_follows_schedule_and_ranks_by_probability():
    probs = [[0.1, 0.9], [0.6, 0.4], [0.2, 0.8], [0.55, 0.45], [0.99, 0.01]]
    params = SamplingParams(decoder="low_confidence", gen_length=5, block_length=5, steps=2)
    chosen, tokens = choose_commits(logits_with_probs(probs), params, StepPlan(0, 2, 5), None)
    assert chosen.tolist() == [True, False, True, False, True]  # 3 of 5 on the first step
    assert tokens[chosen].tolist() == [1, 1, 0]


def test_dream_schedule_reproduces_truncation_quirk():
    ts = dream_timesteps(512, 1e-3)
    # With steps = 512 tokens the first step commits int(512 * (1 - s/t)) = 0 tokens.
    assert dream_transfer_count(512, float(ts[0]), float(ts[1]), False) == 0
    assert dream_transfer_count(5, float(ts[510]), float(ts[511]), True) == 5
    assert torch.isclose(ts[-1], torch.tensor(1e-3))


@pytest.mark.parametrize("kind", ["maskgit_plus", "topk_margin", "entropy"])
def test_dream_confidences(kind):
    logits = logits_with_probs([[0.7, 0.2, 0.1], [0.4, 0.35, 0.25], [0.98, 0.01, 0.01]])
    prop = propose(logits, 0.0, None, None, None)
    conf = confidence_scores(prop, kind, None)
    p = prop.probs
    if kind == "maskgit_plus":
        expected = torch.tensor([0.7, 0.4, 0.98])
    elif kind == "topk_margin":
        expected = torch.tensor([0.5, 0.05, 0.97])
    else:
        expected = (p * torch.log(p + 1e-10)).sum(-1)
    torch.testing.assert_close(conf, expected, atol=1e-6, rtol=1e-6)
    assert int(torch.argmax(conf)) == 2 and int(torch.argmin(conf)) == 1


def test_shift_is_one_place():
    slots = torch.tensor([5, 6, 9])
    assert prediction_rows(slots, logits_shifted=True).tolist() == [4, 5, 8]
    assert prediction_rows(slots, logits_shifted=False).tolist() == [5, 6, 9]
    with pytest.raises(ValueError):
        prediction_rows(torch.tensor([0]), logits_shifted=True)


def test_top_k_and_top_p_filters():
    logits = logits_with_probs([[0.5, 0.3, 0.15, 0.05]])
    assert torch.isinf(filter_logits(logits, 2, None)[0, 2:]).all()
    kept = ~torch.isinf(filter_logits(logits, None, 0.75))
    assert kept[0].tolist() == [True, True, False, False]  # 0.5 + 0.3 >= 0.75
    assert (~torch.isinf(filter_logits(logits, None, 0.5)))[0].tolist() == [True, False, False,
                                                                           False]


def test_sampling_is_reproducible_with_a_seed():
    logits = torch.randn(16, 50, generator=torch.Generator().manual_seed(0))
    a = propose(logits, 1.0, None, None, torch.Generator().manual_seed(3)).tokens
    b = propose(logits, 1.0, None, None, torch.Generator().manual_seed(3)).tokens
    c = propose(logits, 1.0, None, None, torch.Generator().manual_seed(4)).tokens
    assert torch.equal(a, b) and not torch.equal(a, c)
    greedy = propose(logits, 0.0, None, None, None).tokens
    assert torch.equal(greedy, logits.argmax(-1))


def test_gumbel_sampling_follows_the_distribution():
    probs = torch.tensor([0.6, 0.3, 0.1])
    logits = torch.log(probs).expand(20000, 3)
    tokens = propose(logits, 1.0, None, None, torch.Generator().manual_seed(0)).tokens
    freq = torch.bincount(tokens, minlength=3).float() / tokens.numel()
    assert torch.allclose(freq, probs, atol=0.02)


def test_origin_commits_with_probability_one_minus_s_over_t():
    params = SamplingParams(decoder="origin", gen_length=4000, block_length=4000, steps=10)
    logits = torch.zeros(4000, 5)
    chosen, _ = choose_commits(logits, params, StepPlan(0, 10, 4000),
                               torch.Generator().manual_seed(0))
    ts = dream_timesteps(10, params.eps)
    expected = 1 - float(ts[1]) / float(ts[0])
    assert math.isclose(chosen.float().mean().item(), expected, abs_tol=0.03)
    last, _ = choose_commits(logits, params, StepPlan(9, 10, 4000), None)
    assert last.all()


def test_eos_settles_answer():
    mask, eos = 99, 7
    assert not answer_is_settled([1, mask, eos, mask], mask, (eos,))
    assert answer_is_settled([1, 2, eos, mask], mask, (eos,))
    assert not answer_is_settled([1, 2, 3, mask], mask, (eos,))
    assert answer_is_settled([eos, mask], mask, (eos,))
    assert cut_at_stop([4, 5, 8, 7, 1], (7, 8)) == [4, 5]


def test_an_end_waits_for_the_text_before_it():
    mask, eos, pad = 99, 7, 8
    stops = (eos, pad)
    canvas = [mask] * 6
    # "5" at slot 0 and the end from slot 1 in one step: the end waits, the "5" stays.
    assert defer_early_stops([0, 1, 2, 3, 4, 5], [True] * 6, [5, eos, eos, pad, eos, eos], canvas, mask,
                             stops) == [True, False, False, False, False, False]
    # Once "5" was committed at an earlier step, the end right after it (and the run of ends) is kept.
    assert defer_early_stops([1, 2, 3, 4, 5], [True] * 5, [eos, eos, pad, eos, eos], [5] + [mask] * 5, mask,
                             stops) == [True] * 5
    # An end after a slot still masked waits; text elsewhere is committed as chosen; an end at the
    # answer's first slot (an empty answer) is the model's to give.
    assert defer_early_stops([0, 2, 3, 5], [False, True, True, True], [4, eos, 6, eos], [mask, 9, mask, mask, 3, mask],
                             mask, stops) == [False, True, True, True]
    assert defer_early_stops([1, 3], [True, True], [eos, 4], [9, mask, 2, mask], mask, stops) == [True, True]
    assert defer_early_stops([0, 1], [True, True], [eos, eos], [mask, mask], mask, stops) == [True, True]
    # Nothing left to commit: the first masked slot is, whatever it holds (its end follows text).
    assert defer_early_stops([2, 3], [False, True], [eos, eos], [1, 2, mask, mask], mask, stops) == [True, False]
    assert defer_early_stops([1, 2, 3], [False, True, True], [4, eos, eos], [1, mask, mask, mask], mask, stops) == \
        [True, False, False]


@pytest.mark.parametrize("bad", [dict(decoder="beam"), dict(gen_length=30, block_length=32),
                                 dict(gen_length=64, block_length=32, steps=3),
                                 dict(threshold=0.0), dict(top_p=1.5), dict(temperature=-1)])
def test_params_are_validated(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)
