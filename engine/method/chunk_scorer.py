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
   last W query rows pay to each chunk token; `engine.method.scoring.select_kept_tokens` turns it into
   the top-B kept tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import torch

from engine.attention import MaskSpec, bos_probs, dense_mask, full_mask
from engine.cuda_graphs import ANSWER_GRAPHS, GraphedCall, kept_pool
from engine.decode.loop import host_to_device
from engine.decode.sampling import propose
from engine.method.kv_cache import DocumentKV
from engine.method.scoring import (
    LIKELIHOOD_SCORERS,
    SCORERS,
    causal_target_rows,
    chunk_token_relevance,
    gather_log_probs,
    masking_folds,
    mean_over_targets,
)
from engine.model.transformer import AttentionCapture
from engine.runner import Runner


@dataclass(frozen=True)
class ScoringParams:
    scorer: str = "draft_self_information"
    draft_slots: int = 4  # D
    draft_rounds: int = 1  # R: commits R + 1 draft tokens
    window: int = 8  # W: last query rows used for anchors and token relevance
    llada_folds: int | None = None  # None: leave-one-out; k: k strided folds (cheaper)
    attention_layers: int = 4  # the "attention" scorer averages the last this many layers
    max_rows: int = 4096  # bound on query rows per scoring forward (batching)

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
    # [N, T] fp32: log p of each scored target token given the chunk (the likelihood scorers; None
    # for the others); `scores` is their mean. engine.method.scoring.select_by_coverage reads them.
    token_scores: torch.Tensor | None = None


DRAFT_ROUND = 16  # the prompt is padded to a multiple of this: one captured graph serves many questions
MAX_DRAFT_PASSES = 16  # draft passes (padded prompt size x batch: small buffers) a runner keeps, LRU dropped
# Staged scoring passes a runner keeps (each a captured graph), by chunks a pass (a power of two)
# and layout shape (question rows rounded to SCORING_ROUND). The graphs share one memory pool, so
# what each one adds is its small outputs; the passes share their geometry's staging KV.
MAX_SCORING_PASSES = 32
MAX_STAGINGS = 2  # staging buffers kept, one per KV geometry (a model, a chunk size, a dtype)
# The chunks' KV a scoring pass copies, at most (keys and values side by side; a staged pass's
# staging, a shared pass's gathered KV): at Dream-7B's shape a chunk of 512 tokens holds 29 MB,
# LLaDA-8B's 268 MB, so rows alone would not bound it.
MAX_COPIED_KV_BYTES = 2 << 30


