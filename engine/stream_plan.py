"""The stream plan: where the verify's planning runs and how it synchronises with the draft.

| plan                | plan stream waits for                                                     |
|---------------------|---------------------------------------------------------------------------|
| serial              | (no plan stream: the plan runs on main after the draft)                   |
| overlap_wait_stream | `plan.wait_stream(main)` after the draft is enqueued: all main work so far |
| overlap_event       | `plan.wait_event(draft_done)`, recorded on main right after the draft     |
| overlap_split       | draft-independent planning waits only for `step_start` (the previous      |
|                     | step's results), so it runs beside the draft; the rest waits `draft_done` |
| unsafe_no_sync      | nothing before reading draft outputs (refused unless stream.allow_unsafe) |

In every plan, main waits for the plan stream before the verify. One implementation serves every
draft head (single- and multi-layer): the engine calls the same hooks, in this order:

    before_draft(); <draft on main>; after_draft()
    with context(): <independent plan: slots, page table, their copies into the verify's buffers>
                    wait_for_draft(); <draft-dependent plan: the tree's copies>
    before_verify(...); <verify on main>

The host enqueues all planning after the draft, in every plan: the engine's host work before the draft's
first launch is GPU idle time whenever the host is not ahead of the GPU (overlap_split's independent part
enqueued before the draft makes its step 0.2-0.9 ms longer than serial's on an H200, random Llama-3.1-8B).
overlap_split's stream order, not its host order, is what lets that part run beside the draft.

The user decides, never the platform: overlap is on or off by config, and the environment
variable EAGLET_ENABLE_OVERLAP_PLAN_STREAM=0|1 overrides it. Nothing here looks at the vendor:
streams and events come from `torch.get_device_module(device)`, the same code on CUDA and ROCm.
A CPU has no streams, so there the plan is `serial` (said once at start-up).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch

PLANS = ("serial", "overlap_wait_stream", "overlap_event", "overlap_split", "unsafe_no_sync")
ENV = "EAGLET_ENABLE_OVERLAP_PLAN_STREAM"


@dataclass(frozen=True)
class ResolvedPlan:
    name: str  # one of PLANS
    configured: str  # what the config asked for
    reason: str  # why name differs from configured, or "config"

    def describe(self) -> str:
        return f"stream plan: {self.name} ({self.reason})"


def resolve_plan(stream_cfg, device: torch.device) -> ResolvedPlan:
    """Config -> plan, with the environment override. stream_cfg: name, allow_unsafe, forced_overlap."""
    name = stream_cfg.name
    if name not in PLANS:
        raise ValueError(f"stream.name={name!r} is not a plan; choose one of {PLANS}")
    configured, reason = name, "config"
    env = os.environ.get(ENV)
    if env is not None:
        if env not in ("0", "1"):
            raise ValueError(f"{ENV}={env!r}: use 0 (overlap off: serial) or 1 (overlap on)")
        if env == "0" and name != "serial":
            name, reason = "serial", f"{ENV}=0 overrides stream={configured}"
        elif env == "1" and name == "serial":
            name, reason = stream_cfg.forced_overlap, f"{ENV}=1 overrides stream=serial"
            if name not in PLANS or name == "serial":
                raise ValueError(f"stream.forced_overlap={name!r} must be an overlap plan from {PLANS[1:]}")
    if name == "unsafe_no_sync" and not stream_cfg.allow_unsafe:
        raise ValueError("stream=unsafe_no_sync has no draft->plan synchronisation and races by design; "
                         "it runs only with stream.allow_unsafe=true (to demonstrate the hazard)")
    if device.type == "cpu" and name != "serial":
        name, reason = "serial", f"the CPU has no streams; {name} was requested ({reason})"
    return ResolvedPlan(name, configured, reason)


class StreamPlan:
    """The hooks the engine calls around the draft and the plan (see the table and the order above)."""

    def __init__(self, plan: ResolvedPlan, device: torch.device, stress_sleep_cycles: int = 0):
        self.plan = plan
        self.name = plan.name
        self.stress_sleep_cycles = stress_sleep_cycles
        self.mod = torch.get_device_module(device) if device.type != "cpu" else None
        self.stream = self.mod.Stream() if self.name != "serial" else None  # the plan stream
        self.main = None
        self.step_start = self.draft_done = None  # overlap_split's events of the current step

    @property
    def overlap(self) -> bool:
        return self.stream is not None

    @property
    def draft_edge(self) -> str:
        """Which planning is ordered after the draft: "plan" (all of it: serial by stream order, the
        wait_stream and event plans by their edge), "dependent" (overlap_split) or "nothing"
        (unsafe_no_sync). The phase timer times on the plan stream only the planning that runs beside the draft."""
        return {"overlap_split": "dependent", "unsafe_no_sync": "nothing"}.get(self.name, "plan")

    def context(self):
        """Run the enclosed planning on the plan stream (on main for `serial`)."""
        return self.mod.stream(self.stream) if self.overlap else contextlib.nullcontext()

    def before_draft(self) -> None:
        """Step start. The main stream's handle is taken here, outside any stream context: inside
        `with stream(plan)`, current_stream() would be the plan stream itself."""
        self.main = self.mod.current_stream() if self.mod is not None else None
        if self.name == "overlap_split":
            # main's work so far: the previous step's results (seq_lens, page tables), which the
            # independent part reads
            self.step_start = self._record(self.main)
        if self.stress_sleep_cycles and self.mod is not None:
            # stress mode: hold main back so the draft finishes late and any plan that reads its
            # outputs without waiting reads stale ones
            self.mod._sleep(self.stress_sleep_cycles)

    def after_draft(self) -> None:
        """Draft enqueued on main: order the plan stream after it, as the plan says."""
        if self.name == "overlap_wait_stream":
            self.stream.wait_stream(self.main)  # captures everything enqueued on main until now
        elif self.name == "overlap_event":
            self.stream.wait_event(self._record(self.main))  # only the work up to the draft
        elif self.name == "overlap_split":
            self.draft_done = self._record(self.main)
            self.stream.wait_event(self.step_start)  # the independent part: beside the draft
        # unsafe_no_sync: no edge (the hazard); serial: same stream, program order

    def wait_for_draft(self) -> None:
        """Inside `context()`, between the independent and the draft-dependent planning."""
        if self.name == "overlap_split":
            self.stream.wait_event(self.draft_done)

    def _record(self, stream):
        event = self.mod.Event()
        event.record(stream)
        return event

    def before_verify(self, *planned: torch.Tensor) -> None:
        """Main waits for the plan; tensors made on the plan stream and read on main are marked
        as used by main, so the caching allocator does not hand their memory out early."""
        if self.overlap:
            self.main.wait_stream(self.stream)
            for t in planned:
                t.record_stream(self.main)

    def read_on_plan_stream(self, *tensors: torch.Tensor) -> None:
        """Tensors made on main and read by the plan stream (the same allocator rule, other way)."""
        if self.overlap:
            for t in tensors:
                t.record_stream(self.stream)
