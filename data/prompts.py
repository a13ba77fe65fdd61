"""Prompt and conversation datasets: MT-bench, HumanEval, ShareGPT and user JSONL files.

A `Prompt` is a list of user turns, answered one after another (MT-bench style: turn 2
is asked after the model's answer to turn 1). `limit` always means "the first N", so a
limited run is a prefix of the full run.

ShareGPT (the embedded `ShareGPT_V3_unfiltered_cleaned_split.json`, cut off mid-file)
is stream-parsed: 17,671 whole conversations. Split by a stable hash (SHA-256) of the
conversation's *base* id -- ShareGPT splits one long shared chat into `X_0`, `X_1`, ...,
and hashing `X` keeps all parts of a chat on the same side, so no held-out chat leaks
into training through its other parts. Messages are (role, text) with role 'user' or
'assistant'; system banners and empty messages are dropped and consecutive messages of
one speaker merged (see `_ROLES`, `_normalise`). 2% of the base ids are held out:

    split     conversations   prompts (load_sharegpt: non-empty, starting with a user turn)
    train            17,336   10,952
    heldout             335      216
    all              17,671   11,168

Loading takes about 0.6 s (2-core CPU; the raw parse 0.35 s) and is cached per process.
"""

from __future__ import annotations

import codecs
import functools
import gzip
import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from eaglet.data.assets import asset_path

DATASETS = ("mt_bench", "humaneval", "sharegpt", "jsonl")
SPLITS = ("train", "heldout")
HELDOUT_PER_10K = 200  # 2% of ShareGPT base ids are held out

# Why a fenced instruction rather than the bare code: the target is a chat model, and a
# user turn holding only a code prefix is not a request -- instruct models then often
# explain the code instead of writing it. Asking to complete the function inside a
# ```python block makes the answer the code itself, the code-heavy workload HumanEval
# is meant to add to the benchmark mix.
HUMANEVAL_TEMPLATE = "Complete the following Python function:\n```python\n{prompt}```"


@dataclass
class Prompt:
    id: str
    turns: list[str]  # user turns, answered one after another
    meta: dict = field(default_factory=dict)  # dataset extras (category, entry_point, ...)


@dataclass
class Conversation:
    id: str  # ShareGPT id, e.g. "QWJhYvA_0" (123 ids appear twice, one copy empty)
    messages: list[tuple[str, str]]  # (role, text), role 'user' | 'assistant', alternating
    split: str  # 'train' | 'heldout'


def _check_limit(limit: int | None) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be None or an integer >= 0, got {limit!r}")


def _take(items: list, limit: int | None) -> list:
    _check_limit(limit)
    return items if limit is None else items[:limit]


# ----------------------------------------------------------------------------- MT-bench


def load_mt_bench(limit: int | None = None, path: str | Path | None = None) -> list[Prompt]:
    """MT-bench's 80 two-turn questions (FastChat `question.jsonl`); id = question_id."""
    _check_limit(limit)
    path = Path(path) if path is not None else asset_path("mt_bench")
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            q = json.loads(line)
            meta = {"category": q["category"]}
            if "reference" in q:  # math / reasoning / coding questions carry a reference answer
                meta["reference"] = q["reference"]
            out.append(Prompt(id=str(q["question_id"]), turns=list(q["turns"]), meta=meta))
    return _take(out, limit)


# ---------------------------------------------------------------------------- HumanEval


def load_humaneval(limit: int | None = None, path: str | Path | None = None) -> list[Prompt]:
    """HumanEval's 164 problems as one-turn chat prompts (HUMANEVAL_TEMPLATE); id = task_id."""
    _check_limit(limit)
    path = Path(path) if path is not None else asset_path("humaneval")
    opener = gzip.open if path.suffix == ".gz" else open
    out = []
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            p = json.loads(line)
            code = p["prompt"] if p["prompt"].endswith("\n") else p["prompt"] + "\n"  # closing fence on its own line
            turn = HUMANEVAL_TEMPLATE.format(prompt=code)
            meta = {"entry_point": p["entry_point"], "prompt": p["prompt"]}
            out.append(Prompt(id=p["task_id"], turns=[turn], meta=meta))
    return _take(out, limit)


# ----------------------------------------------------------------------------- ShareGPT

# ShareGPT speaker names -> chat roles. Assistants other than ChatGPT appear in a few
# dozen chats (shared from ChatHub / TypingMind). 'system' is dropped: in this file all 41
# system messages are share-site banners ("*This chat conversation is shared from
# TypingMind.com*"), not instructions the assistant saw; as a system prompt they would
# condition the target on noise.
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
          "bard": "assistant", "assistant": "assistant", "system": None}  # fmt: skip
