"""benchmarks/probes/graph_trace.py: kernels are attributed to the graph launch that ran them, and a replay's gaps
are its span minus its kernel time (a synthetic trace with two graphs, one eager kernel and a kernel of another
launch)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "graph_trace", Path(__file__).resolve().parents[2] / "benchmarks" / "probes" / "graph_trace.py")
gt = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(gt)


def kernel(name, corr, ts, dur):
    return {"cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"correlation": corr}}


def test_replays_group_by_launch_and_gaps_are_span_minus_kernel_time():
    events = [{"cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 0, "dur": 3, "args": {"correlation": c}}
              for c in (1, 2, 3)]
    events.append({"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 0, "dur": 3, "args": {"correlation": 9}})
    events += [kernel("gemm", 1, 20, 10), kernel("norm", 1, 10, 2), kernel("gemm", 1, 40, 10)]  # replay 1 (unsorted)
    events += [kernel("gemm", 2, 110, 12), kernel("norm", 2, 100, 2), kernel("gemm", 2, 130, 12)]  # replay 2
    events += [kernel("topk", 3, 200, 5)]  # a one-kernel graph
    events += [kernel("eager", 9, 300, 1)]  # not from a graph: left out
    groups = gt.replays(events)
    assert sorted(groups) == [1, 2, 3]
    assert [e["name"] for e in groups[1]] == ["norm", "gemm", "gemm"]
    text = gt.summarise([groups[1], groups[2]], top=5)
    # spans 40 and 42 (mean 41), kernel time 22 and 26 (mean 24): gaps 17, over 2 gaps per replay
    assert "2 replays; span 41.0 us, kernel time 24.0 us, gaps 17.0 us (8.50 us per kernel)" in text
    rows = text.splitlines()[2:]
    assert rows[0].split()[:4] == ["gemm", "2.0", "11.00", "22.0"]
    assert rows[1].split()[:4] == ["norm", "1.0", "2.00", "2.0"]
    # --sequence: one replay's kernels in launch order, start offsets from its first kernel
    seq = gt.sequence(groups[2], 2).splitlines()
    assert [line.split() for line in seq] == [["0.0", "2.00", "norm"], ["10.0", "12.00", "gemm"]]
