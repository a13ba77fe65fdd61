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


def test_timeline_splits_a_step_into_graph_kernels_eager_launches_and_idle():
    # two steps: a graph launch (kernels 0-10, 10-20) then an eager copy (25-27) and an eager kernel (30-34), the
    # second step the same 100 us later; overlapping events count once toward busy time
    events = [{"cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 0, "dur": 3, "args": {"correlation": c}}
              for c in (1, 2)]
    for c, t in ((1, 0), (2, 100)):
        events += [kernel("layer", c, t, 10), kernel("layer", c, t + 10, 10)]
        copy = {"cat": "gpu_memcpy", "name": "Memcpy DtoD", "ts": t + 25, "dur": 2, "args": {"correlation": 50 + c}}
        events += [copy, kernel("argmax", 60 + c, t + 30, 4), kernel("argmax_overlap", 70 + c, t + 31, 2)]
    text = gt.timeline(events, steps=2)
    head = text.splitlines()[0]
    # window 0..134: 67 a step; graph kernels 20, eager 2 + 4 + 2 = 8 over 3 launches; busy 20 + 2 + 4 = 26, idle 41
    assert "(2 steps, 67.0 us a step): graph kernels 20.0 us, eager kernels and copies 8.0 us (3.0 launches), " \
           "GPU idle 41.0 us" in head
    rows = {line.split()[0]: line.split()[-2:] for line in text.splitlines()[2:]}
    assert rows["argmax"] == ["1.0", "4.00"] and rows["Memcpy"] == ["1.0", "2.00"]
