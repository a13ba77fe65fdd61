"""Token paths merged into a draft tree as a trie, in one launch: the n-gram drafter's tree and n-gram branches.

    graft(tree, paths, extra, fallback=None) -> (tokens, positions, next_token, next_sibling, mask) of N + extra nodes

`tree` is a draft tree in engine/drafter.py's DraftTree field order: tokens [B, N] int64 (node 0 the root),
positions [B, N] int64, next_token / next_sibling [B, N] int64 (first child / next sibling, -1: none) and mask
[B, N, N] bool (ancestor-or-self), at most S deep; paths [B, P, S] int64 are token paths down from the root, -1 past a
path's end (the -1s of a path are a suffix: `graft_sequential` checks it, the launchers do not, as that would read
the device). The result, M = N + extra nodes:
  * the tree's parents and depths come from its mask (depth = row sum - 1, parent = the ancestor of depth - 1); its
    real nodes are the root and the nodes a link reaches (the others are padding: a leaf under the root, token 0,
    that no link reaches, which the verify computes and never accepts);
  * the paths are inserted one by one, path-major, into the trie of the real nodes: a path walks down while its
    token equals a real child's, and creates a node where it departs, at slots N, N+1, ... in creation order, until
    `extra` nodes exist (then the path stops); so siblings keep distinct tokens (tree speculative sampling needs
    them) and paths with a common prefix share its nodes;
  * the tree's nodes keep their slots, tokens and mask rows; a new node's row is its parent's plus itself; unused
    slots N + created .. M-1 are padding (token 0, depth 1, row {root, self});
  * positions = tree positions[:, 0] + depth; links are rebuilt in ascending node order among the real nodes
    (next_token[i] = the smallest real j > 0 whose parent is i, next_sibling[i] = the smallest real j > i with i's
    parent, for real i > 0): build_tree's order, so a tree's own links come back unchanged;
  * with `fallback` (a tree of M nodes, the same five tensors): a request whose paths create no node gets the
    fallback tree as it is, instead of the tree and `extra` padding slots. The drafters pass their own tree widened
    to M nodes from the same candidates: n-gram branches find no match at ~60% of MT-bench steps, and there the
    verify's M slots hold the drafter's best M - 1 candidates, not padding (block drafter at 5/4/16 + 15, MT-bench,
    B=1, H100: tau 3.51 -> 3.58, decode tokens/s +4.1%; results/widened_h100/README.md).
`graft_sequential` is that insertion in plain Python (the spec the tests hold both implementations to); `graft_ref`
the same in batched torch ops (no host sync), which runs where Triton does not (CPU without TRITON_INTERPRET=1).

Kernel (`_graft_kernel`, grid (B,), one program per request). The sequential insertion itself, over vectors of
BLOCK_M = next_power_of_2(M) <= 64 lanes, one a node slot, in registers: token, parent, depth, real, and the mask
row packed into an int64 (node j: bit j). Set-up, on [BLOCK_M, BLOCK_M] tiles: the tree's mask rows loaded (padding
rows {root, self}), depth as row sums, parent as the ancestor one shallower, real as the link targets. Then one loop
of P x S steps (each path token loaded a step ahead): a step looks for the current node's real child with the path's
token (one block min) and, where there is none, creates it in the next free slot with the current node's row (one
block sum) plus its own bit. Last, the links (two [BLOCK_M, BLOCK_M] mins), the rows unpacked and the stores. More
than 64 nodes (MAX_NODES) run `graft_ref`.

Bytes: a request reads its tree (N*N mask bytes, 32N of int64) and paths (8PS) and writes the merged tree (M*M +
32M): 0.5 KB at the n-gram drafter's default tree (N = 1, P = 4, S = 5, M = 8), 32 KB at B = 64, nanoseconds of HBM.
So a launch costs its launch and the chain of P*S dependent steps (20 at that tree), two block reductions each: at
the default tree one warp, whose reductions are shuffles with no barrier. In CUDA graphs on an H100 it takes 2.0-12.9 µs
where the torch reference, ~150 small ops, takes 234-409 (benchmarks/bench_trie_graft.py,
results/trie_graft_h100.md). No host sync and fixed shapes: CUDA-graph capturable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from eaglet.kernels._compile_cases import TREES, CompileCase, Ptr
from eaglet.kernels._utils import is_hip, use_triton

# Trees of more nodes are merged by `graft_ref`, ~150 small ops: 0.35 ms of a 0.60 ms draft at the block drafter's
# 7/4/24 with two branches (38 nodes) on an H100, where its 30-node 7/4/16 took 0.25 (results/block_drafter_h100).
# 64 is what the packed rows hold; 64 lanes take 8 warps (at 4: 116 B of spills on sm_90 at 38 nodes, VGPR spills on
# gfx942).
MAX_NODES = 64
# n-gram branches on an EAGLE tree that eaglet's configs and runs use (docs/drafters.md, scripts/gpu_session.sh's
# eagle3+ng2): the compile cases' K.
BRANCHES = (2,)
# (K, tokens): the default drafter's n-gram branch on the block drafter's tree, deeper than the tree
# (conf/draft/block.yaml; tests/test_configs.py holds the two equal)
BLOCK_BRANCH = (1, 15)


def _check(tree, paths, extra, fallback=None) -> None:
    if len(tree) != 5:
        raise ValueError(f"tree must be (tokens, positions, next_token, next_sibling, mask), got {len(tree)} items")
    tokens, positions, next_token, next_sibling, mask = tree
    if tokens.dim() != 2 or tokens.shape[1] < 1:
        raise ValueError(f"tokens must be [B, N] with N >= 1 (the root), got shape {tuple(tokens.shape)}")
    B, N = tokens.shape
    for name, t in (("tokens", tokens), ("positions", positions), ("next_token", next_token),
                    ("next_sibling", next_sibling)):
        if tuple(t.shape) != (B, N) or t.dtype != torch.int64:
            raise ValueError(f"{name} must be [B, N] = [{B}, {N}] int64, got shape {tuple(t.shape)} {t.dtype}")
    if tuple(mask.shape) != (B, N, N) or mask.dtype != torch.bool:
        raise ValueError(f"mask must be [B, N, N] = [{B}, {N}, {N}] bool, got shape {tuple(mask.shape)} {mask.dtype}")
    if paths.dim() != 3 or paths.shape[0] != B or paths.dtype != torch.int64:
        raise ValueError(f"paths must be [B, P, S] int64 with B = {B}, got shape {tuple(paths.shape)} {paths.dtype}")
    for name, t in (("positions", positions), ("next_token", next_token), ("next_sibling", next_sibling),
                    ("mask", mask), ("paths", paths)):
        if t.device != tokens.device:
            raise ValueError(f"{name} is on {t.device}, tokens on {tokens.device}: move it to {tokens.device}")
    if not isinstance(extra, int) or isinstance(extra, bool) or extra < 0:
        raise ValueError(f"extra={extra!r} must be an int >= 0")
    if fallback is not None:
        M = N + extra
        if len(fallback) != 5:
            raise ValueError(f"fallback must be (tokens, positions, next_token, next_sibling, mask), got "
                             f"{len(fallback)} items")
        for name, t, shape, dtype in zip(("tokens", "positions", "next_token", "next_sibling", "mask"), fallback,
                                         [(B, M)] * 4 + [(B, M, M)], [torch.int64] * 4 + [torch.bool]):
            if tuple(t.shape) != shape or t.dtype != dtype or t.device != tokens.device:
                raise ValueError(f"fallback {name} must be {list(shape)} {dtype} on {tokens.device} (N + extra = {M} "
                                 f"nodes), got shape {tuple(t.shape)} {t.dtype} on {t.device}")


def graft_sequential(tree, paths: torch.Tensor, extra: int, fallback=None) -> tuple[torch.Tensor, ...]:
    """Plain-Python `graft` (the spec): per request the paths inserted one by one into the trie of the tree's real
    nodes, at most `extra` nodes created, the rest of the N + extra slots padding; the fallback's tree where none was
    created. Raises ValueError where a path's -1s are not a suffix (which `graft` and `graft_ref` assume)."""
    _check(tree, paths, extra, fallback)
    tokens, positions, next_token, next_sibling, mask = (t.tolist() for t in tree)
    B, N = len(tokens), len(tokens[0])
    M = N + extra
    out = [[] for _ in range(5)]
    for b, request in enumerate(paths.tolist()):
        tok, rows = list(tokens[b]), [list(r) + [False] * extra for r in mask[b]]
        depth = [sum(r) - 1 for r in rows]
        par = [next((j for j in range(N) if rows[i][j] and depth[j] == depth[i] - 1), 0) for i in range(N)]
        kids, stack, real = {i: [] for i in range(N)}, [0], {0}
        while stack:  # the real nodes: the root and what its links reach, children in link order
            i = stack.pop()
            c = next_token[b][i]
            while c != -1:
                kids[i].append(c)
                real.add(c)
                stack.append(c)
                c = next_sibling[b][c]
        for path in request:
            end = next((d for d, t in enumerate(path) if t < 0), len(path))
            if any(t >= 0 for t in path[end:]):
                raise ValueError(f"request {b}: path {path} has a token after a -1 (the -1s must be a suffix)")
            cur = 0
            for d, t in enumerate(path):
                hit = [k for k in kids[cur] if tok[k] == t]
                if t < 0 or not hit and len(tok) == M:
                    break
                if not hit:  # departs: a new node under cur
                    new = len(tok)
                    tok.append(t)
                    par.append(cur)
                    depth.append(d + 1)
                    rows.append([a or j == new for j, a in enumerate(rows[cur])])
                    kids[cur].append(new)
                    kids[new] = []
                    real.add(new)
                    hit = [new]
                cur = hit[0]
        if fallback is not None and len(tok) == N:  # no node created: the fallback tree as it is
            for k, t in enumerate(fallback):
                out[k].append(t[b].tolist())
            continue
        for i in range(len(tok), M):  # padding: a leaf under the root
            tok.append(0)
            par.append(0)
            depth.append(1)
            rows.append([j in (0, i) for j in range(M)])
        nt = [min((j for j in real if j > 0 and par[j] == i), default=-1) for i in range(M)]
        ns = [min((j for j in real if j > i and par[j] == par[i]), default=-1) if i in real and i > 0 else -1
              for i in range(M)]
        for k, v in enumerate((tok, [positions[b][0] + d for d in depth], nt, ns, rows)):
            out[k].append(v)
    dev = paths.device
    longs = [torch.tensor(v, dtype=torch.int64, device=dev).reshape(B, M) for v in out[:4]]  # [B, M] each
    return (*longs, torch.tensor(out[4], dtype=torch.bool, device=dev).reshape(B, M, M))  # [B, M, M]


