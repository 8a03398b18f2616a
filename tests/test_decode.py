"""The diffusion loop and the baselines: dense decoding against a plain, independent reference loop over
transformers models, and Fast-dLLM's dual cache against dense (engine/decode/loop.py, baselines.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine import Engine, SamplingParams
from engine.decode.baselines import DenseDecoder, FastDLLMDecoder, dense_decode
from engine.decode.loop import DecodeStep, LogitsRequest, decide_together, host_to_device, slot_logits_from_rows
from engine.decode.sampling import StepPlan, choose_commits
from engine.engine import GenerationResult
from tests.test_parity_hf import hf_logits, hf_reference


@pytest.fixture(scope="module")
def pair(request, dream_dir, llada_dir):
    folder = dream_dir if request.param == "dream" else llada_dir
    return Engine.from_pretrained(folder, device="cpu"), hf_reference(request.param, folder)


def reference_greedy(hf_model, cfg, prompt, gen_length, block_length, rule, threshold=0.9):
    """Straightforward greedy loop: full forward, shift for Dream, commit per block.

    rule "one": the single most confident masked slot per step; "threshold": every slot with
    p >= threshold plus the most confident.
    """
    x = list(prompt) + [cfg.mask_token_id] * gen_length
    pos = torch.arange(len(x))
    for b in range(gen_length // block_length):
        lo = len(prompt) + b * block_length
        block = range(lo, lo + block_length)
        while any(x[i] == cfg.mask_token_id for i in block):
            logits = hf_logits(hf_model, torch.tensor(x), pos)
            if cfg.logits_shifted:  # slot i is predicted by row i - 1
                logits = torch.cat((logits[:1], logits[:-1]))
            masked = [i for i in block if x[i] == cfg.mask_token_id]
            probs = torch.softmax(logits[masked], dim=-1)
            conf, tok = probs.max(dim=-1)
            best = int(conf.argmax())
            for j, i in enumerate(masked):
                if j == best or (rule == "threshold" and conf[j] >= threshold):
                    x[i] = int(tok[j])
    return x[len(prompt):]


@pytest.mark.parametrize("pair", ["dream", "llada"], indirect=True)
@pytest.mark.parametrize("rule,threshold", [("one", None), ("threshold", 0.9),
                                            ("threshold", 0.004)])
def test_greedy_equals_reference_loop(pair, rule, threshold):
    engine, ref = pair
    prompt = engine.encode("Where is the report filed?", use_chat_template=True)
    gen, block = 24, 8
    if rule == "one":
        params = SamplingParams(decoder="low_confidence", gen_length=gen, block_length=block,
                                stop_at_eos=False)
    else:
        params = SamplingParams(decoder="threshold", threshold=threshold, gen_length=gen,
                                block_length=block, stop_at_eos=False)
    loop = dense_decode(engine.runner, torch.tensor(prompt), params, None)
    steps = []
    while True:
        try:
            steps.append(next(loop))
        except StopIteration as done:
            outcome = done.value
            break
    expected = reference_greedy(ref, engine.config, prompt, gen, block, rule, threshold or 0.9)
    assert outcome.canvas == expected
    # Blocks are decoded in order, each finished before the next starts.
    blocks = [s.block for s in steps]
    assert blocks == sorted(blocks)
    for s in steps:
        assert all(s.block * block <= p < (s.block + 1) * block for p in s.positions)
    assert outcome.forward_passes == len(steps)
    if rule == "one":
        assert all(len(s.tokens) == 1 for s in steps) and len(steps) == gen
    if threshold == 0.004:
        assert any(len(s.tokens) > 1 for s in steps), "pick a threshold that commits in parallel"


def test_stops_at_eos(llada_dir):
    """Declaring a token the model writes early to be EOS ends decoding once it is settled."""
    engine = Engine.from_pretrained(llada_dir, device="cpu")  # its own copy: the config changes
    params = SamplingParams(decoder="low_confidence", gen_length=32, block_length=8,
                            stop_at_eos=False)
    prompt = engine.encode("Hello there")
    full = engine.generate(prompt, params)
    stop_token = full.answer_ids[3]
    first = full.answer_ids.index(stop_token)
    engine.model.cfg = dataclasses.replace(engine.config, eos_token_id=stop_token,
                                           eot_token_id=None)
    stopped = engine.generate(prompt, dataclasses.replace(params, stop_at_eos=True))
    assert stopped.answer_ids == full.answer_ids[:first]
    assert stopped.stopped_early and stopped.steps < full.steps


def _ends_beside_new_text(events: list, stop: int) -> int:
    """How many of the steps' committed stops follow a slot that was masked before that step and is
    not a stop committed with it."""
    canvas, count = {}, 0
    for step in events[:-1]:
        new = dict(zip(step.positions, step.tokens, strict=True))
        count += sum(tok == stop and pos > 0 and pos - 1 not in canvas and new.get(pos - 1) != stop
                     for pos, tok in new.items())
        canvas.update(new)
    return count


def test_an_end_is_committed_only_after_earlier_text(llada_dir):
    """Over a real decode, with a token the random model writes declared the end: without
    end_after_text some step commits the end beside text it commits too; with it none does, and
    the answer still settles."""
    engine = Engine.from_pretrained(llada_dir, device="cpu")  # its own copy: the config changes
    params = SamplingParams(decoder="threshold", threshold=0.05, gen_length=32, block_length=16)
    prompt = engine.encode("Hello there")
    config = engine.config
    for stop in sorted(set(engine.generate(prompt, dataclasses.replace(params, stop_at_eos=False)).answer_ids)):
        engine.model.cfg = dataclasses.replace(config, eos_token_id=stop, eot_token_id=None)
        if _ends_beside_new_text(list(engine.stream_generate(prompt, params)), stop):
            break
    else:
        pytest.fail("no token of the answer, made the end, is committed beside new text: pick another prompt")
    events = list(engine.stream_generate(prompt, dataclasses.replace(params, end_after_text=True)))
    assert _ends_beside_new_text(events, stop) == 0
    assert stop not in events[-1].answer_ids and len(events) > 1


@pytest.mark.parametrize("pair", ["dream"], indirect=True)
def test_sampled_generation_is_seeded(pair):
    engine, _ = pair
    base = SamplingParams(decoder="entropy", gen_length=16, block_length=16, steps=8,
                          temperature=1.0, stop_at_eos=False, seed=11)
    a = engine.generate("Tell me", base)
    b = engine.generate("Tell me", base)
    c = engine.generate("Tell me", dataclasses.replace(base, seed=12))
    assert a.answer_ids == b.answer_ids and a.answer_ids != c.answer_ids
    assert a.steps == 8


@pytest.mark.parametrize("pair", ["dream"], indirect=True)
def test_stream_yields_steps_then_result(pair):
    engine, _ = pair
    events = list(engine.stream_generate(
        [{"role": "user", "content": "Hi"}],
        SamplingParams(gen_length=16, block_length=8, stop_at_eos=False)))
    assert all(isinstance(e, DecodeStep) for e in events[:-1])
    result = events[-1]
    assert isinstance(result, GenerationResult)
    committed = sorted(p for e in events[:-1] for p in e.positions)
    assert committed == list(range(16))
    assert result.text == engine.tokenizer.decode(result.answer_ids, skip_special_tokens=True)


def test_fastdllm_first_block_step_matches_dense(engines):
    """Fast-dLLM's block-start forward is a full forward, so its first step equals dense's."""
    engine = engines["dream"]
    prompt = torch.randint(5, 300, (40,), generator=torch.Generator().manual_seed(10))
    answer = torch.full((16,), engine.config.mask_token_id)
    with torch.no_grad():
        fast = FastDLLMDecoder(engine.runner, prompt, 8)
        fast.block_start(0, answer)
        a = fast.slot_logits(0, answer, torch.arange(8))
        b = DenseDecoder(engine.runner, prompt).slot_logits(0, answer, torch.arange(8))
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shifted", [False, True])
def test_steps_decided_together_are_each_request_alone_whatever_its_row(shifted):
    """Four questions of three rules in rows 4, 0, 5 and 2 of a six-row block forward, their
    second block partly committed (slot 0 masked in some, an anchor missing in one): each decision,
    and what is written into each answer, is the request's own `choose_commits` over its rows."""
    gen = torch.Generator().manual_seed(3)
    block, vocab, mask_id = 5, 23, 22
    block_logits = torch.randn(6, block, vocab, generator=gen) * 3  # [R, S, V]
    rules = [SamplingParams(decoder="threshold", threshold=0.2, gen_length=10, block_length=5),
             SamplingParams(decoder="low_confidence", gen_length=10, block_length=5, steps=8),
             SamplingParams(decoder="maskgit_plus", gen_length=10, block_length=5, steps=8),
             SamplingParams(decoder="threshold", threshold=0.6, gen_length=10, block_length=5)]
    masked = [(5, 6, 7, 8, 9), (6, 8, 9), (5, 9), (7,)]
    rows, anchors = [4, 0, 5, 2], [torch.randn(vocab, generator=gen) for _ in range(3)] + [None]
    requests = []
    for params, slots in zip(rules, masked, strict=True):
        answer = torch.randint(0, 20, (10,), generator=gen)
        answer[list(slots)] = mask_id
        requests.append(LogitsRequest(None, 1, answer, torch.tensor(slots), slots, params,
                                      StepPlan(1, 4, 5)))
    before = [r.answer.clone() for r in requests]
    decided = decide_together(requests, block_logits, rows, anchors, shifted)
    for r, d, row, anchor, old in zip(requests, decided, rows, anchors, before, strict=True):
        local = r.slots - 5
        alone = slot_logits_from_rows(block_logits[row, local], local, anchor, shifted)
        commit, tokens = choose_commits(alone, r.params, r.plan, None)
        assert d.commit == commit.tolist() and d.tokens == tokens.tolist()
        expected = old.clone()
        expected[r.slots[commit]] = tokens[commit]
        assert torch.equal(r.answer, expected)
    assert any(any(d.commit) and not all(d.commit) for d in decided)  # some commit part of their slots


