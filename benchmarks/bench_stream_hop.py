"""The floor of a plan's exposed time: what a round trip through a side stream costs on the device.

    python -m benchmarks.bench_stream_hop --md results/stream_hop_h200.md

overlap_split's draft-dependent part runs on the plan stream between two cross-stream edges: the plan stream waits
for the draft (an event recorded on main), and main waits for the plan stream before the verify. Whatever the
plan does, those two edges stay on the critical path. This times, on the device and with every launch queued
behind a sleep so the host is never what the GPU waits for:

  * same stream: a kernel, a small copy, a kernel, all on main (the serial plan's shape);
  * via plan stream: the same three with the copy on a side stream between the two edges (the split plan's shape);
  * via plan stream, nothing: the two edges alone around an empty plan stream;
  * via plan stream with timing events: the second shape with timing events on that path: four when every phase
    has its own start and stop events, one (the dependent part's end) when phases that meet share an event (does
    measuring the exposed time cost what it measures? The engine's phase timer records none there);
  * same stream with one timing event: the first shape with one event after the copy (the serial plan's).

The difference between the first two is the cost of the edges beyond the copy itself.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from benchmarks._common import provenance

REPS = 200


def timed(body, mod, main) -> float:
    """Median µs from an event before a 1-element kernel to an event after body(), everything queued first."""
    x = torch.zeros(1, device="cuda")
    times = []
    for _ in range(REPS):
        mod._sleep(200_000)  # ~0.1 ms: the host queues everything below before the GPU reaches it
        start, end = mod.Event(enable_timing=True), mod.Event(enable_timing=True)
        start.record(main)
        x.add_(1)  # the draft's last kernel
        body()
        x.add_(1)  # the verify's first kernel
        end.record(main)
        mod.synchronize()
        times.append(1e3 * start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--md", default=None, help="also write the table as markdown here")
    args = ap.parse_args()
    mod = torch.get_device_module("cuda")
    main_s, plan = mod.current_stream(), mod.Stream()
    src = torch.randint(0, 9, (32 * 8 * 3,), device="cuda")  # a verify's tree inputs at B=32, N=8 (int64)
    dst = torch.empty_like(src)

    def event(stream):
        e = mod.Event(enable_timing=True)
        e.record(stream)

    def via_plan(copy: bool, timing_events: int = 0):
        """timing_events: 4 = a start and a stop event per phase on this path (plan_wait start, the dependent
        part's start and stop, plan_wait stop), 1 = one event at the dependent part's end (phases that meet share
        it), 0 = none between the draft's end and the verify's start (the engine's phase timer)."""
        def body():
            if timing_events == 4:
                event(main_s)
            plan.wait_stream(main_s)
            if copy:
                with mod.stream(plan):
                    if timing_events == 4:
                        event(plan)
                    dst.copy_(src)
                    if timing_events:
                        event(plan)
            main_s.wait_stream(plan)
            if timing_events == 4:
                event(main_s)
        return body

    def same_stream_timed():
        dst.copy_(src)
        event(main_s)

    rows = [("same stream: kernel, copy, kernel", timed(lambda: dst.copy_(src), mod, main_s)),
            ("via plan stream: kernel, [wait, copy, wait], kernel", timed(via_plan(True), mod, main_s)),
            ("via plan stream, nothing on it: kernel, [wait, wait], kernel", timed(via_plan(False), mod, main_s)),
            ("via plan stream, 4 timing events (every phase its own start and stop)",
             timed(via_plan(True, 4), mod, main_s)),
            ("via plan stream, 1 timing event (phases share their boundary events)",
             timed(via_plan(True, 1), mod, main_s)),
            ("same stream, 1 timing event after the copy", timed(same_stream_timed, mod, main_s)),
            ("same stream, no copy: kernel, kernel", timed(lambda: None, mod, main_s))]
    table = ["| shape | µs (median of 200) |", "|---|---|"] + [f"| {name} | {t:.2f} |" for name, t in rows]
    table.append(f"| the two edges' cost beyond the copy (row 2 - row 1) | {rows[1][1] - rows[0][1]:.2f} |")
    table.append(f"| 4 timing events' cost (row 4 - row 2) | {rows[3][1] - rows[1][1]:.2f} |")
    table.append(f"| 1 timing event's cost on the plan stream (row 5 - row 2) | {rows[4][1] - rows[1][1]:.2f} |")
    table.append(f"| 1 timing event's cost on one stream (row 6 - row 1) | {rows[5][1] - rows[0][1]:.2f} |")
    text = provenance() + "\n" + "\n".join(table) + "\n"
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