def draft_rows(prompt_len: int) -> int:
    """Padded prompt rows of the draft pass."""
    return -(-prompt_len // DRAFT_ROUND) * DRAFT_ROUND


class DraftPass:
    """The draft as fixed-shape device work, for `batch` prompts of up to `rows` tokens each.

    Each prompt is padded to `rows` (padding is masked out as keys, so no real row sees it); every
    round proposes all D slots of every prompt and picks each prompt's most confident uncommitted
    one on the device, so nothing reads back to the host until the end: on CUDA the whole draft is
    one captured graph. A shifted-logit model (Dream) commits slot 0 first, from the prompt's last
    row, which needs no block forward: D=4, R=1 costs 2 forwards for Dream and 3 for LLaDA, for
    all the prompts of a batch together (the scheduler drafts the questions it admits at once).
    """

    def __init__(self, runner: Runner, rows: int, slots: int, rounds: int, use_graph: bool, batch: int = 1) -> None:
        cfg, device = runner.cfg, runner.device
        self.runner, self.rows, self.slots, self.rounds, self.batch = runner, rows, slots, rounds, batch
        self.ids = torch.zeros(batch, rows, dtype=torch.long, device=device)
        self.positions = torch.arange(rows, device=device)[None].expand(batch, rows).contiguous()
        self.key_valid = torch.zeros(batch, rows + slots, dtype=torch.bool, device=device)  # prompt rows, then slots
        self.key_valid[:, rows:] = True
        self.last_row = torch.zeros(batch, 1, dtype=torch.long, device=device)  # [B, 1]: each prompt's last row
        self.block_positions = torch.zeros(batch, slots, dtype=torch.long, device=device)
        # Block row r predicts slot r + 1 for a shifted model (slot 0 comes from the prompt's last row).
        slot_ids = torch.arange(slots, device=device)
        self.slot_ids = slot_ids
        self.block_rows = (slot_ids - 1).clamp_min(0) if cfg.logits_shifted else slot_ids
        # The draft's outputs are copied to the host at once: it shares the answer graphs' pool.
        self._call = GraphedCall(self._run, use_graph, "draft", kept_pool(runner, ANSWER_GRAPHS))

    def _run(self) -> tuple[torch.Tensor, torch.Tensor]:
        cfg, runner, device = self.runner.cfg, self.runner, self.ids.device
        b, d = self.batch, self.slots
        ctx = runner.forward(self.ids, self.positions, full_mask(self.key_valid[:, :self.rows]),
                             logits_rows=self.last_row)
        anchor = ctx.logits[:, 0]  # [B, V]: predicts slot 0 for a shifted-logit model
        block = torch.full((b, d), cfg.mask_token_id, dtype=torch.long, device=device)
        committed = torch.zeros(b, d, dtype=torch.bool, device=device)
        for round_ in range(self.rounds + 1):
            if cfg.logits_shifted and round_ == 0:
                # Slot 0 follows the prompt: commit it first, from the anchor alone.
                block[:, :1] = propose(anchor, 0.0, None, None, None).tokens[:, None]
                committed[:, :1] = True  # a slice fill: `committed[:, 0] = True` would copy from the host
                continue
            out = runner.forward(block, self.block_positions, full_mask(self.key_valid), past=ctx.kv,
                                 logits_rows=self.block_rows, return_kv=False)
            logits = out.logits  # [B, D, V]
            if cfg.logits_shifted:
                logits = torch.where((self.slot_ids == 0)[None, :, None], anchor[:, None], logits)
            proposal = propose(logits.flatten(0, 1), 0.0, None, None, None)
            confidence = proposal.confidence.view(b, d).masked_fill(committed, float("-inf"))
            # Tensors only: indexing with a 0-d tensor would read it back to the host.
            pick = torch.argmax(confidence, dim=1, keepdim=True)  # [B, 1]
            block.scatter_(1, pick, proposal.tokens.view(b, d).gather(1, pick))
            committed.scatter_(1, pick, True)
        return block, committed

    def __call__(self, prompts: list[list[int]]) -> list[Draft]:
        """One Draft per prompt (at most `batch` prompts, each of at most `rows` tokens)."""
        assert 0 < len(prompts) <= self.batch, f"{len(prompts)} prompts, a pass of {self.batch}"
        padded = prompts + [prompts[0]] * (self.batch - len(prompts))  # spare rows: a copy, ignored
        ids = torch.full((self.batch, self.rows), self.runner.cfg.mask_token_id, dtype=torch.long)
        lengths = torch.tensor([len(ids_) for ids_ in padded])
        assert int(lengths.min()) > 0 and int(lengths.max()) <= self.rows, f"prompts of {lengths.tolist()} tokens"
        for i, prompt in enumerate(padded):
            ids[i, :len(prompt)] = torch.tensor(prompt)
        lengths = lengths.to(self.ids.device)
        self.ids.copy_(ids)
        self.key_valid[:, :self.rows] = self.positions < lengths[:, None]
        self.last_row.copy_(lengths[:, None] - 1)
        self.block_positions.copy_(lengths[:, None] + self.slot_ids[None])
        tokens, committed = (t.cpu() for t in self._call())
        return [Draft(tokens=tokens[i], committed=committed[i]) for i in range(len(prompts))]


@torch.inference_mode()
def draft_pseudo_labels(runner: Runner, prompt_ids: list[int], slots: int, rounds: int,
                        rows: int | None = None) -> Draft:
    """Context-free guess of the answer's first tokens: [prefix, query] + D mask slots, the R + 1
    most confident committed, by a pass made for this call, run eagerly (`rows`: pad the prompt to
    this many rows, default its length): the reference for `kept_draft_pass`."""
    return DraftPass(runner, rows or len(prompt_ids), slots, rounds, False)([prompt_ids])[0]


def kept_draft_pass(runner: Runner, prompt_len: int, slots: int, rounds: int, batch: int = 1) -> DraftPass:
    """The runner's draft pass for `batch` prompts of up to `prompt_len` tokens (padded, see
    DraftPass), kept across questions and documents (it reads no document); a captured graph on CUDA."""
    rows = draft_rows(prompt_len)
    return runner.kept("draft", (rows, slots, rounds, batch), MAX_DRAFT_PASSES,
                       lambda: DraftPass(runner, rows, slots, rounds, runner.uses_graphs, batch))


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


SCORING_ROUND = 4  # a fold's rows are padded to a multiple of this: one captured graph serves similar questions


@dataclass(frozen=True)
class ScoringLayout:
    """One chunk's scoring rows as a batch item: F folds of R padded rows side by side, sharing the
    chunk's KV (each fold sees the chunk and its own real rows only), so no fold copies the KV.
    A fold's real rows come last (padding first), so questions whose drafts and windows are of one
    size put their window rows at the same indices and can share a pass (`score_documents_together`).
    Positions continue the chunk's local ones (real row r of a fold sits at chunk length + r)."""

    ids: torch.Tensor  # [F*R] long: the rows' tokens, each fold's hidden targets masked; padding = mask id
    offsets: torch.Tensor  # [F*R] long: r, the row's index among its fold's real rows (0 for padding)
    row_mask: torch.Tensor  # [F*R, F*R] bool: which rows a row attends to
    read: torch.Tensor  # [F*T'] long: rows whose logits score a target (T' = targets per fold, padded)
    read_tokens: torch.Tensor  # [F*T'] long: the token each read row is scored on
    read_valid: torch.Tensor  # [F*T'] bool: False for padding
    window: torch.Tensor  # [W] long: fold 0's last W query rows (anchors, token relevance)

    @property
    def shape(self) -> tuple[int, int, int]:
        """What a captured scoring graph depends on: rows, read rows, window rows per batch item."""
        return self.ids.numel(), self.read.numel(), self.window.numel()

    def to(self, device: torch.device) -> ScoringLayout:
        return ScoringLayout(**{f.name: getattr(self, f.name).to(device) for f in fields(ScoringLayout)})


def scoring_layout(rows: ScoringRows, folds: torch.Tensor | None, shifted: bool, mask_token_id: int,
                   round_to: int = SCORING_ROUND, rows_per_fold: int = 0, reads_per_fold: int = 0) -> ScoringLayout:
    """Pure: the batch item every chunk is scored with. `folds` (bool [F, n], masked likelihood):
    fold f hides its targets and reads them in place; None (shifted logits): one causal fold, each
    target read from the row before it. A fold has at least `rows_per_fold` rows and reads (a
    shared pass pads its questions to one shape); both are rounded up to `round_to`."""
    n = rows.ids.numel()
    pad = -(-max(n, rows_per_fold) // round_to) * round_to
    lead = pad - n  # padding rows before the real ones
    plan = torch.zeros(1, n, dtype=torch.bool) if folds is None else folds
    n_folds = plan.shape[0]
    ids = torch.full((n_folds, pad), mask_token_id, dtype=torch.long)
    ids[:, lead:] = rows.ids
    ids[:, lead:][plan] = mask_token_id
    local = (torch.arange(pad) - lead).clamp_min(0)
    real = (torch.arange(pad) >= lead).repeat(n_folds)
    fold_of = torch.arange(n_folds * pad) // pad
    seen = (fold_of[:, None] == fold_of[None, :]) & real[None, :]
    if shifted:
        seen &= local.repeat(n_folds)[None, :] <= local.repeat(n_folds)[:, None]
    if folds is None:
        per_fold_read = [causal_target_rows(rows.targets)]
        per_fold_tokens = [rows.ids[rows.targets]]
    else:
        per_fold_read = [torch.nonzero(f)[:, 0] for f in plan]
        per_fold_tokens = [rows.ids[f] for f in plan]
    most = max(max(r.numel() for r in per_fold_read), reads_per_fold, 1)
    width = -(-most // round_to) * round_to
    read = torch.zeros(n_folds, width, dtype=torch.long)
    tokens = torch.zeros(n_folds, width, dtype=torch.long)
    valid = torch.zeros(n_folds, width, dtype=torch.bool)
    for f, (r, t) in enumerate(zip(per_fold_read, per_fold_tokens, strict=True)):
        read[f, :r.numel()] = r + lead + f * pad
        tokens[f, :t.numel()] = t
        valid[f, :r.numel()] = True
    return ScoringLayout(ids=ids.flatten(), offsets=local.repeat(n_folds), row_mask=seen, read=read.flatten(),
                         read_tokens=tokens.flatten(), read_valid=valid.flatten(), window=rows.window + lead)


def chunk_batches(n_chunks: int, rows_per_chunk: int, max_rows: int) -> list[tuple[int, int]]:
    """[start, end) chunk ranges of at most `max_rows` scored rows each (at least one chunk)."""
    step = max(1, max_rows // max(rows_per_chunk, 1))
    return [(start, min(n_chunks, start + step)) for start in range(0, n_chunks, step)]


def _attention_summary(chunk_size: int):
    """Reduces one layer's captured probs [b, Hq, W, Tk] (chunk keys first) to [b, 2]: the mass on
    the chunk's BOS and on its other tokens, each averaged over heads and window rows."""
    def reduce(probs: torch.Tensor) -> torch.Tensor:
        bos = probs[..., 0].mean(dim=(1, 2))
        content = probs[..., 1:chunk_size].sum(-1).mean(dim=(1, 2))  # masked keys hold exactly 0
        return torch.stack((bos, content), -1)
    return reduce


def valid_chunk_keys(lengths: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Pure: which of each chunk's C key slots hold a token, bool [b, C] from lengths [b]."""
    return torch.arange(chunk_size, device=lengths.device)[None, :] < lengths[:, None]


def _scoring_forward(runner: Runner, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, past: list,
                     read: torch.Tensor, read_tokens: torch.Tensor, capture: AttentionCapture
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """One scoring forward of b chunk items: ids/positions [b, rows], mask [b, 1, rows, C + rows],
    past per layer [b, Hkv, C, D], read and read_tokens [F*T'] or [b, F*T']. Returns the read
    rows' log-probabilities [b, F*T'] fp32 and the attention summary [b, L, 2] (BOS, content)."""
    out = runner.forward(ids, positions, dense_mask(mask), past=past, logits_rows=read, capture=capture,
                         return_kv=False)
    summary = torch.stack([out.attention[i] for i in range(runner.cfg.num_layers)], 1)  # [b, L, 2]
    return _read_log_probs(out.logits, read_tokens), summary


def _read_log_probs(logits: torch.Tensor, read_tokens: torch.Tensor) -> torch.Tensor:
    """log p(token) of each read row, logits [b, F*T', V] and read_tokens [F*T'] or [b, F*T'] ->
    [b, F*T'] fp32, a few chunks at a time: the fp32 log-softmax over the vocabulary is the
    largest temporary of the pass."""
    tokens = read_tokens.expand(logits.shape[0], -1)
    return torch.cat([gather_log_probs(part, part_tokens)
                      for part, part_tokens in zip(logits.split(16), tokens.split(16), strict=True)])


def window_mass(q: torch.Tensor, keys: torch.Tensor, lse: torch.Tensor, own_visible: torch.Tensor,
                chunk_size: int, scale: float) -> torch.Tensor:
    """Pure: what `_attention_summary` reduces the window rows' probabilities to, from their
    log-sum-exp instead of their probabilities over every key: [b, 2] fp32, the mass on the chunk's
    BOS and on its other tokens, each averaged over heads and window rows.

    q [b, Hq, W, D] (the window rows), keys [b, Hkv, C + R, D] (the chunk's C keys, then the rows'
    R), lse [b, Hq, W] fp32 over every visible key, own_visible [b, W, R] bool (which of the rows'
    keys each window row sees). The chunk's tokens other than its BOS hold 1 - BOS - (the rows'
    own keys' mass): only 1 + R scores a row are computed, not C + R, and no fp32 copy of the keys.
    The BOS key must be visible (a chunk of at least one token)."""
    bos = bos_probs(q, keys[:, :, :1], lse, scale)[..., 0]  # [b, Hq, W]
    own = bos_probs(q, keys[:, :, chunk_size:], lse, scale)  # [b, Hq, W, R]
    own = torch.where(own_visible[:, None], own, 0.0).sum(-1)
    return torch.stack((bos.mean(dim=(1, 2)), (1.0 - bos - own).mean(dim=(1, 2))), -1)


class _ScoringLayerCache:
    """One layer of a staged scoring pass, attending by itself (an AttendingCache): the staging's
    keys and values [b, Hkv, C + R, D] (each item's chunk, then room for its R rows), which the
    rows' KV is written into (no per-layer concatenation of the chunks' KV with the rows'); the
    attention returns its log-sum-exp, from which the window rows' BOS and content mass are
    written into `summary` [b, 2] (`window_mass`), where the eager passes capture fp32
    probabilities over every key (their reference)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, mask: MaskSpec, runner: Runner,
                 window: torch.Tensor, own_visible: torch.Tensor, chunk_size: int, summary: torch.Tensor) -> None:
        self.keys, self.values, self.mask, self.runner = keys, values, mask, runner
        self.window, self.own_visible, self.chunk_size, self.summary = window, own_visible, chunk_size, summary

    def attend(self, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, scale: float) -> torch.Tensor:
        rows = k_new.shape[2]
        self.keys[:, :, -rows:] = k_new
        self.values[:, :, -rows:] = v_new
        out, lse = self.runner.attention(q, self.keys, self.values, self.mask, scale, return_lse=True)
        self.summary.copy_(window_mass(q[:, :, self.window], self.keys, lse[:, :, self.window], self.own_visible,
                                       self.chunk_size, scale))
        return out


class _ScoringInputs:
    """The fixed-address inputs of a scoring forward over b chunk items of C keys for layouts of one
    shape (rows, read rows, window rows), filled per pass (a captured graph reads them). Each item
    has its own question's rows and reads; the window rows are at the same indices in every layout
    of one pass (`_sharing_key`)."""

    def __init__(self, runner: Runner, b: int, c: int, shape: tuple[int, int, int]) -> None:
        device, (rows, read, window) = runner.device, shape
        self.ids = torch.zeros(b, rows, dtype=torch.long, device=device)
        self.positions = torch.zeros(b, rows, dtype=torch.long, device=device)
        self.mask = torch.zeros(b, 1, rows, c + rows, dtype=torch.bool, device=device)  # [b, 1, rows, C + rows]
        self.read = torch.zeros(b, read, dtype=torch.long, device=device)  # [b, F*T']
        self.read_tokens = torch.zeros(b, read, dtype=torch.long, device=device)
        self.window = torch.zeros(window, dtype=torch.long, device=device)
        self.capture = AttentionCapture(tuple(range(runner.cfg.num_layers)), self.window, _attention_summary(c))

    def fill(self, layouts: Sequence[ScoringLayout], counts: Sequence[int], lengths: torch.Tensor) -> None:
        """Items [0, counts[0]) take layouts[0], the next counts[1] layouts[1], ...; items past them
        (spare) take layouts[0]. `lengths` [b] (on the device; 0: a spare item, no chunk key)."""
        b, c = self.ids.shape[0], self.mask.shape[-1] - self.ids.shape[1]
        which = _layout_of_items(counts, b, self.ids.device)
        self.positions.copy_(lengths[:, None] + _per_item(layouts, which, "offsets"))
        self.ids.copy_(_per_item(layouts, which, "ids"))
        self.mask[:, 0, :, :c] = valid_chunk_keys(lengths, c)[:, None, :]
        self.mask[:, 0, :, c:] = _per_item(layouts, which, "row_mask")
        self.read.copy_(_per_item(layouts, which, "read"))
        self.read_tokens.copy_(_per_item(layouts, which, "read_tokens"))
        self.window.copy_(layouts[0].window)

    def forward(self, runner: Runner, past: list) -> tuple[torch.Tensor, torch.Tensor]:
        return _scoring_forward(runner, self.ids, self.positions, self.mask, past, self.read, self.read_tokens,
                                self.capture)


def _layout_of_items(counts: Sequence[int], b: int, device: torch.device) -> torch.Tensor:
    """[b] long on `device`: the layout each of b items takes, counts[0] items layouts[0], the next
    counts[1] layouts[1], ..., the spare items past them layouts[0]. Sent without a synchronisation
    (`host_to_device`), so filling a staged pass does not wait for the work queued before it."""
    which = [i for i, n in enumerate(counts) for _ in range(n)]
    return host_to_device(which + [0] * (b - len(which)), device)


def _per_item(layouts: Sequence[ScoringLayout], which: torch.Tensor, name: str) -> torch.Tensor:
    """[b, ...]: each item's row of its layout's tensor `name`, item i taking layouts[which[i]]
    (`_layout_of_items`); one layout is broadcast."""
    if len(layouts) == 1:
        one = getattr(layouts[0], name)
        return one[None].expand(which.shape[0], *one.shape)
    return torch.stack([getattr(layout, name) for layout in layouts])[which]  # [n_layouts, ...] -> [b, ...]


class ScoringPass:
    """One eager scoring forward over chunks [start, end) of a document, its KV read in place (views,
    or copies to the model's device). Returns the read rows' log-probabilities [b, F*T'] fp32 and
    the attention summary [b, L, 2] (BOS, content). The reference of `StagedScoringPass`."""

    def __init__(self, runner: Runner, doc: DocumentKV, start: int, end: int, shape: tuple[int, int, int]) -> None:
        self.runner, self.doc, self.start, self.end = runner, doc, start, end
        self.inputs = _ScoringInputs(runner, end - start, doc.chunk_size, shape)

    def __call__(self, layout: ScoringLayout) -> tuple[torch.Tensor, torch.Tensor]:
        lengths = self.doc.lengths[self.start:self.end].to(self.runner.device)
        self.inputs.fill([layout], [self.end - self.start], lengths)
        return self.inputs.forward(self.runner, _past(self.doc.keys, self.doc.values, self.start, self.end,
                                                      self.runner.device))


@dataclass(frozen=True)
class ScoringStaging:
    """KV buffers [L, B, Hkv, C + room, D] the staged scoring passes of one KV geometry copy chunks
    into: a pass of b <= B chunks and rows <= room question rows uses the first b items' first
    C + rows slots (shared by the passes of every b and layout shape: they run one at a time). The
    chunks' KV fills the first C slots; each layer writes its rows' KV into the next `rows`
    (`_ScoringLayerCache`), so no layer concatenates the chunks' KV with its rows'."""

    keys: torch.Tensor
    values: torch.Tensor
    chunk_size: int  # C

    @property
    def room(self) -> int:
        return self.keys.shape[3] - self.chunk_size


class StagedScoringPass:
    """A scoring forward over up to b chunks of any documents, for layouts of one shape: the chunks'
    KV is copied into the runner's staging buffers, then one captured CUDA graph replays (captured
    on the first call). Returns what `ScoringPass` (one question's chunks) or `_shared_pass`
    (runs of several questions' chunks, their references) returns, for the chunks given.

    Why staged: a graph reads its KV by address, and a prefiltered question's candidates are a new
    tensor every time (`take_chunks`, as the app and the scheduler cut them), so a graph over a
    document's own KV would never replay; eager, a pass costs about 2.5 x its graph at Dream-7B's
    shape (launch-bound). The copy is b chunks' KV on the device (8 x 29 MB there, ~0.2 ms), once
    for all layers, where the eager passes concatenate every layer's past with its rows' KV (at 64
    chunks, 2 x 34 MB a layer at that shape), and their fp32 capture of the window rows'
    probabilities over every key gives way to `window_mass` from the attention's log-sum-exp."""

    def __init__(self, runner: Runner, staging: ScoringStaging, b: int, shape: tuple[int, int, int],
                 pool: tuple | None) -> None:
        assert staging.keys.shape[1] >= b and staging.room >= shape[0], "the staging is too small for the pass"
        self.runner, self.staging, self.b = runner, staging, b
        self.inputs = _ScoringInputs(runner, b, staging.chunk_size, shape)
        self.summary = torch.zeros(staging.keys.shape[0], b, 2, dtype=torch.float32, device=runner.device)  # [L, b, 2]
        self.lengths = torch.zeros(b, dtype=torch.long)
        self._call = GraphedCall(self._run, runner.uses_graphs, "scoring pass", pool)

    def _run(self) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, keys, values, b = self.inputs, self.staging.keys, self.staging.values, self.b
        c = self.staging.chunk_size
        used = c + inputs.ids.shape[1]  # C + rows
        mask = dense_mask(inputs.mask)
        own_visible = inputs.mask[:, 0, :, c:].index_select(1, inputs.window)  # [b, W, rows]
        layers = [_ScoringLayerCache(keys[layer, :b, :, :used], values[layer, :b, :, :used], mask, self.runner,
                                     inputs.window, own_visible, c, self.summary[layer])
                  for layer in range(keys.shape[0])]
        out = self.runner.forward(inputs.ids, inputs.positions, mask, past=layers, logits_rows=inputs.read,
                                  return_kv=False)
        return _read_log_probs(out.logits, inputs.read_tokens), self.summary.permute(1, 0, 2)  # [b, L, 2]

    def __call__(self, doc: DocumentKV, start: int, end: int, layout: ScoringLayout
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """Chunks [start, end) of one document, all with `layout`."""
        return self.run([(doc, start, end, layout)])

    def run(self, items: Sequence[tuple[DocumentKV, int, int, ScoringLayout]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Runs of chunks (document, [start, end), its question's layout) side by side, at most b in
        all: log-probabilities [n, F*T'] fp32 and summaries [n, L, 2], n chunks in run order."""
        c, at = self.staging.chunk_size, 0
        self.lengths.zero_()  # spare items: no chunk key is visible, their rows see each other only
        for doc, start, end in ((doc, start, end) for doc, start, end, _ in items):
            n = end - start
            assert at + n <= self.b, f"{at + n} chunks in a pass of {self.b}"
            for staged, kv in ((self.staging.keys, doc.keys), (self.staging.values, doc.values)):
                if kv.device == staged.device:
                    staged[:, at:at + n, :, :c].copy_(kv[:, start:end])
                else:  # a layer at a time: each source slice is contiguous, so pinned memory copies
                    # asynchronously (into the staging's slice, strided by its room, through a device temporary)
                    for layer in range(kv.shape[0]):
                        staged[layer, at:at + n, :, :c].copy_(kv[layer, start:end], non_blocking=True)
            self.lengths[at:at + n] = doc.lengths[start:end]
            at += n
        self.inputs.fill([layout for *_, layout in items], [end - start for _, start, end, _ in items],
                         self.lengths.to(self.runner.device, non_blocking=True))
        log_probs, summary = self._call()
        return log_probs[:at], summary[:at]


def question_layout(runner: Runner, rows: ScoringRows, params: ScoringParams, rows_per_fold: int = 0,
                    reads_per_fold: int = 0) -> ScoringLayout:
    """The question's scoring layout for the runner's model (folds by the scorer), on its device."""
    cfg = runner.cfg
    likelihood = params.scorer in LIKELIHOOD_SCORERS
    folds = masking_folds(rows.targets, params.llada_folds) if likelihood and not cfg.logits_shifted else None
    return scoring_layout(rows, folds, cfg.logits_shifted, cfg.mask_token_id, rows_per_fold=rows_per_fold,
                          reads_per_fold=reads_per_fold).to(runner.device)


class _ScoreSink:
    """A document's scores, filled pass by pass from the passes' log-probabilities and summaries."""

    def __init__(self, num_chunks: int, num_layers: int, layout: ScoringLayout, params: ScoringParams) -> None:
        self.params = params
        self.valid_reads = torch.nonzero(layout.read_valid)[:, 0]  # [T]: once a document (a host sync)
        self.scores = torch.empty(num_chunks)
        self.anchors = torch.empty(num_chunks, num_layers)
        self.token_scores = (torch.empty(num_chunks, self.valid_reads.numel())
                             if params.scorer in LIKELIHOOD_SCORERS else None)

    def add(self, start: int, end: int, log_probs: torch.Tensor, summary: torch.Tensor) -> None:
        """Chunks [start, end): log_probs [b, F*T'], summary [b, L, 2] (device tensors)."""
        params = self.params
        self.anchors[start:end] = summary[..., 0].cpu()
        if params.scorer == "attention":
            self.scores[start:end] = summary[:, -params.attention_layers:, 1].mean(1).cpu()
        elif params.scorer == "none":
            self.scores[start:end] = -torch.arange(start, end, dtype=torch.float32)
        else:
            # One copy to the host a pass: the chunk score is the mean of its token scores.
            part = log_probs.index_select(1, self.valid_reads).cpu()
            self.token_scores[start:end] = part
            self.scores[start:end] = mean_over_targets(part, torch.ones_like(part, dtype=torch.bool))

    def result(self) -> DocumentScores:
        return DocumentScores(scores=self.scores, anchors=self.anchors, token_scores=self.token_scores)


@torch.inference_mode()
def score_document(runner: Runner, doc: DocumentKV, rows: ScoringRows, params: ScoringParams,
                   interrupt_check: Callable[[], None] | None = None, keep_passes: bool = True) -> DocumentScores:
    """Scores every chunk of one document in batched passes over its cached KV: the runner's kept
    passes (`scoring_passes`: staged, captured graphs on CUDA), or with `keep_passes` False new eager
    ones (the reference). `interrupt_check` is called before each pass and raises to stop (a
    cancelled question: scoring a long document is the longest stretch without a decode step)."""
    layout = question_layout(runner, rows, params)  # on the model's device once per document
    sink = _ScoreSink(doc.num_chunks, runner.cfg.num_layers, layout, params)
    if keep_passes:
        passes = scoring_passes(runner, doc, layout.shape, params.max_rows)
    else:
        passes = [(start, end, ScoringPass(runner, doc, start, end, layout.shape))
                  for start, end in chunk_batches(doc.num_chunks, layout.shape[0], params.max_rows)]
    for start, end, forward in passes:
        if interrupt_check is not None:
            interrupt_check()
        sink.add(start, end, *forward(layout))
    return sink.result()


@dataclass(frozen=True)
class ScoringJob:
    """One document to score for one question (a question over several documents is several jobs)."""

    document: DocumentKV
    rows: ScoringRows
    params: ScoringParams
    # Raises to stop the job (its question was cancelled or is past its budget): called before
    # each pass the job is in; a stopped job has no scores and leaves the later passes.
    interrupt_check: Callable[[], None] | None = None

    def stopped(self) -> bool:
        if self.interrupt_check is None:
            return False
        try:
            self.interrupt_check()
        except Exception:  # noqa: BLE001 - the question's own check says so again where it is handled
            return True
        return False


def _fold_sizes(job: ScoringJob, shifted: bool) -> tuple[int, int, int]:
    """Pure: the job's scoring layout before padding: (folds, rows a fold, most reads a fold)."""
    rows, params = job.rows, job.params
    if params.scorer in LIKELIHOOD_SCORERS and not shifted:
        plan = masking_folds(rows.targets, params.llada_folds)
        return plan.shape[0], rows.ids.numel(), int(plan.sum(1).max())
    return 1, rows.ids.numel(), int(rows.targets.sum())


def _sharing_key(job: ScoringJob, folds: int) -> tuple:
    """Jobs with one key can share a pass: the same fold count, chunk size, KV dtype and device,
    and window rows at the same indices once left-padded to one shape (the rows after the window,
    i.e. the draft's slots, and the window's size agree)."""
    rows, doc = job.rows, job.document
    after_window = rows.ids.numel() - 1 - int(rows.window[-1])
    return folds, after_window, rows.window.numel(), doc.chunk_size, doc.keys.dtype, doc.keys.device


@torch.inference_mode()
def score_documents_together(runner: Runner, jobs: Sequence[ScoringJob]) -> list[DocumentScores | None]:
    """`score_document` of several jobs (documents of several questions), their chunks sharing
    batched passes of at most `max_rows` rows and MAX_COPIED_KV_BYTES of copied KV: one pass reads
    the weights for many questions, where each question alone would read them for its few chunks.
    Where the runner uses graphs, the passes are the runner's kept `StagedScoringPass`es (the runs'
    KV copied into its staging once, a captured graph replayed, no per-layer concatenation);
    elsewhere eager `_shared_pass`es, their reference. A job that shares with no other is scored
    alone (`score_document`: kept passes). Scores equal each job's alone, up to the floating-point
    order of a larger matmul (tests/test_chunk_scorer.py); a job its `interrupt_check` stopped gets None."""
    cfg = runner.cfg
    results: list[DocumentScores | None] = [None] * len(jobs)
    sizes = [_fold_sizes(job, cfg.logits_shifted) for job in jobs]
    groups: dict[tuple, list[int]] = {}
    for j, job in enumerate(jobs):
        groups.setdefault(_sharing_key(job, sizes[j][0]), []).append(j)
    for members in groups.values():
        if len(members) == 1:
            job = jobs[members[0]]
            if not job.stopped():
                results[members[0]] = score_document(runner, job.document, job.rows, job.params)
            continue
        per_fold = max(sizes[j][1] for j in members)  # the group's shape: its largest question's
        reads = max(sizes[j][2] for j in members)
        layouts = [question_layout(runner, jobs[j].rows, jobs[j].params, per_fold, reads) for j in members]
        sinks = [_ScoreSink(jobs[j].document.num_chunks, cfg.num_layers, layout, jobs[j].params)
                 for j, layout in zip(members, layouts, strict=True)]
        doc = jobs[members[0]].document
        rows_per_item, c = layouts[0].ids.numel(), doc.chunk_size
        chunk_bytes = (doc.keys[:, 0].nbytes + doc.values[:, 0].nbytes) if doc.num_chunks else 1
        items_per_pass = max(1, min(min(jobs[j].params.max_rows for j in members) // rows_per_item,
                                    MAX_COPIED_KV_BYTES // chunk_bytes))
        runs = [(m, 0, jobs[j].document.num_chunks) for m, j in enumerate(members)]  # (member, chunks [start, end))
        capture = AttentionCapture(tuple(range(cfg.num_layers)), layouts[0].window, _attention_summary(c))
        stopped = [False] * len(members)
        for batch in _pack_runs(runs, items_per_pass):
            for m in {m for m, _, _ in batch if not stopped[m]}:
                stopped[m] = jobs[members[m]].stopped()
            batch = [run for run in batch if not stopped[run[0]]]
            if not batch:
                continue
            items = [(jobs[members[m]].document, start, end, layouts[m]) for m, start, end in batch]
            if runner.uses_graphs:  # the runs copied into the runner's staging, a captured graph replayed
                n = sum(end - start for _, start, end in batch)
                staged = kept_staged_pass(runner, doc, min(items_per_pass, 1 << (n - 1).bit_length()),
                                          layouts[0].shape)
                log_probs, summary = staged.run(items)
            else:
                log_probs, summary = _shared_pass(runner, items, capture)
            at = 0
            for m, start, end in batch:
                sinks[m].add(start, end, log_probs[at:at + end - start], summary[at:at + end - start])
                at += end - start
        for j, sink, stop in zip(members, sinks, stopped, strict=True):
            results[j] = None if stop else sink.result()
    return results


def _shared_pass(runner: Runner, items: list[tuple[DocumentKV, int, int, ScoringLayout]],
                 capture: AttentionCapture) -> tuple[torch.Tensor, torch.Tensor]:
    """One eager scoring forward over runs of chunks (document, [start, end), its question's
    layout, all layouts of one shape), each item its layout's rows. The runs' KV is copied side
    by side (the chunks of different documents are not one tensor); a single run is read in place.
    The reference of `StagedScoringPass.run`."""
    cfg, device = runner.cfg, runner.device
    if len(items) == 1:
        doc, s, e, _ = items[0]
        keys, values = doc.keys[:, s:e].to(device), doc.values[:, s:e].to(device)  # [L, b, Hkv, C, D]
    else:
        keys = torch.cat([doc.keys[:, s:e].to(device, non_blocking=True) for doc, s, e, _ in items], 1)
        values = torch.cat([doc.values[:, s:e].to(device, non_blocking=True) for doc, s, e, _ in items], 1)
    lengths = torch.cat([doc.lengths[s:e] for doc, s, e, _ in items]).to(device)  # [b]
    counts = [e - s for _, s, e, _ in items]
    layouts, which = [layout for *_, layout in items], _layout_of_items(counts, sum(counts), device)

    def per_item(name: str) -> torch.Tensor:  # [b, ...]: each item's row of its layout's tensor
        return _per_item(layouts, which, name)

    rows, c = items[0][3].ids.numel(), keys.shape[3]
    chunk_keys = valid_chunk_keys(lengths, c)  # [b, C]
    mask = torch.cat((chunk_keys[:, None, :].expand(-1, rows, -1), per_item("row_mask")), -1)[:, None]
    past = [(keys[layer], values[layer]) for layer in range(cfg.num_layers)]
    return _scoring_forward(runner, per_item("ids"), lengths[:, None] + per_item("offsets"), mask, past,
                            per_item("read"), per_item("read_tokens"), capture)


def _pack_runs(runs: list[tuple[int, int, int]], items_per_pass: int) -> list[list[tuple[int, int, int]]]:
    """Pure: consecutive runs (member, start, end) packed into passes of at most `items_per_pass`
    chunks, a run split where a pass fills."""
    passes, current, room = [], [], items_per_pass
    for m, start, end in runs:
        while start < end:
            take = min(room, end - start)
            current.append((m, start, start + take))
            start, room = start + take, room - take
            if room == 0:
                passes.append(current)
                current, room = [], items_per_pass
    if current:
        passes.append(current)
    return passes


def scoring_passes(runner: Runner, doc: DocumentKV, shape: tuple[int, int, int], max_rows: int
                   ) -> list[tuple[int, int, Callable[[ScoringLayout], tuple[torch.Tensor, torch.Tensor]]]]:
    """The forwards that score all of `doc`'s chunks with layouts of `shape`: (start, end, forward)
    for chunk ranges of at most `max_rows` rows. Where the runner uses graphs, the runner's kept
    `StagedScoringPass`es (any document's chunks copied in, at most MAX_COPIED_KV_BYTES of KV a
    pass); elsewhere new eager `ScoringPass`es that read the KV in place."""
    if not (runner.uses_graphs and doc.num_chunks):
        return [(start, end, ScoringPass(runner, doc, start, end, shape))
                for start, end in chunk_batches(doc.num_chunks, shape[0], max_rows)]
    chunk_bytes = doc.keys[:, 0].nbytes + doc.values[:, 0].nbytes
    per_pass = max(1, min(max(1, max_rows // max(shape[0], 1)), MAX_COPIED_KV_BYTES // chunk_bytes))
    passes = []
    for start in range(0, doc.num_chunks, per_pass):
        end = min(doc.num_chunks, start + per_pass)
        staged = kept_staged_pass(runner, doc, min(per_pass, 1 << (end - start - 1).bit_length()), shape)
        passes.append((start, end, lambda layout, start=start, end=end, staged=staged: staged(doc, start, end, layout)))
    return passes


def kept_staged_pass(runner: Runner, doc: DocumentKV, b: int, shape: tuple[int, int, int]) -> StagedScoringPass:
    """The runner's staged scoring pass of b chunks shaped like `doc`'s for layouts of `shape` (b a
    power of two or a pass's most, so few are captured). One staging per KV geometry, grown to the
    largest b and question rows asked; a pass whose staging is no longer the runner's is dropped
    (its graph reads the old buffers), so the live stagings are those kept, at most MAX_STAGINGS."""
    layers, _, hkv, c, d = doc.keys.shape
    rows = shape[0]
    geometry = (layers, hkv, c, d, doc.keys.dtype, runner.device)
    found = runner.kept_items("scoring staging").get(geometry)
    if found is None or found.keys.shape[1] < b or found.room < rows:
        most, room = (b, rows) if found is None else (max(b, found.keys.shape[1]), max(rows, found.room))
        size = (layers, most, hkv, c + room, d)  # zeros: a spare item reads finite keys and values
        found = ScoringStaging(keys=torch.zeros(size, dtype=doc.keys.dtype, device=runner.device),
                               values=torch.zeros(size, dtype=doc.values.dtype, device=runner.device), chunk_size=c)
    staging = runner.kept("scoring staging", geometry, MAX_STAGINGS, lambda: found, fits=lambda kept: kept is found)
    live = {id(s) for s in runner.kept_items("scoring staging").values()}
    passes = runner.kept_items("scoring")
    for key in [key for key, p in passes.items() if id(p.staging) not in live]:
        del passes[key]

    def make() -> StagedScoringPass:
        # The scoring graphs share one memory pool: each one's outputs are read before the next replays.
        return StagedScoringPass(runner, staging, b, shape, kept_pool(runner, "scoring"))
    return runner.kept("scoring", (geometry, b, shape), MAX_SCORING_PASSES, make)


def _past(keys: torch.Tensor, values: torch.Tensor, start: int, end: int, device: torch.device):
    """Per-layer (k, v) [b, Hkv, C, D] of chunks [start, end) of a document's KV ([L, N, Hkv, C, D]):
    views, or copies when the KV is on another device."""
    return [(keys[layer, start:end].to(device, non_blocking=True),
             values[layer, start:end].to(device, non_blocking=True)) for layer in range(keys.shape[0])]


def _rows_mask(lengths: torch.Tensor, c: int, n: int, causal: bool, device) -> torch.Tensor:
    """bool [b, 1, n, C + n]: every valid chunk key, then the rows (causal or full) among themselves."""
    chunk_keys = valid_chunk_keys(lengths.to(device), c)  # [b, C]
    rows = torch.ones(n, n, dtype=torch.bool, device=device)
    if causal:
        rows = torch.tril(rows)
    b = lengths.numel()
    keys = chunk_keys[:, None, :].expand(b, n, c)
    return torch.cat((keys, rows[None].expand(b, n, n)), dim=-1)[:, None]


@torch.inference_mode()
def chunk_relevance(runner: Runner, doc: DocumentKV, chunk_ids: torch.Tensor, rows: ScoringRows) -> torch.Tensor:
    """Query-to-chunk attention per token, layer and KV head for some chunks: [k, L, Hkv, C] fp32."""
    cfg, device = runner.cfg, runner.device
    c, n = doc.chunk_size, rows.ids.numel()
    out_rel = torch.empty(chunk_ids.numel(), cfg.num_layers, cfg.num_kv_heads, c)
    capture = AttentionCapture(layers=tuple(range(cfg.num_layers)), query_rows=rows.window.to(device))
    for i, chunk in enumerate(chunk_ids.tolist()):
        lengths = doc.lengths[chunk:chunk + 1]
        pos = lengths.to(device)[:, None] + torch.arange(n, device=device)
        mask = _rows_mask(lengths, c, n, cfg.logits_shifted, device)
        out = runner.forward(rows.ids.to(device)[None], pos, dense_mask(mask),
                             past=_past(doc.keys, doc.values, chunk, chunk + 1, device), capture=capture,
                             return_kv=False)
        for layer in range(cfg.num_layers):
            out_rel[i, layer] = chunk_token_relevance(out.attention[layer], c, cfg.num_kv_heads)[0].cpu()
    return out_rel
