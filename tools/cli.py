"""The `docqa-tools` command line: measurement (benchmarks, the evaluation and its data, random
checkpoints to try the pipeline with). The product's own commands are `docqa` (ui/cli.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.defaults import BUNDLED_MODEL
from storage.kv_codec import DEFAULT_KV_ENCODING, KV_ENCODINGS
from ui.cli import EXIT_OK, EXIT_USAGE, non_negative_int, positive, run


def _build_parser() -> argparse.ArgumentParser:
    from engine.method.answer import CACHED_KV_MODES, KV_MODES
    from engine.method.scoring import SCORERS
    from tools.load_bench import DOCUMENTS_ON

    parser = argparse.ArgumentParser(prog="docqa-tools", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", required=True)

    ev = sub.add_parser("eval", help="RULER tasks through the pipeline: JSON, markdown table, heatmap")
    ev.add_argument("--model", type=Path, default=BUNDLED_MODEL)
    ev.add_argument("--data", type=Path, default=Path(".ruler-data"), help="folder written by eval-data")
    ev.add_argument("--tasks", nargs="+", default=None)
    ev.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384, 32768, 65536, 131072])
    ev.add_argument("--modes", nargs="+", choices=KV_MODES, default=[*CACHED_KV_MODES, "dense"])
    ev.add_argument("--max-samples", type=int, default=None, help="per task and length")
    ev.add_argument("--dense-max-tokens", type=int, default=16384, help="skip dense above this context length")
    ev.add_argument("--prefilter", type=int, nargs="+", default=[0], metavar="M",
                    help="BM25 prefilter sizes to run static and joint with (0: every chunk scored), e.g. 0 32 64")
    ev.add_argument("--bm25-weight", type=float, nargs="+", default=None, metavar="W",
                    help="score fusion weights to run prefiltered rows with (nats the best BM25 match adds; "
                         "default: the model's)")
    ev.add_argument("--kv-at-rest", nargs="+", choices=KV_ENCODINGS, default=[DEFAULT_KV_ENCODING],
                    help="KV file encodings to answer from (each the same prefill rounded as its files keep it); "
                         "with bf16 and another, the summary gives how often their answers agree")
    ev.add_argument("--read-alone", choices=("model", "on", "off", "both"), default="model",
                    help="also read each chosen chunk alone (the model's docqa.json by default; both: each row twice)")
    ev.add_argument("--device", default=None)
    ev.add_argument("--out", type=Path, default=Path("eval-out"))

    ed = sub.add_parser("eval-data", help="generate RULER and held-out lookup samples with the model's tokenizer "
                                          "(offline)")
    ed.add_argument("--model", type=Path, default=BUNDLED_MODEL)
    ed.add_argument("--out", type=Path, default=Path(".ruler-data"))
    ed.add_argument("--tasks", nargs="+", default=None)
    ed.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384, 32768, 65536, 131072])
    ed.add_argument("--samples", type=int, default=10)
    ed.add_argument("--seed", type=int, default=42,
                    help="RULER's random seed (42: the samples the model card reports; another: held-out samples "
                         "for tuning settings)")

    ep = sub.add_parser("eval-pdfs", help="questions in people's own words about real PDFs (Debian manuals), "
                                          "asked through the app: held-out sources first")
    ep.add_argument("--model", type=Path, default=BUNDLED_MODEL)
    ep.add_argument("--questions", type=Path, default=None,
                    help="question file (default: tools/data/pdf_questions.jsonl)")
    ep.add_argument("--sources", nargs="+", default=None, help="only these sources (default: every one in the file)")
    ep.add_argument("--device", default=None)
    ep.add_argument("--data-dir", type=Path, default=None,
                    help="the app's library to ingest into (default: a temporary folder, removed after); "
                         "other documents in it change BM25's statistics, and so the candidates")
    ep.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                    help="change one of the model's defaults (docqa.json's fields), e.g. bm25_weight=4; repeatable")
    ep.add_argument("--prefilter", type=non_negative_int, default=None, metavar="M",
                    help="chunks the scorer sees, the best M by BM25 (default: the model's; 0: all)")
    ep.add_argument("--corpus", type=Path, default=None,
                    help="a training corpus folder (training.prepare's): also print each source's overlap with it")
    ep.add_argument("--out", type=Path, default=Path("eval-pdfs-out"))

    pr = sub.add_parser("probe-reading", help="questions made by rule and cloze from the PDFs' own sentences, each "
                                              "read over its passage alone: reading by question kind and source")
    pr.add_argument("--model", type=Path, default=BUNDLED_MODEL)
    pr.add_argument("--sources", nargs="+", default=None, help="only these sources (default: every eval-pdfs source)")
    pr.add_argument("--per-kind", type=positive(int), default=25, help="questions of each kind per source")
    pr.add_argument("--seed", type=int, default=11, help="draws which sentences are asked")
    pr.add_argument("--written", action="store_true",
                    help="ask training.written_questions' items instead: every wording of the held-out "
                         "collections', and --per-kind items of each training collection; then their "
                         "unanswered questions (right where the model says it does not know)")
    pr.add_argument("--device", default=None)
    pr.add_argument("--out", type=Path, default=Path("probe-reading-out"))

    pn = sub.add_parser("probe-denoising", help="the PDFs' text with a share of each chunk's tokens masked, "
                                                "predicted in one forward: how well the model knows held-out prose")
    pn.add_argument("--model", type=Path, default=BUNDLED_MODEL)
    pn.add_argument("--sources", nargs="+", default=None, help="only these sources (default: every eval-pdfs source)")
    pn.add_argument("--windows", type=positive(int), default=48, help="chunk-sized windows drawn per source")
    pn.add_argument("--seed", type=int, default=0, help="draws the windows and their masked tokens")
    pn.add_argument("--device", default=None)
    pn.add_argument("--out", type=Path, default=Path("probe-denoising-out"))

    bn = sub.add_parser("bench", help="KV modes side by side on random-weight models at real shapes")
    bn.add_argument("--shape", choices=("dream-7b", "llada-8b", "tiny"), default="dream-7b")
    bn.add_argument("--contexts", type=int, nargs="+", default=[8192, 16384, 32768, 65536, 131072])
    bn.add_argument("--answers", type=int, nargs="+", default=[32, 256])
    bn.add_argument("--modes", nargs="+", choices=KV_MODES, default=list(KV_MODES))
    bn.add_argument("--chunk-size", type=int, default=512)
    bn.add_argument("--top-k", type=int, default=4)
    bn.add_argument("--dense-budget-s", type=float, default=120.0,
                    help="above this estimated time, dense runs 2 steps and is extrapolated")
    bn.add_argument("--device", default=None)
    bn.add_argument("--scorer", choices=SCORERS, default="draft_self_information",
                    help="chunk scorer (default: the app's, a draft then the question's likelihood)")
    bn.add_argument("--llada-folds", type=int, default=4,
                    help="LLaDA masking folds when scoring; 0: leave-one-out (the app's default, ~8x the rows)")
    bn.add_argument("--no-compile", action="store_true",
                    help="run the layers eagerly on CUDA (default: compiled layer halves, every mode)")
    bn.add_argument("--prefilter", type=non_negative_int, nargs="+", default=[0], metavar="M",
                    help="BM25 candidates static and joint score (0: every chunk), e.g. 0 64")
    bn.add_argument("--concurrency", type=non_negative_int, default=0, metavar="N",
                    help="N users at once over N cached documents through the question scheduler "
                         "(the first --contexts and --answers, static mode): burst, throughput, Poisson latency")
    bn.add_argument("--rounds", type=non_negative_int, default=4, help="with --concurrency: questions each user asks "
                                                                       "in the throughput phase")
    bn.add_argument("--load", type=float, default=0.8, help="with --concurrency: Poisson arrival rate as a "
                                                            "fraction of the measured throughput")
    bn.add_argument("--tokens-per-step", type=int, default=1,
                    help="with --concurrency: answer tokens committed at each decode step (default 1; a trained "
                         "model's threshold decoder commits several where it is confident)")
    bn.add_argument("--block-length", type=int, default=32,
                    help="with --concurrency: answer slots decoded as one block (default 32, or the whole answer "
                         "if shorter); shorter blocks recompute fewer rows a step, and each finished block's KV "
                         "is refreshed as a row of the batched step")
    bn.add_argument("--max-prepare", type=int, default=8, metavar="Q",
                    help="with --concurrency: newcomers the scheduler prepares between two steps, their chunks "
                         "scored in shared passes (default 8, the app's)")
    bn.add_argument("--prepare-at-once", action="store_true",
                    help="with --concurrency: prepare newcomers at the next step, rather than gathering them "
                         "while questions decode (engine.scheduler.gathered_enough); for comparison")
    bn.add_argument("--documents-on", choices=DOCUMENTS_ON, default="device",
                    help="with --concurrency: where the N documents' KV is held; host: the scheduler's loader "
                         "threads copy each question's document (or its --prefilter candidates) to the GPU, as "
                         "for the app's documents outside the pool's GPU tier")
    bn.add_argument("--out", type=Path, default=Path("bench-out"))

    from tools.distributed_prefill import add_arguments

    pd = sub.add_parser("prefill-distributed", help="add documents with their prefill split across the ranks of a "
                                                    "torchrun launch (NCCL on GPUs, gloo on CPUs)")
    add_arguments(pd)

    rc = sub.add_parser("replicas-config", help="print HAProxy's configuration for docqa workers over one data "
                                                "folder: questions routed by document affinity, else least loaded")
    rc.add_argument("workers", nargs="+", metavar="HOST:PORT", help="the `docqa serve` workers")
    rc.add_argument("--bind", default="127.0.0.1:7860", help="where the balancer listens")
    rc.add_argument("--policy", choices=("sticky", "bounded", "leastconn"), default="sticky",
                    help="sticky: a document stays with the worker that first answered it, new ones go to the least "
                         "loaded; bounded: consistent hashing with bounded loads; leastconn: no affinity")

    mk = sub.add_parser("make-random-model",
                        help="write a tiny random checkpoint (Dream or LLaDA format) for trying things")
    mk.add_argument("folder", type=Path)
    mk.add_argument("--family", choices=("dream", "llada"), default="llada")
    mk.add_argument("--seed", type=int, default=0)
    return parser


def _cmd_eval_data(args: argparse.Namespace) -> int:
    from tools import lookup, ruler

    tasks = args.tasks or list(ruler.TASKS) + list(lookup.TASKS)
    unknown = [t for t in tasks if t not in ruler.TASKS and t not in lookup.TASKS]
    if unknown:
        raise ValueError(f"unknown task(s) {', '.join(unknown)}; RULER's: {', '.join(ruler.TASKS)}; "
                         f"held-out lookup: {', '.join(lookup.TASKS)}")
    held_out = [t for t in tasks if t in lookup.TASKS]
    if held_out:
        from engine.model.tokenizer import load_tokenizer
        from engine.model.weights import read_model_config

        tokenizer = load_tokenizer(args.model, read_model_config(args.model))
        lookup.generate(args.out, tokenizer, held_out, args.lengths, args.samples, seed=args.seed)
    if len(held_out) < len(tasks):
        ruler.generate(args.out, args.model, [t for t in tasks if t in ruler.TASKS], args.lengths,
                       dict.fromkeys(args.lengths, args.samples), seed=args.seed)
    return EXIT_OK


def _cmd_eval(args: argparse.Namespace) -> int:
    from app.defaults import model_defaults
    from engine import Engine
    from tools import lookup, ruler
    from tools.evaluation import evaluate, summarize, write_reports

    engine = Engine.from_pretrained(args.model, device=args.device)

    samples = ruler.load(args.data, args.tasks or list(ruler.TASKS) + list(lookup.TASKS), args.lengths)
    if args.max_samples is not None:
        kept, seen = [], {}
        for s in samples:
            seen[(s.task, s.length)] = seen.get((s.task, s.length), 0) + 1
            if seen[(s.task, s.length)] <= args.max_samples:
                kept.append(s)
        samples = kept
    args.out.mkdir(parents=True, exist_ok=True)
    rows = evaluate(engine, samples, args.modes, model_defaults(args.model).chunk_size, args.dense_max_tokens,
                    progress=lambda line: print(line, file=sys.stderr, flush=True), rows_path=args.out / "rows.jsonl",
                    prefilters=tuple(args.prefilter), encodings=tuple(args.kv_at_rest),
                    bm25_weights=tuple(args.bm25_weight) if args.bm25_weight else None,
                    read_alone={"model": None, "on": (True,), "off": (False,), "both": (False, True)}[args.read_alone])
    write_reports(rows, args.out, {"model": str(args.model), "device": str(engine.device),
                                   "modes": args.modes, "lengths": args.lengths, "prefilter": args.prefilter,
                                   "kv_at_rest": args.kv_at_rest, "bm25_weight": args.bm25_weight})
    print(summarize(rows))
    return EXIT_OK


def _cmd_eval_pdfs(args: argparse.Namespace) -> int:
    from app.defaults import parse_overrides
    from tools import pdf_questions

    rows = pdf_questions.evaluate(args.model, args.out, args.questions or pdf_questions.QUESTIONS_FILE,
                                  args.sources, args.device, args.data_dir, args.corpus,
                                  progress=lambda line: print(line, file=sys.stderr, flush=True),
                                  overrides=parse_overrides(args.setting), prefilter=args.prefilter)
    print(pdf_questions.summarize(rows))
    return EXIT_OK


def _cmd_probe_reading(args: argparse.Namespace) -> int:
    from tools import reading_probe

    written = None
    if args.written and args.sources:
        print("docqa-tools probe-reading: --written asks the written questions, not the PDFs' --sources",
              file=sys.stderr)
        return EXIT_USAGE
    if args.written:
        from training.written_questions import read_written_questions

        written = read_written_questions()
    rows = reading_probe.probe(args.model, args.out, args.sources, args.per_kind, args.seed, args.device,
                               progress=lambda line: print(line, file=sys.stderr, flush=True), written=written)
    print(reading_probe.summarize(rows))
    return EXIT_OK


def _cmd_probe_denoising(args: argparse.Namespace) -> int:
    from tools import denoising_probe
    from tools.pdf_questions import SOURCES

    rows = denoising_probe.probe(args.model, args.sources or list(SOURCES), windows_per_source=args.windows,
                                 seed=args.seed, device=args.device)
    denoising_probe.write(rows, args.out)
    print(denoising_probe.summarize(rows))
    return EXIT_OK


def _cmd_bench(args: argparse.Namespace) -> int:
    import torch

    from engine import ScoringParams
    from tools import bench

    if args.llada_folds < 0:
        print(f"docqa-tools: --llada-folds must be 0 (leave-one-out) or more, got {args.llada_folds}", file=sys.stderr)
        return EXIT_USAGE
    scoring = ScoringParams(scorer=args.scorer, llada_folds=args.llada_folds or None)
    if args.concurrency:
        return _bench_concurrency(args, scoring)
    rows = bench.run(args.shape, args.contexts, args.answers, args.modes, args.device, args.chunk_size, args.top_k,
                     args.dense_budget_s, progress=lambda line: print(line, file=sys.stderr, flush=True),
                     compile_layers=not args.no_compile, scoring=scoring, prefilters=tuple(args.prefilter))
    meta = {"shape": args.shape, "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "torch": torch.__version__, "chunk_size": args.chunk_size, "top_k": args.top_k,
            "compile_layers": not args.no_compile, "scorer": args.scorer,
            "llada_folds": args.llada_folds or "leave-one-out", "prefilter": args.prefilter,
            "rule": "one token committed per step in every mode"}
    bench.write(rows, args.out, meta)
    print(bench.table(rows))
    return EXIT_OK


def _bench_concurrency(args: argparse.Namespace, scoring) -> int:
    import torch

    from tools import load_bench

    if not 0 < args.load <= 1.5 or not args.rounds or args.max_prepare < 1:
        print("docqa-tools: --load must be in (0, 1.5], --rounds and --max-prepare at least 1", file=sys.stderr)
        return EXIT_USAGE
    answer, prefilter = args.answers[0], args.prefilter[0]
    try:
        load_bench.answer_sampling(answer, args.tokens_per_step, args.block_length)
    except ValueError as e:
        print(f"docqa-tools: --tokens-per-step / --block-length: {e}", file=sys.stderr)
        return EXIT_USAGE
    phases = load_bench.run(args.shape, args.concurrency, args.contexts[0], answer, args.device,
                            args.chunk_size, args.top_k, rounds=args.rounds, load=args.load,
                            progress=lambda line: print(line, file=sys.stderr, flush=True), scoring=scoring,
                            prefilter=prefilter, tokens_per_step=args.tokens_per_step,
                            max_prepare=args.max_prepare, block_length=args.block_length,
                            documents_on=args.documents_on, gather=not args.prepare_at_once)
    meta = {"shape": args.shape, "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "torch": torch.__version__, "concurrency": args.concurrency, "context": args.contexts[0],
            "answer": answer, "chunk_size": args.chunk_size, "top_k": args.top_k, "load": args.load,
            "scorer": args.scorer, "llada_folds": args.llada_folds or "leave-one-out",
            "prefilter": prefilter or "every chunk",
            "rule": f"{args.tokens_per_step} token(s) committed per step", "max_prepare": args.max_prepare,
            "block_length": min(args.block_length, answer), "documents_on": args.documents_on,
            "newcomers": "prepared at once" if args.prepare_at_once else "gathered"}
    load_bench.write(phases, args.out, meta)
    print(load_bench.table(phases))
    return EXIT_OK


def _cmd_make_random_model(args: argparse.Namespace) -> int:
    from engine.model.random_checkpoint import write_random_checkpoint

    cfg = write_random_checkpoint(args.folder, args.family, seed=args.seed)
    print(f"wrote a random {cfg.family} checkpoint ({cfg.num_layers} layers, hidden "
          f"{cfg.hidden_size}, vocab {cfg.vocab_size}) to {args.folder}. Its weights are random: "
          "it produces gibberish, and exists to exercise the pipeline.")
    return EXIT_OK


def _cmd_replicas_config(args: argparse.Namespace) -> int:
    from tools.replicas import haproxy_config, parse_workers

    print(haproxy_config(parse_workers(args.workers), bind=args.bind, policy=args.policy), end="")
    return EXIT_OK


def _cmd_prefill_distributed(args: argparse.Namespace) -> int:
    from tools.distributed_prefill import prefill_distributed

    return prefill_distributed(args)


COMMANDS = {"eval": _cmd_eval, "eval-data": _cmd_eval_data, "eval-pdfs": _cmd_eval_pdfs,
            "probe-reading": _cmd_probe_reading, "probe-denoising": _cmd_probe_denoising, "bench": _cmd_bench,
            "make-random-model": _cmd_make_random_model, "prefill-distributed": _cmd_prefill_distributed,
            "replicas-config": _cmd_replicas_config}


def main(argv: list[str] | None = None) -> int:
    return run(COMMANDS, _build_parser().parse_args(argv), "docqa-tools")


if __name__ == "__main__":
    sys.exit(main())
