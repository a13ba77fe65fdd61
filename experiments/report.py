"""Tables (markdown) and plots (PNG) from the metrics.json files that run_spec.py writes.

    python -m eaglet.experiments.report multirun/ablate_overlap --out results/ablate_overlap

Reads every metrics.json under the given folders and writes into --out what the runs support:
  runs.md                   one row per run: target, draft, data, tree, plan, batch, tau, tokens/s, speedup over AR
  overlap.md                per (target, tree, batch) with several stream plans: each plan's step time split by
                            phase, the share of plan time hidden, and the speedup over `serial` in the same sweep
                            (medians over a sweep point's repeats; with repeats, whether a plan is slower or
                            faster than serial beyond the sweep's run-to-run noise: `versus_serial`)
  step_time_by_phase.png    stacked step time per plan (draft, exposed plan, verify, accept, extend)
  speedup_vs_serial.png     speedup of each overlap plan over serial, by batch size
  trees.md                  per (target, draft, data, batch) with several tree shapes: tau, per-depth acceptance,
  tau_vs_tree_size.png      step time and tokens/s of each shape; tau against verified tokens per (steps, topk)
  speedup_vs_batch.png      speedup over autoregressive decoding against batch size, per (draft, tree, data)
  accept_hist.png           accept-length histograms of the runs with real acceptance

    python -m eaglet.experiments.report --readme README.md

writes the README's results table (`readme_results`: the headline numbers, each from the committed files under
results/ and with the command that reproduces it) between its RESULTS_BEGIN and RESULTS_END markers.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

PHASES = ("draft", "plan_wait", "verify", "accept", "extend")  # what adds up on the main stream
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


TIMINGS = ("step_ms", "step_median_ms", "draft_ms", "plan_ms", "plan_wait_ms", "verify_ms", "accept_ms",
           "extend_ms", "plan_hidden_fraction", "weight_read_floor_ms")


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
    lines = ["| target | tree | B | plan | repeats | step ms | step ms range | draft | plan | plan exposed | verify "
             "| accept | extend | plan hidden | speedup vs serial | beyond noise | verify / weight-read floor "
             "| step / floor |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
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
                         f"| {m['accept_ms']:.3f} | {m['extend_ms']:.3f} | {100 * m['plan_hidden_fraction']:.0f}% | {sp} "
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
    colors = dict(zip(PHASES, ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3")))
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
        ax.plot(range(1, len(hist) + 1), [h / total for h in hist], marker="o", label=f"{m['run']} (tau {m['tau']:.2f})")
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


# The README's results table: one row per headline number, each read from the committed files under results/.
REPO = Path(__file__).resolve().parents[1]
RESULTS_BEGIN = "<!-- results table: python -m eaglet.experiments.report --readme README.md -->"
RESULTS_END = "<!-- end of results table -->"


def md_table(path: Path, heading: str | None = None) -> tuple[list[str], list[list[str]]]:
    """The first markdown table in a file (after `heading`, if given): (its header cells, its body rows as lists of
    cell strings)."""
    lines = path.read_text().splitlines()
    if heading is not None:
        lines = lines[next(i for i, line in enumerate(lines) if line.startswith(heading)):]
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))

    def cells(line: str) -> list[str]:
        return [c.strip() for c in line.strip().strip("|").split("|")]

    rows = []
    for line in lines[start + 2:]:  # past the header and its |---| line
        if not line.startswith("|"):
            break
        rows.append(cells(line))
    return cells(lines[start]), rows


def md_rows(path: Path, heading: str | None = None) -> list[list[str]]:
    """The body rows of the first markdown table in a file (after `heading`, if given), as lists of cell strings."""
    return md_table(path, heading)[1]


def _metrics(path: Path) -> dict:
    return json.loads(path.read_text())


def ok(met: bool, yes: str, no: str) -> str:
    """A target cell: `yes` where the numbers meet it, else `no`."""
    return yes if met else no


def readme_results(results: Path = REPO / "results") -> str:
    """The README's results table (markdown): what was measured | result | target | the command that reproduces
    it. Every number is computed here from a committed metrics file or benchmark table, so the table cannot drift
    from the data (tests/experiments/test_readme_results.py regenerates it and compares)."""
    rows = []

    lossless = [_metrics(p) for p in sorted((results / "lossless_smollm2_h200" / "runs").glob("*/metrics.json"))]
    same = [m for m in lossless if m["invariant"] and m["ar_identical_fraction"] == 1.0]
    kinds = sorted({m["config"]["draft"]["name"] for m in same})
    rows.append(("greedy bf16 speculative output equal to plain decoding (SmolLM2, MT-bench, invariant numerics)",
                 f"{same[0]['num_prompts']} of {same[0]['num_prompts']} answers in {len(same)} of {len(lossless)} "
                 f"runs ({', '.join(kinds)} heads × chain, EAGLE-2 × B=1, 8)",
                 "all: met", "`bash scripts/gpu_session.sh lossless`"))

    # the whole bench run, then the per-layer rows of a later run at 32 and 64 rows (rows64.md: two 32-row tiles at 64
    # rows, which the table since refined by that run's sweep; its whole forwards ran beside an attention variant
    # main does not have, so they are not read)
    inv_dir = results / "invariant_h200"
    # each table's rows override the older tables' (README there: which code each ran): decode rows 1 and 8 from
    # bench_invariant.md, 32 / 64 from rows_128.md, 128 and 2,048 from prefill_k64_proj.md; the decode B=1 from
    # leaf_tree_step.md (the tree attention's leaf tree), the verifies of 8 tokens and B=8 x 16 from
    # prefill_k64_step.md (the 128-row x tiles)
    layer, ratio = {}, {}
    for md in ("bench_invariant.md", "rows64.md", "rows_128.md", "split256_proj.md", "prefill_k64_proj.md"):
        head, body = md_table(inv_dir / md, "Per layer")
        layer.update({(r[0], r[1]): r[head.index("inv folded / best")] for r in body})
    for md in ("bench_invariant.md", "rows_128.md", "split256_step.md", "row_tiles_step.md", "leaf_tree_step.md",
               "prefill_k64_step.md"):
        head, body = md_table(inv_dir / md, "## Whole forward")
        col = {h: i for i, h in enumerate(head)}
        fast = [col["non-invariant ms"], col["folded non-invariant ms"]]
        ratio.update({(r[0], r[1]): float(r[col["invariant folded ms"]]) / min(float(r[i]) for i in fast)
                      for r in body})
    models = (("SmolLM2-135M", "SmolLM2"), ("Llama-3.1-8B", "Llama-3.1-8B"))
    ms = ("1", "8", "64", "128")
    worst = [(M, m) for M in ms for m, _ in models if float(layer[m, M]) > 1.05]
    rows.append(("cost of invariant numerics: a layer's four projections at the defaults (norms folded), invariant / "
                 "fastest, M = 1 / 8 / 64 / 128 rows",
                 "; ".join(f"{short} " + " / ".join(f"{float(layer[m, M]):.3f}×" for M in ms) for m, short in models),
                 ok(not worst, "≤ 1.05×: met", "≤ 1.05×: **not met** at "
                    + ", ".join(f"{M} rows ({m})" for M, m in worst)),
                 "`python -m benchmarks.bench_invariant --parts proj`"))
    pre = {m: float(layer[m, "2048"]) for m, _ in models}
    rows.append(("cost of invariant numerics: a 2,048-row prefill's layer (the four projections, norms folded), "
                 "invariant / fastest",
                 "; ".join(f"{short} {pre[m]:.3f}×" for m, short in models),
                 ok(max(pre.values()) <= 1.3, "≤ 1.3×: met", "≤ 1.3×: **not met** ("
                    + ", ".join(short for m, short in models if pre[m] > 1.3) + ")"),
                 "`python -m benchmarks.bench_invariant --parts proj --ms 2048`"))
    cases = ("B=1 T=1", "B=1 T=8", "B=1 T=64", "B=8 T=8", "B=8 T=16")
    rows.append(("cost of invariant numerics: a forward at the defaults, invariant / fastest (decode B=1; verify B=1 "
                 "× 8 and 64 tokens, B=8 × 8 and 16)",
                 "; ".join(f"{short} " + ", ".join(f"{ratio[m, c]:.2f}×" for c in cases) for m, short in models),
                 ok(max(ratio[m, c] for m, _ in models for c in cases) <= 1.05,
                    "≤ 1.05×: met", "≤ 1.05×: **not met** (verify)"),
                 "`python -m benchmarks.bench_invariant --parts step --step-cases 1x1,1x8,1x64,8x8,8x16`"))

    e2e = {p.parent.name: _metrics(p) for p in (results / "invariant_h200" / "e2e_runs").glob("*/metrics.json")}
    # the e2e stage on the leaf-tree attention: the shipped head's MT-bench first turns at the defaults (each with its
    # invariant AR pass), random Llama-3.1-8B's plain decoding and simulated EAGLE-3
    leaf = {p.parent.name: _metrics(p)
            for p in (results / "invariant_h200" / "e2e_leaf_tree_runs").glob("*/metrics.json")}
    ev = results / "eagle3_smollm2_seed1_h200" / "eval" / "datasets"  # the shipped (stage-6) head's other data sets
    first = [leaf[f"smol_b{b}"] for b in (1, 8)]
    rows.append(("lossless EAGLE-3 with the defaults (invariant, tree 5/4/8), SmolLM2 + the shipped head, MT-bench "
                 "first turns, B=1 / 8: decode tokens/s, × its AR pass, answers identical to it",
                 " / ".join(f"{m['decode_tokens_per_s']:,.0f}" for m in first) + "; "
                 + " / ".join(f"{m['speedup_vs_ar']:.2f}×" for m in first) + "; "
                 + " / ".join(f"{m['ar_identical_fraction']:.0%}" for m in first),
                 ok(first[0]["decode_tokens_per_s"] >= 1600 and min(m["speedup_vs_ar"] for m in first) > 1
                    and min(m["ar_identical_fraction"] for m in first) == 1,
                    "≥ 1,600 at B=1, faster than AR, identical: met",
                    "≥ 1,600 at B=1, faster than AR, identical: **not met**"),
                 "`python run_spec.py data.max_turns=1` (B=8: `gen.batch_size=8`)"))
    l8b = leaf["l8b_ar"]
    floor_ms, tok_s = l8b["weight_read_floor_ms"], l8b["decode_tokens_per_s"]
    rows.append(("plain decoding, random Llama-3.1-8B, B=1, 1k prefix, invariant numerics",
                 f"{tok_s:.0f} tokens/s ({1e3 / tok_s / floor_ms:.2f}× the weight-read floor of {floor_ms:.2f} ms)",
                 ok(tok_s >= 235, "≥ 235: met", "≥ 235: **not met**"),
                 "`python run_spec.py target=random_llama3_8b draft=none data=synthetic data.limit=1 "
                 "data.prompt_len=1024`"))

    sim = leaf["l8b_eagle3_sim_invariant"]
    # the draft's floor: 7 chain steps, each reading the random EAGLE-3 head's 0.75 GB (BENCHMARKS.md)
    floors = sim["weight_read_floor_ms"] + 1.24
    rows.append(("EAGLE-3 `tree=simulate` (tau 4), random Llama-3.1-8B, B=1, invariant numerics: the step against "
                 "the target's and the draft head's weight-read floors",
                 f"{sim['step_median_ms'] / floors:.2f}× ({sim['step_median_ms']:.2f} ms on "
                 f"{sim['weight_read_floor_ms']:.2f} + 1.24; draft {sim['draft_ms']:.2f}, verify {sim['verify_ms']:.2f})",
                 ok(sim["step_median_ms"] <= 1.25 * floors, "≤ 1.25×: met", "≤ 1.25×: **not met**"),
                 "`python run_spec.py +experiment=ablate_overlap hydra.mode=RUN gen.batch_size=1 stream=serial "
                 "tree=simulate invariant=true`"))

    inv = [m["ar_decode_tokens_per_s"] for m in first]  # the AR passes of the shipped head's runs
    plain = [e2e[f"smol_ar_b{b}"]["decode_tokens_per_s"] for b in (1, 8)]  # invariant=false, both turns
    rows.append(("plain decoding, SmolLM2, MT-bench, B=1 / 8: invariant numerics, first turns (fastest kernels, "
                 "both turns)",
                 f"{inv[0]:,.0f} / {inv[1]:,.0f} tokens/s ({plain[0]:,.0f} / {plain[1]:,.0f})", "",
                 "`python run_spec.py draft=none data.max_turns=1` (`python run_spec.py draft=none invariant=false`)"))

    ar = {(r[0], r[1]): r for r in md_rows(results / "ar_h200.md")}
    rows.append(("AR decoding, SmolLM2, B=1, fastest kernels (Hugging Face `generate`)",
                 f"{int(ar[('eaglet AR (CUDA graph, fused linear)', '1')][2]):,} tokens/s "
                 f"({int(ar[('HF generate (eager, bf16)', '1')][2]):,})",
                 "≥ 1,000: met", "`python -m benchmarks.bench_ar --batch 1 8`"))

    rows.append(("shipped EAGLE-3 head, MT-bench, B=1 / 8, the defaults: tau; speedup over plain decoding",
                 f"{first[0]['tau']:.2f} / {first[1]['tau']:.2f}; "
                 f"{first[0]['speedup_vs_ar']:.2f}× / {first[1]['speedup_vs_ar']:.2f}×",
                 ok(first[0]["tau"] >= 3.5 and first[0]["speedup_vs_ar"] >= 2.5, "tau ≥ 3.5, 2.5× at B=1: met",
                    "tau ≥ 3.5, 2.5× at B=1: **not met**"),
                 "`python run_spec.py data.max_turns=1` (B=8: `gen.batch_size=8`)"))
    taus = [_metrics(ev / d / "metrics.json")["tau"] for d in ("humaneval_b8", "sharegpt_b8")]
    rows.append(("shipped head, B=8: tau on HumanEval / held-out ShareGPT", f"{taus[0]:.2f} / {taus[1]:.2f}",
                 "", "`python run_spec.py +experiment=datasets`"))

    v8b = _metrics(results / "verify_8b_h200" / "s14_final_run1.json")
    floor = v8b["weight_read_floor_ms"]
    rows.append(("random Llama-3.1-8B, B=1, simulated tau 4: verify, step / weight-read floor",
                 f"{v8b['verify_ms'] / floor:.2f}×, {v8b['step_median_ms'] / floor:.2f}× "
                 f"({v8b['verify_ms']:.2f}, {v8b['step_median_ms']:.2f} ms on {floor:.2f})",
                 "1.3×: met; 1.5×: **not met**",
                 "`python run_spec.py +experiment=ablate_overlap hydra.mode=RUN gen.batch_size=1 stream=serial "
                 "tree=simulate fold_norms=true`"))

    groups = overlap_groups(load_runs([results / "ablate_overlap_h200" / "runs"]))
    hidden = sorted(round(100 * g["overlap_split"]["plan_hidden_fraction"])
                    for (target, _, B), g in groups.items() if target == "random_llama3_8b" and B == 32)
    rows.append(("`overlap_split`: plan time hidden, random Llama-3.1-8B, B=32", f"{hidden[0]}–{hidden[-1]}%",
                 "≥ 80%: met", "`python run_spec.py +experiment=ablate_overlap`"))
    sigma = run_noise(groups)
    calls = [versus_serial(m, g["serial"], sigma.get(key)) for key, g in groups.items()
             for plan, m in g.items() if plan != "serial"]
    rows.append(("overlap plans slower than `serial` beyond noise (3 repeats, 3 standard errors)",
                 f"{calls.count('slower')} of {len(calls)} points ({calls.count('faster')} faster)", "none: met",
                 "`python run_spec.py +experiment=ablate_overlap` and `+experiment=ablate_overlap_smollm2`"))

    rate = {}
    for probe in ("probe_1gpu", "probe_ddp"):  # the mean of the 10-step windows after the first
        with (results / "ddp_scaling_h200" / probe / "train_log.jsonl").open() as f:
            windows = [json.loads(line)["train/tokens_per_s"] for line in f][1:]
        rate[probe] = sum(windows) / len(windows)
    rows.append(("draft-head training, DDP on two H200s against one",
                 f"{rate['probe_ddp'] / rate['probe_1gpu']:.2f}× ({rate['probe_1gpu'] / 1e3:.1f} k → "
                 f"{rate['probe_ddp'] / 1e3:.1f} k tokens/s)", "≥ 1.7×: met", "`bash scripts/gpu_session.sh scaling`"))

    lines = ["| measured (H200) | result | target | reproduce |", "|---|---|---|---|"]
    lines += [f"| {' | '.join(r)} |" for r in rows]
    return "\n".join(lines) + "\n"


def write_readme_results(readme: str | Path, results: Path = REPO / "results") -> Path:
    """Replace what lies between the README's results markers with `readme_results`."""
    readme = Path(readme)
    text = readme.read_text()
    if RESULTS_BEGIN not in text or RESULTS_END not in text:
        raise ValueError(f"{readme}: no results markers ({RESULTS_BEGIN!r} ... {RESULTS_END!r})")
    head, rest = text.split(RESULTS_BEGIN, 1)
    tail = rest.split(RESULTS_END, 1)[1]
    readme.write_text(f"{head}{RESULTS_BEGIN}\n{readme_results(results)}{RESULTS_END}{tail}")
    log(f"wrote the results table into {readme}")
    return readme


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("roots", nargs="*", help="folders holding run directories with metrics.json")
    ap.add_argument("--out", help="folder for the tables and plots")
    ap.add_argument("--readme", help="a README with the results markers: write the results table into it")
    args = ap.parse_args(argv)
    if args.readme:
        write_readme_results(args.readme)
    if args.roots or args.out:
        if not (args.roots and args.out):
            ap.error("tables and plots need both run folders and --out")
        build(args.roots, args.out)
    elif not args.readme:
        ap.error("give run folders and --out, or --readme")


if __name__ == "__main__":
    main()
