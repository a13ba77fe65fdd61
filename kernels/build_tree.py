"""Build the EAGLE-2 draft tree from the drafted candidates: tokens, parents, positions,
sibling/child links and the tree-attention mask, in one launch for the batch.

Candidate layout (flattened per request), C = K1 + (S-1)*K*K:
  * step 0: K1 children of the root, flat indices 0..K1-1 (depth 1); K1 = K (EAGLE-2), or more
    (`root_children`: the block drafter's root, whose siblings cost one row's top-k);
  * step i >= 1: K*K candidates at flat indices K1+(i-1)*K*K .. (depth i+1), the K children
    of each of the K nodes step i-1 kept (step 0 keeps its first K).
`cand_parents` holds each candidate's parent as a flat candidate index (-1: the root).

Selection: the N-1 best candidates by cumulative log-probability, ties to the lower flat
index. Scores decrease along a path and a parent has a lower flat index than its children,
so a parent always ranks above its child and the selection is a closed tree. Nodes are the
selected candidates in ascending flat index (parents before children) after the root
(node 0, the last verified token). Scores must not be NaN.

Mask formats (`MaskFormat`):
  FULL       flat bool, per request N rows of seq_len+N columns (prefix all True, then
             ancestor-or-self), requests concatenated; sized by the host int seq_lens_sum.
  QLEN_ONLY  [B, N, N] bool ancestor-or-self (what `tree_attention` consumes).
  BITPACKED  [B, N] int32, bit j of row i set iff node j is an ancestor-or-self of i (N <= 32).

`build_tree_pair` builds two trees of different sizes from the same candidates in the same launch (grid (B, 2), the
second program of a request writing the second tree).
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from eaglet.kernels._compile_cases import TREES, CompileCase, Ptr
from eaglet.kernels._utils import is_hip, use_triton


class MaskFormat(str, enum.Enum):
    FULL = "full"
    QLEN_ONLY = "qlen_only"
    BITPACKED = "bitpacked"


_FORMAT_CODE = {MaskFormat.FULL: 0, MaskFormat.QLEN_ONLY: 1, MaskFormat.BITPACKED: 2}


class DraftTree(NamedTuple):
    draft_tokens: torch.Tensor  # [B, N] int64, node 0 = root token
    parents: torch.Tensor  # [B, N] int64, tree index of the parent, -1 for the root
    positions: torch.Tensor  # [B, N] int64, seq_lens + depth
    tree_mask: torch.Tensor  # FULL: [N*seq_lens_sum + B*N*N] bool; QLEN_ONLY: [B, N, N] bool; BITPACKED: [B, N] int32
    retrieve_next_token: torch.Tensor  # [B, N] int64, first child or -1
    retrieve_next_sibling: torch.Tensor  # [B, N] int64, next sibling or -1


def num_candidates(topk: int, steps: int, root_children: int | None = None) -> int:
    """C = K1 + (S-1)*K*K, the flattened EAGLE-2 candidate count per request (K1: root_children, default K)."""
    return (root_children or topk) + (steps - 1) * topk * topk


def random_candidates(
    batch: int,
    topk: int,
    steps: int,
    vocab: int = 1000,
    generator: torch.Generator | None = None,
    tie_levels: int | None = None,
    root_children: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Synthetic EAGLE-2 candidates (CPU) for tests and benchmarks: (cand_scores [B, C] float32,
    cand_tokens [B, C] int64 (distinct among siblings), cand_parents [B, C] int64). Each step
    expands the K best nodes of the previous step, as the drafter does. `tie_levels` draws
    log-probs from {0, -1/q, ..., -(q-1)/q} instead, so that scores tie (child == parent too).
    root_children: the root's K1 >= K children (the layout's step 0), of which the K best are expanded."""
    B, K = batch, topk
    K1 = root_children or K
    if vocab < K1:
        raise ValueError(f"vocab={vocab} must be >= {K1} (siblings carry distinct tokens)")

    def logp(*shape):  # per-edge log-probabilities, <= 0
        if tie_levels:
            return -torch.randint(0, tie_levels, shape, generator=generator).float() / tie_levels
        return torch.rand(shape, generator=generator).clamp_min(1e-6).log()

    def sibling_tokens(parents: int, n: int = K):  # [B, parents*n], top-n of a random distribution: distinct
        return torch.rand(B, parents, vocab, generator=generator).topk(n, dim=-1).indices.reshape(B, parents * n)

    scores, tokens = [logp(B, K1)], [sibling_tokens(1, K1)]  # step 0: children of the root
    parents = [torch.full((B, K1), -1, dtype=torch.int64)]
    # [B, K] the root's children expanded: all of them, or the K best of K1
    top = torch.arange(K).expand(B, K) if K1 == K else scores[0].topk(K, dim=1).indices
    kept, kept_score = top, scores[0].gather(1, top)  # [B, K] flat index / score of kept nodes
    for i in range(1, steps):
        base = K1 + (i - 1) * K * K
        s = (kept_score[:, :, None] + logp(B, K, K)).reshape(B, K * K)  # [B, K*K] cumulative
        scores.append(s)
        tokens.append(sibling_tokens(K))
        parents.append(kept.repeat_interleave(K, dim=1))  # [B, K*K]
        top = s.topk(K, dim=1).indices  # [B, K]
        kept, kept_score = base + top, s.gather(1, top)
    return torch.cat(scores, 1), torch.cat(tokens, 1), torch.cat(parents, 1)


