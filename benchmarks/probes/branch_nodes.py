"""Probe: how many nodes the n-gram branches create a step (the rest of their K x depth slots is padding, or the
drafter's widened tree where they create none).

    python benchmarks/probes/branch_nodes.py <run_spec.py overrides>

runs `run_spec.py` with engine/drafters/ngram.py's `graft` wrapped to count, per request and step, the nodes the
links reach past the drafter's tree, and prints the histogram. CPU or GPU; it reads the device every step, so its
timings are not the engine's.
"""

from __future__ import annotations

import collections
import runpy
import sys
from pathlib import Path

import eaglet.engine.drafters.ngram as ngram

REPO = Path(__file__).resolve().parents[2]


def reached(next_token: list[int], next_sibling: list[int]) -> set[int]:
    """The nodes the links reach from the root (the root included)."""
    seen, stack = {0}, [0]
    while stack:
        i = stack.pop()
        for j in (next_token[i], next_sibling[i]):
            if j >= 0 and j not in seen:
                seen.add(j)
                stack.append(j)
    return seen


def main() -> None:
    created: list[int] = []
    graft = ngram.graft

    def counting(tree, paths, extra, fallback=None):
        out = graft(tree, paths, extra)  # without the fallback: what the branches themselves create
        N = tree.tokens.shape[1]
        for nt, ns in zip(out.next_token.tolist(), out.next_sibling.tolist()):
            created.append(sum(j >= N for j in reached(nt, ns)))
        return graft(tree, paths, extra, fallback)

    ngram.graft = counting
    sys.argv = [str(REPO / "run_spec.py"), *sys.argv[1:]]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as e:
        if e.code:
            raise
    hist = sorted(collections.Counter(created).items())
    print(f"[branch_nodes] {len(created)} request steps; nodes created: {hist}")


if __name__ == "__main__":
    main()
