"""Per-kernel breakdown of the CUDA-graph replays in a PyTorch profiler trace (run_spec.py profile_steps=N).

    python run_spec.py +experiment=ablate_overlap hydra.mode=RUN gen.batch_size=1 tree=simulate logger=none \
        hydra.run.dir=/tmp/prof profile_steps=5
    python -m benchmarks.probes.graph_trace /tmp/prof/trace.json

A graph replay's kernels carry the correlation id of the cudaGraphLaunch that ran them. Replays are grouped by
their kernel count (one group per captured graph: the verify, the draft, the draft-extend), and the largest
groups are summarised: mean span of a replay (first kernel start to last kernel end), kernel time, what is left
(gaps between kernels, minus any overlap), and per kernel name the calls, µs per call and µs per replay.
"""

from __future__ import annotations

import argparse
import collections
import json


def replays(events: list[dict]) -> dict[int, list[dict]]:
    """correlation id of a graph launch -> the kernels (and memcpy/memset) it ran, in start order."""
    launches = {e["args"]["correlation"] for e in events
                if e.get("cat") == "cuda_runtime" and "GraphLaunch" in e.get("name", "") and "args" in e}
    groups = collections.defaultdict(list)
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e.get("args", {}).get("correlation") in launches:
            groups[e["args"]["correlation"]].append(e)
    return {c: sorted(v, key=lambda e: e["ts"]) for c, v in groups.items()}


def summarise(reps: list[list[dict]], top: int, by_grid: bool = False) -> str:
    """Span, kernel time and gaps of a graph's replays, then per kernel name (with by_grid: per name and launch grid,
    which tells apart the calls of one kernel on different shapes, e.g. a layer's four projections)."""
    n = len(reps[0])
    span = sum(r[-1]["ts"] + r[-1]["dur"] - r[0]["ts"] for r in reps) / len(reps)
    busy = sum(e["dur"] for r in reps for e in r) / len(reps)
    lines = [f"== graphs of {n} kernels: {len(reps)} replays; span {span:.1f} us, kernel time {busy:.1f} us, "
             f"gaps {span - busy:.1f} us ({(span - busy) / max(n - 1, 1):.2f} us per kernel)",
             f"{'kernel':90s} {'calls':>6s} {'us/call':>8s} {'us/replay':>10s}"]
    by = collections.defaultdict(lambda: [0, 0.0])  # name -> [calls, total us]
    for e in (e for r in reps for e in r):
        key = e["name"][:70] + (f" grid={e.get('args', {}).get('grid')}" if by_grid else "")
        by[key[:90]][0] += 1
        by[key[:90]][1] += e["dur"]
    for name, (c, d) in sorted(by.items(), key=lambda kv: -kv[1][1])[:top]:
        lines.append(f"{name:90s} {c / len(reps):6.1f} {d / c:8.2f} {d / len(reps):10.1f}")
    return "\n".join(lines)


def sequence(rep: list[dict], first: int) -> str:
    """One replay's first kernels in launch order (start offset, µs), to see which call a kernel follows."""
    t0 = rep[0]["ts"]
    return "\n".join(f"{e['ts'] - t0:9.1f} {e['dur']:7.2f}  {e['name'][:100]}" for e in rep[:first])


def timeline(events: list[dict], steps: int) -> str:
    """Where a profiled window's GPU time goes, per step: kernels of graph replays, kernels (and copies) launched
    eagerly between the graphs, and idle time (no GPU work at all: the host had not launched the next yet). The
    profiler's own host overhead (a few µs an op) makes the idle time an upper bound."""
    launches = {e["args"]["correlation"] for e in events
                if e.get("cat") == "cuda_runtime" and "GraphLaunch" in e.get("name", "") and "args" in e}
    gpu = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    if not gpu or steps <= 0:
        return "no GPU events"
    t0, t1 = gpu[0]["ts"], max(e["ts"] + e["dur"] for e in gpu)
    busy, end = 0.0, t0  # the union of the events' intervals
    for e in gpu:
        busy += max(0.0, e["ts"] + e["dur"] - max(end, e["ts"]))
        end = max(end, e["ts"] + e["dur"])
    eager = [e for e in gpu if e.get("args", {}).get("correlation") not in launches]
    in_graphs = sum(e["dur"] for e in gpu) - sum(e["dur"] for e in eager)
    by = collections.Counter()  # name -> [calls]
    dur = collections.Counter()
    for e in eager:
        by[e["name"][:80]] += 1
        dur[e["name"][:80]] += e["dur"]
    lines = [f"== the window, per step ({steps} steps, {(t1 - t0) / steps:.1f} us a step): graph kernels "
             f"{in_graphs / steps:.1f} us, eager kernels and copies {sum(e['dur'] for e in eager) / steps:.1f} us "
             f"({len(eager) / steps:.1f} launches), GPU idle {((t1 - t0) - busy) / steps:.1f} us",
             f"{'eager kernel or copy':80s} {'a step':>7s} {'us/call':>8s}"]
    for name, c in by.most_common(30):
        lines.append(f"{name:80s} {c / steps:7.1f} {dur[name] / c:8.2f}")
    return "\n".join(lines)


def trace_graph(graph, path: str, replays_n: int = 5, top: int = 16, in_order: bool = False) -> str:
    """Per-kernel time of a captured CUDA graph's replays: a torch.profiler trace written to `path`, summarised as
    `summarise` does (span, kernel time, gaps, µs per kernel); with `in_order`, also one replay's kernels in order."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(replays_n):
            graph.replay()
        torch.cuda.synchronize()
    prof.export_chrome_trace(path)
    groups = replays(json.load(open(path))["traceEvents"])
    if not groups:
        return f"{path}: no graph kernels in the trace"
    reps = list(groups.values())
    out = summarise(reps, top=top, by_grid=True)
    return out + ("\n" + sequence(reps[-1], len(reps[-1])) if in_order else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", help="trace.json written by run_spec.py profile_steps=N")
    ap.add_argument("--graphs", type=int, default=3, help="the largest graphs to summarise")
    ap.add_argument("--top", type=int, default=25, help="kernel names per graph")
    ap.add_argument("--sequence", type=int, default=0, help="also print this many kernels of one replay, in order")
    ap.add_argument("--by-grid", action="store_true", help="one row per kernel name and launch grid")
    ap.add_argument("--timeline", action="store_true", help="also the window's GPU time per step: graph kernels, "
                    "eager launches between the graphs, idle (steps: replays of the largest graph)")
    a = ap.parse_args()
    events = json.load(open(a.trace))["traceEvents"]
    groups = replays(events)
    if not groups:
        raise SystemExit(f"{a.trace}: no kernels from CUDA-graph launches (was gen.cuda_graph on, on a GPU?)")
    sizes = collections.Counter(len(v) for v in groups.values())
    print("graph replays by kernel count:", dict(sorted(sizes.items())))
    for n in sorted(sizes, reverse=True)[: a.graphs]:
        print()
        reps = [r for r in groups.values() if len(r) == n]
        print(summarise(reps, a.top, a.by_grid))
        if a.sequence:
            print(sequence(reps[-1], a.sequence))
    if a.timeline:
        print()
        print(timeline(events, sizes[max(sizes)]))


if __name__ == "__main__":
    main()
