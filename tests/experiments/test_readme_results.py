"""The README's Results table quotes the committed H200 metrics: each headline number, formatted as the table
writes it from the metrics files, appears in the table's row (so a rerun that changes a metric fails here
until the README says so)."""

from __future__ import annotations

import json
from pathlib import Path

from eaglet.experiments.report import load_runs, overlap_groups, run_noise, versus_serial

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "results" / "eagle3_smollm2_h200"  # the stage-1 head's runs (default kernels)
SHIPPED = REPO / "results" / "eagle3_smollm2_allturns_warm2_h200" / "eval"  # the shipped head's runs
STAGE1 = REPO / "results" / "eagle3_smollm2_stage1_h200"  # the shipped head's first training stage
ABLATION = REPO / "results" / "ablate_overlap_h200" / "runs"
SCALING = REPO / "results" / "ddp_scaling_h200"
LOSSLESS = REPO / "results" / "lossless_smollm2_h200" / "runs"
COMPARE = REPO / "results" / "compare_heads_h200" / "runs"
DRAFT_STEP = REPO / "results" / "draft_step_h200"  # the draft kernels' before/after runs


def metrics(path: Path) -> dict:
    return json.loads(path.read_text())


def results_rows() -> dict[str, str]:
    """The Results table of README.md: first cell -> the whole row."""
    text = (REPO / "README.md").read_text()
    table = text[text.index("## Results"):].split("\n\n")[2]
    return {row.split("|")[1].strip(): row for row in table.splitlines()[2:]}


def test_readme_results_agree_with_the_committed_metrics():
    rows = results_rows()
    b1, b8 = (metrics(SHIPPED / f"eagle3_b{b}" / "metrics.json") for b in (1, 8))
    spec = rows["EAGLE-3 (shipped head), MT-bench, B=1 / 8"]
    assert f"tau {b1['tau']:.2f} / {b8['tau']:.2f}" in spec
    assert f"{b1['speedup_vs_ar']:.2f}× / {b8['speedup_vs_ar']:.2f}× (default kernels)" in spec
    d1, d8 = (metrics(DRAFT_STEP / f"smol{b}_after.json") for b in ("", "8"))  # the draft kernels (session 12)
    assert f"{d1['speedup_vs_ar']:.2f}× / {d8['speedup_vs_ar']:.2f}× eaglet AR with the draft's" in spec
    shipped = rows["shipped head tau on MT-bench"]
    assert f"{b1['tau']:.2f} (B=8: {b8['tau']:.2f};" in shipped
    for data, name in (("humaneval_b8", "HumanEval"), ("sharegpt_b8", "held-out ShareGPT")):
        assert f"{name} {metrics(SHIPPED / data / 'metrics.json')['tau']:.2f}" in shipped
    # the lossless row's runs without invariant numerics: the stage-1 head's compare_heads runs
    b1, b8 = (metrics(SPEC / "compare_heads" / f"eagle3_b{b}" / "metrics.json") for b in (1, 8))
    # bf16 losslessness: every invariant run identical on all 80 answers; the default kernels' runs are quoted too
    same = rows["bf16 losslessness, EAGLE-1 / EAGLE-3 / multi-layer × chain / eagle2 × B=1 / 8 (identical answers)"]
    lossless = {p.parent.name: metrics(p) for p in LOSSLESS.glob("*/metrics.json")}
    assert sorted(lossless) == sorted(f"{k}_{t}_b{b}" for k in ("eagle1", "eagle3", "multi_layer")
                                      for t in ("chain", "eagle2") for b in (1, 8))
    assert all(m["invariant"] and m["num_prompts"] == 80 and m["ar_identical_fraction"] == 1.0 for m in lossless.values())
    assert f"80 of 80 in all {len(lossless)} runs" in same
    assert f"{round(80 * b1['ar_identical_fraction'])} / {round(80 * b8['ar_identical_fraction'])} of 80" in same
    cost = rows["cost of invariant numerics, eaglet AR decode tokens/s, B=1 / 8"]
    inv = [lossless[f"eagle3_eagle2_b{b}"]["ar_decode_tokens_per_s"] for b in (1, 8)]
    plain = [metrics(COMPARE / f"none_b{b}" / "metrics.json")["decode_tokens_per_s"] for b in (1, 8)]
    assert f"{inv[0]:,.0f} / {inv[1]:,.0f} (default kernels: {plain[0]:,.0f} / {plain[1]:,.0f})" in cost

    # the shipped head's first training stage (mean rate) and the DDP scaling of the random-batch probes (mean of the
    # windows after the first, as benchmarks/gpu_session.sh computes it)
    train = metrics(STAGE1 / "train_metrics.json")
    row = rows["training throughput, DDP scaling"]
    assert f"{train['tokens_seen'] / train['train_s'] / 1e3:.0f} k tokens/s on two GPUs" in row
    rate = {}
    for p in ("probe_1gpu", "probe_ddp"):
        w = [json.loads(line)["train/tokens_per_s"] for line in (SCALING / p / "train_log.jsonl").open()][1:]
        rate[p] = sum(w) / len(w)
    assert f"one GPU {rate['probe_1gpu'] / 1e3:.1f} k, DDP {rate['probe_ddp'] / 1e3:.1f} k" in row
    assert f"= {rate['probe_ddp'] / rate['probe_1gpu']:.2f}×" in row and "met" in row

    groups = overlap_groups(load_runs([ABLATION]))  # what experiments/report.py tabulates: medians of the repeats
    serial = groups[("random_llama3_8b", "simulate (7/1/8)", 1)]["serial"]
    floor = serial["weight_read_floor_ms"]
    assert (f"{serial['verify_ms'] / floor:.2f}×, {serial['step_ms'] / floor:.2f}×"
            in rows["random Llama-3.1-8B, B=1, random EAGLE-3 draft: verify, step / weight-read floor"])
    after = [metrics(DRAFT_STEP / f"l8b_after{r}.json") for r in (1, 2)]
    quoted = {f"{m['verify_ms'] / m['weight_read_floor_ms']:.2f}×, {m['step_median_ms'] / m['weight_read_floor_ms']:.2f}×"
              for m in after}
    assert len(quoted) == 1 and f"the draft kernels {quoted.pop()} (`serial`" in rows[
        "random Llama-3.1-8B, B=1, random EAGLE-3 draft: verify, step / weight-read floor"]
    hidden = sorted(round(100 * groups[("random_llama3_8b", t, 32)]["overlap_split"]["plan_hidden_fraction"])
                    for t in ("simulate (7/1/8)", "simulate_wide (6/4/32)"))
    assert f"{hidden[0]}–{hidden[1]}%" in rows["overlap_split plan hidden at B=32, random Llama-3.1-8B"]
    sigma = run_noise(groups)
    slower = [p for key, g in groups.items() for p, m in g.items()
              if p != "serial" and versus_serial(m, g["serial"], sigma[key]) == "slower"]
    points = sum(len(g) - 1 for g in groups.values())
    assert f"{len(slower)} of {points} points" in rows["overlap plans slower than serial beyond noise (3 repeats, 3 standard errors)"]
