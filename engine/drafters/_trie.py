"""Token paths merged into a draft tree as a trie (`graft`): the one tree merge of the drafters. The n-gram drafter
grafts its matches' continuations onto the bare root (`root_tree`); n-gram branches graft them onto another
drafter's tree (engine/drafters/ngram.py). Device tensors of fixed shape, no host sync: CUDA-graph capturable.
"""

from __future__ import annotations

import torch

from eaglet.engine.drafter import DraftTree


def root_tree(roots: torch.Tensor, seq_lens: torch.Tensor) -> DraftTree:
    """roots [B] int64, seq_lens [B] -> the tree of the root alone (N = 1)."""
    B = roots.shape[0]
    none = torch.full((B, 1), -1, dtype=torch.long, device=roots.device)  # [B, 1]
    mask = torch.ones(B, 1, 1, dtype=torch.bool, device=roots.device)  # [B, 1, 1]
    return DraftTree(roots[:, None].long(), seq_lens[:, None].long(), none, none, mask)


def graft(tree: DraftTree, paths: torch.Tensor, extra: int) -> DraftTree:
    """tree (N nodes, at most S deep) and paths [B, P, S] int64 (tokens down from the root, -1 past a path's end)
    -> the merged tree of N + extra nodes.

    A path walks down the tree while its token equals a linked child's and creates nodes only where it departs;
    paths with a common prefix share its new nodes (those of the first such path). So siblings keep distinct tokens
    (tree speculative sampling needs them). New nodes take slots N, N+1, ... in path-major order, parents before
    children; the first `extra` are kept, and the slots left over are padding: a leaf under the root (token 0) that no
    link reaches, which the verify computes and never accepts. The tree's own nodes keep their slots, tokens and
    mask rows; links are rebuilt in ascending node order (build_tree's and the n-gram drafter's order, so a tree's
    own links come back unchanged).
    """
    B, N = tree.tokens.shape
    P, S = paths.shape[1:]
    M = N + extra
    dev = paths.device
    j = torch.arange(N, device=dev)  # [N]
    # the tree's parents, depths and linked nodes (padding slots are reached by no link)
    depth = tree.mask.sum(-1) - 1  # [B, N]
    is_parent = tree.mask & (depth[:, None, :] == depth[:, :, None] - 1)  # [B, i, j]: j is i's parent
    parent = is_parent.int().argmax(-1)  # [B, N]; the root: 0
    linked = torch.zeros(B, N + 1, dtype=torch.bool, device=dev)  # [B, N+1]; column N takes the -1 links
    for link in (tree.next_token, tree.next_sibling):
        linked.scatter_(1, torch.where(link >= 0, link, N), True)
    real = linked[:, :N] | (j == 0)  # [B, N]
    # walk each path down the tree: node[b, p, d] is the tree node of its first d+1 tokens, -1 once it departs
    ok = paths >= 0  # [B, P, S]
    node = torch.full((B, P, S), -1, dtype=torch.long, device=dev)  # [B, P, S]
    cur = torch.zeros(B, P, dtype=torch.long, device=dev)  # [B, P]
    on = torch.ones(B, P, dtype=torch.bool, device=dev)  # [B, P]
    for d in range(S):
        hit = (real & (j > 0))[:, None, :] & (parent[:, None, :] == cur[:, :, None]) & (
            tree.tokens[:, None, :] == paths[:, :, d, None])  # [B, P, N]
        on = on & hit.any(-1)  # [B, P] still on the tree
        cur = torch.where(on, hit.int().argmax(-1), cur)  # [B, P]
        node[:, :, d] = torch.where(on, cur, -1)
    # past the tree: node (p, d) is shared with the first path p2 whose tokens 0..d equal p's
    same = (paths[:, :, None, :] == paths[:, None, :, :]) & ok[:, :, None, :] & ok[:, None, :, :]  # [B, P, P, S]
    rep = same.int().cumprod(dim=-1).argmax(dim=2)  # [B, P, S] that p2 (p itself where ok)
    new = ok & (node < 0) & (rep == torch.arange(P, device=dev)[:, None])  # [B, P, S] nodes of their own
    order = new.reshape(B, P * S).long().cumsum(dim=1)  # [B, P*S] 1-based rank of each new node
    keep = new.reshape(B, P * S) & (order <= extra)  # [B, P*S]
    index = torch.where(node >= 0, node, N - 1 + order.view(B, P, S).gather(1, rep))  # [B, P, S] merged node
    up = torch.cat([torch.zeros(B, P, 1, dtype=torch.long, device=dev), index[:, :, :-1]], dim=2)  # [B, P, S]
    # scatter the kept new nodes into slots N..M-1 (slot M: a dump column, cut below)
    slot = torch.where(keep, N - 1 + order, M)  # [B, P*S]

    def put(base: torch.Tensor, fill, value: torch.Tensor) -> torch.Tensor:  # [B, N] + new values -> [B, M]
        out = torch.cat([base, torch.full((B, extra + 1), fill, dtype=base.dtype, device=dev)], dim=1)  # [B, M+1]
        return out.scatter(1, slot, value.reshape(B, P * S))[:, :M]

    d1 = torch.arange(1, S + 1, device=dev).expand(B, P, S)  # [B, P, S] depth of (p, d)
    tokens = put(tree.tokens, 0, paths)  # [B, M]
    parents = put(parent, 0, up)  # [B, M]
    depths = put(depth, 1, d1)  # [B, M]
    real = put(real, False, keep)  # [B, M]
    # ancestor-or-self: the tree's rows as they are; a new node's row is its parent's plus itself (depth <= S)
    eye = torch.eye(M, dtype=torch.bool, device=dev).expand(B, M, M)  # [B, M, M]
    mask = eye | (torch.arange(M, device=dev) == 0)  # [B, M, M]: padding rows, a leaf under the root
    mask = torch.cat([torch.cat([tree.mask, mask[:, :N, N:]], 2), mask[:, N:]], 1)  # [B, M, M]
    for _ in range(S):
        mask = eye | mask.gather(1, parents[:, :, None].expand(B, M, M))  # [B, M, M]
    next_token, next_sibling = links(parents, real)  # [B, M] each
    return DraftTree(tokens, tree.positions[:, :1] + depths, next_token, next_sibling, mask)


def links(parents: torch.Tensor, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """parents [B, M] (the root's: 0), real [B, M] (nodes the links reach) -> (first child, next sibling) [B, M]
    int64 among the real nodes in ascending node order, -1 where none."""
    M = parents.shape[1]
    j = torch.arange(M, device=parents.device)  # [M]
    child = real[:, None, :] & (parents[:, None, :] == j[None, :, None]) & (j > 0)  # [B, i, j]
    sib = (real[:, None, :] & (parents[:, None, :] == parents[:, :, None]) & (j[None, None, :] > j[:, None])
           & real[:, :, None] & (j > 0)[None, :, None])  # [B, i, j]
    next_token = torch.where(child.any(-1), child.int().argmax(-1), -1)  # [B, M]
    next_sibling = torch.where(sib.any(-1), sib.int().argmax(-1), -1)  # [B, M]
    return next_token.long(), next_sibling.long()
