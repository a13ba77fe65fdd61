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
    assert all(r.split("|")[-2].strip() == "1.000" for r in rows if "| serial |" in r)
