"""Adds documents to a data folder with their prefill split across processes (one a GPU):

    docqa-tools prefill-distributed --nproc-per-node 8 --data-dir docqa-data FILE...
    torchrun --nproc-per-node 8 -m tools.distributed_prefill --data-dir docqa-data FILE...

The first starts its ranks itself with torch's elastic launcher (what torchrun runs: the same
command line again in each rank, on this host) and answers a failed rank in one line; the second
is torchrun's own launch (several hosts too). NCCL between GPUs, gloo between CPU processes; one
process without either. Rank 0 ingests each file as `docqa ingest` does; every rank prefills a
share of each document's chunks and writes its KV files into the shared data folder
(app.distributed_prefill). A document is stored whole or not at all.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta
from functools import partial
from pathlib import Path

from app.defaults import BUNDLED_MODEL
from storage.kv_codec import DEFAULT_KV_ENCODING, KV_ENCODINGS
from storage.store import DEFAULT_MAX_SHARD_BYTES
from ui.cli import EXIT_ERROR, EXIT_OK, run


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--nproc-per-node", type=int, default=1,
                   help="ranks to start on this host (ignored under torchrun, which starts them)")
    p.add_argument("--data-dir", type=Path, default=Path("docqa-data"), help="the shared data folder")
    p.add_argument("--model", type=Path, default=BUNDLED_MODEL)
    p.add_argument("--device", default=None, help="default: cuda:LOCAL_RANK when there is a GPU, else cpu")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None)
    p.add_argument("--kv-at-rest", choices=KV_ENCODINGS, default=DEFAULT_KV_ENCODING)
    p.add_argument("--chunk-size", type=int, default=None, help="default: the model's")
    p.add_argument("--max-shard-mb", type=float, default=DEFAULT_MAX_SHARD_BYTES / 2**20,
                   help="the most MiB one KV file holds (a rank's share is whole files)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds a rank waits for the others at a collective before giving up")


def cpu_threads_per_rank() -> int:
    """This host's cores shared among its ranks (torchrun's LOCAL_WORLD_SIZE)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def tokenizer_pieces() -> int:
    """Pieces each rank tokenizes a document in (app.distributed_prefill.tokenize_in_pieces): two
    a thread, at least 8; the fast tokenizer's threads are set to this rank's cores, so the ranks
    of a host do not oversubscribe it."""
    threads = cpu_threads_per_rank()
    os.environ.setdefault("RAYON_NUM_THREADS", str(threads))  # read when the tokenizer first batches
    return max(8, 2 * threads)


def _group_env() -> tuple[int, int, int]:
    return (int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")),
            int(os.environ.get("LOCAL_RANK", "0")))


def launch_ranks(nproc: int) -> int:
    """Runs this process's own command line in `nproc` ranks on this host, through torch's
    elastic launcher (torchrun's), and waits for them; a failed rank is answered in one line (each
    rank has said why on stderr)."""
    import uuid

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # CPU ranks share the cores (torchrun sets 1 thread a rank; this keeps them all busy).
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()),
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0)
    try:
        elastic_launch(config, sys.executable)(*sys.orig_argv[1:])
    except ChildFailedError as exc:
        ranks = ", ".join(f"rank {r}: exit code {f.exitcode}" for r, f in sorted(exc.failures.items()))
        print(f"docqa-tools: the distributed prefill stopped ({ranks}); a document not reported as added "
              "was not stored", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


def prefill_distributed(args: argparse.Namespace) -> int:
    if args.nproc_per_node < 1:
        raise ValueError(f"--nproc-per-node must be 1 or more, not {args.nproc_per_node}")
    if args.nproc_per_node > 1 and "RANK" not in os.environ:
        return launch_ranks(args.nproc_per_node)
    import torch
    import torch.distributed as dist

    from app.distributed_prefill import DistributedKVService, RankGroup
    from app.errors import IngestError
    from app.service import DocQA, ServiceConfig

    rank, world, local = _group_env()
    device = args.device or (f"cuda:{local}" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))  # NCCL's object collectives use the current device
    backend = "nccl" if device.startswith("cuda") else "gloo"
    timeout = timedelta(seconds=args.timeout)
    if "MASTER_ADDR" in os.environ:  # under torchrun
        dist.init_process_group(backend, timeout=timeout)
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    service = None
    try:
        config = ServiceConfig(data_dir=args.data_dir, model_dir=args.model, device=device, dtype=args.dtype,
                               kv_encoding=args.kv_at_rest, max_shard_bytes=int(args.max_shard_mb * 2**20))
        make = partial(DocQA, config, kv_service=partial(DistributedKVService, group=RankGroup.current(),
                                                         tokenizer_pieces=tokenizer_pieces()))
        # Rank 0 first: it creates or upgrades the library and keeps the weights' digests, which the
        # others then reuse (a 15 GB checkpoint is hashed once, not by every rank at once).
        service = make() if rank == 0 else None
        dist.barrier()
        if service is None:
            service = make()
        dist.barrier()  # every rank's store opened (its recovery done) before rank 0 writes
        if rank != 0:
            service.kv.serve_prefills()
            return EXIT_OK
        failed = 0
        try:
            for path in args.files:
                try:
                    info, added = service.ingest_file(path, chunk_size=args.chunk_size)
                except IngestError as exc:
                    print(f"docqa-tools: {path.name}: {exc}", file=sys.stderr)
                    failed += 1
                    if service.kv.lost:  # the group is broken: no later document can be prefilled
                        break
                    continue
                print(f"{'added' if added else 'already stored'}: {info.record.name}  id {info.record.id[:12]}  "
                      f"{info.tokens} tokens, {info.chunks} chunks over {world} rank(s)")
        finally:
            service.kv.stop_ranks()
        return EXIT_ERROR if failed else EXIT_OK
    finally:
        if service is not None:
            service.close()
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools.distributed_prefill", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    add_arguments(parser)
    args = parser.parse_args(argv)
    args.command = "prefill-distributed"
    rank = _group_env()[0]
    return run({"prefill-distributed": prefill_distributed}, args, f"docqa-tools (rank {rank})")


if __name__ == "__main__":
    sys.exit(main())
