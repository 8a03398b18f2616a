"""Trains the bundled model (docqa-tiny): masked diffusion on the answer, in the inference layout.

    python -m training.train --data .train-data --model-dir models/docqa-tiny --minutes 8 \
        [--resume CHECKPOINT.pt] [--checkpoint CHECKPOINT.pt]

Objective (LLaDA SFT): per example t ~ U(eps, 1); every answer token (and, in part of the batch,
every question token) is masked with probability t; the loss is the cross-entropy on the masked
tokens weighted 1/t, averaged over the example's target tokens. Attention reproduces inference
(training/tasks.py: `attention_mask`), so `static` decoding over independently encoded chunks is
in distribution. Curriculum over K, the number of chunks: 1, then 2, then mostly 4.
fp32 master weights with bf16 autocast (pure bf16 parameters stalled in the probe). Seeded.
The run is bounded by wall-clock minutes and can resume from its checkpoint (weights, optimizer,
step, elapsed time), so a long training is a series of runs under 10 minutes.

On several GPUs of one host, data parallel (each GPU its own data stream, gradients averaged):

    torchrun --standalone --nproc-per-node 2 -m training.train ...   # --batch-size is per GPU

On CUDA the layers' halves around attention are compiled (engine.model.compiled_layers; `--no-compile`
runs them eagerly): a 384-wide model is otherwise bound by kernel launches, not arithmetic.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import os
import random
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tokenizers import Tokenizer

from engine.attention import BACKENDS, dense_mask
from engine.method.prompting import build_question_prompt
from engine.model.compiled_layers import compiled_layer_functions
from engine.model.config import ModelConfig
from engine.model.random_checkpoint import llada_config_json
from engine.model.transformer import DiffusionLM
from engine.model.weights import read_model_config, save_weights
from engine.runner import Runner
from training.synonyms import read_synonyms
from training.tasks import (
    LOOKUP_NOT_FOUND_SHARE,
    MIN_FILL,
    NIAH_VARIANT_WEIGHTS,
    TASK_WEIGHTS,
    Layout,
    TaskSampler,
    attention_mask,
    collate,
)
from training.written_questions import read_written_questions, training_items, written_questions_digest

CHUNK_SIZE = 128
ANSWER_LEN = 64
# (fraction of training time at which the stage starts, chunk counts drawn in it)
CURRICULUM = [(0.0, [1]), (0.12, [1, 2]), (0.3, [2, 4, 4]), (0.5, [1, 2, 4, 4, 4, 4])]


def _weights(text: str) -> dict[str, float]:
    """'a=1,b=2' -> {'a': 1.0, 'b': 2.0} (TaskSampler checks the names)."""
    try:
        return {k.strip(): float(v) for k, v in (item.split("=") for item in text.split(","))}
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected name=weight,... got {text!r}") from e


def _key_counts(text: str) -> tuple[int, ...]:
    """'3,4,4' -> (3, 4, 4) (TaskSampler checks the range)."""
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected numbers like 3,4,4, got {text!r}") from e


def _share(text: str) -> float:
    """'0.5' -> 0.5, a share within [0, 1]."""
    try:
        value = float(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected a number within [0, 1], got {text!r}") from e
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number within [0, 1], got {text!r}")
    return value


def model_config(tok: Tokenizer, num_layers: int = 8, hidden_size: int = 384, num_kv_heads: int = 2) -> ModelConfig:
    """The bundled model's architecture (8 x 384 by default); heads of 64, 2 KV heads, SwiGLU 3x."""
    if hidden_size % 64:
        raise ValueError(f"hidden size must be a multiple of the head size 64, got {hidden_size}")
    if (hidden_size // 64) % num_kv_heads:
        raise ValueError(f"{num_kv_heads} KV heads do not divide {hidden_size // 64} query heads")
    ids = {t: tok.token_to_id(t) for t in ("<|startoftext|>", "<|endoftext|>", "<|mdm_mask|>", "<|eot_id|>")}
    return ModelConfig(
        family="llada", vocab_size=tok.get_vocab_size(), hidden_size=hidden_size, intermediate_size=3 * hidden_size,
        num_layers=num_layers, num_heads=hidden_size // 64, num_kv_heads=num_kv_heads, head_dim=64, rms_norm_eps=1e-5,
        rope_theta=10000.0, rope_in_fp32=True,
        max_position_embeddings=4096, mask_token_id=ids["<|mdm_mask|>"], bos_token_id=ids["<|startoftext|>"],
        eos_token_id=ids["<|endoftext|>"], eot_token_id=ids["<|eot_id|>"], pad_token_id=ids["<|endoftext|>"])


def make_layout(model_dir: Path, cfg: ModelConfig) -> Layout:
    import transformers

    hf_tok = transformers.PreTrainedTokenizerFast.from_pretrained(str(model_dir))
    prompt = build_question_prompt(hf_tok, "QUESTION", cfg.bos_token_id)
    q = prompt.query_ids
    head, tail = q[:prompt.question_span[0]], q[prompt.question_span[1]:]
    return Layout(prefix=prompt.prefix_ids, query_head=head, query_tail=tail, bos=cfg.bos_token_id,
                  eos=cfg.eos_token_id, mask=cfg.mask_token_id, pad=cfg.pad_token_id)


@dataclasses.dataclass(frozen=True)
class RewordingOption:
    """--reword-share and --synonyms: TaskSampler's reword_share, and the file training.synonyms wrote."""

    share: float
    synonyms: Path


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplerOptions:
    """What a run's command line sets of its examples: TaskSampler's task and NIAH variant weights
    and its shares (each documented there), and the rewording's synonyms."""

    task_weights: dict[str, float]
    niah_variant_weights: dict[str, float]
    multiquery_keys: tuple[int, ...] | None = None
    near_miss_share: float = 0.0
    rewording: RewordingOption | None = None
    decoy_share: float = 0.0
    answerable_decoy_share: float = 0.0
    written_not_found_share: float = LOOKUP_NOT_FOUND_SHARE
    written_unanswered_share: float = 0.0
    filled_context_share: float = 0.0
    written_page_share: float = 0.0


def task_sampler(corpus_path: Path, model_dir: Path, layout: Layout, seed: int,
                 options: SamplerOptions) -> TaskSampler:
    """The training's example source: the prepared corpus, the model's tokenizer, chunks of
    CHUNK_SIZE and answers of ANSWER_LEN tokens."""
    corpus = torch.load(corpus_path, weights_only=False)
    if options.task_weights.get("written_qa"):  # tracked beside the code, not in the prepared corpus
        corpus["written_questions"] = training_items(read_written_questions())
    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    rewording = options.rewording
    return TaskSampler(corpus, lambda s: tok.encode(s).ids, tok.decode, layout, CHUNK_SIZE, ANSWER_LEN, seed=seed,
                       task_weights=options.task_weights, niah_variant_weights=options.niah_variant_weights,
                       multiquery_keys=options.multiquery_keys, near_miss_share=options.near_miss_share,
                       reword_share=rewording.share if rewording else 0.0,
                       synonyms=read_synonyms(rewording.synonyms) if rewording else None,
                       decoy_share=options.decoy_share, answerable_decoy_share=options.answerable_decoy_share,
                       written_not_found_share=options.written_not_found_share,
                       written_unanswered_share=options.written_unanswered_share,
                       filled_context_share=options.filled_context_share,
                       written_page_share=options.written_page_share)


class Batches(torch.utils.data.IterableDataset):
    """Endless batches; each worker has its own seeded sampler; the stage comes from a shared value."""

    def __init__(self, corpus_path: Path, model_dir: Path, layout: Layout, batch_size: int, seed: int, stage,
                 options: SamplerOptions) -> None:
        self.corpus_path, self.model_dir, self.layout, self.options = corpus_path, model_dir, layout, options
        self.batch_size, self.seed, self.stage = batch_size, seed, stage

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        wid = info.id if info else 0
        sampler = task_sampler(self.corpus_path, self.model_dir, self.layout, self.seed * 1000 + wid, self.options)
        rng = random.Random(self.seed * 7919 + wid)
        while True:
            ks = CURRICULUM[self.stage.value][1]
            examples = [sampler.sample(rng.choice(ks)) for _ in range(self.batch_size)]
            yield collate(examples, self.layout, CHUNK_SIZE, question_loss_share=0.3, rng=rng)


def training_runner(model: DiffusionLM, compile_layers: bool, replica: torch.nn.Module | None = None) -> Runner:
    """The model at work in training: SDPA attention (training's masks are dense), the layers'
    halves compiled with dynamic shapes on CUDA (batches vary in length) unless `compile_layers` is
    False; `replica` runs the forwards when it wraps the model (DistributedDataParallel)."""
    compiled = compile_layers and model.embed_tokens.weight.device.type == "cuda"
    return Runner(model, BACKENDS["sdpa"], dynamic_layers=compiled_layer_functions(dynamic=True) if compiled else None,
                  module=replica)


def diffusion_loss(runner: Runner, batch, gen: torch.Generator, eps: float = 0.05):
    """Masked-diffusion loss on the batch's targets; returns (loss, masked-token accuracy).

    t starts at eps = 0.05 rather than LLaDA's 1e-3: the 1/t weight then stays below 20, which
    kept the first run (t from 1e-3, lr 1.5e-3) from diverging to NaN after 1,250 steps.
    """
    cfg = runner.cfg
    ids, targets = batch["ids"], batch["targets"]
    b = ids.shape[0]
    t = eps + (1 - eps) * torch.rand(b, 1, device=ids.device, generator=gen)
    masked = targets & (torch.rand(ids.shape, device=ids.device, generator=gen) < t)
    # At least one masked target per row.
    first = torch.argmax(targets.int(), dim=1)
    none = ~masked.any(1)
    masked[none, first[none]] = True
    noisy = torch.where(masked, torch.full_like(ids, cfg.mask_token_id), ids)
    width = int(masked.sum(1).max())
    order = torch.argsort((~masked).int(), dim=1, stable=True)[:, :width]  # masked positions first
    valid = torch.gather(masked, 1, order)
    mask = dense_mask(attention_mask(batch["roles"], batch["segments"]))
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=ids.is_cuda):
        out = runner.forward(noisy, batch["positions"], mask, logits_rows=order, return_kv=False)
    logits = out.logits.float()  # [B, R, V]
    truth = torch.gather(ids, 1, order)
    # Rows flattened, not [B, V, R]: the class dimension last takes the plain softmax kernel
    # (the "spatial" one over dim 1 was a quarter of a compiled step, profiled).
    ce = F.cross_entropy(logits.flatten(0, 1), truth.flatten(), reduction="none").view_as(truth)  # [B, R]
    per_row = (ce * valid).sum(1) / t[:, 0] / targets.sum(1).clamp_min(1)
    acc = ((logits.argmax(-1) == truth) & valid).sum() / valid.sum()
    return per_row.mean(), acc


