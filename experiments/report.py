"""Tables (markdown) and plots (PNG) from the metrics.json files that run_spec.py writes.

    python -m eaglet.experiments.report multirun/ablate_overlap --out results/ablate_overlap

Reads every metrics.json under the given folders and writes into --out what the runs support:
  runs.md                   one row per run: target, draft, data, tree, plan, batch, tau, tokens/s, speedup over AR
  overlap.md                per (target, tree, batch) with several stream plans: each plan's step time split by
                            phase, the share of plan time hidden, and the speedup over `serial` in the same sweep
                            (medians over a sweep point's repeats; with repeats, whether a plan is slower or
                            faster than serial beyond the sweep's run-to-run noise: `versus_serial`)
  step_time_by_phase.png    stacked step time per plan (draft, exposed plan, verify and accept, extend)
  speedup_vs_serial.png     speedup of each overlap plan over serial, by batch size
  trees.md                  per (target, draft, data, batch) with several tree shapes: tau, per-depth acceptance,
  tau_vs_tree_size.png      step time and tokens/s of each shape; tau against verified tokens per (steps, topk)
  speedup_vs_batch.png      speedup over autoregressive decoding against batch size, per (draft, tree, data)
  accept_hist.png           accept-length histograms of the runs with real acceptance

README.md's results table is experiments/readme_table.py's.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

PHASES = ("draft", "plan_wait", "verify", "extend")  # what adds up on the main stream
PLAN_ORDER = ("serial", "overlap_wait_stream", "overlap_event", "overlap_split", "unsafe_no_sync")


def log(msg: str) -> None:
    print(f"[report] {msg}", flush=True)


def load_runs(roots: list[str | Path]) -> list[dict]:
    """Every metrics.json under the roots, with `run` set to its folder (relative to its root)."""
    runs = []
    for root in map(Path, roots):
        files = sorted(root.rglob("metrics.json"))
        log(f"{root}: {len(files)} runs")
        for f in files:
            m = json.loads(f.read_text())
            m["run"] = str(f.parent.relative_to(root)) or "."
            if "accept_ms" in m:  # runs from before the accept joined the verify's graph timed it apart
                m["verify_ms"] = m.get("verify_ms", 0.0) + m.pop("accept_ms")
            runs.append(m)
    return runs


def tree_name(m: dict) -> str:
    t = m.get("tree")
    return "-" if not t else f"{t['name']} ({t['steps']}/{t['topk']}/{t['num_draft_tokens']})"


def runs_table(runs: list[dict]) -> str:
    lines = ["| run | target | draft | data | tree | plan | B | tau | tokens/s | decode tokens/s | speedup vs AR "
             "| identical to AR |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in sorted(runs, key=lambda m: m["run"]):
        tau = f"{m['tau']:.2f}" if "tau" in m else "-"
        sp = f"{m['speedup_vs_ar']:.2f}" if "speedup_vs_ar" in m else "-"
        same = f"{100 * m['ar_identical_fraction']:.0f}%" if "ar_identical_fraction" in m else "-"
        lines.append(f"| {m['run']} | {m['target']} | {m['draft']} | {m.get('data', '-')} | {tree_name(m)} "
                     f"| {m.get('stream_plan', '-')} | {m['batch_size']} | {tau} | {m['tokens_per_s']:.1f} "
                     f"| {m['decode_tokens_per_s']:.1f} | {sp} | {same} |")
    return "\n".join(lines) + "\n"


def configured_plan(m: dict) -> str:
    return m["config"]["stream"]["name"]


def overlap_groups(runs: list[dict]) -> dict[tuple, dict[str, dict]]:
    """(target, tree, batch) -> configured plan -> metrics, for speculative runs with phase timings; the repeats
    of a sweep point (config `repeat`) merged by `merge_repeats`. Keyed by the configured plan; the table says
    when it ran as another (CPU, environment)."""
    groups: dict[tuple, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for m in runs:
        if "step_ms" in m and m.get("stream_plan"):
            groups[(m["target"], tree_name(m), m["batch_size"])][configured_plan(m)].append(m)
    return {k: {plan: merge_repeats(ms) for plan, ms in v.items()}
            for k, v in sorted(groups.items(), key=lambda kv: kv[0]) if len(v) > 1}


TIMINGS = ("step_ms", "step_median_ms", "draft_ms", "plan_ms", "plan_wait_ms", "verify_ms", "extend_ms",
           "plan_hidden_fraction", "weight_read_floor_ms")


def step_time(m: dict) -> float:
    """The step time plans are compared by: a run's median step period (one stalled step does not move it), or its
    mean step for runs that predate that metric."""
    return m.get("step_median_ms") or m["step_ms"]


def merge_repeats(ms: list[dict]) -> dict:
    """Repeats of one sweep point -> the first's metrics with the median of each timing, the number of repeats, and
    the repeats' `step_time`s, their median (`step_compare_ms`) and range (min, max)."""
    out = dict(ms[0])
    for k in TIMINGS:
        vals = [m[k] for m in ms if m.get(k) is not None]
        if vals:
            out[k] = statistics.median(vals)
    steps = [step_time(m) for m in ms]
    out.update(repeats=len(ms), step_ms_repeats=steps, step_compare_ms=statistics.median(steps),
               step_ms_range=(min(steps), max(steps)))
    return out


