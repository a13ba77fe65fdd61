"""README.md's results table is what experiments/readme_table.py computes from the committed files under results/,
so a rerun that changes a metric fails here until the table is regenerated (`python -m
eaglet.experiments.readme_table --readme README.md`). The prose around it is not checked."""

from __future__ import annotations

import pytest

from eaglet.experiments.readme_table import REPO, RESULTS_BEGIN, RESULTS_END, readme_results, write_readme_results

README = REPO / "README.md"


def readme_table(text: str) -> str:
    return text.split(RESULTS_BEGIN, 1)[1].split(RESULTS_END, 1)[0].lstrip("\n")


def test_the_readme_results_table_is_the_one_the_committed_results_give():
    assert readme_table(README.read_text()) == readme_results(), (
        "README.md's results table differs from the committed results: "
        "run python -m eaglet.experiments.readme_table --readme README.md")


def test_every_results_row_says_how_to_reproduce_it():
    rows = readme_results().splitlines()[2:]
    assert rows
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 4 and cells[0] and cells[1], row
        assert cells[3].startswith("`") and ("python" in cells[3] or "bash" in cells[3]), row


def test_writing_the_table_replaces_only_what_lies_between_the_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nbefore\n\n{RESULTS_BEGIN}\n| stale |\n{RESULTS_END}\n\nafter\n")
    write_readme_results(readme)
    text = readme.read_text()
    assert text.startswith("# x\n\nbefore\n\n") and text.endswith(f"{RESULTS_END}\n\nafter\n")
    assert readme_table(text) == readme_results()
    readme.write_text("# no markers\n")
    with pytest.raises(ValueError, match="no results markers"):
        write_readme_results(readme)


def test_the_readme_is_a_map_of_at_most_200_lines():
    assert len(README.read_text().splitlines()) <= 200
