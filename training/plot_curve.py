"""Draws the bundled model's training curve from the run logs: loss and masked-token accuracy
over the steps of all runs, one colour a run.

    python -m training.plot_curve \
        docs/results/docqa-tiny-{pretrain-2026-12-06,run23,run24,run25,run26,run27,run28}/train-log.json \
        --labels pretraining "run 23" "run 24" "run 25" "run 26" "run 27" "run 28" \
        --out models/docqa-tiny/loss_curve.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("logs", type=Path, nargs="+", help="run logs (training.train --log-file), in run order")
    ap.add_argument("--labels", nargs="+", default=None, help="one a log (default: each file's name)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.labels is not None and len(args.labels) != len(args.logs):
        ap.error(f"{len(args.logs)} logs but {len(args.labels)} labels")
    labels = args.labels or [path.stem.removeprefix("docqa-tiny-train-") for path in args.logs]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(10, 3.6))
    offset = 0
    for path, label in zip(args.logs, labels, strict=True):
        log = json.loads(path.read_text())
        curve = log["curve"]
        steps = [offset + row["step"] for row in curve]
        loss_ax.plot(steps, [row["loss"] for row in curve], lw=0.8, label=label)
        acc_ax.plot(steps, [row["masked_acc"] for row in curve], lw=0.8, label=label)
        if log["meta"].get("first_step"):  # a resumed run's curve holds its earlier part too: mark the resume
            for ax in (loss_ax, acc_ax):
                ax.axvline(offset + log["meta"]["first_step"], color="grey", lw=0.6, ls="--")
        offset = steps[-1] if steps else offset
    loss_ax.set(xlabel="step (all runs)", ylabel="masked-diffusion loss", yscale="log")
    acc_ax.set(xlabel="step (all runs)", ylabel="masked-token accuracy")
    for ax in (loss_ax, acc_ax):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)


if __name__ == "__main__":
    main()
