"""The public engine API: a loaded model, its tokenizer, and generation."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.attention import AttentionBackend, full_mask, select_backend
from engine.decode.baselines import dense_decode
from engine.decode.loop import DecodeStep
from engine.decode.sampling import SamplingParams
from engine.method.answer import AnswerParams, AnswerResult, stream_answer
from engine.method.chunking import ChunkedTokens
from engine.method.kv_cache import DocumentKV
from engine.method.prefill import (
    PREFILL_TOKEN_BUDGET,
    PrefillBatch,
    ProgressFn,
    default_token_budget,
    document_chunks,
    prefill_batches,
    prefill_document,
)
from engine.model.config import ModelConfig
from engine.model.tokenizer import encode_prompt, load_tokenizer
from engine.model.transformer import DiffusionLM
from engine.model.weights import default_dtype, load_model, model_fingerprint, read_model_config
from engine.runner import Runner

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationResult:
    text: str
    answer_ids: list[int]
    prompt_tokens: int
    steps: int
    forward_passes: int
    stopped_early: bool
    seconds: float


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The requested device, or CUDA when present, else CPU (decided at call time, not import)."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but torch sees no CUDA device")
    return device


class Engine:
    """A diffusion LM ready to run: `Engine.from_pretrained(folder)`."""

    def __init__(self, runner: Runner, tokenizer, path: Path | None = None, fingerprint: str = "") -> None:
        # The model at work: its weights, attention backend and layer halves, and the passes (and
        # captured graphs) one question leaves for the next.
        self.runner = runner
        self.tokenizer = tokenizer
        self.path = path
        # Identifies the checkpoint (config, tokenizer, weights): KV caches are keyed by it.
        self.fingerprint = fingerprint

    @property
    def model(self) -> DiffusionLM:
        return self.runner.model

    @property
    def attention(self) -> AttentionBackend:
        return self.runner.attention

    @property
    def config(self) -> ModelConfig:
        return self.runner.cfg

    @property
    def device(self) -> torch.device:
        return self.runner.device

    @property
    def dtype(self) -> torch.dtype:
        return self.runner.dtype

    @classmethod
    def from_pretrained(cls, path: str | Path, device: str | torch.device | None = None,
                        dtype: torch.dtype | None = None, attention: str | None = None,
                        weight_digests: Mapping[str, list] | None = None, compile_layers: bool = True) -> Engine:
        """Loads a local Dream / LLaDA-format folder. bf16 on GPU, fp32 on CPU unless `dtype`.
        `weight_digests`: the weight files' digests kept from an earlier run
        (`engine.model.weights.weight_file_digests`); without them the files are hashed. `compile_layers`: the
        layers' halves around attention run compiled on CUDA (engine.model.compiled_layers)."""
        path = Path(path)
        dev = resolve_device(device)
        dtype = dtype or default_dtype(dev)
        cfg = read_model_config(path)
        tokenizer = load_tokenizer(path, cfg)
        model = load_model(path, cfg, dev, dtype)
        backend = select_backend(dev, dtype, override=attention)
        logger.info("engine ready: %s on %s (%s), attention=%s", path, dev, dtype, backend.name)
        runner = Runner.for_model(model, backend, compile_layers)
        return cls(runner, tokenizer, path, model_fingerprint(path, weight_digests))

    @torch.inference_mode()
    def logits(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Full bidirectional forward; unshifted logits [B, T, V] for every row (tests and evals)."""
        if input_ids.dim() == 1:
            input_ids = input_ids[None]
        input_ids = input_ids.to(self.device)
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=self.device).expand_as(input_ids)
        elif position_ids.dim() == 1:
            position_ids = position_ids[None].expand_as(input_ids)
        return self.runner.forward(input_ids, position_ids.to(self.device), full_mask(), logits_rows="all",
                                   return_kv=False).logits

    def encode(self, prompt_or_messages: str | list[dict[str, str]],
               use_chat_template: bool = True) -> list[int]:
        return encode_prompt(self.tokenizer, prompt_or_messages, use_chat_template)

    @torch.inference_mode()
    def stream_generate(self, prompt_or_messages: str | list[dict[str, str]] | list[int],
                        params: SamplingParams | None = None, use_chat_template: bool = True
                        ) -> Iterator[DecodeStep | GenerationResult]:
        """Yields a DecodeStep per denoising step, then the GenerationResult (dense decoding)."""
        params = params or SamplingParams()
        if isinstance(prompt_or_messages, list) and all(isinstance(t, int) for t in prompt_or_messages):
            ids = list(prompt_or_messages)
        else:
            ids = self.encode(prompt_or_messages, use_chat_template)
        if not ids:
            raise ValueError("the prompt is empty")
        generator = torch.Generator(device=self.device).manual_seed(params.seed)
        start = time.perf_counter()
        outcome = yield from dense_decode(self.runner, torch.tensor(ids), params, generator)
        text = self.tokenizer.decode(outcome.answer_ids, skip_special_tokens=True)
        yield GenerationResult(text=text, answer_ids=outcome.answer_ids, prompt_tokens=len(ids),
                               steps=outcome.steps, forward_passes=outcome.forward_passes,
                               stopped_early=outcome.stopped_early,
                               seconds=time.perf_counter() - start)

    def generate(self, prompt_or_messages: str | list[dict[str, str]] | list[int],
                 params: SamplingParams | None = None,
                 use_chat_template: bool = True) -> GenerationResult:
        """Runs `stream_generate` to the end and returns its result."""
        result = None
        for event in self.stream_generate(prompt_or_messages, params, use_chat_template):
            result = event
        assert isinstance(result, GenerationResult)
        return result

    def prefill(self, token_ids: torch.Tensor | list[int], chunk_size: int,
                progress: ProgressFn | None = None, token_budget: int = PREFILL_TOKEN_BUDGET,
                out_device: torch.device | str | None = None, breaks: Sequence[int] | None = None) -> DocumentKV:
        """Encodes a document's tokens into BOS-prefixed per-chunk KV ([L, N, Hkv, C, D]); `breaks`:
        token indices where sentences begin, where chunks are cut when they can be."""
        return prefill_document(self.runner, token_ids, chunk_size, progress, token_budget, out_device, breaks)

    def chunk(self, token_ids: torch.Tensor | list[int], chunk_size: int,
              breaks: Sequence[int] | None = None) -> ChunkedTokens:
        """The document's chunk layout, as `prefill` and `prefill_stream` encode it."""
        return document_chunks(self.config, token_ids, chunk_size, breaks)

    def prefill_stream(self, chunks: ChunkedTokens, progress: ProgressFn | None = None,
                       token_budget: int | None = None) -> Iterator[PrefillBatch]:
        """The chunks' KV a batch at a time (see engine.method.prefill.prefill_batches): what a caller
        that writes each batch away uses, so the document's KV is never in memory whole.
        `token_budget`: tokens a forward holds (default: engine.method.prefill.default_token_budget)."""
        budget = token_budget if token_budget is not None else default_token_budget(self.device)
        return prefill_batches(self.runner, chunks, budget, progress)

    def prefill_text(self, text: str, chunk_size: int, progress: ProgressFn | None = None) -> DocumentKV:
        """Tokenizes plain text (no special tokens) and prefills it (fixed cuts; the app cuts at
        sentence starts, `app.kv_service.prefill_text`)."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return self.prefill(ids, chunk_size, progress)

    def stream_answer(self, documents: DocumentKV | list[DocumentKV], question: str,
                      params: AnswerParams | None = None,
                      interrupt_check: Callable[[], None] | None = None,
                      chunk_priors: Sequence[Sequence[float]] | None = None) -> Iterator[DecodeStep | AnswerResult]:
        """Yields a DecodeStep per denoising step, then the AnswerResult with its trace.
        `interrupt_check` raises to stop the question before decoding (and between the lone
        readings' steps); `chunk_priors` (per document, per chunk, in [0, 1]) are fused with the
        scores (see engine.method.answer)."""
        docs = [documents] if isinstance(documents, DocumentKV) else list(documents)
        yield from stream_answer(self.runner, self.tokenizer, docs, question, params or AnswerParams(),
                                 interrupt_check, chunk_priors)

    def answer(self, documents: DocumentKV | list[DocumentKV], question: str,
               params: AnswerParams | None = None,
               chunk_priors: Sequence[Sequence[float]] | None = None) -> AnswerResult:
        """Answers a question over prefilled documents (see `stream_answer`)."""
        result = None
        for event in self.stream_answer(documents, question, params, chunk_priors=chunk_priors):
            result = event
        assert isinstance(result, AnswerResult)
        return result
