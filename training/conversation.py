"""Conversations the target holds with itself: user turns answered turn by turn through eaglet's batched AREngine
(training/data.py's AnswerGenerator), and user turns it writes itself from its chat template's opening of a user
turn (Magpie), kept while they stay coherent new requests (`Checker`). Used by training/synthesis.py."""

from __future__ import annotations

import collections
import hashlib
from dataclasses import dataclass

from eaglet.data.chat import encode_turns
from eaglet.training.data import AnswerGenerator
from eaglet.training.dedup import PromptIndex, is_eval
from eaglet.training.filters import FilterConfig, reject_reason

_SENTINEL = "\x00user-turn\x00"


@dataclass
class Record:
    id: str  # "sharegpt:<conversation id>" | "magpie:<chunk>:<i>"
    source: str  # "sharegpt" | "magpie"
    turns: list[str]  # user turns (a Magpie record: its first; the others are written while conversing)


def derived_seed(seed: int, *parts) -> int:
    """A seed per piece of work (a chunk, a turn), independent of the order pieces are made in."""
    return int(hashlib.sha256(":".join(map(str, (seed, *parts))).encode()).hexdigest()[:8], 16)


def user_turn_prefix(tokenizer, history: list[tuple[str, str]]) -> list[int]:
    """Token ids of the chat template through `history` and the opening of the next user turn, up to where its
    text begins (SmolLM2: `...<|im_start|>user\\n`)."""
    msgs = [{"role": r, "content": t} for r, t in history] + [{"role": "user", "content": _SENTINEL}]
    text = tokenizer.apply_chat_template(msgs, tokenize=False)
    if _SENTINEL not in text:
        raise ValueError("the chat template does not render a user turn's text verbatim, so the opening of a user "
                         "turn cannot be found")
    return tokenizer(text[: text.index(_SENTINEL)], add_special_tokens=False)["input_ids"]


def written_turn(out: list[int], writer: AnswerGenerator, tokenizer) -> tuple[str, bool]:
    """A sampled user turn's text, and whether the target ended it itself (its end-of-turn token)."""
    eos = set(writer.eos_ids)
    text = tokenizer.decode([t for t in out if t not in eos], skip_special_tokens=True).strip()
    return text, bool(out) and out[-1] in eos


class Checker:
    """Whether a user turn the target wrote goes on its conversation: "unfinished" | a filter's reason | "eval" |
    "echo" | None (keep it)."""

    def __init__(self, index: PromptIndex, fc: FilterConfig, tokenizer):
        self.index, self.fc, self.tokenizer = index, fc, tokenizer

    def __call__(self, text: str, finished: bool, history: list[tuple[str, str]]) -> str | None:
        if not finished:
            return "unfinished"
        n = len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if (why := reject_reason(text, n, self.fc)) is not None:
            return why
        sig = self.index.signature(text)
        if is_eval(self.index.match(text, sig)):
            return "eval"
        # a model that lost the thread asks an earlier question again or echoes the answer it just gave
        for t in [t for r, t in history if r == "user"] + [history[-1][1]]:
            if self.index.signature(t).jaccard(sig) >= self.index.dc.threshold:
                return "echo"
        return None


@dataclass
class Generators:
    """The batched engines of a synthesis run (each its own KV pool and CUDA graphs: sampling settings are part of
    a captured graph)."""

    writer: AnswerGenerator  # user turns, sampled (magpie.*)
    answer: AnswerGenerator  # answers at temperature 0
    sampler: AnswerGenerator | None  # extra sampled answers (answers.sampled > 0)

    def all(self) -> list[AnswerGenerator]:
        return [g for g in (self.writer, self.answer, self.sampler) if g is not None]


def converse(records: list[Record], answer: AnswerGenerator, tokenizer, seed: int, stats: collections.Counter,
             writer: AnswerGenerator | None = None, check: Checker | None = None,
             magpie_turns: int = 1) -> tuple[list[list[tuple[str, str]]], list[bool]]:
    """Each record's conversation [(role, text)], and whether its last answer was cut by the token budget: its user
    turns answered by `answer`, turn by turn; with a `writer`, a Magpie record's next user turn is written by the
    target after each answer (up to `magpie_turns` user turns, while `check` keeps them)."""
    eos, context = set(answer.eos_ids), answer.rc.max_context
    msgs: list[list[tuple[str, str]]] = [[] for _ in records]
    cut = [False] * len(records)
    todo = [list(r.turns) for r in records]  # user turns still to answer
    alive = [True] * len(records)
    turn = 0
    while any(a and t for a, t in zip(alive, todo)):
        rows, prompts = [], []
        for i in range(len(records)):
            if alive[i] and todo[i]:
                hist = [{"role": r, "content": t} for r, t in msgs[i]] + [{"role": "user", "content": todo[i][0]}]
                ids = encode_turns(tokenizer, hist, True)
                if len(ids) >= context - 1:  # no room left to answer: the conversation ends here
                    alive[i] = False
                    stats["turns/no_room"] += 1
                    continue
                rows.append(i)
                prompts.append(ids)
        for i, out in zip(rows, answer(prompts, derived_seed(seed, "answer", turn)) if rows else []):
            text = tokenizer.decode([t for t in out if t not in eos], skip_special_tokens=True)
            msgs[i] += [("user", todo[i].pop(0)), ("assistant", text)]
            stats["turns/answered"] += 1
            if not out or out[-1] not in eos:  # cut by the token budget: no user turn follows a cut answer
                alive[i], cut[i] = False, True
                stats["turns/answer_cut"] += 1
        if writer is not None:
            more = [i for i in rows if alive[i] and not todo[i] and records[i].source == "magpie"
                    and len(msgs[i]) // 2 < magpie_turns]
            prefixes = [user_turn_prefix(tokenizer, msgs[i]) for i in more]
            fits = [j for j, p in enumerate(prefixes) if len(p) < context - 1]
            stats["turns/no_room"] += len(more) - len(fits)
            more, prefixes = [more[j] for j in fits], [prefixes[j] for j in fits]
            for i, out in zip(more, writer(prefixes, derived_seed(seed, "write", turn)) if more else []):
                text, finished = written_turn(out, writer, tokenizer)
                why = check(text, finished, msgs[i])
                stats[f"followups/{why or 'kept'}"] += 1
                if why is None:
                    todo[i].append(text)
        turn += 1
    return msgs, cut
