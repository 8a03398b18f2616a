"""The `docqa` command line."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from app.choices import DECODERS, DEFAULT_KV_ENCODING, KV_ENCODINGS, KV_MODES, POSITION_MODES, SCORERS
from app.defaults import BUNDLED_MODEL

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("decoding")
    g.add_argument("--decoder", choices=DECODERS, default=None, help="default: the model's, else threshold")
    g.add_argument("--gen-length", type=int, default=None, help="answer canvas length in tokens (default 64)")
    g.add_argument("--block-length", type=int, default=None,
                   help="tokens denoised together (generate: 32; answer: the model's, 64 for docqa-tiny)")
    g.add_argument("--steps", type=int, default=None,
                   help="total steps for scheduled decoders (default: one per token)")
    g.add_argument("--threshold", type=float, default=None,
                   help="confidence threshold tau (generate: 0.9; answer: the model's, 0.999 for docqa-tiny)")
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--sample-top-p", dest="top_p", type=float, default=None, help="nucleus sampling")
    g.add_argument("--sample-top-k", dest="top_k_sampling", type=int, default=None, help="top-k sampling")
    g.add_argument("--seed", type=int, default=0)


def positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be more than 0, not {text}")
        return value
    return parse


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def _add_question_limits(p: argparse.ArgumentParser) -> None:
    """Overrides of ServiceConfig's limits (None keeps its defaults)."""
    p.add_argument("--max-question-tokens", type=positive(int), default=None,
                   help="refuse longer questions (default 512)")
    p.add_argument("--request-timeout", type=positive(float), default=None,
                   help="seconds a question may hold the model before it is stopped (default 300)")
    p.add_argument("--prefilter-chunks", type=non_negative_int, default=None, metavar="M",
                   help="chunks the scorer sees, the best M by BM25; 0 scores every chunk (default: the model's; "
                        "the bundled model's: 64 on a GPU, 32 on a CPU)")


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="docqa", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text from a prompt (dense diffusion decoding)")
    gen.add_argument("prompt")
    gen.add_argument("--model", type=Path, default=None, help="local checkpoint folder (default: the bundled model)")
    gen.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: cuda if present)")
    gen.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None)
    gen.add_argument("--attention", choices=("reference", "sdpa"), default=None)
    gen.add_argument("--no-chat-template", action="store_true",
                     help="feed the prompt as plain text, without the model's chat template")
    gen.add_argument("--show-steps", action="store_true", help="print every denoising step")
    _add_sampling_args(gen)

    ans = sub.add_parser("answer", help="answer a question about text files (prefill in memory, no storage)")
    ans.add_argument("question")
    ans.add_argument("files", nargs="+", type=Path, help="UTF-8 text or Markdown files")
    ans.add_argument("--model", type=Path, default=None, help="local checkpoint folder (default: the bundled model)")
    ans.add_argument("--device", default=None)
    ans.add_argument("--chunk-size", type=int, default=None, help="default: the model's (docqa.json), else 512")
    ans.add_argument("--top-k", default=None, help="chunks to keep, or 'auto' (default: the model's, else 4)")
    ans.add_argument("--score-margin", type=float, default=None,
                     help="keep chunks scoring within this of the best (0: no margin rule; default: the model's)")
    ans.add_argument("--coverage-gain", type=float, default=None,
                     help="also keep chunks that add this much (nats a token) to what the kept ones explain "
                          "of the question (0: off; both rules off keep all K; default: the model's)")
    ans.add_argument("--token-budget", type=int, default=None, help="tokens kept per chunk and head (0: all)")
    ans.add_argument("--kv-mode", choices=KV_MODES, default=None)
    ans.add_argument("--position-mode", choices=POSITION_MODES, default=None)
    ans.add_argument("--scorer", choices=SCORERS, default=None)
    _add_sampling_args(ans)

    def service_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--model", type=Path, default=None, help="local checkpoint folder (default: the bundled model)")
        p.add_argument("--data-dir", type=Path, default=Path("docqa-data"), help="where documents and caches live")
        p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: cuda if present)")
        p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                       help="the model's dtype (default: bfloat16 on a GPU and on a CPU with native bf16, "
                            "else float32)")
        p.add_argument("--kv-at-rest", choices=KV_ENCODINGS, default=DEFAULT_KV_ENCODING,
                       help="how KV files keep keys and values: fp8 (e4m3 with scales, half of bf16's bytes) or "
                            f"bf16 (default {DEFAULT_KV_ENCODING}); each is a cache of its own")

    sv = sub.add_parser("serve", help="start the web app and its OpenAI-compatible API at /v1 (127.0.0.1 by default)")
    service_args(sv)
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (never shared publicly)")
    sv.add_argument("--port", type=int, default=7860)
    sv.add_argument("--max-upload-mb", type=int, default=200)
    _add_question_limits(sv)

    ing = sub.add_parser("ingest", help="add documents (PDF, TXT, Markdown) and prefill them")
    service_args(ing)
    ing.add_argument("files", nargs="+", type=Path)
    ing.add_argument("--password", default=None, help="password of an encrypted PDF")

    ask = sub.add_parser("ask", help="ask a question about stored documents (names or ids)")
    service_args(ask)
    _add_question_limits(ask)
    ask.add_argument("documents", nargs="+",
                     help="document names, ids or @collection names, then the question last")

    col = sub.add_parser("collection", help="save a named set of documents (ask it as @NAME)")
    service_args(col)
    col.add_argument("name")
    col.add_argument("documents", nargs="*", help="document names or ids (none: delete the collection)")

    ls = sub.add_parser("list", help="list stored documents")
    service_args(ls)

    rm = sub.add_parser("rm", help="delete stored documents (names or ids)")
    service_args(rm)
    rm.add_argument("documents", nargs="+")

    doc = sub.add_parser("doctor", help="check a data folder: database, files, backup (changes nothing)")
    doc.add_argument("--data-dir", type=Path, default=Path("docqa-data"), help="where documents and caches live")

    rep = sub.add_parser("repair", help="rebuild a missing or damaged database from its backup and the files")
    rep.add_argument("--data-dir", type=Path, default=Path("docqa-data"), help="where documents and caches live")

    return parser


