"""Diffusion decoding rules as pure functions of logits, parameters and an explicit generator.

Decoders (`SamplingParams.decoder`):
- "threshold" (default; Fast-dLLM): commit every masked slot whose confidence p(x0) >= tau, and
  always at least the single most confident one; the number of steps per block is adaptive.
- "low_confidence" / "random" (LLaDA): a fixed number of commits per step from a uniform
  schedule over `steps` per block; ranked by p(x0) or by uniform noise.
- "maskgit_plus" / "topk_margin" / "entropy" (Dream): k = int(M * (1 - s/t)) commits per step over
  Dream's linspace(1, eps, steps + 1) schedule, ranked by p(x0), top-1 minus top-2, or negative
  entropy; sampled instead of ranked when `alg_temp` > 0.
- "origin" (Dream): each masked slot is committed independently with probability 1 - s/t.

All functions take logits already aligned to the slots they decode: row m of `logits` predicts slot
m. Which model row that is (Dream predicts slot i from row i - 1) is decided in exactly one place,
`prediction_rows`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DECODERS = ("threshold", "low_confidence", "random", "origin", "maskgit_plus", "topk_margin",
            "entropy")
SCHEDULED = ("low_confidence", "random")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    decoder: str = "threshold"
    gen_length: int = 128
    block_length: int = 32
    # Denoising steps over the whole answer for the scheduled and Dream decoders (split evenly over
    # blocks); None means one per token. Ignored by "threshold".
    steps: int | None = None
    threshold: float = 0.9
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    eps: float = 1e-3  # end of Dream's timestep linspace
    alg_temp: float | None = None  # Dream: sample positions from softmax(confidence / alg_temp)
    stop_at_eos: bool = True
    # Commit a stop token only right after text committed at an earlier step (or after another
    # stop token): the answer's end is then decided knowing its last word, instead of in the same
    # step as it, where a slot's prediction cannot see its neighbour's ("5" then the end, for "58").
    # Costs about one step an answer (the end waits for the text). `defer_early_stops`.
    end_after_text: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.decoder not in DECODERS:
            raise ValueError(f"unknown decoder {self.decoder!r}; choose from {', '.join(DECODERS)}")
        if self.gen_length <= 0 or self.block_length <= 0:
            raise ValueError("gen_length and block_length must be positive")
        if self.gen_length % self.block_length:
            raise ValueError(f"gen_length ({self.gen_length}) must be a multiple of block_length "
                             f"({self.block_length})")
        if self.steps is not None and (self.steps <= 0 or self.steps % self.num_blocks):
            raise ValueError(f"steps ({self.steps}) must be a positive multiple of the number of "
                             f"blocks ({self.num_blocks})")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k <= 0:
            raise ValueError(f"top_k must be positive, got {self.top_k}")
        if not 0.0 < self.eps < 1.0:
            raise ValueError(f"eps must be in (0, 1), got {self.eps}")

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length

    @property
    def steps_per_block(self) -> int:
        return (self.steps or self.gen_length) // self.num_blocks


@dataclass(frozen=True)
class Proposal:
    tokens: torch.Tensor  # [M] long: proposed token per slot (x0)
    probs: torch.Tensor  # [M, V] fp32: the distribution x0 was drawn from
    confidence: torch.Tensor  # [M] fp32: probs[m, tokens[m]]


def prediction_rows(slot_positions: torch.Tensor, logits_shifted: bool) -> torch.Tensor:
    """Model rows whose logits predict the given slots: the slot itself, or the slot before (Dream)."""
    if not logits_shifted:
        return slot_positions
    if (slot_positions < 1).any():
        raise ValueError("a shifted-logit model cannot predict position 0")
    return slot_positions - 1


def filter_logits(logits: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """Sets logits outside the top-k / nucleus to -inf (which renormalises the softmax)."""
    out = logits
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(out, top_k, dim=-1).values[..., -1:]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(out, descending=True, dim=-1)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        drop_sorted = cum - torch.softmax(sorted_logits, dim=-1) >= top_p  # keep the first over p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out


def propose(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None,
            generator: torch.Generator | None) -> Proposal:
    """Draws x0 for each slot: argmax at temperature 0, else a Gumbel-max sample in float64."""
    filtered = filter_logits(logits.float(), top_k, top_p)
    if temperature > 0:
        scaled = filtered / temperature
        probs = torch.softmax(scaled, dim=-1)
        u = torch.rand(scaled.shape, generator=generator, dtype=torch.float64,
                       device=scaled.device).clamp_min(1e-300)
        tokens = torch.argmax(scaled.double() - torch.log(-torch.log(u)), dim=-1)
    else:
        probs = torch.softmax(filtered, dim=-1)
        tokens = torch.argmax(filtered, dim=-1)
    confidence = probs.gather(-1, tokens[:, None])[:, 0]
    return Proposal(tokens=tokens, probs=probs, confidence=confidence)


def confidence_scores(proposal: Proposal, kind: str, generator: torch.Generator | None) -> torch.Tensor:
    """[M] fp32, higher = commit sooner."""
    if kind in ("threshold", "low_confidence", "maskgit_plus"):
        return proposal.confidence
    if kind == "topk_margin":
        top2 = torch.topk(proposal.probs, 2, dim=-1).values
        return top2[:, 0] - top2[:, 1]
    if kind == "entropy":
        p = proposal.probs
        return (p * torch.log(p + 1e-10)).sum(dim=-1)  # negative entropy
    if kind == "random":
        return torch.rand(proposal.confidence.shape, generator=generator,
                          device=proposal.confidence.device)
    raise ValueError(f"no confidence rule for {kind!r}")


def select_above_threshold(confidence: torch.Tensor, threshold: float) -> torch.Tensor:
    """bool [M]: slots with confidence >= threshold, and always the most confident one."""
    chosen = confidence >= threshold
    chosen[torch.argmax(confidence)] = True
    return chosen


def select_top_k(confidence: torch.Tensor, k: int, alg_temp: float | None = None,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """bool [M]: the k most confident slots, or k sampled from softmax(confidence / alg_temp)."""
    chosen = torch.zeros_like(confidence, dtype=torch.bool)
    k = min(k, confidence.numel())
    if k <= 0:
        return chosen
    if alg_temp:
        probs = torch.softmax(confidence / alg_temp, dim=-1)
        idx = torch.multinomial(probs, k, replacement=False, generator=generator)
    else:
        idx = torch.topk(confidence, k).indices
    chosen[idx] = True
    return chosen


def uniform_transfer_schedule(masked: int, steps: int) -> list[int]:
    """LLaDA's per-step commit counts: masked // steps each, the remainder on the first steps."""
    base, extra = divmod(masked, steps)
    return [base + (1 if i < extra else 0) for i in range(steps)]


