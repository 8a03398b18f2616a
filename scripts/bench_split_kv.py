"""Times one decode step's attention over selected chunk pages: the split-KV kernel (pages read in
place) against FlexAttention and SDPA over the same KV gathered into contiguous memory.

    python scripts/bench_split_kv.py --out bench-split-kv.json        # needs a CUDA GPU
    python scripts/bench_split_kv.py --sweep --out sweep.json          # the plan's settings, swept

Shapes: Dream-7B (28 query / 4 KV heads) and LLaDA-8B (32 / 32), head dim 128, a 32-token active
block, chunk pages of 512 tokens picked at random from a 128K-token document, 8K and 32K cached
tokens, with and without token eviction (256 of 512 kept per page and KV head). Every variant is
checked against the fp32 reference before it is timed twice: launched from Python (CUDA events,
median of 50 runs; includes the host's launch cost when it exceeds the kernel's) and replayed
inside a CUDA graph, as decoding runs it (`*_graph_ms`: the GPU time alone).

`--sweep` times the kernel (split and merge, inside a CUDA graph) at a static decode's own shape,
K = 4 whole or evicted pages and a tail of about 200 rows, for every distinct plan over the
settings of `make_split_plan` (how the keys are cut, the tile size, warps and pipelining stages).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
from pathlib import Path

import torch

from engine.attention.split_kv import (
    PagedKV,
    make_split_plan,
    page_addresses,
    split_kv_attention,
    split_kv_reference,
)
from engine.model.rope import rerotate, shift_cos_sin

SHAPES = {"dream-7b": (28, 4), "llada-8b": (32, 32)}


def _time(fn, runs: int = 50) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _time_in_graph(fn, calls: int = 20, replays: int = 10) -> float | None:
    """ms per call with `calls` calls captured in one CUDA graph (None if capture fails)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
    except RuntimeError as e:
        print(f"capture failed: {e}")
        return None
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / (calls * replays)


