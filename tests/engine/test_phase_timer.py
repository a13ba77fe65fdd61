"""The phase timer's arithmetic, on host time stamps (a CPU's marks): spans, sampled steps, step periods, clearing."""

import pytest
import torch

from eaglet.engine.phase_timer import PHASES, PhaseTimer


def test_phase_timer_spans_from_the_latest_start_to_the_earliest_end():
    timer = PhaseTimer(True, torch.device("cpu"), every=1)  # host time stamps on CPU: seconds as floats
    timer.begin_step()
    timer.span("draft", 1.0, 1.5)
    timer.span("plan_beside", 1.2, (1.3, 1.5))  # beside the draft, ends before it
    timer.span("plan_beside", 1.2, (1.7, 1.5))  # runs past the draft's end: that part is plan_wait's
    timer.span("plan_wait", (1.4, 1.5), 1.7)  # the draft's end, whatever else is listed first
    timer.span("plan_wait", 1.9, 1.8)  # an end before its start counts as nothing
    timer.span("draft", 2.0, 2.5)
    totals = timer.totals()
    assert totals["draft"] == pytest.approx(1000.0) and totals["plan_beside"] == pytest.approx(400.0)
    assert totals["plan_wait"] == pytest.approx(200.0) and set(totals) == set(PHASES)
    timer.clear()  # a new generate call starts from nothing
    assert timer.totals()["draft"] == 0.0 and timer.periods() == [] and timer.timed_steps == 0


def test_one_step_in_every_is_timed_and_the_step_before_it_gives_the_period(monkeypatch):
    clock = iter(range(100))
    monkeypatch.setattr("eaglet.engine.phase_timer.time.perf_counter", lambda: float(next(clock)))
    timer = PhaseTimer(True, torch.device("cpu"), every=3)
    starts, inner = [], []
    for _ in range(7):  # steps 0, 3 and 6 timed; 2 and 5 mark their starts alone
        starts.append(timer.begin_step())
        t = timer.mark()
        inner.append(t)
        timer.span("draft", starts[-1], t)
    assert [s is not None for s in starts] == [True, False, False, True, False, False, True]
    assert [t is not None for t in inner] == [True, False, False, True, False, False, True]
    assert timer.timed_steps == 3 and len(timer.spans) == 3
    # marks: step 0's two (0, 1), step 2's start (2), step 3's two (3, 4), step 5's start (5), step 6's (6, 7)
    assert timer.periods() == [pytest.approx(1000.0), pytest.approx(1000.0)]  # 2 -> 3 and 5 -> 6
    assert timer.totals()["draft"] == pytest.approx(3000.0)


def test_a_disabled_timer_records_nothing():
    off = PhaseTimer(False, torch.device("cpu"))
    for _ in range(10):
        off.span("draft", off.begin_step(), off.mark())
    assert off.mark() is None and off.totals()["draft"] == 0.0 and off.periods() == [] and off.timed_steps == 0