def _cmd_generate(args: argparse.Namespace) -> int:
    from app.oneshot import generate

    def show(step: int, block: int, committed: int, masked_left: int) -> None:
        print(f"step {step:4d} block {block}: committed {committed} token(s), {masked_left} masked left",
              file=sys.stderr)

    out = generate(args.prompt, args.model, device=args.device, dtype=args.dtype, attention=args.attention,
                   use_chat_template=not args.no_chat_template, on_step=show if args.show_steps else None,
                   decoder=args.decoder, gen_length=args.gen_length, block_length=args.block_length, steps=args.steps,
                   threshold=args.threshold, temperature=args.temperature, top_p=args.top_p,
                   top_k=args.top_k_sampling, seed=args.seed)
    print(out.text)
    print(f"[{out.tokens} tokens, {out.steps} steps, {out.forward_passes} forward passes, {out.seconds:.2f} s]",
          file=sys.stderr)
    return EXIT_OK


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"no such file: {path}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text") from None


def _cmd_answer(args: argparse.Namespace) -> int:
    from app.oneshot import answer_texts

    if args.top_k is not None and args.top_k != "auto" and not args.top_k.isdigit():
        raise ValueError(f"--top-k must be a number or 'auto', not {args.top_k!r}")
    texts = [_read_text(p) for p in args.files]
    out = answer_texts(
        args.question, texts, args.model, device=args.device, chunk_size=args.chunk_size,
        sampling={"steps": args.steps, "temperature": args.temperature, "top_p": args.top_p,
                  "top_k": args.top_k_sampling, "seed": args.seed},
        top_k=int(args.top_k) if args.top_k not in (None, "auto") else None,
        auto_k=True if args.top_k == "auto" else None, token_budget=args.token_budget, kv_mode=args.kv_mode,
        position_mode=args.position_mode, scorer=args.scorer, decoder=args.decoder, threshold=args.threshold,
        gen_length=args.gen_length, block_length=args.block_length, score_margin=args.score_margin,
        coverage_gain=args.coverage_gain)
    print(out.text)
    print(f"[{out.steps} steps, {out.forward_passes} forward passes; "
          + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in out.timings.items()) + "]", file=sys.stderr)
    for c in out.citations:
        print(f"  {args.files[c.text_index].name} chunk {c.chunk} (tokens {c.token_start}-{c.token_end}), "
              f"score {c.score:.3f}: {c.snippet[:80]}", file=sys.stderr)
    return EXIT_OK


