"""The n-gram drafter's config (conf/draft/ngram.yaml) checked before anything loads, torch-free (runner/config.py);
the tree's fit is `NgramDrafter.check_config`'s, in the last layer."""

from __future__ import annotations

MAX_N = 16  # kernels/ngram_match.py's MAX_N (the suffix tokens a program holds), named here without torch
MAX_M = 16  # kernels/ngram_match.py's MAX_M (the matches a program follows): n-gram branches at most


def check_values(c) -> None:
    n_max = c.integer("draft.n_max", lo=1, hi=MAX_N)
    n_min = c.integer("draft.n_min", lo=1, hi=MAX_N)
    if n_max is not None and n_min is not None and n_min > n_max:
        c.bad("draft.n_min", n_min, f"must be at most draft.n_max={n_max}")
