"""The `docqa` command line."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    from engine.sampling import DECODERS

    g = p.add_argument_group("decoding")
    g.add_argument("--decoder", choices=DECODERS, default="threshold")
    g.add_argument("--gen-length", type=int, default=64, help="answer canvas length in tokens")
    g.add_argument("--block-length", type=int, default=32)
    g.add_argument("--steps", type=int, default=None,
                   help="total steps for scheduled decoders (default: one per token)")
    g.add_argument("--threshold", type=float, default=0.9, help="confidence threshold tau")
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=None)
    g.add_argument("--top-k", type=int, default=None)
    g.add_argument("--seed", type=int, default=0)


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="docqa", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text from a prompt (dense diffusion decoding)")
    gen.add_argument("prompt")
    gen.add_argument("--model", required=True, type=Path, help="local checkpoint folder")
    gen.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: cuda if present)")
    gen.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None)
    gen.add_argument("--attention", choices=("reference", "sdpa"), default=None)
    gen.add_argument("--no-chat-template", action="store_true",
                     help="feed the prompt as plain text, without the model's chat template")
    gen.add_argument("--show-steps", action="store_true", help="print every denoising step")
    _add_sampling_args(gen)

    mk = sub.add_parser("make-random-model",
                        help="write a tiny random checkpoint (Dream or LLaDA format) for trying things")
    mk.add_argument("folder", type=Path)
    mk.add_argument("--family", choices=("dream", "llada"), default="llada")
    mk.add_argument("--seed", type=int, default=0)
    return parser


def _cmd_generate(args: argparse.Namespace) -> int:
    import torch

    from engine import Engine, SamplingParams
    from engine.decode import DecodeStep

    params = SamplingParams(decoder=args.decoder, gen_length=args.gen_length,
                            block_length=args.block_length, steps=args.steps,
                            threshold=args.threshold, temperature=args.temperature,
                            top_p=args.top_p, top_k=args.top_k, seed=args.seed)
    dtype = getattr(torch, args.dtype) if args.dtype else None
    engine = Engine.from_pretrained(args.model, device=args.device, dtype=dtype,
                                    attention=args.attention)
    for event in engine.stream_generate(args.prompt, params,
                                        use_chat_template=not args.no_chat_template):
        if isinstance(event, DecodeStep):
            if args.show_steps:
                print(f"step {event.step:4d} block {event.block}: committed {len(event.tokens)} "
                      f"token(s), {event.masked_left} masked left", file=sys.stderr)
        else:
            print(event.text)
            print(f"[{len(event.answer_ids)} tokens, {event.steps} steps, "
                  f"{event.forward_passes} forward passes, {event.seconds:.2f} s]", file=sys.stderr)
    return EXIT_OK


def _cmd_make_random_model(args: argparse.Namespace) -> int:
    from app.random_checkpoint import write_random_checkpoint

    cfg = write_random_checkpoint(args.folder, args.family, seed=args.seed)
    print(f"wrote a random {cfg.family} checkpoint ({cfg.num_layers} layers, hidden "
          f"{cfg.hidden_size}, vocab {cfg.vocab_size}) to {args.folder}. Its weights are random: "
          "it produces gibberish, and exists to exercise the pipeline.")
    return EXIT_OK


COMMANDS = {"generate": _cmd_generate, "make-random-model": _cmd_make_random_model}


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    from engine.config import ConfigError
    from engine.tokenizer import TokenizerError
    from engine.weights import CheckpointError

    try:
        return COMMANDS[args.command](args)
    except (CheckpointError, ConfigError, TokenizerError) as exc:
        print(f"docqa: cannot load the model: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except ValueError as exc:
        print(f"docqa: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("docqa: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