def _parse_format(mask_format: MaskFormat | str) -> MaskFormat:
    try:
        return MaskFormat(mask_format.lower() if isinstance(mask_format, str) else mask_format)
    except ValueError:
        raise ValueError(
            f"mask_format={mask_format!r} is not one of {[f.value for f in MaskFormat]}"
        ) from None


def _check_args(
    cand_scores, cand_tokens, cand_parents, root_tokens, seq_lens, num_draft_tokens, topk, steps,
    mask_format, seq_lens_sum, root_children=None,
) -> MaskFormat:
    if topk < 1 or steps < 1:
        raise ValueError(f"topk={topk} and steps={steps} must both be >= 1")
    if root_children is not None and root_children < topk:
        raise ValueError(f"root_children={root_children} must be >= topk={topk} (depth 1 keeps {topk} of them)")
    if num_draft_tokens < 1:
        raise ValueError(f"num_draft_tokens={num_draft_tokens} must be >= 1 (the root)")
    C = num_candidates(topk, steps, root_children)
    if num_draft_tokens - 1 > C:
        raise ValueError(
            f"num_draft_tokens={num_draft_tokens} needs {num_draft_tokens - 1} candidates but "
            f"topk={topk}, steps={steps}, root_children={root_children} give only {C}: use num_draft_tokens "
            f"<= {C + 1}"
        )
    if cand_scores.dim() != 2:
        raise ValueError(f"cand_scores must be [B, C], got shape {tuple(cand_scores.shape)}")
    B = cand_scores.shape[0]
    for name, t, dtype in (
        ("cand_scores", cand_scores, torch.float32),
        ("cand_tokens", cand_tokens, torch.int64),
        ("cand_parents", cand_parents, torch.int64),
    ):
        if tuple(t.shape) != (B, C):
            raise ValueError(
                f"{name} must be [B, C] = [{B}, {C}] (C = K1 + (S-1)*K*K), got {tuple(t.shape)}"
            )
        if t.dtype != dtype:
            raise ValueError(f"{name} must be {dtype}, got {t.dtype}")
    for name, t, dtype in (("root_tokens", root_tokens, torch.int64), ("seq_lens", seq_lens, torch.int32)):
        if tuple(t.shape) != (B,):
            raise ValueError(f"{name} must be [B] = [{B}], got {tuple(t.shape)}")
        if t.dtype != dtype:
            raise ValueError(f"{name} must be {dtype}, got {t.dtype}")
    for name, t in (("cand_tokens", cand_tokens), ("cand_parents", cand_parents),
                    ("root_tokens", root_tokens), ("seq_lens", seq_lens)):
        if t.device != cand_scores.device:
            raise ValueError(f"{name} is on {t.device}, cand_scores on {cand_scores.device}: move them together")
    fmt = _parse_format(mask_format)
    if fmt == MaskFormat.BITPACKED and num_draft_tokens > 32:
        raise ValueError(
            f"mask_format=BITPACKED holds one int32 per row: num_draft_tokens={num_draft_tokens} > 32; "
            "use QLEN_ONLY"
        )
    if fmt == MaskFormat.FULL:
        if seq_lens_sum is None:
            raise ValueError("mask_format=FULL needs seq_lens_sum (host int, sum of seq_lens) to size the mask")
        # The sum is a host int so that no device value is read; check it where that is free.
        if not seq_lens.is_cuda and int(seq_lens.sum()) != seq_lens_sum:
            raise ValueError(f"seq_lens_sum={seq_lens_sum} != seq_lens.sum()={int(seq_lens.sum())}")
    return fmt