def _service(args: argparse.Namespace, **kw):
    from app.service import DocQA, ServiceConfig

    limits = {"max_question_tokens": getattr(args, "max_question_tokens", None),
              "request_timeout_s": getattr(args, "request_timeout", None),
              "prefilter_chunks": getattr(args, "prefilter_chunks", None)}
    return DocQA(ServiceConfig(data_dir=args.data_dir, model_dir=args.model or BUNDLED_MODEL, device=args.device,
                               kv_encoding=args.kv_at_rest, dtype=args.dtype,
                               **kw, **{k: v for k, v in limits.items() if v is not None}))


def _cmd_ingest(args: argparse.Namespace) -> int:
    from app.errors import IngestError, StorageError, without_name

    service = _service(args)
    failed = 0
    for path in args.files:
        def progress(stage: str, frac: float, name=path.name) -> None:
            bar = "#" * int(30 * frac)
            print(f"\r{name}: [{bar:<30}] {stage:<32}", end="", file=sys.stderr, flush=True)

        try:
            info, added = service.ingest_file(path, password=args.password, progress=progress)
            print(file=sys.stderr)
            print(f"{'added' if added else 'already stored'}: {info.record.name}  id {info.record.id[:12]}  "
                  f"{info.record.page_count} pages, {info.tokens} tokens, {info.chunks} chunks")
        except (IngestError, StorageError) as exc:  # every file is tried and reported
            print(file=sys.stderr)
            print(f"docqa: {path.name}: {without_name(str(exc), path.name)}", file=sys.stderr)
            failed += 1
    if failed and len(args.files) > 1:
        print(f"docqa: {failed} of {len(args.files)} files not added", file=sys.stderr)
    return EXIT_ERROR if failed else EXIT_OK


def _cmd_ask(args: argparse.Namespace) -> int:
    if len(args.documents) < 2:
        raise ValueError("give one or more documents, then the question")
    service = _service(args)
    *names, question = args.documents
    ids = service.resolve_documents(names, listing="docqa list")
    for event in service.ask(question, ids, origin="cli"):
        if event.kind == "step" and sys.stderr.isatty():
            print(f"\r{event.partial[:100]:<100}", end="", file=sys.stderr, flush=True)
        elif event.kind == "done":
            if sys.stderr.isatty():
                print("\r" + " " * 100 + "\r", end="", file=sys.stderr)
            r = event.result
            print(r.reply)
            if r.warning:
                print(f"warning: {r.warning}", file=sys.stderr)
            for c in r.citations:
                snippet = " ".join(c.text.split())[:90]
                print(f"  [{c.document}, p. {c.pages}] score {c.score:.2f}: {snippet}", file=sys.stderr)
    return EXIT_OK


