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
    assert all(r.split("|")[15].strip() == "1.000" for r in rows if "| serial |" in r)  # speedup vs serial


def test_repeats_merge_into_medians_and_a_noise_verdict():
    """Repeats of a sweep point give median timings, and a plan is called slower than serial only when all its
    repeats are slower than all of serial's."""
    from eaglet.experiments.report import overlap_groups, overlap_table

    def run(plan, step, repeat):
        return {"target": "t", "tree": {"name": "simulate", "steps": 7, "topk": 1, "num_draft_tokens": 8},
                "batch_size": 1, "stream_plan": plan, "config": {"stream": {"name": plan}, "repeat": repeat},
                "step_ms": step, "draft_ms": 1.0, "plan_ms": 0.1, "plan_wait_ms": 0.0, "verify_ms": 2.0,
                "accept_ms": 0.1, "extend_ms": 0.1, "plan_hidden_fraction": 1.0}

    runs = [run("serial", s, i) for i, s in enumerate((10.0, 10.2, 10.1))]
    runs += [run("overlap_event", s, i) for i, s in enumerate((10.5, 10.4, 10.6))]  # all slower than serial's worst
    runs += [run("overlap_split", s, i) for i, s in enumerate((10.15, 9.9, 10.0))]  # overlaps serial's range
    (plans,) = overlap_groups(runs).values()
    assert plans["serial"]["step_ms"] == 10.1 and plans["serial"]["repeats"] == 3
    assert plans["overlap_event"]["step_ms_range"] == (10.4, 10.6)
    verdicts = {r.split("|")[4].strip(): r.split("|")[16].strip() for r in overlap_table(overlap_groups(runs))
                .splitlines()[2:]}
    assert verdicts == {"serial": "-", "overlap_event": "slower", "overlap_split": "within noise"}


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