def _alloc_mask(fmt: MaskFormat, B: int, N: int, seq_lens_sum: int | None, device) -> torch.Tensor:
    if fmt == MaskFormat.FULL:
        return torch.empty(N * seq_lens_sum + B * N * N, dtype=torch.bool, device=device)
    if fmt == MaskFormat.QLEN_ONLY:
        return torch.empty(B, N, N, dtype=torch.bool, device=device)
    return torch.empty(B, N, dtype=torch.int32, device=device)


def _depth(c: int, topk: int, root_children: int | None = None) -> int:
    k1 = root_children or topk
    return 1 if c < k1 else 2 + (c - k1) // (topk * topk)


def build_tree_ref(
    cand_scores: torch.Tensor,
    cand_tokens: torch.Tensor,
    cand_parents: torch.Tensor,
    root_tokens: torch.Tensor,
    seq_lens: torch.Tensor,
    num_draft_tokens: int,
    topk: int,
    steps: int,
    mask_format: MaskFormat | str = MaskFormat.QLEN_ONLY,
    seq_lens_sum: int | None = None,
    root_children: int | None = None,
) -> DraftTree:
    """Pure-Python reference (the spec). Same arguments and outputs as `build_tree`."""
    fmt = _check_args(cand_scores, cand_tokens, cand_parents, root_tokens, seq_lens,
                      num_draft_tokens, topk, steps, mask_format, seq_lens_sum, root_children)
    B, C = cand_scores.shape
    N = num_draft_tokens
    scores, toks, cpar = cand_scores.tolist(), cand_tokens.tolist(), cand_parents.tolist()
    roots, lens = root_tokens.tolist(), seq_lens.tolist()
    out = {k: [[0] * N for _ in range(B)] for k in ("tok", "par", "pos", "nxt", "sib")}
    anc = [[[False] * N for _ in range(N)] for _ in range(B)]
    for b in range(B):
        best = sorted(range(C), key=lambda c: (-scores[b][c], c))[: N - 1]
        sel = sorted(best)
        tree_of = {c: i + 1 for i, c in enumerate(sel)}
        par = [-1]
        for c in sel:
            p = cpar[b][c]
            if p >= 0 and p not in tree_of:
                raise ValueError(
                    f"request {b}: candidate {c} kept without its parent {p}: scores must decrease along a path"
                )
            par.append(tree_of[p] if p >= 0 else 0)
        out["tok"][b] = [roots[b]] + [toks[b][c] for c in sel]
        out["par"][b] = par
        out["pos"][b] = [lens[b]] + [lens[b] + _depth(c, topk, root_children) for c in sel]
        for i in range(N):
            out["nxt"][b][i] = min((j for j in range(N) if par[j] == i), default=-1)
            out["sib"][b][i] = -1 if i == 0 else min((j for j in range(i + 1, N) if par[j] == par[i]), default=-1)
            j = i
            while j >= 0:
                anc[b][i][j] = True
                j = par[j]
    dev = cand_scores.device
    as_long = lambda x: torch.tensor(x, dtype=torch.int64, device=dev).reshape(B, N)  # noqa: E731
    if fmt == MaskFormat.QLEN_ONLY:
        mask = torch.tensor(anc, dtype=torch.bool, device=dev).reshape(B, N, N)  # [B, N, N]
    elif fmt == MaskFormat.BITPACKED:
        rows = [[sum(1 << j for j in range(N) if anc[b][i][j]) for i in range(N)] for b in range(B)]
        rows = [[v - (1 << 32) if v >= (1 << 31) else v for v in r] for r in rows]  # bit 31 is the sign
        mask = torch.tensor(rows, dtype=torch.int32, device=dev).reshape(B, N)  # [B, N]
    else:
        flat = []
        for b in range(B):
            for i in range(N):
                flat += [True] * lens[b] + anc[b][i]
        mask = torch.tensor(flat, dtype=torch.bool, device=dev)  # [N*seq_lens_sum + B*N*N]
    return DraftTree(as_long(out["tok"]), as_long(out["par"]), as_long(out["pos"]), mask,
                     as_long(out["nxt"]), as_long(out["sib"]))


