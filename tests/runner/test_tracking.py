"""Run bookkeeping: the commit a run names is the code that ran."""

from __future__ import annotations

import subprocess

import pytest

from eaglet.runner import tracking


def _git(repo, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)


@pytest.mark.skipif(subprocess.run(["git", "--version"], capture_output=True).returncode != 0, reason="no git")
def test_git_commit_marks_a_tree_that_differs_from_head(tmp_path, monkeypatch):
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "commit", "-qm", "a")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    monkeypatch.setattr(tracking, "REPO", tmp_path)
    assert tracking.git_commit() == head
    (tmp_path / "a.py").write_text("x = 2\n")  # the GPU machine's case: newer files under an older .git
    assert tracking.git_commit() == head + "-dirty"
    monkeypatch.setattr(tracking, "REPO", tmp_path / "absent")
    assert tracking.git_commit() is None