def export(model: DiffusionLM, cfg: ModelConfig, model_dir: Path, runs: list[dict]) -> None:
    model_dir.mkdir(parents=True, exist_ok=True)
    for old in model_dir.glob("model-*.safetensors"):
        old.unlink()
    save_weights(model_dir, cfg, model.state_dict(), max_shard_bytes=14_000_000)
    (model_dir / "config.json").write_text(json.dumps(llada_config_json(cfg), indent=2))
    (model_dir / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id}, indent=2))
    # docqa.json keeps what people wrote (defaults, weak_score); training.runs is these weights'
    # lineage (`runs`: the runs they descend from, then this one), not the folder's earlier contents.
    path = model_dir / "docqa.json"
    existing = json.loads(path.read_text()) if path.exists() else {}
    defaults = {"chunk_size": CHUNK_SIZE, "top_k": 4, "scorer": "self_information", "llada_folds": 4,
                "gen_length": ANSWER_LEN, "block_length": 32, "decoder": "threshold", "threshold": 0.9}
    runs = json.loads(json.dumps(runs))  # as docqa.json holds them (a run's tuples read back as lists)
    training = dict(existing.get("training", {}))
    earlier = training.get("runs", [])
    if earlier != runs[:len(earlier)]:  # other weights' lineage (a fresh model in a copied folder):
        training = {}  # its notes (machine, command, parameters) describe those weights, not these
    training["runs"] = runs
    merged = {**defaults, **{k: v for k, v in existing.items() if k != "training"}, "training": training}
    path.write_text(json.dumps(merged, indent=2))