@triton.jit
def _score_key(s):
    """int32 key with the order of the float32 scores (NaN excluded; -0.0 and 0.0 tie)."""
    bits = s.to(tl.int32, bitcast=True)
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # negative floats: flip the magnitude bits
    return tl.where(s == 0.0, 0, key)


@triton.jit
def _build_tree_kernel(
    scores_ptr, cand_tokens_ptr, cand_parents_ptr, root_ptr, seq_lens_ptr, ints_ptr, mask_ptr, ints2_ptr, mask2_ptr,
    C,
    N: tl.constexpr, K: tl.constexpr, K1: tl.constexpr, S: tl.constexpr, FORMAT: tl.constexpr,
    N_PAD: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_L: tl.constexpr,
    N2: tl.constexpr, N2_PAD: tl.constexpr, BLOCK_L2: tl.constexpr,
):
    """Grid (B, 1): the tree of N nodes; grid (B, 2) with N2 > 0: program (b, 1) builds request b's tree of N2 nodes
    from the same candidates into the second outputs, beside program (b, 0) (`build_tree_pair`). A tree's five int64
    outputs are one [5, B, N] buffer (ints_ptr): one allocation and one argument a tree, not five."""
    b = tl.program_id(0)
    if N2 == 0:
        _build_one(b, scores_ptr, cand_tokens_ptr, cand_parents_ptr, root_ptr, seq_lens_ptr, ints_ptr, mask_ptr, C,
                   N, K, K1, S, FORMAT, N_PAD, BLOCK_C, BLOCK_L)
    elif tl.program_id(1) == 0:
        _build_one(b, scores_ptr, cand_tokens_ptr, cand_parents_ptr, root_ptr, seq_lens_ptr, ints_ptr, mask_ptr, C,
                   N, K, K1, S, FORMAT, N_PAD, BLOCK_C, BLOCK_L)
    else:
        _build_one(b, scores_ptr, cand_tokens_ptr, cand_parents_ptr, root_ptr, seq_lens_ptr, ints2_ptr, mask2_ptr, C,
                   N2, K, K1, S, FORMAT, N2_PAD, BLOCK_C, BLOCK_L2)


