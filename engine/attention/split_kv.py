"""Split-KV attention for a decode step over chunk pages: the GPU fast path and its fp32 reference.

The active block's queries attend to
- the selected chunks' cached KV, read in place from the document's cache (`pages`, one chunk a
  page, keys after RoPE at local positions 0..C-1), through a page table and, per page and KV head,
  a list of kept token offsets (token eviction; -1 = none), each page moved to its placed position
  by a per-page rotation; and
- a contiguous `tail` (prefix, question, finished and active answer blocks), valid up to `tail_len`.

Nothing is gathered into contiguous memory. The key axis is cut into splits (a group of whole pages,
a part of one page, or a piece of the tail); each program attends its queries to one split, and the
partial results are merged by log-sum-exp (flash-decoding). Softmax is order-free, so pages and tail may come in any
order.

Moving a page instead of its keys: with rotate-half RoPE, <R(p) q, R(s + j) k> = <R(p - s) q, R(j) k>,
so a page placed at start s is attended by rotating the query by -s once per page, which is exact
up to rounding and costs nothing per key. `split_kv_reference` does it the other way round (re-rotates
the gathered keys, fp32 throughout), so the tests compare two independent routes.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from engine.attention.reference import bos_probs

try:  # Triton is optional: the CPU path never needs it.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on machines without triton
    triton = None


@dataclass(frozen=True)
class PagedKV:
    """One layer's view of a static decoding context (batch 1)."""

    k_pages: torch.Tensor  # [N, Hkv, C, D] keys after RoPE at local positions (the document cache)
    v_pages: torch.Tensor  # [N, Hkv, C, D]
    page_ids: torch.Tensor  # [K] int32, the chunk index of each page slot
    token_ids: torch.Tensor  # [K, Hkv, B] int32, kept offsets within the page; -1 = padding
    rot_cos: torch.Tensor | None  # [K, D/2] fp32, `engine.model.rope.shift_cos_sin` of each page's start
    rot_sin: torch.Tensor | None  # [K, D/2] fp32
    k_tail: torch.Tensor  # [Hkv, T_cap, D] keys after RoPE at their final positions
    v_tail: torch.Tensor  # [Hkv, T_cap, D]
    tail_len: torch.Tensor  # [1] int32 (a tensor, so one captured CUDA graph serves every step)
    # [2] int64 on the device, `page_addresses(k_pages, v_pages, k_tail)`: when set, the kernel
    # reads the pages through these (offsets from k_tail), not through k_pages' and v_pages' own
    # addresses, so a graph captured over one document replays over another with the same page
    # strides once they are rewritten.
    page_base: torch.Tensor | None = None
    # [K, Hkv, D] each page slot's BOS key (local position 0), refilled with the pages: what
    # `bos_attention_mass` reads when set, for the same reason.
    bos_keys: torch.Tensor | None = None

    def __post_init__(self) -> None:
        n, hkv, _, d = self.k_pages.shape
        assert self.v_pages.shape == self.k_pages.shape, "k_pages and v_pages differ"
        assert self.k_pages.stride() == self.v_pages.stride(), "k_pages and v_pages must share strides"
        assert self.token_ids.dim() == 3 and self.token_ids.shape[:2] == (self.page_ids.numel(), hkv)
        assert self.k_tail.shape[0] == hkv and self.k_tail.shape[2] == d and self.v_tail.shape == self.k_tail.shape
        assert self.k_tail.stride() == self.v_tail.stride(), "k_tail and v_tail must share strides"
        assert (self.rot_cos is None) == (self.rot_sin is None)
        assert d % 2 == 0
        assert self.page_base is None or (self.page_base.dtype == torch.int64 and self.page_base.shape == (2,))
        assert self.bos_keys is None or self.bos_keys.shape == (self.page_ids.numel(), hkv, d)

    @property
    def num_kv_heads(self) -> int:
        return self.k_pages.shape[1]


