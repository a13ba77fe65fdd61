"""Text filters for the user turns of synthesized training conversations (training/synthesis.py), and the
stop that ends an answer caught in a verbatim loop (`LoopStop`).

Each rule is a cheap, documented heuristic, calibrated on the first turns of ShareGPT's train split (10,952):

- length: fewer than `min_words` words ("hi", "Hello", "codes please": 328 first turns at 3) or more than
  `max_tokens` target tokens (a turn that leaves no room to answer in the context);
- degenerate repetition: the fraction of duplicate word 4-grams, 1 - distinct / total, above `max_repeat`. Natural
  requests score ~0; a sampled turn caught in a loop scores > 0.8; at 0.5 the ShareGPT turns dropped (60) are pasted
  logs and CSV headers repeated line after line, at 0.3 (180) also YAML and code a user asked about, so 0.5;
- language (English, the target's and the benchmarks' language; no model download): (a) at least
  `min_ascii_letters` of the letters are ASCII, which drops Chinese, Korean, Cyrillic, ... (90 first turns at 0.9);
  (b) among Latin-script texts, more distinct common Spanish/French/German/Portuguese/Italian function words than
  English ones (`FOREIGN`, `ENGLISH` below) marks another language. A minimum count of English stopwords instead
  dropped 243 English imperatives and code pastes ("explain the metaverse", "build seven day meal plan around
  macros"): short requests need not contain any. Words two of these languages share with English ("a", "in", "on",
  "me", "no", "die") are in neither list.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ENGLISH = frozenset("the and is are was of to that it for with this what how why you your be can have has will would "
                    "i my do does an from about please which there they we not if".split())
FOREIGN = frozenset("que el los las una por con para del es est une des les et pas pour avec dans qui der und das "
                    "ist nicht ein eine mit auf sich não uma il che di sono della".split())
_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class FilterConfig:
    min_words: int = 3  # shorter user turns are dropped (greetings, fragments)
    max_tokens: int = 1024  # longer user turns (target tokens) are dropped: little room is left to answer
    max_repeat: float = 0.5  # highest fraction of duplicate word 4-grams (degenerate repetition)
    min_ascii_letters: float = 0.9  # lowest fraction of ASCII among the letters (drops non-Latin scripts)

    def __post_init__(self):
        if self.min_words < 0 or self.max_tokens < 1:
            raise ValueError(f"filters.min_words={self.min_words} / filters.max_tokens={self.max_tokens}: use "
                             f"min_words >= 0 and max_tokens >= 1")
        for key in ("max_repeat", "min_ascii_letters"):
            if not 0 <= getattr(self, key) <= 1:
                raise ValueError(f"filters.{key}={getattr(self, key)} must be a fraction in [0, 1]")


def repeat_fraction(words: list[str], n: int = 4) -> float:
    """1 - distinct / total word n-grams: 0 for text without a repeated n-gram, -> 1 for a loop."""
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return 1 - len(set(grams)) / len(grams) if grams else 0.0


def reject_reason(text: str, n_tokens: int, fc: FilterConfig) -> str | None:
    """Why a user turn is dropped ("short" | "long" | "repetitive" | "language"), or None to keep it."""
    words = _WORD.findall(text.lower())
    if len(words) < fc.min_words:
        return "short"
    if n_tokens > fc.max_tokens:
        return "long"
    if repeat_fraction(words) > fc.max_repeat:
        return "repetitive"
    letters = [c for c in text if c.isalpha()]
    if letters and sum(c.isascii() for c in letters) < fc.min_ascii_letters * len(letters):
        return "language"
    vocab = set(words[:300])  # a long paste decides by its start, in constant time
    if len(vocab & FOREIGN) > len(vocab & ENGLISH):
        return "language"
    return None


class LoopStop:
    """An `on_token` callback of AREngine.generate that ends an answer caught in a verbatim loop: once `run`
    consecutive token `n`-grams of its output each already occurred earlier in that output, the request finishes
    with reason "loop" (its output then ends without the end-of-turn token, as a cut answer does).

    Why: SmolLM2-135M's greedy answers loop. On 13,312 synthesized conversations (H200, answers.max_new_tokens=1024)
    9,963 of 22,871 answers ran to the token budget, and 80% of the assistant tokens of a sample were inside repeats
    (an 8-gram seen before in the sequence). The budget then goes mostly to tokens a head predicts at step 0 with
    0.82 accuracy, and the training accuracy they inflate says little about the 0.52 on the rest (held-out
    eval/acc_0: 0.52-0.54; benchmarks/probes/loop_share.py). Replayed over 4 of those chunks, run=64 ends 44% of the
    answers and keeps 41% of the assistant tokens; the loop's first ~70 repeated tokens stay, so the head still
    learns to follow a loop into its repetition. The prompt is not counted: an answer may quote it."""

    def __init__(self, run: int, n: int = 8):
        if run < 1 or n < 1:
            raise ValueError(f"LoopStop(run={run}, n={n}): both must be >= 1")
        self.run, self.n = run, n
        self._state: dict[int, list] = {}  # id(request) -> [n-grams seen, current run of repeated n-grams]
        self.stopped = 0  # requests this callback ended

    def __call__(self, r, token: int) -> None:
        out = r.output_ids
        if r.done:  # ended by its end-of-turn token or the budget
            self._state.pop(id(r), None)
            return
        if len(out) < self.n:
            return
        st = self._state.setdefault(id(r), [set(), 0])
        g = tuple(out[-self.n:])
        st[1] = st[1] + 1 if g in st[0] else 0
        st[0].add(g)
        if st[1] >= self.run:
            r.finish_reason = "loop"
            self.stopped += 1
            del self._state[id(r)]