@triton.jit
def _build_one(
    b, scores_ptr, cand_tokens_ptr, cand_parents_ptr, root_ptr, seq_lens_ptr, ints_ptr, mask_ptr,
    C,
    N: tl.constexpr, K: tl.constexpr, K1: tl.constexpr, S: tl.constexpr, FORMAT: tl.constexpr,
    N_PAD: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_L: tl.constexpr,
):
    """Request b's tree of N nodes (one program) into ints [5, B, N]: tokens, parents, positions, next token, next
    sibling."""
    row = b.to(tl.int64) * C
    nodes = tl.num_programs(0).to(tl.int64) * N  # B * N: one output of the five
    tokens_ptr = ints_ptr
    parents_ptr = ints_ptr + nodes
    positions_ptr = ints_ptr + 2 * nodes
    next_token_ptr = ints_ptr + 3 * nodes
    next_sibling_ptr = ints_ptr + 4 * nodes
    t = tl.arange(0, N_PAD)  # tree indices
    valid = t < N
    is_node = valid & (t >= 1)

    # Select by threshold instead of sorting: find T = the (N-1)-th largest score key with a
    # 16-ary search over the int32 key space (8 rounds of 15 counts), keep keys > T plus the
    # lowest-index ties at T. O(8*16*C) compares on keys loaded once (BLOCK_C >= C); a pairwise
    # rank would be O(C^2) (C = 510 for 6/10). Keys loaded once: B=64, 6/10/64 in 14.6 µs a graph
    # replay, half the time of keys reloaded each round (results/tree_verify_h200.md).
    c = tl.arange(0, BLOCK_C)
    in_c = c < C
    key = _score_key(tl.load(scores_ptr + row + c, mask=in_c, other=0.0))  # [BLOCK_C]
    lo = tl.full([], -2147483648, tl.int64)
    k16 = tl.arange(0, 16).to(tl.int64)
    for r in tl.static_range(8):
        thr = lo + k16 * (1 << (28 - 4 * r))  # [16], thr[0] = lo keeps the invariant count(key >= lo) >= N-1
        cnt = tl.sum(((key[None, :] >= thr[:, None]) & in_c[None, :]).to(tl.int32), axis=1)  # [16]
        lo = tl.max(tl.where(cnt >= N - 1, thr, lo), 0)  # counts fall with thr: the last that has enough
    above = (key > lo) & in_c  # [BLOCK_C]
    tie = (key == lo) & in_c  # [BLOCK_C]
    n_ties = N - 1 - tl.sum(above.to(tl.int32), 0)  # ties at T to keep, lowest flat index first
    kept = above | (tie & (tl.cumsum(tie.to(tl.int32), 0) <= n_ties))  # [BLOCK_C]
    tidx = tl.cumsum(kept.to(tl.int32), 0)  # [BLOCK_C] tree index (ascending flat order, root = 0)

    # node -> candidate: scatter through the parents output as scratch, CTA barrier, gather back.
    # (A register scatter would be an [N, C] reduction: 32k elements for 64/510.)
    tl.store(parents_ptr + b.to(tl.int64) * N + tidx, c.to(tl.int64), mask=kept)
    tl.debug_barrier()
    node_cand = tl.load(parents_ptr + b.to(tl.int64) * N + t, mask=is_node, other=-1)  # [N_PAD]
    tl.debug_barrier()  # every thread has read the scratch before parents is written below

    cand = tl.where(is_node, node_cand, 0)  # [N_PAD] safe gather index
    root = tl.load(root_ptr + b)
    tok = tl.load(cand_tokens_ptr + row + cand, mask=is_node, other=0)  # [N_PAD]
    tok = tl.where(t == 0, root, tok)
    pcand = tl.load(cand_parents_ptr + row + cand, mask=is_node, other=-1)  # [N_PAD]
    # Parent's tree index: the node holding the parent candidate; no match (pcand = -1) -> root 0.
    is_par = is_node[None, :] & (node_cand[None, :] == pcand[:, None])  # [N_PAD, N_PAD]
    par = tl.sum(tl.where(is_par, t[None, :], 0), axis=1)  # [N_PAD]
    par = tl.where(t == 0, -1, par)
    depth = tl.where(cand < K1, 1, 2 + (cand - K1) // (K * K))  # [N_PAD]
    depth = tl.where(t == 0, 0, depth)
    seq_len = tl.load(seq_lens_ptr + b)

    out = b.to(tl.int64) * N + t
    tl.store(tokens_ptr + out, tok, mask=valid)
    tl.store(parents_ptr + out, par.to(tl.int64), mask=valid)
    tl.store(positions_ptr + out, (seq_len + depth).to(tl.int64), mask=valid)
    child = valid[None, :] & (par[None, :] == t[:, None])  # [i, j]: j is a child of i
    first = tl.min(tl.where(child, t[None, :], N_PAD), axis=1)  # [N_PAD]
    tl.store(next_token_ptr + out, tl.where(first < N_PAD, first, -1).to(tl.int64), mask=valid)
    sib = valid[None, :] & (par[None, :] == par[:, None]) & (t[None, :] > t[:, None])  # [N_PAD, N_PAD]
    nxt = tl.min(tl.where(sib, t[None, :], N_PAD), axis=1)  # [N_PAD]
    tl.store(next_sibling_ptr + out, tl.where(nxt < N_PAD, nxt, -1).to(tl.int64), mask=valid)

    # Ancestor-or-self: self, the root, then climb parents; depth <= S leaves <= S-1 non-root ancestors.
    anc = (t[None, :] == t[:, None]) | (t[None, :] == 0)  # [N_PAD, N_PAD]
    up = par
    for _ in range(S - 1):
        at = t[None, :] == up[:, None]  # [N_PAD, N_PAD]
        anc = anc | at
        up = tl.sum(tl.where(at, par[None, :], 0), axis=1)  # parent of up (root -> -1 -> 0: harmless)

    both = valid[:, None] & valid[None, :]
    if FORMAT == 1:  # QLEN_ONLY
        tl.store(mask_ptr + b.to(tl.int64) * N * N + t[:, None] * N + t[None, :], anc.to(tl.int8), mask=both)
    elif FORMAT == 2:  # BITPACKED: distinct bits, so the int64 sum is the OR; truncation keeps bit 31 as sign
        bits = tl.where(anc & valid[None, :], tl.full([N_PAD, N_PAD], 1, tl.int64) << t[None, :].to(tl.int64), 0)
        tl.store(mask_ptr + out, tl.sum(bits, axis=1).to(tl.int32), mask=valid)
    else:  # FULL: request b starts after N*(seq_len+N) entries of each earlier request
        before = tl.zeros([], dtype=tl.int64)
        for b0 in range(0, b, BLOCK_L):
            bb = b0 + tl.arange(0, BLOCK_L)
            before += tl.sum(tl.load(seq_lens_ptr + bb, mask=bb < b, other=0).to(tl.int64), 0)
        width = seq_len + N  # row length
        base = mask_ptr + N * (before + b.to(tl.int64) * N) + t[:, None].to(tl.int64) * width  # [N_PAD, 1]
        for l0 in range(0, seq_len, BLOCK_L):
            col = l0 + tl.arange(0, BLOCK_L)
            ones = tl.full([N_PAD, BLOCK_L], 1, tl.int8)
            tl.store(base + col[None, :], ones, mask=valid[:, None] & (col < seq_len)[None, :])
        tl.store(base + seq_len + t[None, :], anc.to(tl.int8), mask=both)


def build_tree(
    cand_scores: torch.Tensor,
    cand_tokens: torch.Tensor,
    cand_parents: torch.Tensor,
    root_tokens: torch.Tensor,
    seq_lens: torch.Tensor,
    num_draft_tokens: int,
    topk: int,
    steps: int,
    mask_format: MaskFormat | str = MaskFormat.QLEN_ONLY,
    seq_lens_sum: int | None = None,
    root_children: int | None = None,
) -> DraftTree:
    """Select the N-1 best candidates per request and emit the draft tree (one launch, no host sync).

    cand_scores [B, C] float32, cand_tokens [B, C] int64, cand_parents [B, C] int64,
    root_tokens [B] int64, seq_lens [B] int32; C = K1 + (steps-1)*topk**2, K1 = root_children or topk.
    """
    fmt = _check_args(cand_scores, cand_tokens, cand_parents, root_tokens, seq_lens,
                      num_draft_tokens, topk, steps, mask_format, seq_lens_sum, root_children)
    if not use_triton(cand_scores, cand_tokens, cand_parents, root_tokens, seq_lens):
        return build_tree_ref(cand_scores, cand_tokens, cand_parents, root_tokens, seq_lens,
                              num_draft_tokens, topk, steps, fmt, seq_lens_sum, root_children)
    return _launch(cand_scores, cand_tokens, cand_parents, root_tokens, seq_lens, (num_draft_tokens,), topk, steps,
                   fmt, seq_lens_sum, root_children)[0]


def build_tree_pair(
    cand_scores: torch.Tensor,
    cand_tokens: torch.Tensor,
    cand_parents: torch.Tensor,
    root_tokens: torch.Tensor,
    seq_lens: torch.Tensor,
    num_draft_tokens: int,
    num_wide: int,
    topk: int,
    steps: int,
    mask_format: MaskFormat | str = MaskFormat.QLEN_ONLY,
    seq_lens_sum: int | None = None,
    root_children: int | None = None,
) -> tuple[DraftTree, DraftTree]:
    """`build_tree` at num_draft_tokens and at num_wide from the same candidates, in one launch: each request's two
    trees are built by two programs side by side (the drafters' tree and its widened fallback, engine/drafter.py;
    two single-program launches took 2 x 6.4 µs of a 155 µs draft graph on an H100, results/widened_h100). Masks
    QLEN_ONLY or BITPACKED: FULL's two bodies in one kernel spill MI300's scalar registers (12-14 at 44 nodes)."""
    if _parse_format(mask_format) == MaskFormat.FULL:
        raise ValueError("build_tree_pair builds QLEN_ONLY or BITPACKED masks; for FULL call build_tree once a size")
    fmt = _check_args(cand_scores, cand_tokens, cand_parents, root_tokens, seq_lens,
                      num_draft_tokens, topk, steps, mask_format, seq_lens_sum, root_children)
    _check_args(cand_scores, cand_tokens, cand_parents, root_tokens, seq_lens, num_wide, topk, steps, mask_format,
                seq_lens_sum, root_children)
    args = (cand_scores, cand_tokens, cand_parents, root_tokens, seq_lens)
    if not use_triton(*args):
        return tuple(build_tree_ref(*args, n, topk, steps, fmt, seq_lens_sum, root_children)
                     for n in (num_draft_tokens, num_wide))
    return _launch(*args, (num_draft_tokens, num_wide), topk, steps, fmt, seq_lens_sum, root_children)


def _launch(cand_scores, cand_tokens, cand_parents, root_tokens, seq_lens, sizes: tuple[int, ...], topk: int,
            steps: int, fmt: MaskFormat, seq_lens_sum: int | None,
            root_children: int | None = None) -> tuple[DraftTree, ...]:
    """One launch of `_build_tree_kernel`, grid (B, len(sizes)): a tree of each size (at most two) a request."""
    B, C = cand_scores.shape
    dev = cand_scores.device
    trees, args = [], []
    for N in sizes:
        ints = torch.empty(5, B, N, dtype=torch.int64, device=dev)  # [5, B, N]: the kernel's one output buffer
        tokens, parents, positions, next_token, next_sibling = ints.unbind(0)  # [B, N] each
        mask = _alloc_mask(fmt, B, N, seq_lens_sum, dev)
        trees.append(DraftTree(tokens, parents, positions, mask, next_token, next_sibling))
        args += [ints, mask.view(torch.int8) if mask.dtype == torch.bool else mask]
    if B == 0:
        return tuple(trees)
    _build_tree_kernel[(B, len(sizes))](
        cand_scores.contiguous(), cand_tokens.contiguous(), cand_parents.contiguous(),
        root_tokens.contiguous(), seq_lens.contiguous(), *args[:2], *(args[2:] or args[:2]),  # one tree: unused
        C, **_launch_meta(sizes[0], topk, steps, fmt, is_hip(), sizes[1] if len(sizes) > 1 else 0,
                          root_children),
    )
    return tuple(trees)


def _launch_meta(N: int, topk: int, steps: int, fmt: MaskFormat, hip: bool = False, N2: int = 0,
                 root_children: int | None = None) -> dict:
    """Blocks and warps for a tree of N tokens (and one of N2 beside it, 0: none) from topk / steps (/ root_children)
    candidates in mask format fmt."""
    n_pad, n2_pad = (max(triton.next_power_of_2(n), 2) for n in (N, N2))
    # all candidates of a request in registers
    block_c = max(triton.next_power_of_2(num_candidates(topk, steps, root_children)), 16)
    # FULL's prefix rows are stored as [N_PAD, BLOCK_L] tiles of ones: at N_PAD = 64 (6/10/60) a [64, 128] tile
    # spills 24 B a thread on sm_90 (ptxas: 128 registers), a [64, 64] tile takes 80 registers and does not
    block_l, block_l2 = (min(128, 4096 // p) for p in (n_pad, n2_pad))
    widest = max(n_pad, n2_pad if N2 else 0)
    meta = dict(N=N, K=topk, K1=root_children or topk, S=steps, FORMAT=_FORMAT_CODE[fmt], N_PAD=n_pad,
                BLOCK_C=block_c, BLOCK_L=block_l, N2=N2, N2_PAD=n2_pad, BLOCK_L2=block_l2,
                num_warps=8 if block_c >= 512 or widest >= 64 else 4)
    if hip and widest == 64 and (fmt == MaskFormat.FULL or N2):
        # MI300, one program a request: at 44 nodes (a wide tree widened by n-gram branches; the pair's wide tree)
        # LLVM allocated 101+ SGPRs and reported 6 waves per SIMD where kernels/_aot.py's model gives 7, a mismatch
        # tests/portability fails on; hinted, LLVM reports the hint (as trie_graft's 64-lane kernel)
        meta["waves_per_eu"] = 4
    return meta


def compile_cases(hip: bool) -> list[CompileCase]:
    """kernels/_compile_cases.py: every tree in every mask format it allows (BITPACKED: N <= 32); the same on both
    models (the tree is all the kernel sees) and vendors but for MI300's hint at 64-node full masks."""
    from eaglet.kernels.trie_graft import launched_shapes  # (importing it above would cycle)

    i64 = Ptr(torch.int64)
    cases = []
    # each tree alone, and beside itself widened by the n-gram branches grafted onto it (the fallback's pair,
    # engine/drafter.py)
    pairs = [(t, 0) for t in TREES]
    pairs += [(t._replace(name=f"{t.name} + widened"), N + extra) for _, t, N, _, _, extra in launched_shapes(TREES)
              if N > 1 and N + extra <= num_candidates(t.topk, t.steps, t.root_children) + 1]
    for t, N2 in pairs:
        for fmt in MaskFormat:
            if (fmt == MaskFormat.BITPACKED and max(t.num_draft_tokens, N2) > 32) or (N2 and fmt == MaskFormat.FULL):
                continue
            mask = Ptr(torch.int32 if fmt == MaskFormat.BITPACKED else torch.int8)
            cases.append(CompileCase.of(
                _build_tree_kernel, (f"{t.name} {fmt.value}",), scores_ptr=Ptr(torch.float32), cand_tokens_ptr=i64,
                cand_parents_ptr=i64, root_ptr=i64, seq_lens_ptr=Ptr(torch.int32), ints_ptr=i64, mask_ptr=mask,
                ints2_ptr=i64, mask2_ptr=mask, C=num_candidates(t.topk, t.steps, t.root_children),
                **_launch_meta(t.num_draft_tokens, t.topk, t.steps, fmt, hip, N2, t.root_children)))
    return cases