def dream_timesteps(steps: int, eps: float, device: torch.device | None = None) -> torch.Tensor:
    """[steps + 1] fp32, linspace(1, eps)."""
    return torch.linspace(1, eps, steps + 1, device=device)


def dream_transfer_count(masked: int, t: float, s: float, is_last: bool) -> int:
    """Dream's k = int(M * (1 - s / t)) (truncated, as its sampler does); all on the last step."""
    return masked if is_last else int(masked * (1 - s / t))


@dataclass(frozen=True)
class StepPlan:
    """Where a step sits in its block, for the schedule-based decoders."""

    step_in_block: int
    steps_in_block: int
    masked_at_block_start: int


# Rules whose decision is a function of the logits alone at temperature 0 (no generator drawn
# from): several questions' steps can then be decided in one batched call.
RULES_DECIDED_TOGETHER = ("threshold", "low_confidence", "maskgit_plus", "topk_margin", "entropy")


def decides_without_noise(params: SamplingParams) -> bool:
    """Whether a step's commits depend on the logits alone (greedy tokens, no sampled ranking or
    filter), so that `choose_commits_together` decides them."""
    return (params.temperature == 0 and params.top_k is None and params.top_p is None
            and not params.alg_temp and params.decoder in RULES_DECIDED_TOGETHER)


def step_limit(params: SamplingParams, plan: StepPlan, masked: int) -> float:
    """The step's bound for `choose_commits_together`: the confidence threshold ("threshold"),
    else how many of the `masked` slots the ranked rule commits (all of them on a block's last
    step)."""
    if params.decoder == "threshold":
        return params.threshold
    if plan.step_in_block >= plan.steps_in_block - 1:
        return masked
    if params.decoder in SCHEDULED:
        return uniform_transfer_schedule(plan.masked_at_block_start, plan.steps_in_block)[plan.step_in_block]
    ts = dream_timesteps(plan.steps_in_block, params.eps)
    t, s = float(ts[plan.step_in_block]), float(ts[plan.step_in_block + 1])
    return dream_transfer_count(masked, t, s, False)


