"""experiments/report.py rebuilds the committed tables and plots from the committed sample metrics."""

from __future__ import annotations

from pathlib import Path

from eaglet.experiments.report import build

SAMPLES = Path(__file__).resolve().parents[2] / "experiments" / "samples"


def test_report_rebuilds_committed_sample(tmp_path):
    written = build([SAMPLES / "ablate_overlap_cpu"], tmp_path)
    names = {p.name for p in written}
    assert {"runs.md", "overlap.md", "step_time_by_phase.png", "speedup_vs_serial.png"} <= names
    for table in ("runs.md", "overlap.md"):
        assert (tmp_path / table).read_text() == (SAMPLES / "ablate_overlap_cpu_report" / table).read_text()
    for png in ("step_time_by_phase.png", "speedup_vs_serial.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_overlap_table_compares_each_plan_with_serial(tmp_path):
    build([SAMPLES / "ablate_overlap_cpu"], tmp_path)
    rows = [r for r in (tmp_path / "overlap.md").read_text().splitlines()[2:]]
    assert len(rows) == 4
    assert all(r.split("|")[14].strip() == "1.000" for r in rows if "| serial |" in r)  # speedup vs serial


def test_repeats_merge_into_medians_and_a_noise_verdict():
    """Repeats of a sweep point give median timings; a plan is called slower or faster than serial only beyond
    3 standard errors of the run-to-run spread pooled over the sweep."""
    from eaglet.experiments.report import overlap_groups, overlap_table, run_noise

    def run(plan, step, repeat, B=1):
        return {"target": "t", "tree": {"name": "simulate", "steps": 7, "topk": 1, "num_draft_tokens": 8},
                "batch_size": B, "stream_plan": plan, "config": {"stream": {"name": plan}, "repeat": repeat},
                "step_ms": step, "draft_ms": 1.0, "plan_ms": 0.1, "plan_wait_ms": 0.0, "verify_ms": 2.0,
                "extend_ms": 0.1, "plan_hidden_fraction": 1.0}

    runs = [run("serial", s, i) for i, s in enumerate((10.0, 10.2, 10.1))]
    runs += [run("overlap_event", s, i) for i, s in enumerate((11.0, 10.9, 11.1))]  # 9% slower: ~5 SE
    runs += [run("overlap_split", s, i) for i, s in enumerate((10.5, 10.4, 10.6))]  # 4% slower: ~2 SE
    runs += [run("overlap_wait_stream", s, i) for i, s in enumerate((9.2, 9.3, 9.1))]  # 9% faster
    # a second point with one outlier run: it moves the pooled spread little (robust estimate)
    runs += [run(p, s, i, B=8) for p in ("serial", "overlap_event") for i, s in enumerate((20.0, 20.1, 26.0))]
    groups = overlap_groups(runs)
    plans = groups[("t", "simulate (7/1/8)", 1)]
    assert plans["serial"]["step_ms"] == 10.1 and plans["serial"]["repeats"] == 3
    assert plans["overlap_event"]["step_ms_range"] == (10.9, 11.1)
    sigma = run_noise(groups)
    assert 0.01 < sigma[("t", "simulate (7/1/8)", 1)] < 0.03  # ~2% per run: the B=8 outlier (30%) did not inflate it
    # the B=8 point's own spread, wider than the pooled one, is what its plans are judged by
    assert sigma[("t", "simulate (7/1/8)", 8)] > 0.05
    verdicts = {(r.split("|")[3].strip(), r.split("|")[4].strip()): r.split("|")[15].strip()
                for r in overlap_table(groups).splitlines()[2:] if r.startswith("| t ")}
    assert verdicts == {("1", "serial"): "-", ("1", "overlap_event"): "slower", ("1", "overlap_split"): "within noise",
                        ("1", "overlap_wait_stream"): "faster", ("8", "serial"): "-",
                        ("8", "overlap_event"): "within noise"}


def test_report_rebuilds_the_tree_sweep_and_head_comparison(tmp_path):
    written = build([SAMPLES / "sweep_tree_cpu", SAMPLES / "compare_heads_cpu"], tmp_path)
    names = {p.name for p in written}
    assert {"runs.md", "trees.md", "tau_vs_tree_size.png", "speedup_vs_batch.png"} <= names
    assert "overlap.md" not in names  # one plan per (target, tree, batch): nothing to compare
    for table in ("runs.md", "trees.md"):
        assert (tmp_path / table).read_text() == (SAMPLES / "spec_experiments_cpu_report" / table).read_text()
    trees = (tmp_path / "trees.md").read_text().splitlines()[2:]
    # one row per swept shape, in (steps, topk, tokens) order
    assert [tuple(r.split("|")[5:8]) for r in trees] == [(" 3 ", " 4 ", " 8 "), (" 3 ", " 4 ", " 16 "),
                                                         (" 5 ", " 4 ", " 8 "), (" 5 ", " 4 ", " 16 ")]
    for png in ("tau_vs_tree_size.png", "speedup_vs_batch.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_batch_series_needs_two_batch_sizes():
    from eaglet.experiments.report import batch_series

    run = {"target": "t", "draft": "eagle3", "tree": None, "data": "mt_bench", "batch_size": 1, "speedup_vs_ar": 2.0}
    assert batch_series([run]) == {}
    assert batch_series([run, {**run, "batch_size": 8, "speedup_vs_ar": 1.5}]) == {
        ("t", "eagle3", "-", "mt_bench"): [(1, 2.0), (8, 1.5)]}
