"""Rewrites a checkpoint's weights in int8 with per-row scales (engine.model.weights.quantize_int8).

    python scripts/quantize_weights.py MODEL_DIR OUT_DIR

OUT_DIR gets the same config, tokenizer and defaults, and int8 safetensors shards of at most 15 MB.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from engine.model.weights import INDEX_FILE, load_model, save_weights  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("out_dir", type=Path)
    args = ap.parse_args()
    if args.out_dir.resolve() == args.model_dir.resolve():
        print("quantize_weights: write to another folder, then move it over", file=sys.stderr)
        return 2
    model = load_model(args.model_dir, dtype=torch.float32)
    shutil.copytree(args.model_dir, args.out_dir, ignore=shutil.ignore_patterns("*.safetensors", INDEX_FILE),
                    dirs_exist_ok=True)
    paths = save_weights(args.out_dir, model.cfg, model.state_dict(), quantize=True)
    total = sum(p.stat().st_size for p in paths)
    print(f"{len(paths)} int8 shards, {total / 1e6:.1f} MB, in {args.out_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
