"""Scale-out benchmarks, run under torchrun (one rank a GPU), random weights at real shapes:

    # prefill tokens/s against the number of GPUs (one line of prefill.jsonl per run)
    for n in 1 2 4 8; do
      torchrun --standalone --nproc-per-node $n -m tools.scale_bench prefill --shape dream-7b \\
          --tokens 1048576 --data-dir /dev/shm/docqa-bench --out bench-out/scale
    done
    # questions/s against the number of replicas (HAProxy in front, tools.replicas)
    for n in 1 2 4 8; do
      torchrun --standalone --nproc-per-node $n -m tools.scale_bench questions --shape dream-7b \\
          --model /tmp/dream7b-random --data-dir /tmp/docqa-replicas --out bench-out/scale
    done
    python -m tools.scale_bench summary bench-out/scale     # efficiency against n times one GPU's

`prefill`: the product's own path (app.distributed_prefill): a random-text document in a real
data folder, each rank tokenizing it, prefilling and encoding its share and writing its KV files,
rank 0 committing; timed from a barrier to the commit. `--no-write` times the prefill, encoding
and copy to the host alone (each rank's share, no files): at Dream-7B's shape fp8 KV is 14.7 MB a
chunk, so the disk, not the GPUs, bounds a persisted prefill beyond a GB/s or two (use /dev/shm to
see the GPUs' side). The first run (compilation) is a warm-up, untimed.

`questions`: each rank serves one replica (`docqa serve`'s web server and API, on port
--base-port + rank, over one data folder); rank 0 adds the documents first, then puts HAProxy in
front (tools.replicas) and asks questions from `--users` threads through it, every question new
(so none is answered from the answer memo), each about one document drawn at random. Reports
questions/s, each replica's share and the affinity hit rate: of the questions after a document's
first, those answered by the replica that answered its first (`--policy leastconn`: no affinity,
to compare). The model folder is written once at --shape if missing (Dream-7B's layers and
heads, the small random tokenizer's vocabulary).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import timedelta
from pathlib import Path

PREFILL_FILE, QUESTIONS_FILE = "prefill.jsonl", "questions.jsonl"
WORDS = ("harbour ship pier gull tide lantern keeper rope anchor sail dock crane wave salt fog bell river "
         "city mountain report table figure section chapter summary result method data year month").split()


def _rank_env() -> tuple[int, int, int]:
    return (int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")),
            int(os.environ.get("LOCAL_RANK", "0")))


def _device(arg: str | None, local: int) -> str:
    import torch

    return arg or (f"cuda:{local}" if torch.cuda.is_available() else "cpu")


def _init_group(backend: str, timeout_s: float) -> None:
    import torch.distributed as dist

    if "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timedelta(seconds=timeout_s))


def random_text(tokens: int, tokenizer, seed: int) -> str:
    """Random sentences of about `tokens` tokens under `tokenizer` (measured on a sample)."""
    rng = random.Random(seed)

    def sentences(n: int) -> list[str]:
        return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 16))).capitalize() + "." for _ in range(n)]

    sample = " ".join(sentences(200))
    per_sentence = len(tokenizer(sample, add_special_tokens=False)["input_ids"]) / 200
    return " ".join(sentences(max(1, int(tokens / per_sentence))))


def _append(out: Path, name: str, row: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / name, "a") as f:
        f.write(json.dumps(row) + "\n")


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


# ---- prefill ----------------------------------------------------------------------------------------

def bench_prefill(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    from app.distributed_prefill import DistributedKVService, RankGroup, share_chunks
    from engine import Engine
    from engine.attention import select_backend
    from engine.model.random_checkpoint import write_random_checkpoint
    from engine.model.tokenizer import load_tokenizer
    from engine.model.weights import random_model, read_model_config
    from engine.runner import Runner
    from storage import DocumentStore, PageSpan, TieredKVPool
    from tools.bench import SHAPES
    from tools.distributed_prefill import tokenizer_pieces

    rank, world, local = _rank_env()
    device = torch.device(_device(args.device, local))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    _init_group("nccl" if device.type == "cuda" else "gloo", args.timeout)
    try:
        cfg = SHAPES[args.shape]
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        runner = Runner.for_model(random_model(cfg, device, dtype), select_backend(device, dtype), True)
        with tempfile.TemporaryDirectory() as tok_dir:  # the small random tokenizer: ids below any vocabulary
            write_random_checkpoint(tok_dir, "dream")
            tokenizer = load_tokenizer(tok_dir, read_model_config(tok_dir))
        engine = Engine(runner, tokenizer, fingerprint=f"scale-bench-{args.shape}")
        data_dir = args.data_dir / f"rank-group-{world}"
        if rank == 0:
            shutil.rmtree(data_dir, ignore_errors=True)
            DocumentStore(data_dir)  # the library made once, before the other ranks open it
        dist.barrier()
        store = DocumentStore(data_dir, max_shard_bytes=int(args.max_shard_mb * 2**20), run_recovery=rank == 0)
        kv = DistributedKVService(engine, store, TieredKVPool(device, 0, 0), args.kv_at_rest,
                                  group=RankGroup(rank, world), tokenizer_pieces=tokenizer_pieces())
        for run in range(args.repeats + 1):  # the first pass compiles and warms the allocator: not timed
            text = random_text(args.tokens, tokenizer, seed=run)
            doc_id = f"{run:064x}"
            if rank == 0:
                store.add_document(doc_id, f"bench-{run}.txt", "text/plain", len(text), text,
                                   [PageSpan(0, "1", 0, len(text), True)], status="ingesting")
            dist.barrier()
            start = time.perf_counter()
            if args.no_write:
                layout = kv.layout(doc_id, args.chunk_size)
                share, aligned = kv.share_of(layout.chunks)
                for _ in kv.file_parts(share_chunks(layout.chunks, share)):
                    pass  # each batch prefilled, encoded and copied to the host, then dropped
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                dist.barrier()
                num_chunks = layout.chunks.num_chunks
            elif rank == 0:
                kv.ensure_stored(doc_id, args.chunk_size)
                kv.stop_ranks()
                num_chunks = store.find_kv(kv.key(doc_id, args.chunk_size)).num_chunks
                aligned = True
            else:
                kv.serve_prefills()
            wall = time.perf_counter() - start
            if rank == 0:
                tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
                row = {"shape": args.shape, "gpus": world, "device": _gpu_name(), "tokens": tokens,
                       "chunks": num_chunks, "chunk_size": args.chunk_size, "write": not args.no_write,
                       "kv_at_rest": args.kv_at_rest, "data_dir": str(args.data_dir), "wall_s": round(wall, 3),
                       "tokens_per_s": round(tokens / wall, 1), "aligned": aligned, "warmup": run == 0}
                print(f"prefill {args.shape} x{world}: {tokens} tokens in {wall:.2f} s = {tokens / wall:,.0f} tok/s"
                      f"{' (warm-up)' if run == 0 else ''}", flush=True)
                if run > 0:
                    _append(args.out, PREFILL_FILE, row)
                store.delete_document(doc_id)
            dist.barrier()
        return 0
    finally:
        dist.destroy_process_group()


# ---- questions ---------------------------------------------------------------------------------------

def _write_shape_checkpoint(folder: Path, shape: str) -> None:
    from engine.model.random_checkpoint import TinyShape, write_random_checkpoint
    from tools.bench import SHAPES

    cfg = SHAPES[shape]
    write_random_checkpoint(folder, cfg.family, TinyShape(cfg.hidden_size, cfg.intermediate_size, cfg.num_layers,
                                                          cfg.num_heads, cfg.num_kv_heads),
                            max_shard_bytes=2 << 30, std=0.02)


def _post(url: str, body: dict, timeout_s: float) -> tuple[str, dict]:
    from tools.replicas import REPLICA_HEADER

    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return resp.headers.get(REPLICA_HEADER, "?"), json.loads(resp.read())


def _wait(url: str, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def bench_questions(args: argparse.Namespace) -> int:
    import torch.distributed as dist

    from app.service import DocQA, ServiceConfig
    from tools.replicas import Worker, haproxy_config
    from ui.app import launch

    rank, world, local = _rank_env()
    if shutil.which("haproxy") is None:
        raise ValueError("the questions benchmark needs haproxy (apt-get install haproxy)")
    _init_group("gloo", args.timeout)  # barriers only
    service = server = balancer = None
    try:
        if rank == 0:
            if not (args.model / "config.json").exists():
                print(f"writing a random {args.shape} checkpoint to {args.model}", flush=True)
                _write_shape_checkpoint(args.model, args.shape)
            if args.data_dir.exists():
                shutil.rmtree(args.data_dir)
        dist.barrier()
        config = ServiceConfig(data_dir=args.data_dir, model_dir=args.model, device=_device(args.device, local),
                               prefilter_chunks=args.prefilter)
        doc_ids: list[str] = []
        if rank == 0:  # the documents first, so the others find their text and KV (and the weights' digests)
            service = DocQA(config)
            for d in range(args.docs):
                text = random_text(args.context, service.engine.tokenizer, seed=1000 + d)
                info, _ = service.ingest(text.encode(), f"doc-{d}.txt")
                doc_ids.append(info.record.id)
        dist.barrier()
        if rank != 0:
            service = DocQA(config)
        server = launch(service, host="127.0.0.1", port=args.base_port + rank, block=False)
        dist.barrier()
        if rank == 0:
            row, balancer = _ask_through_balancer(args, world, doc_ids, haproxy_config, Worker)
            _append(args.out, QUESTIONS_FILE, row)
        dist.barrier()
        return 0
    finally:
        if balancer is not None:
            balancer.terminate()
            balancer.wait(timeout=20)
        if server is not None:
            server.close()
        if service is not None:
            service.close()
        dist.destroy_process_group()


def _ask_through_balancer(args, world, doc_ids, haproxy_config, Worker):
    workers = [Worker(f"w{r}", f"127.0.0.1:{args.base_port + r}") for r in range(world)]
    lb = f"127.0.0.1:{args.base_port + world}"
    cfg = haproxy_config(workers, bind=lb, policy=args.policy)
    cfg_path = args.out / "haproxy.cfg"
    args.out.mkdir(parents=True, exist_ok=True)
    cfg_path.write_text(cfg)
    balancer = subprocess.Popen(["haproxy", "-db", "-f", str(cfg_path)], stdout=subprocess.DEVNULL)
    _wait(f"http://{lb}/v1/models")
    model = json.loads(urllib.request.urlopen(f"http://{lb}/v1/models", timeout=10).read())["data"][0]["id"]
    rng = random.Random(7)
    plan = [[(rng.randrange(len(doc_ids)), " ".join(rng.choice(WORDS) for _ in range(12)) + "?")
             for _ in range(args.rounds)] for _ in range(args.users)]
    served: list[tuple[float, int, str]] = []  # (time answered, document, replica)
    errors: list[str] = []
    lock = threading.Lock()

    def user(questions) -> None:
        for d, question in questions:
            body = {"model": model, "documents": [doc_ids[d]], "max_tokens": args.answer,
                    "messages": [{"role": "user", "content": question}]}
            try:
                replica, _ = _post(f"http://{lb}/v1/chat/completions", body, 600)
            except OSError as exc:
                with lock:
                    errors.append(str(exc))
                continue
            with lock:
                served.append((time.perf_counter(), d, replica))

    # One question per document first, untimed (each replica's compilation and first loads).
    user([(d, "warm up?") for d in range(len(doc_ids))])
    served.clear()
    start = time.perf_counter()
    threads = [threading.Thread(target=user, args=(q,)) for q in plan]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    first: dict[int, str] = {}
    hits = later = 0
    for _, d, replica in sorted(served):
        if d in first:
            later += 1
            hits += replica == first[d]
        else:
            first[d] = replica
    share = {w.name: sum(r == w.name for _, _, r in served) for w in workers}
    row = {"shape": args.shape, "model": str(args.model), "replicas": world, "device": _gpu_name(),
           "docs": len(doc_ids),
           "context": args.context, "answer": args.answer, "users": args.users, "questions": len(served),
           "errors": len(errors), "wall_s": round(wall, 3), "questions_per_s": round(len(served) / wall, 3),
           "policy": args.policy, "affinity_hit_rate": round(hits / later, 4) if later else None,
           "per_replica": share}
    print(f"questions {args.model.name} x{world} replicas ({args.policy}): {len(served)} in {wall:.2f} s = "
          f"{len(served) / wall:.2f} q/s, affinity hits {hits}/{later}, per replica {share}, "
          f"errors {len(errors)}", flush=True)
    return row, balancer


# ---- summary -----------------------------------------------------------------------------------------

def summary(args: argparse.Namespace) -> int:
    """Each run's throughput against n times the one-GPU (one-replica) run's of the same setting."""
    for name, unit, n_key, rate_key, same in (
            (PREFILL_FILE, "tok/s", "gpus", "tokens_per_s", ("shape", "write", "kv_at_rest")),
            (QUESTIONS_FILE, "q/s", "replicas", "questions_per_s", ("model", "policy", "context"))):
        path = args.folder / name
        if not path.exists():
            continue
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        best: dict[tuple, float] = {}
        for r in rows:  # the best of the repeats
            k = (*(r.get(s) for s in same), r[n_key])
            best[k] = max(best.get(k, 0.0), r[rate_key])
        print(f"{name}:")
        for k in sorted(best, key=str):
            one = best.get((*k[:-1], 1))
            eff = f"{best[k] / (k[-1] * one):6.1%} of linear" if one else "no 1-rank run to compare"
            print(f"  {dict(zip((*same, n_key), k, strict=True))}: {best[k]:,.1f} {unit}  {eff}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools.scale_bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    from tools.bench import SHAPES

    pf = sub.add_parser("prefill", help="prefill tokens/s over the torchrun ranks")
    pf.add_argument("--shape", choices=sorted(SHAPES), default="dream-7b")
    pf.add_argument("--tokens", type=int, default=1 << 20)
    pf.add_argument("--chunk-size", type=int, default=512)
    pf.add_argument("--kv-at-rest", choices=("fp8", "bf16"), default="fp8")
    pf.add_argument("--max-shard-mb", type=float, default=128.0)
    pf.add_argument("--data-dir", type=Path, default=Path("/dev/shm/docqa-scale-bench"))
    pf.add_argument("--no-write", action="store_true", help="prefill, encode and copy to the host only")
    pf.add_argument("--repeats", type=int, default=2)
    pf.add_argument("--device", default=None)
    pf.add_argument("--timeout", type=float, default=1800.0)
    pf.add_argument("--out", type=Path, default=Path("bench-out/scale"))

    qs = sub.add_parser("questions", help="questions/s over one replica a rank, behind HAProxy")
    qs.add_argument("--shape", choices=sorted(SHAPES), default="dream-7b")
    qs.add_argument("--model", type=Path, default=Path("/tmp/docqa-random-dream-7b"),
                    help="checkpoint folder (written at --shape when missing)")
    qs.add_argument("--data-dir", type=Path, default=Path("/tmp/docqa-scale-replicas"))
    qs.add_argument("--docs", type=int, default=16)
    qs.add_argument("--context", type=int, default=32768, help="tokens a document")
    qs.add_argument("--answer", type=int, default=32, help="answer tokens (max_tokens)")
    qs.add_argument("--users", type=int, default=32, help="clients asking at once")
    qs.add_argument("--rounds", type=int, default=4, help="questions each client asks")
    qs.add_argument("--prefilter", type=int, default=None, help="BM25 candidates (default: the model's)")
    qs.add_argument("--policy", choices=("sticky", "bounded", "leastconn"), default="sticky",
                    help="HAProxy's routing (tools.replicas): leastconn has no affinity, to compare")
    qs.add_argument("--base-port", type=int, default=7900)
    qs.add_argument("--device", default=None)
    qs.add_argument("--timeout", type=float, default=3600.0)
    qs.add_argument("--out", type=Path, default=Path("bench-out/scale"))

    sm = sub.add_parser("summary", help="efficiency against linear from the runs' files")
    sm.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return {"prefill": bench_prefill, "questions": bench_questions, "summary": summary}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