def _cmd_list(args: argparse.Namespace) -> int:
    service = _service(args)
    docs = service.documents(include_failed=True)
    if not docs:
        print("no documents yet (docqa ingest FILE...)")
    for d in docs:
        state = ("cached" if d.cached else "not cached") if d.record.status == "ready" else "FAILED"
        print(f"{d.record.id[:12]}  {d.record.name:<40} {d.record.page_count:>5} pages {d.tokens:>8} tokens "
              f"{d.chunks:>6} chunks  {state} {d.kv_bytes / 2**20:8.1f} MiB")
        if d.record.status == "failed":
            print(f"              {d.record.error} (add it again to retry)")
    if service.read_only:
        print(f"(the data folder {service.store.root} is read-only: documents can be asked, not changed)")
    return EXIT_OK


def _cmd_rm(args: argparse.Namespace) -> int:
    service = _service(args)
    for doc_id in service.resolve_documents(args.documents, include_failed=True, listing="docqa list"):
        service.delete(doc_id)
        print(f"deleted {doc_id[:12]}")
    return EXIT_OK


def _print_report(report) -> None:
    print(f"database: {report.database}")
    for line in report.problems:
        print(f"  problem: {line}")
    for line in report.actions:
        print(f"  done: {line}")


def _cmd_doctor(args: argparse.Namespace) -> int:
    from app.maintenance import diagnose

    report = diagnose(args.data_dir)
    _print_report(report)
    if report.healthy:
        print("no problems found")
        return EXIT_OK
    print(f"run `docqa repair --data-dir {args.data_dir}` to fix what can be fixed")
    return EXIT_ERROR


def _cmd_repair(args: argparse.Namespace) -> int:
    from app.maintenance import repair

    report = repair(args.data_dir)
    _print_report(report)
    if not report.problems:
        print("nothing to repair")
    return EXIT_OK


def _cmd_collection(args: argparse.Namespace) -> int:
    service = _service(args)
    if not args.documents:
        print(f"deleted collection {args.name}" if service.delete_collection(args.name)
              else f"no collection named {args.name}")
        return EXIT_OK
    ids = service.resolve_documents(args.documents, listing="docqa list")
    service.save_collection(args.name, ids)
    print(f"collection {args.name}: {len(ids)} document(s); ask it with: docqa ask @{args.name} \"question\"")
    return EXIT_OK


def _cmd_serve(args: argparse.Namespace) -> int:
    from ui.app import launch

    service = _service(args, max_upload_bytes=args.max_upload_mb << 20)
    launch(service, host=args.host, port=args.port)
    return EXIT_OK


COMMANDS = {"generate": _cmd_generate, "answer": _cmd_answer, "ingest": _cmd_ingest, "ask": _cmd_ask,
            "collection": _cmd_collection, "list": _cmd_list, "rm": _cmd_rm, "doctor": _cmd_doctor,
            "repair": _cmd_repair, "serve": _cmd_serve}


def main(argv: list[str] | None = None) -> int:
    return run(COMMANDS, _build_parser().parse_args(argv), "docqa")


def run(commands: dict, args: argparse.Namespace, prog: str) -> int:
    """Runs `args.command` from `commands`: logging configured here (an entry point), and every
    error the user can cause answered as one line on stderr with an exit status, never a traceback."""
    logging.basicConfig(level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    import sqlite3

    from app.errors import MODEL_ERRORS, QuestionStopped, ServiceBusy, StorageError

    try:
        return commands[args.command](args)
    except MODEL_ERRORS as exc:
        print(f"{prog}: cannot load the model: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except StorageError as exc:
        print(f"{prog}: storage: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except (QuestionStopped, ServiceBusy) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except sqlite3.DatabaseError as exc:  # damaged while in use (checked at open)
        data_dir = getattr(args, "data_dir", "DATA")
        print(f"{prog}: the library database is damaged ({exc}); run `docqa repair --data-dir {data_dir}`",
              file=sys.stderr)
        return EXIT_ERROR
    except OSError as exc:
        print(f"{prog}: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=sys.stderr)
        return EXIT_ERROR
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