def pool_kv_heads(state: dict[str, torch.Tensor], cfg: ModelConfig, kv_heads: int) -> dict[str, torch.Tensor]:
    """The same weights with each group of cfg.num_kv_heads // kv_heads consecutive KV heads replaced
    by their mean (GQA conversion, Ainslie et al. 2023): query head h then reads KV head
    h // (num_heads // kv_heads), the group it belonged to. k/v_proj rows are [Hkv * D]; the model
    needs training after it (the mean is a starting point, not the same function)."""
    if kv_heads < 1 or cfg.num_kv_heads % kv_heads or cfg.num_heads % kv_heads:
        raise ValueError(f"cannot pool {cfg.num_kv_heads} KV heads ({cfg.num_heads} query heads) into {kv_heads}")
    group = cfg.num_kv_heads // kv_heads
    pooled = dict(state)
    for name, t in state.items():
        if ".k_proj." in name or ".v_proj." in name:  # weight [Hkv * D, hidden] or bias [Hkv * D]
            grouped = t.reshape(kv_heads, group, cfg.head_dim, *t.shape[1:])
            pooled[name] = grouped.mean(dim=1).reshape(kv_heads * cfg.head_dim, *t.shape[1:])
    return pooled


def _start_data_parallel() -> tuple[int, int]:
    """(rank, world size): joins the process group when started by torchrun, else (0, 1)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1
    rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available() and rank >= torch.cuda.device_count():
        raise SystemExit(f"{world} processes but {torch.cuda.device_count()} CUDA devices: one each is needed")
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")  # gloo: CPU, for the tests
    return rank, world


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=Path(".train-data"))
    ap.add_argument("--model-dir", type=Path, default=Path("models/docqa-tiny"))
    ap.add_argument("--minutes", type=float, default=8.0)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=8e-4)
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resume", type=Path, default=None)
    ap.add_argument("--checkpoint", type=Path, default=Path(".train-ckpt/last.pt"))
    ap.add_argument("--total-minutes", type=float, default=None,
                    help="length of the whole training (all runs), for the curriculum and LR schedule")
    ap.add_argument("--log-file", type=Path, default=None, help="writes the run's meta and loss curve here (JSON)")
    ap.add_argument("--init-from", type=Path, default=None,
                    help="start from an exported model folder (bf16 weights, fresh optimizer): a further run "
                         "when the previous run's full checkpoint is not at hand")
    ap.add_argument("--layers", type=int, default=8, help="layers of a model trained from scratch")
    ap.add_argument("--hidden", type=int, default=384, help="hidden size of a model trained from scratch")
    ap.add_argument("--kv-heads", type=int, default=2, help="KV heads of a model trained from scratch (GQA)")
    ap.add_argument("--pool-kv-heads", type=int, default=None,
                    help="with --init-from: average the model's KV heads in groups down to this many "
                         "(grouped-query attention from a multi-head model), then train on")
    ap.add_argument("--start-stage", type=int, default=None,
                    help="first curriculum stage (with --init-from; a resumed run keeps its checkpoint's)")
    ap.add_argument("--task-weights", type=_weights, default=dict(TASK_WEIGHTS),
                    help="task draw weights, e.g. niah=12,kv_retrieval=2,hotpot=2,which_document=1")
    ap.add_argument("--niah-variant-weights", type=_weights, default=dict(NIAH_VARIANT_WEIGHTS),
                    help="NIAH variant weights, e.g. single=3,multikey=3,multivalue=3,multiquery=3")
    ap.add_argument("--multiquery-keys", type=_key_counts, default=None,
                    help="keys a multi-query question asks for, drawn uniformly from this list, e.g. 3,4,4 "
                         "(default: 2-4 uniformly)")
    ap.add_argument("--near-miss-share", type=_share, default=0.0,
                    help="of the unanswerable examples of sentence_qa, parsed_qa, written_qa and hotpot, the "
                         "share shown passages on the question's topic without its answer (default 0: none)")
    ap.add_argument("--decoy-share", type=_share, default=0.0,
                    help="of sentence_qa's, parsed_qa's and written_qa's near misses, the share shown a decoy "
                         "besides: a sentence holding a value of the answer's kind about another subject "
                         "(training.decoy_values; needs --near-miss-share; default 0: none)")
    ap.add_argument("--answerable-decoy-share", type=_share, default=0.0,
                    help="of sentence_qa's, parsed_qa's and written_qa's answerable examples, the share whose "
                         "context holds a decoy besides the answer, so that telling them apart pays, not refusing "
                         "(default 0: none)")
    ap.add_argument("--written-not-found-share", type=_share, default=LOOKUP_NOT_FOUND_SHARE,
                    help="of written_qa's examples, the share whose passage does not answer (\"not found\"; "
                         f"default {LOOKUP_NOT_FOUND_SHARE}, the other question tasks' share)")
    ap.add_argument("--written-unanswered-share", type=_share, default=0.0,
                    help="of written_qa's examples of items with unanswered questions, the share asking one "
                         "over the item's whole passage (\"not found\"; drawn before --written-not-found-share, "
                         "which applies to the rest; default 0: none)")
    ap.add_argument("--filled-context-share", type=_share, default=0.0,
                    help="of the passages sentence_qa, parsed_qa and written_qa show, the share placed among "
                         "real text that fills their chunk, as a document's chunks are at inference (one within "
                         f"{MIN_FILL} tokens of a full chunk stays as it is; default 0: each alone in a shorter chunk)")
    ap.add_argument("--written-page-share", type=_share, default=0.0,
                    help="of the passages written_qa shows for an answer or an unanswered question, the share "
                         "placed among the other passages of their own document, as a manual's page holds them "
                         "(default 0: as --filled-context-share places them)")
    ap.add_argument("--reword-share", type=_share, default=0.0,
                    help="of sentence_qa's and parsed_qa's questions, the share reworded as people ask "
                         "(training.reworded_questions; needs --synonyms; default 0: none)")
    ap.add_argument("--synonyms", type=Path, default=None,
                    help="the synonym map training.synonyms wrote (for --reword-share)")
    ap.add_argument("--no-compile", action="store_true", help="run the layers eagerly on CUDA too")
    args = ap.parse_args()
    if args.reword_share and (args.synonyms is None or not args.synonyms.is_file()):
        ap.error("--reword-share needs --synonyms, the file training.synonyms writes")
    if args.decoy_share and not args.near_miss_share:
        ap.error("--decoy-share needs --near-miss-share: decoys are shown in near misses")
    rank, world = _start_data_parallel()
    lead = rank == 0  # logs, checkpoints and exports
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    device = torch.device(f"cuda:{rank}" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    tok = Tokenizer.from_file(str(args.model_dir / "tokenizer.json"))
    resumed = torch.load(args.resume, map_location=device, weights_only=False) \
        if args.resume and args.resume.exists() else None
    # A further run keeps the architecture it starts from; a first run takes --layers / --hidden.
    if resumed is not None and "config" in resumed:
        cfg = ModelConfig(**resumed["config"])
    elif args.init_from:
        cfg = read_model_config(args.init_from)
        if args.pool_kv_heads is not None:
            cfg = dataclasses.replace(cfg, num_kv_heads=args.pool_kv_heads)
    else:
        cfg = model_config(tok, args.layers, args.hidden, args.kv_heads)
    layout = make_layout(args.model_dir, cfg)
    model = DiffusionLM(cfg).to(device)
    for name, p in model.named_parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.02 if "down_proj" not in name and "o_proj" not in name
                                  else 0.02 / math.sqrt(2 * cfg.num_layers))
    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    no_decay = [p for n, p in model.named_parameters() if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=device.type == "cuda")
    step, elapsed_before, curve = 0, 0.0, []
    earlier_runs = []  # the runs these weights descend from (docqa.json's training.runs)
    if args.init_from is not None:
        from engine.model.weights import load_model

        start_state = load_model(args.init_from, device=device, dtype=torch.float32).state_dict()
        if args.pool_kv_heads is not None:
            start_state = pool_kv_heads(start_state, read_model_config(args.init_from), args.pool_kv_heads)
        model.load_state_dict(start_state)
        earlier = args.init_from / "docqa.json"
        earlier_runs = json.loads(earlier.read_text()).get("training", {}).get("runs", []) if earlier.exists() else []
    if resumed is not None:
        model.load_state_dict(resumed["model"])
        opt.load_state_dict(resumed["optimizer"])
        step, elapsed_before, curve = resumed["step"], resumed["elapsed"], resumed["curve"]
        earlier_runs = resumed.get("runs", [])
    # A resumed call continues its run: the curriculum floor and the weights it started from are
    # the checkpoint's, unless told otherwise (else a run begun at stage 3 falls back to the
    # schedule's earlier stages for its middle stretch).
    start_stage = args.start_stage if args.start_stage is not None else \
        (resumed or {}).get("start_stage", 0)
    init_from = str(args.init_from) if args.init_from else (resumed or {}).get("init_from")
    first_step = step
    total = 60 * (args.total_minutes or args.minutes)
    stage = torch.multiprocessing.Value("i", start_stage)  # the workers draw before the first step
    # Each rank draws its own examples and masks: the seeds differ by rank (rank 0's are a
    # single-GPU run's, so one GPU reproduces the earlier runs).
    data_seed = args.seed + step + 1_000_003 * rank
    data = torch.utils.data.DataLoader(
        Batches(args.data / "corpus.pt", args.model_dir, layout, args.batch_size, data_seed, stage, SamplerOptions(
            task_weights=args.task_weights, niah_variant_weights=args.niah_variant_weights,
            multiquery_keys=args.multiquery_keys, near_miss_share=args.near_miss_share,
            rewording=RewordingOption(args.reword_share, args.synonyms) if args.reword_share else None,
            decoy_share=args.decoy_share, answerable_decoy_share=args.answerable_decoy_share,
            written_not_found_share=args.written_not_found_share,
            written_unanswered_share=args.written_unanswered_share,
            filled_context_share=args.filled_context_share, written_page_share=args.written_page_share)),
        batch_size=None, num_workers=args.workers, persistent_workers=args.workers > 0,
        prefetch_factor=4 if args.workers > 0 else None, pin_memory=device.type == "cuda")
    gen = torch.Generator(device=device).manual_seed(data_seed)
    replica = None
    if world > 1:
        ids = [device] if device.type == "cuda" else None
        replica = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
    runner = training_runner(model, not args.no_compile, replica)
    n_params = sum(p.numel() for p in model.parameters())
    if lead:
        print(f"model: {n_params / 1e6:.1f}M parameters; {world} x {device.type}; "
              f"layers {'compiled' if runner.compiled else 'eager'}; resume step {step}", flush=True)
    start = time.perf_counter()
    tokens = skipped = bad_run = 0
    good = {"model": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "optimizer": copy.deepcopy(opt.state_dict()), "step": step}
    model.train()
    for batch in data:
        # Rank 0's clock decides for all: every rank must take the same steps at the same rate.
        clock = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
        if world > 1:
            dist.broadcast(clock, 0)
        elapsed = elapsed_before + clock.item()
        frac = elapsed / total
        if clock.item() > 60 * args.minutes or frac >= 1.0:
            break
        stage.value = max(start_stage, max(i for i, (at, _) in enumerate(CURRICULUM) if frac >= at))
        lr = args.lr * min(1.0, (step + 1) / 500) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))
        for g in opt.param_groups:
            g["lr"] = lr
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        loss, acc = diffusion_loss(runner, batch, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP averages the gradients over the ranks here
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        # Judged on the averaged gradients' norm, which every rank shares (a non-finite loss on any
        # rank makes it non-finite), so all ranks skip or roll back together.
        if not torch.isfinite(norm):
            # A non-finite step is skipped; a run of them rolls back to the last good weights
            # with half the learning rate, so a spike never ends as NaN weights.
            skipped += 1
            bad_run += 1
            if bad_run >= 10:
                model.load_state_dict(good["model"])
                opt.load_state_dict(good["optimizer"])
                args.lr /= 2
                bad_run = 0
                if lead:
                    print(f"rolled back to step {good['step']}, lr now {args.lr}", flush=True)
            continue
        opt.step()
        bad_run = 0
        step += 1
        if step % 500 == 0:
            good = {"model": {k: v.detach().clone() for k, v in model.state_dict().items()},
                    "optimizer": copy.deepcopy(opt.state_dict()), "step": step}
        # Rank 0's batch times the ranks: an estimate (each rank pads its batch to its own length).
        tokens += batch["ids"].numel() * world
        if step % 100 == 0 and lead:
            row = {"step": step, "minutes": round(elapsed / 60, 2), "loss": round(loss.item(), 4), "skipped": skipped,
                   "masked_acc": round(acc.item(), 4), "stage": stage.value, "lr": lr,
                   "tokens_per_s": round(tokens / (time.perf_counter() - start))}
            curve.append(row)
            print(json.dumps(row), flush=True)
    elapsed = elapsed_before + time.perf_counter() - start
    model.eval()
    if world > 1:
        dist.destroy_process_group()
    if not lead:
        return
    # steps and minutes count from the start of training, across resumes (from first_step on here).
    meta = {"steps": step, "first_step": first_step, "skipped_steps": skipped, "minutes": round(elapsed / 60, 2),
            "batch_size": args.batch_size, "processes": world, "gpus": world if device.type == "cuda" else 0,
            "seed": args.seed,
            "parameters": n_params, "chunk_size": CHUNK_SIZE, "curriculum": CURRICULUM,
            "task_weights": args.task_weights, "niah_variant_weights": args.niah_variant_weights,
            "multiquery_keys": args.multiquery_keys, "near_miss_share": args.near_miss_share,
            "reword_share": args.reword_share, "decoy_share": args.decoy_share,
            "answerable_decoy_share": args.answerable_decoy_share,
            "written_not_found_share": args.written_not_found_share,
            "written_unanswered_share": args.written_unanswered_share,
            "filled_context_share": args.filled_context_share,
            "written_page_share": args.written_page_share,
            "written_questions_sha256": written_questions_digest() if args.task_weights.get("written_qa") else None,
            "init_from": init_from, "start_stage": start_stage,
            "pool_kv_heads": args.pool_kv_heads,
            "lr": args.lr, "total_minutes": args.total_minutes}
    runs = [*earlier_runs, meta]
    args.checkpoint.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step, "elapsed": elapsed,
                "curve": curve, "config": dataclasses.asdict(cfg), "runs": runs, "start_stage": start_stage,
                "init_from": init_from}, args.checkpoint)
    if not all(torch.isfinite(p).all() for p in model.parameters()):
        raise RuntimeError("training ended with non-finite weights; nothing exported")
    export(model, cfg, args.model_dir, runs)
    if args.log_file:
        args.log_file.write_text(json.dumps({"meta": meta, "curve": curve}, indent=1))
    print(f"done: {step} steps in {elapsed / 60:.1f} min; exported to {args.model_dir}", flush=True)


if __name__ == "__main__":
    main()
