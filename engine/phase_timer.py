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

Sampled steps: a step times its phases with five events, ~16 µs of a 1.1 ms SmolLM2 step, which plain decoding (no
events) does not pay. So one step in `TIMED_EVERY` is timed (the first of a generate call, then every TIMED_EVERY-th);
the others record nothing. The phase means are over the timed steps. A step's period (draft start to the next draft
start) is measured on the step before each timed one: one event at its start, the timed step's start ends it.
"""

from __future__ import annotations

import time

import torch

PHASES = ("draft", "plan_beside", "plan_wait", "verify", "extend")

# one step in this many is timed: 6 events every 8 steps, ~2.5 µs a step on average
TIMED_EVERY = 8


class PhaseTimer:
    """Spans of phases between marks (events on a GPU, host time stamps on a CPU) in the timed steps (one in
    `every`); `enabled=False` records nothing and marks are None."""

    def __init__(self, enabled: bool, device: torch.device, every: int = TIMED_EVERY):
        self.enabled, self.every = enabled, every
        self.mod = torch.get_device_module(device) if device.type != "cpu" else None
        self.clear()

    def clear(self) -> None:
        """Forget what was recorded so far (a new generate call); its first step is timed."""
        self.spans: list = []  # (phase, start(s), end(s))
        self._periods: list = []  # (start, the next step's start) of untimed steps
        self._step = 0  # steps begun
        self._timing = False  # the current step is timed
        self._open = None  # the start of a step whose period ends at the next step's start
        self.timed_steps = 0

    def begin_step(self):
        """A step starts -> its start mark when the step is timed (else None). The step before a timed one marks its
        start too: the timed step's start ends that step's period."""
        n, self._step = self._step, self._step + 1
        self._timing = self.enabled and n % self.every == 0
        lead = self.enabled and (n + 1) % self.every == 0
        if not (self._timing or lead or self._open is not None):
            return None
        t = self._mark()
        if self._open is not None:
            self._periods.append((self._open, t))
        self._open = t if lead else None
        self.timed_steps += self._timing
        return t if self._timing else None

    def mark(self):
        """An event on the current stream (a host time stamp on CPU) in a timed step; else None."""
        return self._mark() if self._timing else None

    def _mark(self):
        if self.mod is None:
            return time.perf_counter()
        e = self.mod.Event(enable_timing=True)
        e.record()
        return e

    def span(self, phase: str, start, end) -> None:
        """One interval of a phase of a timed step, from `start` to `end`: marks, or tuples of marks (the latest start,
        the earliest end)."""
        if self._timing:
            self.spans.append((phase, start, end))

    def _ms(self, start, end) -> float:
        starts = start if isinstance(start, tuple) else (start,)
        ends = end if isinstance(end, tuple) else (end,)
        if self.mod is None:
            return max(0.0, 1e3 * (min(ends) - max(starts)))
        return max(0.0, min(a.elapsed_time(b) for a in starts for b in ends))

    def periods(self) -> list[float]:
        """ms from a step's start to the next step's start (one step's period, its gaps included), of the steps
        whose period was measured."""
        return [self._ms(a, b) for a, b in self._periods]

    def totals(self) -> dict[str, float]:
        """ms per phase, summed over the timed steps' spans."""
        out = {p: 0.0 for p in PHASES}
        for phase, starts, end in self.spans:
            out[phase] += self._ms(starts, end)
        return out
