"""benchmarks/sharegpt_subset.py --first-exchange: a cut conversation reads as the same first exchange."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from eaglet.data.prompts import _normalise

_SPEC = importlib.util.spec_from_file_location(
    "sharegpt_subset", Path(__file__).resolve().parents[2] / "benchmarks" / "sharegpt_subset.py")
subset = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(subset)


def test_first_exchange_keeps_the_merged_first_turns_only():
    turns = [{"from": "system", "value": "*This chat conversation is shared from TypingMind.com*"},
             {"from": "human", "value": "part one"}, {"from": "human", "value": "part two"},
             {"from": "gpt", "value": ""}, {"from": "gpt", "value": "answer"}, {"from": "gpt", "value": "more"},
             {"from": "human", "value": "second question"}, {"from": "gpt", "value": "second answer"}]
    conv = {"id": "abc_0", "conversations": turns}
    cut = subset.first_exchange(conv)
    assert cut["id"] == "abc_0" and cut["conversations"] == turns[:6]
    assert _normalise("abc_0", cut["conversations"]) == _normalise("abc_0", turns)[:2]
    assert _normalise("abc_0", cut["conversations"]) == (("user", "part one\n\npart two"), ("assistant", "answer\n\nmore"))
    short = {"id": "x", "conversations": turns[1:3]}
    assert subset.first_exchange(short) == short  # no assistant turn: kept whole
