"""A block drafter's accuracy per block row: one PNG, the curve TRAINING.md shows for each training stage.

    python scripts/plot_block_accuracy.py <train run dir> [...] --out results/X/block_rows.png

Per run (a train_draft.py run directory with train/head=block): each evaluation's held-out accuracy per row
(metrics.json's eval_history: block row k+1 drafting the target's greedy token with the answer's parent, on the
target's greedy answers to held-out prompts), solid, and the last log window's training accuracy per row
(train_log.jsonl's train/acc_k), dashed. Row k+1 is accepted only after rows 1..k: the product of the first k is the
chance a chain of k drafts is all accepted.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def curves(run: Path) -> tuple[list[tuple[str, list[float]]], list[float]]:
    """(held-out accuracy per row at each evaluation, labelled by step; the last window's training accuracy)."""
    metrics = json.loads((run / "metrics.json").read_text())
    held = [(f"step {e['step']}", e["acc"]) for e in metrics.get("eval_history") or []]
    last = json.loads((run / "train_log.jsonl").read_text().splitlines()[-1])
    train = [last[f"train/acc_{k}"] for k in range(metrics["ttt_length"])]
    return held, train


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="train_draft.py run directories (train/head=block)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in map(Path, args.runs):
        held, train = curves(run)
        rows = range(1, len(train) + 1)
        for label, acc in held:
            ax.plot(rows[:len(acc)], acc, marker="o", label=f"{run.name}: held-out, {label}")
        ax.plot(rows, train, linestyle="--", marker=".", label=f"{run.name}: training, last window")
        ax.set_xticks(list(rows))
    ax.set_xlabel("block row (depth drafted)")
    ax.set_ylabel("top-1 accuracy (teacher-forced parent)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