# A plan is slower (faster) than serial beyond noise when its median step time is more than this many standard
# errors above (below) serial's. With 3, pure noise calls one of a sweep's ~36 comparisons slower about 5% of the time.
NOISE_SE = 3.0


def _residuals(plans) -> list[float]:
    """Residuals of log(step time) about each plan's mean over its repeats, each scaled by sqrt(n / (n - 1)) for the
    fitted mean (1.4826 x their median: a robust estimate of the run-to-run standard deviation)."""
    residuals = []
    for m in plans:
        logs = [math.log(t) for t in m.get("step_ms_repeats", [])]
        n = len(logs)
        if n > 1:
            mean = sum(logs) / n
            residuals += [abs(x - mean) * math.sqrt(n / (n - 1)) for x in logs]
    return residuals


def run_noise(groups: dict[tuple, dict[str, dict]]) -> dict[tuple, float]:
    """(target, tree, batch) -> the run-to-run standard deviation of log(step time), i.e. the relative spread of
    one run, that the point's plans are judged by: the larger of the spread pooled over every point of the target
    and the spread pooled over the point's own plans. Robust (1.4826 x the median absolute residual), so a single
    outlier run moves it little. The point's own spread matters where it is wider than the target's: on random
    Llama-3.1-8B at B=32 with the 32-token tree (a compute-bound verify), 8 repeats of serial spanned 1.6% of a
    step against a pooled spread of 0.24% (results/ablate_overlap_h200/rerun_wide_b32/)."""
    by_target: dict[str, list[float]] = defaultdict(list)
    for (target, _, _), plans in groups.items():
        by_target[target] += _residuals(plans.values())
    pooled = {t: 1.4826 * statistics.median(r) for t, r in by_target.items() if r}
    out = {}
    for key, plans in groups.items():
        own = _residuals(plans.values())
        if key[0] in pooled:  # without repeats there is no spread to judge by
            out[key] = max(pooled[key[0]], 1.4826 * statistics.median(own) if own else 0.0)
    return out


def versus_serial(m: dict, base: dict, sigma: float | None) -> str:
    """Whether a plan's median step time differs from serial's by more than NOISE_SE standard errors. sigma: the
    point's run-to-run relative spread (`run_noise`); the standard error of a median of n runs is taken as
    sqrt(pi / 2) sigma / sqrt(n) (the large-n value; for 2-3 repeats it overstates it a little). Without repeats
    there is no spread to judge by. (A rule of non-overlapping ranges of two repeats each flags one in three
    comparisons of identical plans.)"""
    if m["repeats"] < 2 or base["repeats"] < 2 or not sigma:
        return "-"
    se = math.sqrt(math.pi / 2) * sigma * math.sqrt(1 / m["repeats"] + 1 / base["repeats"])
    d = math.log(m["step_compare_ms"] / base["step_compare_ms"])
    return "slower" if d > NOISE_SE * se else "faster" if d < -NOISE_SE * se else "within noise"


def tree_groups(runs: list[dict]) -> dict[tuple, list[dict]]:
    """(target, draft, data, batch) -> runs of different tree shapes with real acceptance, in shape order;
    only groups that hold more than one shape (a tree sweep)."""
    groups: dict[tuple, dict[tuple, dict]] = defaultdict(dict)
    for m in runs:
        t = m.get("tree")
        if "tau" in m and t and not t.get("simulate"):
            groups[(m["target"], m["draft"], m.get("data", "-"), m["batch_size"])][
                (t["steps"], t["topk"], t["num_draft_tokens"])] = m
    return {k: [v[shape] for shape in sorted(v)] for k, v in sorted(groups.items()) if len(v) > 1}


