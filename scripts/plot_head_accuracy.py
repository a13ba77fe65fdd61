"""Training accuracy against held-out accuracy over a head's training stages: one PNG.

    python scripts/plot_head_accuracy.py results/eagle3_smollm2_stage1_h200 ... --out results/X/acc_gap.png \\
        --probe "stage-3 head, non-repeated synthesized tokens=0.525"

Each stage folder holds the trainer's train_log.jsonl and train_metrics.json; stages are laid end to end on the axis
of tokens seen. Plotted: train/acc_0 per log window, and eval/acc_0 (the trainer's held-out evaluation: teacher-forced
step 0 on the target's greedy answers to held-out ShareGPT prompts) at each evaluation, and train/acc_0_fresh
(step 0 outside verbatim repeats) where a log has it. --probe adds horizontal
reference lines (benchmarks/probes/loop_share.py's numbers).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stages", nargs="+", help="result folders, in training order")
    ap.add_argument("--out", required=True)
    ap.add_argument("--probe", action="append", default=[], help="LABEL=VALUE: a horizontal reference line")
    args = ap.parse_args()
    fig, ax = plt.subplots(figsize=(9, 4.8))
    offset = 0.0
    for i, d in enumerate(map(Path, args.stages)):
        m = json.loads((d / "train_metrics.json").read_text())
        per_step = m["tokens_seen"] / m["steps"] / 1e6  # M tokens per optimiser step
        rows = [json.loads(line) for line in (d / "train_log.jsonl").open()]
        xs = [offset + r["step"] * per_step for r in rows if "train/acc_0" in r]
        ax.plot(xs, [r["train/acc_0"] for r in rows if "train/acc_0" in r], color="C0", lw=1,
                label="train/acc_0 (training batches)" if i == 0 else None)
        fresh = [(offset + r["step"] * per_step, r["train/acc_0_fresh"]) for r in rows if "train/acc_0_fresh" in r]
        if fresh:  # logged since the trainer split step 0's accuracy at verbatim repeats (training/losses.py)
            ax.plot(*zip(*fresh), color="C2", lw=1, label="train/acc_0_fresh (outside verbatim repeats)"
                    if not any(line.get_color() == "C2" for line in ax.lines) else None)
        ev = [(offset + h["step"] * per_step, h["acc"][0]) for h in m.get("eval_history", []) if h.get("acc")]
        if ev:
            ax.plot(*zip(*ev), "o-", color="C3", label="eval/acc_0 (held-out ShareGPT)" if i == 1 else None)
        offset += m["tokens_seen"] / 1e6
        ax.axvline(offset, color="0.8", lw=0.8)
        ax.text(offset - 1, 0.42, d.name.replace("eagle3_smollm2_", "").replace("_h200", ""), rotation=90,
                ha="right", va="bottom", fontsize=7, color="0.4")
    for j, p in enumerate(args.probe):
        label, value = p.rsplit("=", 1)
        ax.axhline(float(value), color=f"C{j + 4}", ls="--", lw=1, label=label)
    ax.set_xlabel("tokens seen (M), stages end to end")
    ax.set_ylabel("step-0 accuracy")
    ax.set_ylim(0.4, 0.9)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title("EAGLE-3 head for SmolLM2-135M: training vs held-out step-0 accuracy")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
