"""Request bookkeeping both engines share: admission, budgets, emitting tokens, padded prefill inputs, the host
copy of a step's tokens."""

from collections import deque

import pytest
import torch

from eaglet.engine.requests import PendingTokens, Request, admit, check_request, emit, pad_prompts


def test_admission_waits_for_a_batch_of_free_rows():
    w = deque(range(10))
    assert admit(w, 0, 8, 2) == list(range(8))  # nothing runs: fill every row
    assert admit(w, 7, 8, 2) == [] and len(w) == 2  # one free row while others decode: wait
    assert admit(w, 6, 8, 2) == [8, 9]  # two free rows: prefill both
    assert admit(deque([5]), 7, 8, 2) == [5]  # all that wait fit: no reason to wait
    assert admit(deque([5]), 8, 8, 1) == []  # no free row


def test_a_request_is_capped_at_the_context_and_bad_prompts_are_named():
    r = Request([1, 2, 3], 100)
    check_request(r, 10)
    assert r.max_new_tokens == 7
    with pytest.raises(ValueError, match="empty prompt"):
        check_request(Request([], 4, rid=3), 10)
    with pytest.raises(ValueError, match="prompt has 10 tokens but the context is 10"):
        check_request(Request([1] * 10, 4), 10)


def test_emit_stops_at_eos_or_the_budget_and_drops_the_rest():
    seen = []
    r = Request([1], 5)
    emit(r, [4, 9, 6, 7], {9}, lambda req, t: seen.append((t, req.done)))
    assert r.output_ids == [4, 9] and r.finish_reason == "eos" and seen == [(4, False), (9, True)]
    r = Request([1], 2)
    emit(r, [4, 5, 6], set(), None)
    assert r.output_ids == [4, 5] and r.finish_reason == "length"


def test_prompts_are_right_padded_with_their_valid_positions():
    tokens, positions, valid, lens = pad_prompts([Request([5, 6, 7], 1), Request([8], 1)], "cpu")
    assert tokens.tolist() == [[5, 6, 7], [8, 0, 0]] and lens.tolist() == [3, 1]
    assert positions.tolist() == [[0, 1, 2], [0, 1, 2]]
    assert valid.tolist() == [[True, True, True], [True, False, False]]


def test_pending_tokens_reach_the_host_with_their_requests():
    reqs = [Request([1], 1, rid=0), Request([2], 1, rid=1)]
    copy = PendingTokens(torch.tensor([[2, 7, 8], [1, 9, 0]]), reqs)  # [B, 1 + tokens]
    assert copy.reqs is reqs and copy.get() == [[2, 7, 8], [1, 9, 0]]