_JSON_WS = re.compile(r"[ \t\n\r]*")


def _iter_json_array(path: str | Path, chunk_bytes: int = 1 << 22) -> Iterator:
    """Yield the elements of a top-level JSON array one by one, stopping at a cut-off end.

    Reads `chunk_bytes` at a time and parses element by element with `raw_decode`, so a
    125 MB file is never handed to `json.loads` whole, and an element cut off by the end
    of the file is dropped instead of failing the whole parse. A malformed element that
    is not at the end of the file still raises ValueError.
    """
    decoder = json.JSONDecoder()
    utf8 = codecs.getincrementaldecoder("utf-8")()  # holds back a multibyte char split by a chunk edge
    buf, pos = "", 0
    with open(path, "rb") as f:

        def more() -> bool:  # append the next chunk (buffer offsets change); False at end of file
            nonlocal buf, pos
            raw = f.read(chunk_bytes)
            if not raw:
                return False  # buf untouched, so offsets into it stay valid
            # Never final=True: a multibyte char cut by the truncation is dropped, not an error.
            buf, pos = buf[pos:] + utf8.decode(raw), 0
            return True

        def peek() -> str:  # next non-whitespace char ('' at end of file)
            nonlocal pos
            while True:
                pos = _JSON_WS.match(buf, pos).end()
                if pos < len(buf):
                    return buf[pos]
                if not more():
                    return ""

        if peek() != "[":
            raise ValueError(f"{path}: expected a JSON array")
        pos += 1
        if peek() == "]":
            return
        while True:
            while True:  # parse one element, reading on until it is complete or the file ends
                try:
                    value, end = decoder.raw_decode(buf, pos)
                except json.JSONDecodeError as e:
                    if more():
                        continue
                    # Cut off inside the element: the decoder fails at the end, at most 5 chars
                    # before it (inside a literal like `fals` or an escape like `\u00e`; measured
                    # by cutting a JSON document at every offset), or at an unterminated string's start.
                    if e.pos >= len(buf) - 5 or e.msg.startswith("Unterminated string"):
                        return
                    raise ValueError(f"{path}: malformed JSON element: {e.msg}") from e
                if end < len(buf):
                    break
                if not more():  # the element ends exactly at the end of the file
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                        return  # a number is not self-delimiting: `12` may be a cut `123`
                    break
            yield value
            pos = end
            c = peek()
            if c == ",":
                pos += 1
                peek()
            elif c in ("]", ""):  # end of array, or cut off right after an element
                return
            else:
                raise ValueError(f"{path}: expected ',' or ']' after an array element, got {c!r}")


def sharegpt_split(conversation_id: str) -> str:
    """'train' or 'heldout', from a stable hash of the base id (the id without its `_<part>`)."""
    base = re.sub(r"_\d+$", "", conversation_id)
    bucket = int.from_bytes(hashlib.sha256(base.encode("utf-8")).digest()[:8], "big") % 10_000
    return "heldout" if bucket < HELDOUT_PER_10K else "train"


def _normalise(conv_id: str, turns: list[dict]) -> tuple[tuple[str, str], ...]:
    msgs: list[tuple[str, str]] = []
    for t in turns:
        if t["from"] not in _ROLES:
            raise ValueError(
                f"ShareGPT conversation {conv_id!r}: unknown speaker {t['from']!r}; known: {sorted(_ROLES)}"
            )
        role, text = _ROLES[t["from"]], t["value"]
        if role is None or not text.strip():
            continue  # banners and empty messages carry nothing to answer or learn from
        if msgs and msgs[-1][0] == role:
            # Chat templates expect alternating roles; consecutive messages of one speaker
            # (a user pasting in two parts) are one turn.
            msgs[-1] = (role, msgs[-1][1] + "\n\n" + text)
        else:
            msgs.append((role, text))
    return tuple(msgs)


@functools.lru_cache(maxsize=4)
def _parse_sharegpt(path: str, mtime_ns: int, size: int) -> tuple[tuple[str, tuple[tuple[str, str], ...], str], ...]:
    # Keyed by mtime and size too, so a rewritten file is parsed again. Immutable tuples
    # are cached; callers get fresh dataclasses they may mutate.
    return tuple(
        (c["id"], _normalise(c["id"], c["conversations"]), sharegpt_split(c["id"])) for c in _iter_json_array(path)
    )