@pytest.mark.parametrize("values,dtype", [([[3, 1, 4], [1, 5, 9]], None), ([True, False, True], None),
                                          ([0.5, 2.0], torch.float32)])
def test_host_to_device_gives_what_torch_tensor_gives(values, dtype):
    """The decisions' small inputs: the values and dtype `torch.tensor` makes of them (the CPU branch;
    the pinned, non-blocking one is `test_host_to_device_does_not_wait_for_the_gpu`)."""
    got = host_to_device(values, torch.device("cpu"), dtype)
    want = torch.tensor(values, dtype=dtype)
    assert got.dtype == want.dtype and torch.equal(got, want)


@pytest.mark.gpu
def test_host_to_device_does_not_wait_for_the_gpu():
    """On CUDA the copy goes through pinned memory without a synchronisation (the sync debug mode
    raises on one; a plain `torch.tensor(..., device=...)` trips it), and the values arrive."""
    device = torch.device("cuda")
    busy = torch.randn(4096, 4096, device=device)
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        busy = busy @ busy  # queued work the copy must not wait for
        got = host_to_device([[7, 8], [9, 10]], device)
        with pytest.raises(RuntimeError):
            torch.tensor([1, 2], device=device)
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    assert got.device.type == "cuda" and torch.equal(got.cpu(), torch.tensor([[7, 8], [9, 10]]))
