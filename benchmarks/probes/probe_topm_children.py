"""How often does restricting each depth's children to the base row's top-M ids change the block drafter's tree?

    python benchmarks/probes/probe_topm_children.py [run_spec.py overrides, e.g. data.limit=6 gen.max_new_tokens=128]

A run_spec.py run (CPU: torch references) with the block drafter's `grow_tree` wrapped: each step builds the exact
tree and, for each M, the tree whose depth-d children are only the M largest ids of base[:, d] (the dependency term
added to those; the log-softmax normaliser is those M ids with the term plus the rest of the base row's mass, which no
child can take), then counts equal candidate sets and equal N-node trees. results/block_drafter_h100/topm_children.md
has the answer: that restriction would let every depth's full-vocabulary pass run in parallel, in one launch.
"""

from __future__ import annotations

import collections
import runpy
import sys

import torch

import eaglet.engine.drafters.block as block_drafter
import eaglet.kernels.block_tree as bt
from eaglet.kernels.build_tree import build_tree
from eaglet.kernels.topk import top_ids_ref

MS = (32, 128, 512, 2048)
stats = collections.Counter()


def restricted(base, dep_in, dep_out, roots, S: int, K: int, d2t, M: int):
    """grow_tree_ref's tree with each depth's children among base[:, d]'s top M (module doc)."""
    rows = base[:, :S]  # [B, S, Vd]
    top = rows.topk(M, dim=-1).indices  # [B, S, M]
    keep = torch.zeros_like(rows, dtype=torch.bool).scatter_(2, top, True)  # [B, S, Vd]
    rest = (rows.logsumexp(-1).exp() - rows.gather(2, top).exp().sum(-1)).clamp(min=1e-30).log()  # [B, S]
    # one more column: the rest's mass, dependency-free (a zero column of dep_out), never a child (below)
    ext = torch.cat([torch.where(keep, rows, float("-inf")), rest[:, :, None]], dim=2)  # [B, S, Vd + 1]
    dout = torch.cat([dep_out, torch.zeros(dep_out.shape[0], 1, dtype=dep_out.dtype)], dim=1)  # [r, Vd + 1]
    d2 = None if d2t is None else torch.cat([d2t, torch.zeros(1, dtype=d2t.dtype)])  # [Vd + 1]
    real = bt.topk_logprobs_ref

    def topk_without_rest(logits, k):
        x = logits.float()
        ids = top_ids_ref(x[..., :-1], k)  # [..., k]
        return torch.log_softmax(x, dim=-1).gather(-1, ids), ids

    bt.topk_logprobs_ref = topk_without_rest
    try:
        return bt.grow_tree_ref(ext, dep_in, dout, roots, S, K, d2)
    finally:
        bt.topk_logprobs_ref = real


def wrapped(base, dep_in, dep_out, roots, S: int, K: int, d2t=None):
    exact = bt.grow_tree_ref(base, dep_in, dep_out, roots, S, K, d2t)
    zeros = torch.zeros_like(roots, dtype=torch.int32)
    N = block_drafter_tree.num_draft_tokens
    want = build_tree(*exact, roots, zeros, N, K, S).draft_tokens  # [B, N]
    for M in MS:
        approx = restricted(base, dep_in, dep_out, roots, S, K, d2t, M)
        stats[M, "candidates"] += int(torch.equal(exact[1], approx[1]) and torch.equal(exact[2], approx[2]))
        stats[M, "tree"] += int(torch.equal(want, build_tree(*approx, roots, zeros, N, K, S).draft_tokens))
    stats["steps"] += 1
    return exact


class _Tree:
    num_draft_tokens = 16  # set from the drafter's tree at its first propose


block_drafter_tree = _Tree()
_propose = block_drafter.BlockDrafter.propose


def propose(self, *args, **kwargs):
    block_drafter_tree.num_draft_tokens = self.tree.num_draft_tokens
    return _propose(self, *args, **kwargs)


if __name__ == "__main__":
    block_drafter.grow_tree = wrapped
    block_drafter.BlockDrafter.propose = propose
    sys.argv = ["run_spec.py"] + sys.argv[1:]
    try:
        runpy.run_path("run_spec.py", run_name="__main__")
    except SystemExit:
        pass
    n = stats["steps"]
    print(f"draft steps: {n}\n| M | same candidates | same {block_drafter_tree.num_draft_tokens}-node tree |")
    print("|---|---|---|")
    for M in MS:
        print(f"| {M} | {stats[M, 'candidates'] / max(n, 1):.3f} | {stats[M, 'tree'] / max(n, 1):.3f} |")
