"""scripts/sharegpt_subset.py: a cut conversation reads as the same first exchange (--first-exchange) or the same
roles and user turns (--user-turns)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from eaglet.data.assets import asset_path
from eaglet.data.prompts import _iter_json_array, _normalise

_SPEC = importlib.util.spec_from_file_location(
    "sharegpt_subset", Path(__file__).resolve().parents[2] / "scripts" / "sharegpt_subset.py")
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
    assert _normalise("abc_0", cut["conversations"]) == (("user", "part one\n\npart two"),
                                                         ("assistant", "answer\n\nmore"))
    short = {"id": "x", "conversations": turns[1:3]}
    assert subset.first_exchange(short) == short  # no assistant turn: kept whole


def _users_and_roles(conv_id: str, turns: list[dict]):
    msgs = _normalise(conv_id, turns)
    return [r for r, _ in msgs], [t for r, t in msgs if r == "user"]


def test_user_turns_keep_every_role_and_user_turn():
    turns = [{"from": "system", "value": "*This chat conversation is shared from TypingMind.com*"},
             {"from": "human", "value": "part one"}, {"from": "human", "value": "part two"},
             {"from": "gpt", "value": ""}, {"from": "gpt", "value": "answer"}, {"from": "gpt", "value": "more"},
             {"from": "human", "value": "second question"}, {"from": "gpt", "value": "second answer"}]
    cut = subset.user_turns({"id": "abc_0", "conversations": turns})
    assert _users_and_roles("abc_0", cut["conversations"]) == _users_and_roles("abc_0", turns)
    assert [t["value"] for t in cut["conversations"]] == ["", "part one", "part two", "", ".", ".",
                                                          "second question", "."]


def test_user_turns_on_the_embedded_file():
    """Every conversation of the embedded ShareGPT file reads with the same roles and user turns after the cut."""
    raw = list(_iter_json_array(asset_path("sharegpt")))
    assert len(raw) == 17_671
    for conv in raw:
        assert _users_and_roles(conv["id"], subset.user_turns(conv)["conversations"]) == \
            _users_and_roles(conv["id"], conv["conversations"]), conv["id"]