def graft_ref(tree, paths: torch.Tensor, extra: int, fallback=None) -> tuple[torch.Tensor, ...]:
    """`graft` in batched torch ops (no host sync: CUDA-graph capturable), where Triton does not run. A path walks the
    tree's real nodes by masks over [B, P, N]; past the tree, a new node at (path p, depth d) is shared with the
    first path whose tokens 0..d equal p's; new nodes are ranked path-major by a cumsum and scattered into slots
    N.. (the first `extra` kept); a new node's mask row is its parent's plus itself (S gathers)."""
    _check(tree, paths, extra, fallback)
    tree_tokens, tree_positions, tree_next, tree_sibling, tree_mask = tree
    B, N = tree_tokens.shape
    P, S = paths.shape[1:]
    M = N + extra
    dev = paths.device
    j = torch.arange(N, device=dev)  # [N]
    # the tree's parents, depths and linked nodes (padding slots are reached by no link)
    depth = tree_mask.sum(-1) - 1  # [B, N]
    is_parent = tree_mask & (depth[:, None, :] == depth[:, :, None] - 1)  # [B, i, j]: j is i's parent
    parent = is_parent.int().argmax(-1)  # [B, N]; the root: 0
    linked = torch.zeros(B, N + 1, dtype=torch.bool, device=dev)  # [B, N+1]; column N takes the -1 links
    for link in (tree_next, tree_sibling):
        linked.scatter_(1, torch.where(link >= 0, link, N), True)
    real = linked[:, :N] | (j == 0)  # [B, N]
    # walk each path down the tree: node[b, p, d] is the tree node of its first d+1 tokens, -1 once it departs
    ok = paths >= 0  # [B, P, S]
    node = torch.full((B, P, S), -1, dtype=torch.long, device=dev)  # [B, P, S]
    cur = torch.zeros(B, P, dtype=torch.long, device=dev)  # [B, P]
    on = torch.ones(B, P, dtype=torch.bool, device=dev)  # [B, P]
    for d in range(S):
        hit = (real & (j > 0))[:, None, :] & (parent[:, None, :] == cur[:, :, None]) & (
            tree_tokens[:, None, :] == paths[:, :, d, None])  # [B, P, N]
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
    tokens = put(tree_tokens, 0, paths)  # [B, M]
    parents = put(parent, 0, up)  # [B, M]
    depths = put(depth, 1, d1)  # [B, M]
    real = put(real, False, keep)  # [B, M]
    # ancestor-or-self: the tree's rows as they are; a new node's row is its parent's plus itself (depth <= S)
    eye = torch.eye(M, dtype=torch.bool, device=dev).expand(B, M, M)  # [B, M, M]
    mask = eye | (torch.arange(M, device=dev) == 0)  # [B, M, M]: padding rows, a leaf under the root
    mask = torch.cat([torch.cat([tree_mask, mask[:, :N, N:]], 2), mask[:, N:]], 1)  # [B, M, M]
    for _ in range(S):
        mask = eye | mask.gather(1, parents[:, :, None].expand(B, M, M))  # [B, M, M]
    next_token, next_sibling = links(parents, real)  # [B, M] each
    out = (tokens, tree_positions[:, :1] + depths, next_token, next_sibling, mask)
    if fallback is None:
        return out
    none = ~keep.any(1)  # [B] no node created
    return tuple(torch.where(none.view(B, *[1] * (a.dim() - 1)), f, a) for a, f in zip(out, fallback))


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


