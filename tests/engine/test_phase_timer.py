"""The phase timer's arithmetic, on host time stamps (a CPU's marks): spans, step periods, clearing."""

import pytest
import torch

from eaglet.engine.phase_timer import PHASES, PhaseTimer


def test_phase_timer_spans_from_the_latest_start_to_the_earliest_end():
    timer = PhaseTimer(True, torch.device("cpu"))  # host time stamps on CPU: seconds as floats
    timer.span("draft", 1.0, 1.5)
    timer.span("plan_beside", 1.2, (1.3, 1.5))  # beside the draft, ends before it
    timer.span("plan_beside", 1.2, (1.7, 1.5))  # runs past the draft's end: that part is plan_wait's
    timer.span("plan_wait", (1.4, 1.5), 1.7)  # the draft's end, whatever else is listed first
    timer.span("plan_wait", 1.9, 1.8)  # an end before its start counts as nothing
    timer.span("draft", 2.0, 2.5)
    totals = timer.totals()
    assert totals["draft"] == pytest.approx(1000.0) and totals["plan_beside"] == pytest.approx(400.0)
    assert totals["plan_wait"] == pytest.approx(200.0) and timer.periods("draft") == [pytest.approx(1000.0)]
    assert set(totals) == set(PHASES)
    timer.clear()  # a new generate call starts from nothing
    assert timer.totals()["draft"] == 0.0 and timer.periods("draft") == []


def test_a_disabled_timer_records_nothing():
    off = PhaseTimer(False, torch.device("cpu"))
    off.span("draft", off.mark(), off.mark())
    assert off.mark() is None and off.totals()["draft"] == 0.0
