"""Stream plans: resolution (config, environment override, CPU), and on a GPU: equal outputs across
the safe plans, PyTorch's CUDA sanitizer, and the stress mode that makes the unsafe plan corrupt."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from eaglet.engine.stream_plan import ENV, PLANS, StreamPlan, resolve_plan

CUDA = torch.device("cuda")  # resolution only looks at the device type: no GPU needed
REPO = Path(__file__).resolve().parents[2]


def cfg(name, allow_unsafe=False, forced="overlap_wait_stream"):
    return OmegaConf.create({"name": name, "allow_unsafe": allow_unsafe, "forced_overlap": forced})


@pytest.mark.parametrize("name", [p for p in PLANS if p != "unsafe_no_sync"])
def test_config_decides_without_env(monkeypatch, name):
    monkeypatch.delenv(ENV, raising=False)
    plan = resolve_plan(cfg(name), CUDA)
    assert (plan.name, plan.reason) == (name, "config")


def test_env_overrides_config(monkeypatch):
    monkeypatch.setenv(ENV, "0")
    plan = resolve_plan(cfg("overlap_event"), CUDA)
    assert plan.name == "serial" and ENV in plan.reason
    monkeypatch.setenv(ENV, "1")
    assert resolve_plan(cfg("serial"), CUDA).name == "overlap_wait_stream"
    assert resolve_plan(cfg("serial", forced="overlap_split"), CUDA).name == "overlap_split"
    assert resolve_plan(cfg("overlap_event"), CUDA).name == "overlap_event"  # already overlapping
    monkeypatch.setenv(ENV, "yes")
    with pytest.raises(ValueError, match=ENV):
        resolve_plan(cfg("serial"), CUDA)


def test_env_override_reaches_run_spec(tmp_path):
    """End to end: the resolved plan is printed and stored in metrics.json."""
    cmd = [sys.executable, "run_spec.py", "target=random_llama3_8b", "target.random=tiny_llama", "draft=eagle1",
           "draft.random_init=true", "data=synthetic", "data.limit=1", "data.prompt_len=16", "gen.max_new_tokens=4",
           "stream=overlap_event", "logger=none", f"hydra.run.dir={tmp_path}"]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, ENV: "0"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "stream plan: serial" in out.stdout
    import json

    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["stream_plan"] == "serial" and ENV in m["stream_plan_reason"]


def test_unsafe_needs_opt_in(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    with pytest.raises(ValueError, match="allow_unsafe"):
        resolve_plan(cfg("unsafe_no_sync"), CUDA)
    assert resolve_plan(cfg("unsafe_no_sync", allow_unsafe=True), CUDA).name == "unsafe_no_sync"
    with pytest.raises(ValueError, match="stream.name"):
        resolve_plan(cfg("overlap"), CUDA)


@pytest.mark.parametrize("name, edge", [("serial", "plan"), ("overlap_wait_stream", "plan"), ("overlap_event", "plan"),
                                        ("overlap_split", "dependent"), ("unsafe_no_sync", "nothing")])
def test_draft_edge(name, edge):
    """What each plan orders after the draft (the phase timer's plan start events follow it). A CPU has no
    plan stream, so the property is read off a bare object with the plan's name."""
    assert StreamPlan.draft_edge.fget(SimpleNamespace(name=name)) == edge


def test_cpu_runs_serial(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    plan = resolve_plan(cfg("overlap_split"), torch.device("cpu"))
    assert plan.name == "serial" and "CPU" in plan.reason
    assert not StreamPlan(plan, torch.device("cpu")).overlap


def test_vendor_does_not_change_the_plan(monkeypatch):
    """ROCm or CUDA: the same config resolves to the same plan (no silent per-vendor switch)."""
    monkeypatch.delenv(ENV, raising=False)
    got = {}
    for hip in (None, "6.2.0"):
        monkeypatch.setattr(torch.version, "hip", hip)
        got[hip] = [resolve_plan(cfg(p), CUDA).name for p in PLANS if p != "unsafe_no_sync"]
    assert got[None] == got["6.2.0"]


# ---- GPU -------------------------------------------------------------------------------------
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")


def run_plan(plan, sleep=0, sanitizer=False, graphs=True, max_new=24, drafter="eagle"):
    """stream_plan_decode.py in a child process: one plan's decode against plain decoding."""
    cmd = [sys.executable, str(Path(__file__).with_name("stream_plan_decode.py")), "--plan", plan, "--drafter", drafter,
           "--sleep", str(sleep), "--max-new", str(max_new), *([] if graphs else ["--no-graphs"])]
    # torch turns CSAN on when the variable exists at all (even "0"): absent unless sanitizing. CSAN also
    # takes a graph capture's launches for eager ones (false races on the static buffers, seen on an H200),
    # so sanitized runs decode without graphs, the AR reference included.
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_CUDA_SANITIZER", "EAGLET_KERNELS")}
    if sanitizer:
        # CSAN sees ATen ops only: the torch references stand in for the Triton kernels, which write the draft's
        # outputs that the plan stream copies (the racing access; with Triton, CSAN reported nothing on an H200)
        env.update(TORCH_CUDA_SANITIZER="1", EAGLET_KERNELS="torch")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


@gpu
@pytest.mark.parametrize("drafter", ["eagle", "ngram", "block"])  # every drafter under every safe plan, CUDA graphs on
@pytest.mark.parametrize("plan", ["serial", "overlap_wait_stream", "overlap_event", "overlap_split"])
def test_safe_plans_are_identical_to_plain_decoding(plan, drafter):
    out = run_plan(plan, drafter=drafter)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "IDENTICAL" in out.stdout
    # the phase timer on the device: serial exposes all of its plan; the split plan's independent part runs
    # beside the draft, so some of its plan is hidden
    draft, plan_ms, wait, verify, hidden = map(float, out.stdout.split("PHASES")[1].split())
    assert draft > 0 and plan_ms > 0 and wait > 0 and verify > 0
    if plan == "serial":
        assert hidden == 0.0 and wait >= plan_ms
    if plan == "overlap_split":
        assert hidden > 0.0


@gpu
@pytest.mark.parametrize("plan", ["serial", "overlap_wait_stream", "overlap_event", "overlap_split", "unsafe_no_sync"])
def test_cuda_sanitizer(plan):
    """CSAN tracks eager kernels, so the sanitizer runs without CUDA graphs."""
    out = run_plan(plan, sanitizer=True, graphs=False, max_new=8)
    raced = "CSAN detected a possible data race" in out.stderr
    assert raced == (plan == "unsafe_no_sync"), out.stderr[-3000:]


@gpu
@pytest.mark.parametrize("plan", ["overlap_wait_stream", "overlap_event", "overlap_split", "unsafe_no_sync"])
def test_stress_mode_corrupts_only_the_unsafe_plan(plan):
    out = run_plan(plan, sleep=20_000_000)
    if plan == "unsafe_no_sync":
        assert out.returncode != 0 or "MISMATCH" in out.stdout
    else:
        assert out.returncode == 0 and "IDENTICAL" in out.stdout, out.stderr[-3000:]