@triton.jit
def _graft_kernel(TOK, POS, NEXT, SIB, MASK, PATHS, FB_TOK, FB_POS, FB_NEXT, FB_SIB, FB_MASK, OUT_TOK, OUT_POS,
                  OUT_NEXT, OUT_SIB, OUT_MASK, N, M, P: tl.constexpr, S: tl.constexpr, BLOCK_M: tl.constexpr,
                  HAS_FALLBACK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK_M)  # [BLOCK_M] node slots
    old = i < N  # [BLOCK_M] the tree's slots
    rows, cols = i[:, None], i[None, :]  # [BLOCK_M, 1], [1, BLOCK_M]
    # the tree's mask rows; slots past it are padding rows {root, self}
    m = tl.load(MASK + b * N * N + rows * N + cols, mask=old[:, None] & old[None, :], other=0)  # [BLOCK_M, BLOCK_M]
    m = (m != 0) | ((rows >= N) & ((cols == 0) | (cols == rows)))  # [BLOCK_M, BLOCK_M]
    dep = tl.sum(m.to(tl.int32), 1) - 1  # [BLOCK_M]; padding: 1
    is_par = m & (dep[None, :] == dep[:, None] - 1)  # [BLOCK_M, BLOCK_M]: j is i's parent
    par = tl.min(tl.where(is_par, cols, BLOCK_M), 1)  # [BLOCK_M]
    par = tl.where(par < BLOCK_M, par, 0)  # the root: 0
    # Mask rows packed, node j as bit j (BLOCK_M <= 64): a row is one int64, so a step reads and writes a lane, not a
    # tile (as [BLOCK_M, BLOCK_M] bools the loop held 184 registers a thread at BLOCK_M = 64 on sm_90).
    bit = tl.full([1, BLOCK_M], 1, tl.int64) << cols.to(tl.int64)  # [1, BLOCK_M]
    anc = tl.sum(tl.where(m, bit, 0), 1)  # [BLOCK_M] distinct bits: the sum is the OR
    nt = tl.load(NEXT + b * N + i, mask=old, other=-1)  # [BLOCK_M]
    ns = tl.load(SIB + b * N + i, mask=old, other=-1)  # [BLOCK_M]
    linked = (nt[:, None] == cols) | (ns[:, None] == cols)  # [BLOCK_M, BLOCK_M]: i links to j
    real = (i == 0) | (old & (tl.max(linked.to(tl.int32), 0) > 0))  # [BLOCK_M]
    tok = tl.load(TOK + b * N + i, mask=old, other=0)  # [BLOCK_M] int64
    # The paths inserted one by one, P*S steps of one loop, each token loaded a step ahead: unrolled, the P*S loads
    # were all issued up front and held (P = 10, S = 6: 216 registers a thread on sm_90, SGPR spills on gfx942).
    # `count` nodes exist, so the next is created in slot `count`; `cur` is the node the path has reached.
    path = PATHS + b * P * S
    t_next = tl.load(path)
    count = tl.zeros([], tl.int32) + N
    cur = tl.zeros([], tl.int32)
    alive = count >= 0  # true
    for q in range(P * S):
        d = q % S
        t = t_next
        t_next = tl.load(path + q + 1, mask=q + 1 < P * S, other=-1)
        cur = tl.where(d == 0, 0, cur)  # a path starts at the root
        go = ((d == 0) | alive) & (t >= 0)
        hit = real & (i > 0) & (par == cur) & (tok == t)  # [BLOCK_M] cur's child with token t
        h = tl.min(tl.where(hit, i, BLOCK_M), 0)
        found = go & (h < BLOCK_M)
        create = go & (h == BLOCK_M) & (count < M)
        new = create & (i == count)  # [BLOCK_M] the new node's lane, if any
        row = tl.sum(tl.where(i == cur, anc, 0), 0)  # cur's mask row
        anc = tl.where(new, row | (tl.full([], 1, tl.int64) << count.to(tl.int64)), anc)  # [BLOCK_M]
        tok = tl.where(new, t, tok)  # [BLOCK_M]
        par = tl.where(new, cur, par)  # [BLOCK_M]
        dep = tl.where(new, d + 1, dep)  # [BLOCK_M]
        real = real | new  # [BLOCK_M]
        cur = tl.where(found, h, tl.where(create, count, cur))
        count += create.to(tl.int32)
        alive = found | create
    # links among the real nodes, ascending
    child = real[None, :] & (par[None, :] == rows) & (cols > 0)  # [BLOCK_M, BLOCK_M]: j is a child of i
    first = tl.min(tl.where(child, cols, BLOCK_M), 1)  # [BLOCK_M]
    sib = real[None, :] & (par[None, :] == par[:, None]) & (cols > rows) & (real & (i > 0))[:, None]  # [BM, BM]
    nxt = tl.min(tl.where(sib, cols, BLOCK_M), 1)  # [BLOCK_M]
    pos0 = tl.load(POS + b * N)
    out = b * M + i  # [BLOCK_M]
    valid = i < M  # [BLOCK_M]
    pos = pos0 + dep.to(tl.int64)  # [BLOCK_M]
    first = tl.where(first < BLOCK_M, first, -1).to(tl.int64)  # [BLOCK_M]
    nxt = tl.where(nxt < BLOCK_M, nxt, -1).to(tl.int64)  # [BLOCK_M]
    m = ((anc[:, None] >> cols.to(tl.int64)) & 1).to(tl.int8)  # [BLOCK_M, BLOCK_M] the rows unpacked
    tile = b * M * M + rows * M + cols  # [BLOCK_M, BLOCK_M]
    if HAS_FALLBACK:  # no node created: the fallback tree as it is (a scalar choice, one program a request)
        fb = count == N
        tok = tl.where(fb, tl.load(FB_TOK + out, mask=valid, other=0), tok)
        pos = tl.where(fb, tl.load(FB_POS + out, mask=valid, other=0), pos)
        first = tl.where(fb, tl.load(FB_NEXT + out, mask=valid, other=-1), first)
        nxt = tl.where(fb, tl.load(FB_SIB + out, mask=valid, other=-1), nxt)
        m = tl.where(fb, tl.load(FB_MASK + tile, mask=valid[:, None] & valid[None, :], other=0), m)
    tl.store(OUT_TOK + out, tok, mask=valid)
    tl.store(OUT_POS + out, pos, mask=valid)
    tl.store(OUT_NEXT + out, first, mask=valid)
    tl.store(OUT_SIB + out, nxt, mask=valid)
    tl.store(OUT_MASK + tile, m, mask=valid[:, None] & valid[None, :])