def choose_commits_together(logits: torch.Tensor, candidates: torch.Tensor, rule: str, limits: torch.Tensor
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """One greedy denoising decision for each of N rows (questions) at once.

    logits: [N, M, V], row n's m-th slot predicting a slot of question n (in ascending slot order
    among its candidates); candidates: [N, M] bool, False for padding (every row has at least one
    candidate); rule: one of RULES_DECIDED_TOGETHER; limits: [N] fp32, each row's `step_limit`.
    Returns (commit bool [N, M], tokens long [N, M]): per row what `choose_commits` decides over
    its candidates alone; equal scores rank the earlier slot first.
    """
    logits = logits.float()
    tokens = logits.argmax(dim=-1)  # [N, M]
    probs = torch.softmax(logits, dim=-1)  # [N, M, V]
    if rule in ("threshold", "low_confidence", "maskgit_plus"):
        score = probs.gather(-1, tokens[..., None])[..., 0]
    elif rule == "topk_margin":
        top2 = torch.topk(probs, 2, dim=-1).values
        score = top2[..., 0] - top2[..., 1]
    elif rule == "entropy":
        score = (probs * torch.log(probs + 1e-10)).sum(dim=-1)  # negative entropy
    else:
        raise ValueError(f"{rule!r} is not decided without noise; choose from {', '.join(RULES_DECIDED_TOGETHER)}")
    score = score.masked_fill(~candidates, float("-inf"))  # [N, M]
    if rule == "threshold":  # above the threshold, and always each row's most confident candidate
        commit = candidates & (score >= limits[:, None])
        return commit.scatter(1, score.argmax(dim=1, keepdim=True), True), tokens
    order = torch.sort(score, dim=1, descending=True, stable=True).indices
    places = torch.arange(order.shape[1], device=order.device).expand_as(order)
    ranks = torch.empty_like(order).scatter_(1, order, places)  # [N, M]: 0 = the most confident
    return candidates & (ranks < limits[:, None]), tokens


def choose_commits(logits: torch.Tensor, params: SamplingParams, plan: StepPlan,
                   generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One denoising decision over the M still-masked slots of the active block.

    logits: [M, V], row m predicts masked slot m. Returns (commit bool [M], tokens long [M]); only
    tokens where commit is True are to be written.
    """
    m = logits.shape[0]
    if decides_without_noise(params):  # one definition with the batched decision
        limits = torch.tensor([step_limit(params, plan, m)], dtype=torch.float32, device=logits.device)
        candidates = torch.ones(1, m, dtype=torch.bool, device=logits.device)
        commit, tokens = choose_commits_together(logits[None], candidates, params.decoder, limits)
        return commit[0], tokens[0]
    proposal = propose(logits, params.temperature, params.top_k, params.top_p, generator)
    decoder = params.decoder
    if decoder == "threshold":
        chosen = select_above_threshold(proposal.confidence, params.threshold)
    elif decoder == "origin":
        ts = dream_timesteps(plan.steps_in_block, params.eps)
        t, s = float(ts[plan.step_in_block]), float(ts[plan.step_in_block + 1])
        chosen = torch.rand(m, generator=generator, device=logits.device) < (1 - s / t)
        if plan.step_in_block >= plan.steps_in_block - 1:
            chosen[:] = True
    else:
        k = int(step_limit(params, plan, m))
        alg_temp = None if decoder in SCHEDULED else params.alg_temp
        chosen = select_top_k(confidence_scores(proposal, decoder, generator), k, alg_temp, generator)
    return chosen, proposal.tokens


def defer_early_stops(positions: list[int], commit: list[bool], tokens: list[int], canvas: list[int],
                      mask_id: int, stop_ids: tuple[int, ...]) -> list[bool]:
    """`commit` (per masked slot at `positions`, ascending) with the stop tokens left masked that
    would not follow text committed at an earlier step: a stop is kept where the slot before it
    (in `canvas`, the answer before this step) was committed already, or is a stop kept this step,
    or where it is the answer's first slot. If nothing would be committed then, the first masked
    slot is (its token, stop or not, always qualifies), so that every step makes progress."""
    stops = set(stop_ids)
    kept = list(commit)
    kept_stop_at: set[int] = set()
    for i, (pos, chosen, tok) in enumerate(zip(positions, commit, tokens, strict=True)):
        if not chosen or tok not in stops:
            continue
        before = pos - 1
        if pos == 0 or canvas[before] != mask_id or before in kept_stop_at:
            kept_stop_at.add(pos)
        else:
            kept[i] = False
    if commit and not any(kept):
        kept[0] = True
    return kept


def answer_is_settled(answer: list[int], mask_id: int, stop_ids: tuple[int, ...]) -> bool:
    """True when a stop token is committed and every slot before it is committed.

    answer: the answer canvas (token ids; masks where not yet committed). Decoders never un-commit
    a slot, so from then on the text before the stop token cannot change and decoding may end early.
    """
    first = next((i for i, tok in enumerate(answer) if tok in stop_ids), None)
    return first is not None and mask_id not in answer[:first]


def cut_at_stop(answer: list[int], stop_ids: tuple[int, ...]) -> list[int]:
    """The answer tokens before the first stop token."""
    for i, tok in enumerate(answer):
        if tok in stop_ids:
            return answer[:i]
    return answer