def page_addresses(k_pages: torch.Tensor, v_pages: torch.Tensor, k_tail: torch.Tensor) -> torch.Tensor:
    """[2] int64 (host): where k_pages and v_pages start, as offsets from k_tail's start in units
    of 16 bytes (all three are 16-byte aligned and of one dtype, as the kernel assumes)."""
    assert k_pages.dtype == v_pages.dtype == k_tail.dtype, "pages and tail must share a dtype"
    offsets = [p.data_ptr() - k_tail.data_ptr() for p in (k_pages, v_pages)]
    assert all(a % 16 == 0 for a in (*offsets, k_tail.data_ptr())), "pages must start on a 16-byte boundary"
    return torch.tensor([o // 16 for o in offsets], dtype=torch.int64)


def page_bos_keys(k_pages: torch.Tensor, page_ids: torch.Tensor) -> torch.Tensor:
    """k_pages [..., N, Hkv, C, D] -> [..., K, Hkv, D]: each page slot's key at local position 0
    (the BOS), at that local position."""
    return k_pages.select(-2, 0).index_select(-3, page_ids.long())  # position 0 first: no whole pages copied


def split_kv_reference(q: torch.Tensor, kv: PagedKV, scale: float,
                       lse_out: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 oracle: gathers kept keys, re-rotates them to their placed positions, plain softmax.

    q: [Hq, Tq, D] (after RoPE). Returns [Hq, Tq, D] in q's dtype; with `lse_out` ([Hq, Tq] fp32)
    also writes each row's log-sum-exp of the scaled scores there.
    """
    hkv = kv.num_kv_heads
    half = q.shape[-1] // 2
    keys, values, valid = [], [], []
    for slot in range(kv.page_ids.numel()):
        page = int(kv.page_ids[slot])
        tok = kv.token_ids[slot].long()  # [Hkv, B]
        ok = tok >= 0
        idx = tok.clamp_min(0)[..., None].expand(-1, -1, q.shape[-1])
        k = torch.gather(kv.k_pages[page].float(), 1, idx)  # [Hkv, B, D]
        v = torch.gather(kv.v_pages[page].float(), 1, idx)
        if kv.rot_cos is not None:
            c, s = kv.rot_cos[slot].float(), kv.rot_sin[slot].float()  # [D/2]
            k1, k2 = k[..., :half], k[..., half:]
            k = torch.cat((k1 * c - k2 * s, k2 * c + k1 * s), -1)  # R(start) k
        keys.append(k)
        values.append(v)
        valid.append(ok)
    t = int(kv.tail_len)
    keys.append(kv.k_tail[:, :t].float())
    values.append(kv.v_tail[:, :t].float())
    valid.append(torch.ones(hkv, t, dtype=torch.bool, device=q.device))
    k, v, ok = torch.cat(keys, 1), torch.cat(values, 1), torch.cat(valid, 1)  # [Hkv, Tk(, D)]
    groups = q.shape[0] // hkv
    k, v, ok = (x.repeat_interleave(groups, 0) for x in (k, v, ok))  # head-major GQA
    scores = torch.einsum("hqd,hkd->hqk", q.float(), k) * scale
    scores = scores.masked_fill(~ok[:, None, :], float("-inf"))
    if lse_out is not None:
        lse_out.copy_(torch.logsumexp(scores, -1))
    probs = torch.nan_to_num(torch.softmax(scores, -1), nan=0.0)
    return torch.einsum("hqk,hkd->hqd", probs, v).to(q.dtype)


def bos_attention_mass(q: torch.Tensor, kv: PagedKV, scale: float, lse: torch.Tensor,
                       row_weights: torch.Tensor) -> torch.Tensor:
    """Attention mass on each page's BOS (offset 0, always kept), from the rows' log-sum-exp.

    q [Hq, Tq, D] after RoPE; lse [Hq, Tq] (natural log, as `split_kv_reference` / the kernel
    write it); row_weights [Tq] (e.g. 1/n for n real rows, 0 for padding). Returns [K] fp32:
    the weighted sum over rows of the mean over heads of p(BOS of page k). The split kernel never
    materialises probabilities, so the BOS scores are recomputed: K keys per head, a tiny matmul.
    """
    d = q.shape[-1]
    bos = (kv.bos_keys if kv.bos_keys is not None else page_bos_keys(kv.k_pages, kv.page_ids)).float()  # [K, Hkv, D]
    if kv.rot_cos is not None:  # R(start) k, the BOS at its placed position
        half = d // 2
        c, s = kv.rot_cos.float()[:, None], kv.rot_sin.float()[:, None]  # [K, 1, D/2]
        b1, b2 = bos[..., :half], bos[..., half:]
        bos = torch.cat((b1 * c - b2 * s, b2 * c + b1 * s), -1)
    probs = bos_probs(q[None], bos.transpose(0, 1)[None], lse[None], scale)[0]  # [Hq, Tq, K]
    return torch.einsum("tk,t->k", probs.mean(dim=0), row_weights.float())


@dataclass(frozen=True)
class SplitPlan:
    """How the key axis is cut, fixed for a whole decode (so one CUDA graph replays it).

    A page split reads `pages_per_split` consecutive page slots, or, when there are few pages, one
    `part_len`-token part of one page (`page_parts` parts a page); a tail split reads `tail_split`
    rows (splits past `tail_len` contribute nothing). Page and tail splits run in one launch. The
    cut trades parallelism (programs to fill the GPU) against the fp32 partial outputs every split
    writes and the merge reads: a split never covers fewer than `min_split_keys` kept tokens.
    """

    pages_per_split: int
    page_parts: int
    part_len: int  # kept tokens per part, a multiple of block_n
    num_page_splits: int
    tail_split: int
    num_tail_splits: int
    block_m: int  # query rows per program (rows = query heads per KV head x block tokens)
    block_n: int  # keys per tile
    num_warps: int  # launch settings of the split kernel
    num_stages: int  # software-pipelining depth of its key loops


def make_split_plan(kv: PagedKV, rows_per_kv_head: int, target_programs: int = 264, max_split_keys: int = 2048,
                    tail_split: int = 512, block_n: int = 64, min_split_keys: int = 256, num_warps: int = 4,
                    num_stages: int = 2) -> SplitPlan:
    """A plan for `rows_per_kv_head` query rows (query heads per KV head x tokens) per KV head.

    Two pipelining stages, not Triton's default three: 4-18% faster at a static decode's shape on
    the H200 (`scripts/bench_split_kv.py --sweep`, journal: performance sessions 1-11)."""
    for name, size in (("tail_split", tail_split), ("block_n", block_n)):
        assert size >= 16 and size & (size - 1) == 0, f"{name} must be a power of two >= 16"
    block_n = min(block_n, tail_split)
    block_m = max(16, min(64, 1 << (rows_per_kv_head - 1).bit_length()))
    m_tiles = math.ceil(rows_per_kv_head / block_m)
    slots, kept = kv.token_ids.shape[0], kv.token_ids.shape[2]
    kept_tiles = max(1, math.ceil(kept / block_n))
    units = slots * kv.num_kv_heads * m_tiles  # programs at one page per split
    per_split = math.ceil(units / target_programs)
    per_split = max(1, min(per_split, max_split_keys // max(kept, 1), slots))
    parts = 1
    if per_split == 1:  # few pages: cut each page into parts of at least min_split_keys tokens
        max_parts = max(1, kept_tiles * block_n // max(min_split_keys, block_n))
        parts = max(1, min(max_parts, math.ceil(target_programs / units)))
    part_tiles = math.ceil(kept_tiles / parts)
    parts = math.ceil(kept_tiles / part_tiles)
    cap = kv.k_tail.shape[1]
    tail_split = min(tail_split, max(block_n, 1 << (cap - 1).bit_length()))  # no tile past the capacity
    return SplitPlan(per_split, parts, part_tiles * block_n, math.ceil(slots / per_split) * parts, tail_split,
                     max(1, math.ceil(cap / tail_split)), block_m, block_n, num_warps, num_stages)


if triton is not None:

    @triton.jit
    def _split_kv_kernel(
        Q, KP, VP, PAGE_BASE, PAGE_IDS, TOKEN_IDS, ROT_COS, ROT_SIN, KT, VT, TAIL_LEN, OUT, LSE,
        stride_qh, stride_qt, stride_pn, stride_ph, stride_pc, stride_th, stride_tt,
        stride_tk, stride_tth, stride_os, stride_oh, stride_om, stride_ls, stride_lh,
        num_page_splits, num_slots, kept, Tq, M, G, qk_scale,
        PAGES_PER_SPLIT: tl.constexpr, PAGE_PARTS: tl.constexpr, PART_LEN: tl.constexpr, TAIL_SPLIT: tl.constexpr,
        HALF: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        HAS_ROT: tl.constexpr, PRECISION: tl.constexpr, DOT_FP32: tl.constexpr, INDIRECT: tl.constexpr,
        ELEMS_16B: tl.constexpr,
    ):
        s = tl.program_id(0)  # split: page splits first, then tail splits
        h = tl.program_id(1)
        offs_m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
        m_ok = offs_m < M
        # Row m of KV head h is query head h*G + m // Tq, position m % Tq (head-major GQA).
        q_ptr = Q + (h * G + offs_m // Tq)[:, None] * stride_qh + (offs_m % Tq)[:, None] * stride_qt
        d = tl.arange(0, HALF)[None, :]
        q1 = tl.load(q_ptr + d, mask=m_ok[:, None], other=0.0).to(tl.float32)  # [BLOCK_M, HALF]
        q2 = tl.load(q_ptr + HALF + d, mask=m_ok[:, None], other=0.0).to(tl.float32)
        # Operands of tl.dot in the cache's dtype (bf16 on the GPU); fp32 under the interpreter, whose
        # bf16 dot is wrong (it multiplies raw bits), so CPU tests check indexing, masks and merging.
        dot_ty = tl.float32 if DOT_FP32 else KP.dtype.element_ty
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc1 = tl.zeros([BLOCK_M, HALF], tl.float32)
        acc2 = tl.zeros([BLOCK_M, HALF], tl.float32)
        if s < num_page_splits:
            if INDIRECT:  # the pages' addresses are data (see PagedKV.page_base)
                # Offsets from the tail's address in 16-byte units, times the elements in 16 bytes:
                # the compiler then knows the pages are 16-byte aligned and reads them in vectors
                # (a loaded address converted to a pointer tells it nothing: 1.5-1.8x slower).
                k_root = KT + tl.load(PAGE_BASE) * ELEMS_16B
                v_root = KT + tl.load(PAGE_BASE + 1) * ELEMS_16B
            else:
                k_root, v_root = KP, VP
            first_slot = (s // PAGE_PARTS) * PAGES_PER_SPLIT
            n_lo = (s % PAGE_PARTS) * PART_LEN  # this split's part of each page's kept tokens
            for i in range(PAGES_PER_SPLIT):
                slot = first_slot + i
                slot_ok = slot < num_slots
                page = tl.load(PAGE_IDS + slot, mask=slot_ok, other=0).to(tl.int64)
                qa, qb = q1, q2
                if HAS_ROT:  # R(-start) q: attend as if the page's keys sat at their placed positions
                    rot_ok = (d * 0 + slot) < num_slots  # block-shaped (Triton 3.9's interpreter wants it)
                    c = tl.load(ROT_COS + slot * HALF + d, mask=rot_ok, other=1.0)
                    sn = tl.load(ROT_SIN + slot * HALF + d, mask=rot_ok, other=0.0)
                    qa, qb = q1 * c + q2 * sn, q2 * c - q1 * sn
                qa = (qa * qk_scale).to(dot_ty)
                qb = (qb * qk_scale).to(dot_ty)
                k_base = k_root + page * stride_pn + h * stride_ph
                v_base = v_root + page * stride_pn + h * stride_ph
                for n0 in range(0, PART_LEN, BLOCK_N):
                    offs_n = n_lo + n0 + tl.arange(0, BLOCK_N)
                    tok = tl.load(TOKEN_IDS + slot * stride_tk + h * stride_tth + offs_n,
                                  mask=(offs_n < kept) & ((offs_n * 0 + slot) < num_slots), other=-1)
                    row = tl.maximum(tok, 0).to(tl.int64) * stride_pc
                    acc1, acc2, m_i, l_i = _attend_tile(qa, qb, k_base, v_base, row, tok >= 0, acc1, acc2, m_i, l_i,
                                                        HALF, dot_ty, PRECISION)
        else:
            qa = (q1 * qk_scale).to(dot_ty)
            qb = (q2 * qk_scale).to(dot_ty)
            lo = (s - num_page_splits) * TAIL_SPLIT
            hi = tl.minimum(lo + TAIL_SPLIT, tl.load(TAIL_LEN))
            for n0 in range(0, TAIL_SPLIT, BLOCK_N):  # a fixed trip count; rows at or past `hi` are masked
                offs_n = lo + n0 + tl.arange(0, BLOCK_N)
                row = offs_n.to(tl.int64) * stride_tt
                acc1, acc2, m_i, l_i = _attend_tile(qa, qb, KT + h * stride_th, VT + h * stride_th, row, offs_n < hi,
                                                    acc1, acc2, m_i, l_i, HALF, dot_ty, PRECISION)
        empty = l_i == 0.0
        inv = tl.where(empty, 0.0, 1.0 / l_i)
        lse = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))  # log2 units
        o_ptr = OUT + s * stride_os + h * stride_oh + offs_m[:, None] * stride_om + d
        tl.store(o_ptr, acc1 * inv[:, None], mask=m_ok[:, None])
        tl.store(o_ptr + HALF, acc2 * inv[:, None], mask=m_ok[:, None])
        tl.store(LSE + s * stride_ls + h * stride_lh + offs_m, lse, mask=m_ok)

    @triton.jit
    def _attend_tile(qa, qb, k_base, v_base, row, n_ok, acc1, acc2, m_i, l_i, HALF: tl.constexpr,
                     dot_ty: tl.constexpr, PRECISION: tl.constexpr):
        """Online softmax over one tile of keys at row offsets `row` ([BLOCK_N]); scores in log2 units."""
        kp = k_base + row[None, :] + tl.arange(0, HALF)[:, None]  # [HALF, BLOCK_N], transposed
        k1 = tl.load(kp, mask=n_ok[None, :], other=0.0).to(dot_ty)
        k2 = tl.load(kp + HALF, mask=n_ok[None, :], other=0.0).to(dot_ty)
        qk = tl.dot(qa, k1, input_precision=PRECISION) + tl.dot(qb, k2, input_precision=PRECISION)
        qk = tl.where(n_ok[None, :], qk, float("-inf"))  # [BLOCK_M, BLOCK_N]
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(qk - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        vp = v_base + row[:, None] + tl.arange(0, HALF)[None, :]  # [BLOCK_N, HALF]
        v1 = tl.load(vp, mask=n_ok[:, None], other=0.0).to(dot_ty)
        v2 = tl.load(vp + HALF, mask=n_ok[:, None], other=0.0).to(dot_ty)
        p = p.to(dot_ty)
        acc1 = acc1 * alpha[:, None] + tl.dot(p, v1, input_precision=PRECISION)
        acc2 = acc2 * alpha[:, None] + tl.dot(p, v2, input_precision=PRECISION)
        return acc1, acc2, m_new, l_i

    @triton.jit
    def _merge_kernel(OUT, LSE, DST, LSE_DST, M, Tq, G, stride_os, stride_oh, stride_om, stride_ls, stride_lh,
                      stride_dh, stride_dt, stride_lsh, S: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
                      HAS_LSE_OUT: tl.constexpr):
        h = tl.program_id(0)
        offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        m_ok = offs_m < M
        d = tl.arange(0, D)[None, :]
        m_run = tl.full([BLOCK_M], float("-inf"), tl.float32)
        w_sum = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        for s in range(0, S):  # S is fixed by the plan, so a decode compiles one variant
            lse = tl.load(LSE + s * stride_ls + h * stride_lh + offs_m, mask=m_ok, other=float("-inf"))
            o = tl.load(OUT + s * stride_os + h * stride_oh + offs_m[:, None] * stride_om + d,
                        mask=m_ok[:, None], other=0.0)
            m_new = tl.maximum(m_run, lse)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_run - m_safe)
            w = tl.exp2(lse - m_safe)
            acc = acc * alpha[:, None] + o * w[:, None]
            w_sum = w_sum * alpha + w
            m_run = m_new
        out = acc / tl.where(w_sum == 0.0, 1.0, w_sum)[:, None]
        dst = DST + (h * G + offs_m // Tq)[:, None] * stride_dh + (offs_m % Tq)[:, None] * stride_dt + d
        tl.store(dst, out.to(DST.dtype.element_ty), mask=m_ok[:, None])
        if HAS_LSE_OUT:  # the row's log-sum-exp in natural-log units (the partials are in log2 units)
            empty = w_sum == 0.0
            log2_total = m_run + tl.log2(tl.where(empty, 1.0, w_sum))
            total = tl.where(empty, float("-inf"), log2_total * 0.6931471805599453)  # x ln 2
            tl.store(LSE_DST + (h * G + offs_m // Tq) * stride_lsh + offs_m % Tq, total, mask=m_ok)


MERGE_BLOCK_M = 16  # rows per merge program: small, so the merge runs on many SMs


def split_kv_attention(q: torch.Tensor, kv: PagedKV, scale: float, plan: SplitPlan,
                       out: torch.Tensor | None = None, lse_out: torch.Tensor | None = None) -> torch.Tensor:
    """Triton split-KV attention; same contract as `split_kv_reference`. No host synchronisation.

    Two launches: every split (pages and tail) in one, then the log-sum-exp merge.
    """
    if triton is None:
        raise RuntimeError("split-KV attention needs the triton package")
    hq, tq, d = q.shape
    hkv = kv.num_kv_heads
    if not q.is_cuda and not _interpreting():
        # Otherwise the CUDA driver rejects the CPU pointers with an opaque error (seen on the H200).
        raise ValueError("split_kv_attention needs CUDA tensors, or Triton's interpreter for CPU ones "
                         "(TRITON_INTERPRET=1); callers check kernel_usable() and use split_kv_reference")
    assert q.stride(-1) == 1 and kv.k_pages.stride(-1) == 1 and kv.k_tail.stride(-1) == 1, "last dim contiguous"
    assert head_dim_supported(d), "head_dim must be a power of two >= 32"
    g = hq // hkv
    m = g * tq
    sp, st = plan.num_page_splits, plan.num_tail_splits
    work = torch.empty(sp + st, hkv, m, d, dtype=torch.float32, device=q.device)
    lse = torch.empty(sp + st, hkv, m, dtype=torch.float32, device=q.device)
    has_rot = kv.rot_cos is not None
    rot_cos = kv.rot_cos if has_rot else lse  # any tensor; never read without HAS_ROT
    rot_sin = kv.rot_sin if has_rot else lse
    slots, kept = kv.token_ids.shape[0], kv.token_ids.shape[2]
    indirect = kv.page_base is not None
    _split_kv_kernel[(sp + st, hkv, triton.cdiv(m, plan.block_m))](
        q, kv.k_pages, kv.v_pages, kv.page_base if indirect else kv.page_ids, kv.page_ids, kv.token_ids, rot_cos,
        rot_sin, kv.k_tail, kv.v_tail, kv.tail_len, work, lse, q.stride(0), q.stride(1), kv.k_pages.stride(0),
        kv.k_pages.stride(1), kv.k_pages.stride(2), kv.k_tail.stride(0), kv.k_tail.stride(1), kv.token_ids.stride(0),
        kv.token_ids.stride(1), work.stride(0), work.stride(1), work.stride(2), lse.stride(0), lse.stride(1),
        sp, slots, kept, tq, m, g, scale * math.log2(math.e),
        PAGES_PER_SPLIT=plan.pages_per_split, PAGE_PARTS=plan.page_parts, PART_LEN=plan.part_len,
        TAIL_SPLIT=plan.tail_split, HALF=d // 2, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, HAS_ROT=has_rot,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        DOT_FP32=q.dtype == torch.float32 or _interpreting(), INDIRECT=indirect,
        ELEMS_16B=16 // kv.k_tail.element_size(), num_warps=plan.num_warps, num_stages=plan.num_stages)
    if out is None:
        out = torch.empty_like(q)
    if lse_out is not None:
        assert lse_out.shape == (hq, tq) and lse_out.dtype == torch.float32 and lse_out.stride(1) == 1
    _merge_kernel[(hkv, triton.cdiv(m, MERGE_BLOCK_M))](
        work, lse, out, lse_out if lse_out is not None else lse, m, tq, g, work.stride(0), work.stride(1),
        work.stride(2), lse.stride(0), lse.stride(1), out.stride(0), out.stride(1),
        lse_out.stride(0) if lse_out is not None else 0, S=sp + st, D=d, BLOCK_M=MERGE_BLOCK_M,
        HAS_LSE_OUT=lse_out is not None, num_warps=4)
    return out


def head_dim_supported(head_dim: int) -> bool:
    """The kernel splits the head in two halves for RoPE and needs power-of-two tiles."""
    return head_dim >= 32 and head_dim & (head_dim - 1) == 0


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def kernel_native(device: torch.device | str, head_dim: int) -> bool:
    """The kernel runs natively here: CUDA with triton installed, a supported head size."""
    return triton is not None and torch.device(device).type == "cuda" and head_dim_supported(head_dim)


def kernel_usable(device: torch.device | str, head_dim: int) -> bool:
    """Natively, or under TRITON_INTERPRET=1 on the CPU (the tests); else callers use the reference."""
    on_interpreter = triton is not None and _interpreting() and torch.device(device).type == "cpu"
    return kernel_native(device, head_dim) or (on_interpreter and head_dim_supported(head_dim))