def load_sharegpt_conversations(split: str | None = None, path: str | Path | None = None) -> list[Conversation]:
    """All ShareGPT conversations in file order (split=None: all 17,671), or one split's."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS} or None (all), got {split!r}")
    path = Path(path) if path is not None else asset_path("sharegpt")
    st = path.stat()
    return [
        Conversation(id=cid, messages=list(msgs), split=s)
        for cid, msgs, s in _parse_sharegpt(str(path), st.st_mtime_ns, st.st_size)
        if split is None or s == split
    ]


def load_sharegpt(split: str = "heldout", limit: int | None = None, path: str | Path | None = None) -> list[Prompt]:
    """The user turns of ShareGPT conversations of one split, as prompts.

    Conversations that are empty or start with an assistant message are skipped: the
    latter are continuations (`X_1`, ...) whose first question lives in another part.
    """
    _check_limit(limit)
    out = []
    for conv in load_sharegpt_conversations(split, path):
        if conv.messages and conv.messages[0][0] == "user":
            turns = [text for role, text in conv.messages if role == "user"]
            out.append(Prompt(id=conv.id, turns=turns, meta={"split": conv.split}))
    return _take(out, limit)


# -------------------------------------------------------------------------------- JSONL

_JSONL_EXPECTED = (
    'each line must be a JSON object with either "prompt" (a non-empty string) or "turns" '
    '(a non-empty list of non-empty strings), and optionally "id" (a string or integer)'
)


def load_jsonl(path: str | Path, limit: int | None = None) -> list[Prompt]:
    """Prompts from a JSONL file; id defaults to the 1-based line number, other keys go to meta."""
    _check_limit(limit)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompt file not found: {path}")
    out, seen = [], set()
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue

            def bad(why: str) -> ValueError:
                return ValueError(f"{path}, line {lineno}: {why}; {_JSONL_EXPECTED}")

            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise bad(f"invalid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise bad(f"got a JSON {type(obj).__name__}, not an object")
            if ("prompt" in obj) == ("turns" in obj):
                raise bad("has both 'prompt' and 'turns'" if "prompt" in obj else "has neither 'prompt' nor 'turns'")
            turns = [obj["prompt"]] if "prompt" in obj else obj["turns"]
            if not isinstance(turns, list) or not turns:
                raise bad("'turns' is empty or not a list")
            if not all(isinstance(t, str) and t.strip() for t in turns):
                raise bad("a turn is not a non-empty string")
            pid = obj.get("id", lineno)
            if isinstance(pid, bool) or not isinstance(pid, (str, int)):
                raise bad(f"'id' is a {type(pid).__name__}")
            pid = str(pid)
            if pid in seen:
                raise bad(f"duplicate id {pid!r}")
            seen.add(pid)
            meta = {k: v for k, v in obj.items() if k not in ("id", "prompt", "turns")}
            out.append(Prompt(id=pid, turns=list(turns), meta=meta))
    return _take(out, limit)


# --------------------------------------------------------------------------- dispatcher


def load_prompts(
    name: str,
    limit: int | None = None,
    path: str | Path | None = None,
    max_turns: int | None = None,
    split: str | None = None,
) -> list[Prompt]:
    """Load prompts by dataset name (the fields of conf/data/*.yaml).

    name: 'mt_bench' | 'humaneval' | 'sharegpt' | 'jsonl'. path: required for 'jsonl';
    for the others it replaces the embedded file with one of the same format. split:
    ShareGPT only ('train' | 'heldout', default 'heldout'). max_turns: keep only each
    prompt's first turns (e.g. 1 for single-turn MT-bench).
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known datasets: {', '.join(DATASETS)}")
    if max_turns is not None and (isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1):
        raise ValueError(f"max_turns must be None or an integer >= 1, got {max_turns!r}")
    if split is not None and name != "sharegpt":
        raise ValueError(f"split={split!r} applies to the 'sharegpt' dataset only, not {name!r}; set it to null")
    if name == "mt_bench":
        prompts = load_mt_bench(limit, path)
    elif name == "humaneval":
        prompts = load_humaneval(limit, path)
    elif name == "sharegpt":
        prompts = load_sharegpt(split or "heldout", limit, path)
    else:
        if path is None:
            raise ValueError("dataset 'jsonl' needs path=<file.jsonl> (data.path=... on the command line)")
        prompts = load_jsonl(path, limit)
    if max_turns is not None:
        for p in prompts:
            p.turns = p.turns[:max_turns]
    return prompts
