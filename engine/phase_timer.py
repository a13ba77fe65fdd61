"""Device time per phase of a speculative step (draft, plan, verify, extend), the breakdown the overlap
report compares stream plans by (experiments/report.py, overlap.md).

SpeculativeEngine creates one PhaseTimer and its step records into it: an event at each phase boundary, on the stream
the phase runs on (the plan on the plan stream, the rest on main). The events are read once, after the decode
loop, so timing adds no host sync to it. On a CPU the work is synchronous and host time stamps stand in for
events.

The phases, as `StepStats.summary` reports them:

  draft        the draft on main, up to the tree
  plan_beside  the planning that ran beside the draft (on the plan stream, off the critical path), up to the
               draft's end at most
  plan_wait    the gap on main between the draft's end and the verify's start: the plan time left exposed
  verify       the target forward over the tree, then the accepted path and its KV commit (one graph)
  extend       the draft head over the accepted tokens

Two phases that meet share one event, and no event lies between the draft's end and the verify's start: each
timing event on the critical path lengthens it (~3.3 µs on an H200, `benchmarks/bench_stream_hop.py`). With four
events there, overlap_split's measured exposed time is 12-14 µs at B=32 on random Llama-3.1-8B; with none,
7-9 µs.
"""

from __future__ import annotations

import time

import torch

PHASES = ("draft", "plan_beside", "plan_wait", "verify", "extend")


class PhaseTimer:
    """Spans of phases between marks (events on a GPU, host time stamps on a CPU); `enabled=False` records
    nothing and marks are None."""

    def __init__(self, enabled: bool, device: torch.device):
        self.enabled = enabled
        self.mod = torch.get_device_module(device) if device.type != "cpu" else None
        self.spans: list = []  # (phase, start(s), end(s))

    def clear(self) -> None:
        """Forget the spans recorded so far (a new generate call)."""
        self.spans = []

    def mark(self):
        """An event on the current stream (a host time stamp on CPU); None when timing is off."""
        if not self.enabled:
            return None
        if self.mod is None:
            return time.perf_counter()
        e = self.mod.Event(enable_timing=True)
        e.record()
        return e

    def span(self, phase: str, start, end) -> None:
        """One interval of a phase, from `start` to `end`: marks, or tuples of marks (the latest start, the
        earliest end)."""
        if self.enabled:
            self.spans.append((phase, start, end))

    def _ms(self, start, end) -> float:
        starts = start if isinstance(start, tuple) else (start,)
        ends = end if isinstance(end, tuple) else (end,)
        if self.mod is None:
            return max(0.0, 1e3 * (min(ends) - max(starts)))
        return max(0.0, min(a.elapsed_time(b) for a in starts for b in ends))

    def periods(self, phase: str) -> list[float]:
        """ms between consecutive starts of a phase: one step's period, its gaps included."""
        starts = [s for p, s, _ in self.spans if p == phase]
        return [self._ms(a, b) for a, b in zip(starts, starts[1:])]

    def totals(self) -> dict[str, float]:
        """ms per phase, summed over the spans."""
        out = {p: 0.0 for p in PHASES}
        for phase, starts, end in self.spans:
            out[phase] += self._ms(starts, end)
        return out
