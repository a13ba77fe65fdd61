"""Token paths merged into a draft tree as a trie (`graft`): the one tree merge of the drafters. The n-gram drafter
grafts its matches' continuations onto the bare root (`root_tree`); n-gram branches graft them onto another
drafter's tree (engine/drafters/ngram.py). The merge is kernels/trie_graft.py: one Triton launch for the batch (one
program a request), where the torch version it replaced took ~150 small ops (0.32 ms of the n-gram drafter's step on
an H100); that module's docstring has the exact semantics. Device tensors of fixed shape, no host sync: CUDA-graph
capturable.
"""

from __future__ import annotations

import torch

from eaglet.engine.drafter import DraftTree
from eaglet.kernels import trie_graft


def root_tree(roots: torch.Tensor, seq_lens: torch.Tensor) -> DraftTree:
    """roots [B] int64, seq_lens [B] -> the tree of the root alone (N = 1)."""
    B = roots.shape[0]
    none = torch.full((B, 1), -1, dtype=torch.long, device=roots.device)  # [B, 1]
    mask = torch.ones(B, 1, 1, dtype=torch.bool, device=roots.device)  # [B, 1, 1]
    return DraftTree(roots[:, None].long(), seq_lens[:, None].long(), none, none, mask)


def graft(tree: DraftTree, paths: torch.Tensor, extra: int, fallback: DraftTree | None = None) -> DraftTree:
    """tree (N nodes, at most S deep) and paths [B, P, S] int64 (tokens down from the root, -1 past a path's end)
    -> the merged tree of N + extra nodes (kernels/trie_graft.py's `graft`); a request whose paths create no node
    gets `fallback` (N + extra nodes) instead, where given.

    A path walks down the tree while its token equals a linked child's and creates nodes only where it departs;
    paths with a common prefix share its new nodes (those of the first such path). So siblings keep distinct tokens
    (tree speculative sampling needs them). New nodes take slots N, N+1, ... in path-major order, parents before
    children; the first `extra` are kept, and the slots left over are padding: a leaf under the root (token 0) that no
    link reaches, which the verify computes and never accepts. The tree's own nodes keep their slots, tokens and
    mask rows; links are rebuilt in ascending node order (build_tree's and the n-gram drafter's order, so a tree's
    own links come back unchanged).
    """
    return DraftTree(*trie_graft.graft(tree, paths, extra, fallback))
