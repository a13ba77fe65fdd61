"""Exact and near-duplicate detection of prompts, one index for the evaluation sets and the training pool.

`PromptIndex` holds two kinds of entries: evaluation prompts (MT-bench's turns, HumanEval's prompts as eaglet asks
them, every user turn of ShareGPT's held-out split), which keep a candidate out of training, and the training
prompts accepted so far, which make a later candidate a duplicate. A candidate is checked by content:

- exactly, by the SHA-1 of its normalised text (lower case, every run of non-word characters one space);
- approximately, by datasketch's MinHash LSH over character 5-grams of that text: a near-duplicate is one whose
  estimated Jaccard similarity reaches `threshold`, verified on the stored signatures (LSH buckets alone also
  return pairs below it). Character 5-grams, not word n-grams, because prompts are short: one word changed in
  "Compose an engaging travel blog post about a recent trip to Hawaii, ..." leaves a character-5-gram Jaccard of
  0.86 (word 3-grams: 0.67), a request about Japan in the same frame 0.52, so 0.7 separates them. The estimate's
  standard error at 0.7 is 0.04 with 128 permutations: a pair right at the threshold may fall either side.

The MinHash permutations come from a fixed seed and the pinned `affine32` scheme, and candidates are checked in a
fixed order, so a pool is the same for the same inputs on any machine.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import numpy as np
from datasketch import MinHash, MinHashLSH

from eaglet.data.prompts import load_humaneval, load_mt_bench, load_sharegpt_conversations

EVAL_SETS = ("mt_bench", "humaneval", "sharegpt_heldout")
_NON_WORD = re.compile(r"\W+")


@dataclass(frozen=True)
class DedupConfig:
    threshold: float = 0.7  # estimated Jaccard similarity (character 5-grams) at which two prompts are near-duplicates
    num_perm: int = 128  # MinHash permutations (the estimate's standard error is ~ 1 / sqrt(num_perm))
    shingle: int = 5  # characters per shingle

    def __post_init__(self):
        if not 0 < self.threshold <= 1:
            raise ValueError(f"dedup.threshold={self.threshold} must be in (0, 1] (a Jaccard similarity)")
        if self.num_perm < 16 or self.shingle < 1:
            raise ValueError(f"dedup.num_perm={self.num_perm} / dedup.shingle={self.shingle}: use num_perm >= 16 "
                             f"and shingle >= 1")


def bands(threshold: float, num_perm: int, recall: float = 0.999) -> tuple[int, int]:
    """LSH (bands, rows per band): the most rows per band (the fewest candidates below the threshold to verify) with
    which a pair right at the threshold is still a candidate with probability >= `recall`. For 0.7 and 128
    permutations: 32 x 4 (0.9998); datasketch's own choice for 0.7, 14 x 9, finds 44% of such pairs, and let a
    planted near-duplicate of an MT-bench prompt through."""
    best = (num_perm, 1)
    for r in range(1, num_perm + 1):
        b = num_perm // r
        if 1 - (1 - threshold ** r) ** b >= recall:
            best = (b, r)
    return best


def normalise(text: str) -> str:
    return _NON_WORD.sub(" ", text.lower()).strip()


class PromptIndex:
    """Evaluation and accepted training prompts; `check` says whether a candidate is new."""

    def __init__(self, dc: DedupConfig):
        self.dc = dc
        self.lsh = MinHashLSH(num_perm=dc.num_perm, params=bands(dc.threshold, dc.num_perm))
        self._perm = MinHash(num_perm=dc.num_perm, seed=1, scheme="affine32").permutations
        self.exact: dict[str, str] = {}  # SHA-1 of the normalised text -> key
        self.sigs: dict[str, np.ndarray] = {}  # key -> MinHash signature [num_perm] uint32

    def signature(self, text: str) -> MinHash:
        t, n = normalise(text), self.dc.shingle
        m = MinHash(num_perm=self.dc.num_perm, permutations=self._perm, scheme="affine32")
        m.update_batch([t[i:i + n].encode() for i in range(max(1, len(t) - n + 1))])
        return m

    def add(self, key: str, text: str, sig: MinHash | None = None) -> None:
        """Index `text` under `key` ("eval:..." keys exclude, others deduplicate)."""
        sig = sig if sig is not None else self.signature(text)
        self.exact.setdefault(_digest(text), key)
        if key not in self.sigs:
            self.lsh.insert(key, sig)
            self.sigs[key] = sig.hashvalues.astype(np.uint32)

    def match(self, text: str, sig: MinHash | None = None) -> str | None:
        """The key of an indexed prompt equal to or a near-duplicate of `text` (an evaluation prompt first), or
        None."""
        if (key := self.exact.get(_digest(text))) is not None:
            return key
        sig = sig if sig is not None else self.signature(text)
        hits = sorted(k for k in self.lsh.query(sig)
                      if float(np.mean(self.sigs[k] == sig.hashvalues)) >= self.dc.threshold)
        evals = [k for k in hits if k.startswith("eval:")]
        return (evals or hits or [None])[0]


def _digest(text: str) -> str:
    return hashlib.sha1(normalise(text).encode()).hexdigest()


def is_eval(key: str | None) -> bool:
    return key is not None and key.startswith("eval:")


def eval_prompts(names, sharegpt_path=None) -> list[tuple[str, str]]:
    """(key, text) of every prompt of the named evaluation sets (EVAL_SETS), in a fixed order: all turns of
    MT-bench's 80 questions, HumanEval's 164 problems as eaglet asks them (HUMANEVAL_TEMPLATE), every user turn of
    ShareGPT's held-out split (`sharegpt_path`: the file training reads)."""
    unknown = sorted(set(names) - set(EVAL_SETS))
    if unknown:
        raise ValueError(f"exclude={list(names)}: unknown {unknown}; the evaluation sets are {', '.join(EVAL_SETS)}")
    out = []
    if "mt_bench" in names:
        out += [(f"eval:mt_bench:{p.id}:{i}", t) for p in load_mt_bench() for i, t in enumerate(p.turns)]
    if "humaneval" in names:
        out += [(f"eval:humaneval:{p.id}", p.turns[0]) for p in load_humaneval()]
    if "sharegpt_heldout" in names:
        out += [(f"eval:sharegpt:{c.id}:{i}", t) for c in load_sharegpt_conversations("heldout", sharegpt_path)
                for i, (r, t) in enumerate(c.messages) if r == "user"]
    return out