def trees_table(groups: dict[tuple, list[dict]]) -> str:
    lines = ["| target | draft | data | B | steps | topk | verified tokens | tau | accept rate by depth | step ms "
             "| decode tokens/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (target, draft, data, B), ms in groups.items():
        for m in ms:
            t = m["tree"]
            depth = " / ".join(f"{r:.2f}" for r in m.get("accept_rate_depth", []))
            lines.append(f"| {target} | {draft} | {data} | {B} | {t['steps']} | {t['topk']} | {t['num_draft_tokens']} "
                         f"| {m['tau']:.2f} | {depth} | {m['step_ms']:.3f} | {m['decode_tokens_per_s']:.1f} |")
    return "\n".join(lines) + "\n"


def plot_tau_vs_tree_size(groups: dict[tuple, list[dict]], path: Path) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(groups), figsize=(4.5 * len(groups), 4), squeeze=False)
    for ax, (key, ms) in zip(axes[0], groups.items()):
        lines: dict[tuple, list[tuple[int, float]]] = defaultdict(list)
        for m in ms:
            t = m["tree"]
            lines[(t["steps"], t["topk"])].append((t["num_draft_tokens"], m["tau"]))
        for (steps, topk), pts in sorted(lines.items()):
            ax.plot([n for n, _ in pts], [tau for _, tau in pts], marker="o", label=f"steps {steps}, topk {topk}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("verified tokens per step (root included)")
        ax.set_ylabel("tau (tokens per verify step)")
        ax.set_title(f"{key[0]}, {key[1]}, {key[2]}, B={key[3]}", fontsize=8)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def batch_series(runs: list[dict]) -> dict[tuple, list[tuple[int, float]]]:
    """(target, draft, tree, data) -> [(batch, speedup over AR)] for runs measured against AR, when a
    series has more than one batch size."""
    series: dict[tuple, dict[int, float]] = defaultdict(dict)
    for m in runs:
        if "speedup_vs_ar" in m:
            series[(m["target"], m["draft"], tree_name(m), m.get("data", "-"))][m["batch_size"]] = m["speedup_vs_ar"]
    return {k: sorted(v.items()) for k, v in sorted(series.items()) if len(v) > 1}


def plot_speedup_vs_batch(series: dict[tuple, list[tuple[int, float]]], path: Path) -> None:
    lines = [(f"{draft} | {tree} | {data}", pts) for (target, draft, tree, data), pts in series.items()]
    plot_vs_batch(lines, "autoregressive", "decode speedup over autoregressive (same run)", path)


def plot_vs_batch(lines: list[tuple[str, list[tuple[int, float]]]], baseline: str, ylabel: str, path: Path) -> None:
    """One line per (label, [(batch size, speedup)]), over a grey line at 1 for the baseline."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, pts in lines:
        ax.plot([b for b, _ in pts], [s for _, s in pts], marker="o", label=label)
    ax.axhline(1.0, color="grey", lw=0.8, label=baseline)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def overlap_table(groups: dict[tuple, dict[str, dict]]) -> str:
    lines = ["| target | tree | B | plan | repeats | step ms | step ms range | draft | plan | plan exposed "
             "| verify (and accept) | extend | plan hidden | speedup vs serial | beyond noise "
             "| verify / weight-read floor | step / floor |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    sigma = run_noise(groups)
    for (target, tree, B), plans in groups.items():
        base = plans.get("serial")
        for plan in sorted(plans, key=PLAN_ORDER.index):
            m = plans[plan]
            sp = f"{base['step_compare_ms'] / m['step_compare_ms']:.3f}" if base else "-"
            noise = versus_serial(m, base, sigma.get((target, tree, B))) if base and plan != "serial" else "-"
            lo, hi = m["step_ms_range"]
            ran = plan if m["stream_plan"] == plan else f"{plan} (ran as {m['stream_plan']})"
            floor = m.get("weight_read_floor_ms")  # GPU runs only
            vs_floor = (f"{m['verify_ms'] / floor:.2f}x | {m['step_ms'] / floor:.2f}x" if floor else "- | -")
            lines.append(f"| {target} | {tree} | {B} | {ran} | {m['repeats']} | {m['step_compare_ms']:.3f} "
                         f"| {lo:.3f}–{hi:.3f} "
                         f"| {m['draft_ms']:.3f} | {m['plan_ms']:.3f} | {m['plan_wait_ms']:.3f} | {m['verify_ms']:.3f} "
                         f"| {m['extend_ms']:.3f} | {100 * m['plan_hidden_fraction']:.0f}% "
                         f"| {sp} "
                         f"| {noise} | {vs_floor} |")
    for target in dict.fromkeys(t for t, _, _ in sigma):
        sd = [100 * v for k, v in sigma.items() if k[0] == target]
        lines.append(f"\n{target}: step ms = `step_time` (a run's median step), median and range over the repeats; "
                     f"the phases are means per step. Beyond noise: more than {NOISE_SE:g} standard errors from "
                     f"serial's step, by the larger of the run-to-run spread pooled over the target and over the "
                     f"point's plans (robust): {min(sd):.2f}–{max(sd):.2f}% of a step.")
    return "\n".join(lines) + "\n"


def plot_step_time(groups: dict[tuple, dict[str, dict]], path: Path) -> None:
    plt = _pyplot()
    keys = list(groups)
    fig, axes = plt.subplots(1, len(keys), figsize=(3.2 * len(keys), 4), squeeze=False, sharey=False)
    colors = dict(zip(PHASES, ("#4c72b0", "#dd8452", "#55a868", "#8172b3")))
    for ax, key in zip(axes[0], keys):
        plans = sorted(groups[key], key=PLAN_ORDER.index)
        bottom = [0.0] * len(plans)
        for phase in PHASES:
            vals = [groups[key][p][f"{phase}_ms"] for p in plans]
            ax.bar(range(len(plans)), vals, bottom=bottom, color=colors[phase],
                   label="plan (exposed)" if phase == "plan_wait" else phase)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_xticks(range(len(plans)), [p.replace("overlap_", "ov_") for p in plans], rotation=45, ha="right")
        ax.set_title(f"{key[0]}\n{key[1]}, B={key[2]}", fontsize=8)
        ax.set_ylabel("ms per step (device events; host clock on CPU)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_speedup(groups: dict[tuple, dict[str, dict]], path: Path) -> None:
    series: dict[tuple, list[tuple[int, float]]] = defaultdict(list)
    for (target, tree, B), plans in groups.items():
        if "serial" not in plans:
            continue
        for plan, m in plans.items():
            if plan != "serial":
                series[(target, tree, plan)].append((B, plans["serial"]["step_compare_ms"] / m["step_compare_ms"]))
    lines = [(f"{plan} | {tree}", sorted(pts)) for (target, tree, plan), pts in sorted(series.items())]
    plot_vs_batch(lines, "serial", "step-time speedup over serial", path)


def plot_accept_hist(runs: list[dict], path: Path) -> bool:
    real = [m for m in runs if m.get("accept_hist") and not (m.get("tree") or {}).get("simulate")]
    if not real:
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for m in real:
        hist = m["accept_hist"]
        total = sum(hist) or 1
        ax.plot(range(1, len(hist) + 1), [h / total for h in hist], marker="o",
                label=f"{m['run']} (tau {m['tau']:.2f})")
    ax.set_xlabel("tokens emitted per verify step")
    ax.set_ylabel("fraction of steps")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def build(roots: list[str | Path], out: str | Path) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs = load_runs(roots)
    if not runs:
        raise FileNotFoundError(f"no metrics.json under {', '.join(map(str, roots))}")
    written = [out / "runs.md"]
    written[0].write_text(runs_table(runs))
    groups = overlap_groups(runs)
    if groups:
        log(f"overlap ablation: {len(groups)} (target, tree, batch) groups")
        (out / "overlap.md").write_text(overlap_table(groups))
        plot_step_time(groups, out / "step_time_by_phase.png")
        plot_speedup(groups, out / "speedup_vs_serial.png")
        written += [out / "overlap.md", out / "step_time_by_phase.png", out / "speedup_vs_serial.png"]
    trees = tree_groups(runs)
    if trees:
        log(f"tree sweep: {sum(map(len, trees.values()))} runs in {len(trees)} groups")
        (out / "trees.md").write_text(trees_table(trees))
        plot_tau_vs_tree_size(trees, out / "tau_vs_tree_size.png")
        written += [out / "trees.md", out / "tau_vs_tree_size.png"]
    series = batch_series(runs)
    if series:
        log(f"speedup vs batch: {len(series)} series")
        plot_speedup_vs_batch(series, out / "speedup_vs_batch.png")
        written.append(out / "speedup_vs_batch.png")
    if plot_accept_hist(runs, out / "accept_hist.png"):
        written.append(out / "accept_hist.png")
    for p in written:
        log(f"wrote {p}")
    return written


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("roots", nargs="+", help="folders holding run directories with metrics.json")
    ap.add_argument("--out", required=True, help="folder for the tables and plots")
    args = ap.parse_args(argv)
    build(args.roots, args.out)


if __name__ == "__main__":
    main()