def _launch_meta(N: int, extra: int, P: int, S: int, hip: bool = False) -> dict:
    """Constexprs and warps for N + extra nodes and P paths of S tokens: the [BLOCK_M, BLOCK_M] tiles of the set-up
    and the links at 16 elements a thread at most, so one warp up to BLOCK_M = 16 (the n-gram drafter's default tree
    is 8 slots), whose step reductions are then shuffles without a barrier."""
    block_m = max(triton.next_power_of_2(N + extra), 2)
    meta = dict(P=P, S=S, BLOCK_M=block_m, num_warps=max(1, block_m * block_m // 512))
    if hip and block_m >= 32:
        # MI300: one program a request, whose occupancy does not matter. Unhinted, LLVM reported 7 waves per SIMD
        # where kernels/_aot.py's model (VGPRs, SGPRs, LDS) gives 8 (64 lanes; 32 with a fallback tree's five more
        # pointers), a mismatch tests/portability fails on; hinted, LLVM reports the hint, which is what that test
        # checks of hinted binaries
        meta["waves_per_eu"] = 4
    return meta


def graft(tree, paths: torch.Tensor, extra: int, fallback=None) -> tuple[torch.Tensor, ...]:
    """tree (tokens [B, N], positions [B, N], next_token [B, N], next_sibling [B, N] int64, mask [B, N, N] bool: a
    DraftTree) and paths [B, P, S] int64 (-1 past a path's end) -> the merged tree of N + extra nodes, the same five
    tensors; fallback (the same five of N + extra nodes, or None): the tree of a request whose paths create no node.
    Module docstring for the exact semantics. Triton on GPU (and on CPU under TRITON_INTERPRET=1) up to MAX_NODES =
    64 nodes, else `graft_ref`. No host sync: CUDA-graph capturable."""
    _check(tree, paths, extra, fallback)
    if not use_triton(*tree, paths) or tree[0].shape[1] + extra > MAX_NODES:
        return graft_ref(tree, paths, extra, fallback)
    tokens, positions, next_token, next_sibling, mask = (t.contiguous() for t in tree)
    paths = paths.contiguous()
    (B, N), P, S = tokens.shape, paths.shape[1], paths.shape[2]
    M = N + extra
    dev = tokens.device
    out = [torch.empty(B, M, dtype=torch.int64, device=dev) for _ in range(4)]  # [B, M] each
    out_mask = torch.empty(B, M, M, dtype=torch.bool, device=dev)  # [B, M, M]
    fb = out if fallback is None else [t.contiguous() for t in fallback]  # unread without one
    if B > 0:
        _graft_kernel[(B,)](tokens, positions, next_token, next_sibling, mask.view(torch.int8), paths, *fb[:4],
                            fb[4].view(torch.int8) if fallback is not None else out_mask.view(torch.int8), *out,
                            out_mask.view(torch.int8), N, M, HAS_FALLBACK=fallback is not None,
                            **_launch_meta(N, extra, P, S, is_hip()))
    return (*out, out_mask)


def launched_shapes(trees) -> list[tuple[str, object, int, int, int, int]]:
    """(label, tree, N, P, S, extra) of each graft eaglet launches at these TreeSpecs, where it fits MAX_NODES (else
    `graft_ref` runs): the n-gram drafter's (the bare root, N = 1; P = topk matches of S = steps tokens; extra =
    num_draft_tokens - 1), `BRANCHES` n-gram branches of S = steps tokens on the tree's EAGLE tree (N =
    num_draft_tokens, P = K, extra = K * S) and, on the block tree, `BLOCK_BRANCH`'s. The compile cases and the
    benchmarks of the graft and of `build_tree_pair` take their shapes from here."""
    out = []
    for t in trees:
        N = t.num_draft_tokens
        shapes = [(f"{t.name} ngram", 1, t.topk, t.steps, N - 1)]
        shapes += [(f"{t.name} eagle+ngram{k}", N, k, t.steps, k * t.steps) for k in BRANCHES]
        if t.name == "block":
            k, depth = BLOCK_BRANCH
            shapes.append((f"{t.name} block+ngram{k}x{depth}", N, k, depth, k * depth))
        out += [(label, t, n, P, S, extra) for label, n, P, S, extra in shapes if n + extra <= MAX_NODES]
    return out


def compile_cases(hip: bool) -> list[CompileCase]:
    """kernels/_compile_cases.py: every graft of `launched_shapes(TREES)`; the same on both vendors."""
    i64, i8 = Ptr(torch.int64), Ptr(torch.int8)
    # the n-gram drafter's graft onto the bare root has no fallback; branches on a model drafter's tree have its
    # widened tree (engine/drafters/ngram.py)
    return [CompileCase.of(_graft_kernel, (label,), TOK=i64, POS=i64, NEXT=i64, SIB=i64, MASK=i8, PATHS=i64,
                           FB_TOK=i64, FB_POS=i64, FB_NEXT=i64, FB_SIB=i64, FB_MASK=i8, OUT_TOK=i64, OUT_POS=i64,
                           OUT_NEXT=i64, OUT_SIB=i64, OUT_MASK=i8, N=N, M=N + extra, HAS_FALLBACK=N > 1,
                           **_launch_meta(N, extra, P, S, hip))
            for label, t, N, P, S, extra in launched_shapes(TREES)]