def _case(hq: int, hkv: int, cached: int, keep: int, page: int = 512, doc_pages: int = 256, d: int = 128,
          tq: int = 32, tail: int = 160, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    dev, dt = "cuda", torch.bfloat16
    k = cached // keep
    k_pages = torch.randn(doc_pages, hkv, page, d, generator=g).to(dev, dt)
    v_pages = torch.randn(doc_pages, hkv, page, d, generator=g).to(dev, dt)
    page_ids = torch.randperm(doc_pages, generator=g)[:k].sort().values.int()
    token_ids = torch.stack([torch.randperm(page, generator=g)[:keep].sort().values for _ in range(k * hkv)])
    token_ids = token_ids.view(k, hkv, keep).int()
    starts = 200 + torch.arange(k) * page
    cos, sin = shift_cos_sin(starts, d, 1e6)
    kv = PagedKV(k_pages, v_pages, page_ids.to(dev), token_ids.to(dev), cos.to(dev), sin.to(dev),
                 torch.randn(hkv, tail, d, generator=g).to(dev, dt), torch.randn(hkv, tail, d, generator=g).to(dev, dt),
                 torch.tensor([tail], dtype=torch.int32, device=dev))
    q = torch.randn(hq, tq, d, generator=g).to(dev, dt)
    return q, kv, starts


def _gathered(kv: PagedKV, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What the contiguous route builds once per question: kept tokens gathered, re-rotated, + tail."""
    idx = kv.token_ids.long()  # [K, Hkv, B]
    d = kv.k_pages.shape[-1]
    pages = kv.page_ids.long()
    keys = torch.gather(kv.k_pages[pages], 2, idx[..., None].expand(-1, -1, -1, d))  # [K, Hkv, B, D]
    values = torch.gather(kv.v_pages[pages], 2, idx[..., None].expand(-1, -1, -1, d))
    keys = rerotate(keys, starts.to(keys.device).view(-1, 1, 1), 1e6)
    t = int(kv.tail_len)
    flat = lambda x, tail: torch.cat((x.permute(1, 0, 2, 3).flatten(1, 2), tail[:, :t]), 1)  # noqa: E731
    return flat(keys, kv.k_tail)[None].contiguous(), flat(values, kv.v_tail)[None].contiguous()


def _measure(shape: str, hq: int, hkv: int, cached: int, keep: int, flex) -> dict:
    q, kv, starts = _case(hq, hkv, cached, keep)
    scale = 128 ** -0.5
    plan = make_split_plan(kv, hq // hkv * q.shape[1])
    ref = split_kv_reference(q, kv, scale).float()
    k_cat, v_cat = _gathered(kv, starts)
    q4, gqa = q[None], hq != hkv
    # Pages read through addresses kept on the device, as the engine's decode step reads them.
    indirect = dataclasses.replace(kv, page_base=page_addresses(kv.k_pages, kv.v_pages, kv.k_tail).to(q.device))
    variants = {
        "split_kv": lambda: split_kv_attention(q, kv, scale, plan),
        "split_kv_indirect": lambda: split_kv_attention(q, indirect, scale, plan),
        "flex_gathered": lambda: flex(q4, k_cat, v_cat, scale=scale, enable_gqa=gqa)[0],
        "sdpa_gathered": lambda: torch.nn.functional.scaled_dot_product_attention(
            q4, k_cat, v_cat, scale=scale, enable_gqa=gqa)[0],
    }
    err = {name: (fn().float() - ref).abs().max().item() for name, fn in variants.items()}
    row = {"shape": shape, "cached_tokens": cached, "kept_per_page": keep, "pages": cached // keep,
           **{f"{name}_ms": _time(fn) for name, fn in variants.items()},
           **{f"{name}_graph_ms": _time_in_graph(fn) for name, fn in variants.items()},
           "gather_ms": _time(lambda: _gathered(kv, starts)), "max_abs_error": err}
    kv_bytes = 2 * hkv * (cached + int(kv.tail_len)) * 128 * 2
    row["split_kv_gb_s"] = kv_bytes / row["split_kv_ms"] / 1e6
    row["speedup_vs_flex"] = row["flex_gathered_ms"] / row["split_kv_ms"]
    if row["split_kv_graph_ms"] and row["flex_gathered_graph_ms"]:
        row["split_kv_graph_gb_s"] = kv_bytes / row["split_kv_graph_ms"] / 1e6
        row["speedup_vs_flex_graph"] = row["flex_gathered_graph_ms"] / row["split_kv_graph_ms"]
    assert all(math.isfinite(e) and e < 0.05 for e in err.values()), err
    return row


SWEEP = {"target_programs": (132, 264, 528), "block_n": (32, 64, 128), "min_split_keys": (128, 256, 512),
         "num_warps": (4, 8), "num_stages": (2, 3)}


def _sweep_case(shape: str, hq: int, hkv: int, keep: int) -> list[dict]:
    """Every distinct plan for one decode-shaped case, checked against the reference and timed."""
    import itertools

    tail_cap, tail_len = 256, 200  # a static decode's tail: prefix, question, 32 answer slots
    q, kv, _ = _case(hq, hkv, 4 * keep, keep, tail=tail_cap)
    kv = dataclasses.replace(kv, tail_len=torch.tensor([tail_len], dtype=torch.int32, device=q.device))
    kv = dataclasses.replace(kv, page_base=page_addresses(kv.k_pages, kv.v_pages, kv.k_tail).to(q.device))
    scale = 128 ** -0.5
    ref = split_kv_reference(q, kv, scale).float()
    default = make_split_plan(kv, hq // hkv * q.shape[1])
    plans = {}
    for values in itertools.product(*SWEEP.values()):
        plan = make_split_plan(kv, hq // hkv * q.shape[1], **dict(zip(SWEEP, values, strict=True)))
        plans.setdefault(plan, dict(zip(SWEEP, values, strict=True)))
    rows = []
    for plan, settings in plans.items():
        out = torch.empty_like(q)
        try:
            err = (split_kv_attention(q, kv, scale, plan, out=out).float() - ref).abs().max().item()
        except Exception as e:  # noqa: BLE001 - e.g. Triton's OutOfResources: too much shared memory
            print(f"skipped {settings}: {type(e).__name__}", flush=True)
            continue
        ms = _time_in_graph(lambda plan=plan, out=out: split_kv_attention(q, kv, scale, plan, out=out))
        rows.append({"shape": shape, "kept_per_page": keep, "settings": settings, "plan": dataclasses.asdict(plan),
                     "default": plan == default, "graph_us": None if ms is None else 1000 * ms,
                     "max_abs_error": err})
        assert math.isfinite(err) and err < 0.05, rows[-1]
    rows.sort(key=lambda r: r["graph_us"] if r["graph_us"] is not None else math.inf)
    best, base = rows[0], next(r for r in rows if r["default"])
    print(f"{shape} keep {keep}: {len(rows)} plans; default {base['graph_us']:.2f} us, "
          f"best {best['graph_us']:.2f} us with {best['settings']}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("bench-split-kv.json"))
    ap.add_argument("--sweep", action="store_true", help="time every distinct plan at a decode's shape")
    args = ap.parse_args()
    if args.sweep:
        rows = [r for shape, (hq, hkv) in SHAPES.items() for keep in (512, 256)
                for r in _sweep_case(shape, hq, hkv, keep)]
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                        "sweep": SWEEP, "rows": rows}, indent=1))
        return
    from torch.nn.attention.flex_attention import flex_attention

    flex = torch.compile(flex_attention, dynamic=False)
    rows = []
    for shape, (hq, hkv) in SHAPES.items():
        for cached in (8192, 32768):
            for keep in (512, 256):
                rows.append(_measure(shape, hq, hkv, cached, keep, flex))
                print(json.dumps(rows[-1]), flush=True)
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                    "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
