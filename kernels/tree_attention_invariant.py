"""The invariant tree-attention kernel (`tree_attention(..., invariant=True)`, `_inv_fwd_kernel` +
`_inv_merge_kernel`): a query's output depends only on its own keys, never on the batch, the tree around it or the
grid's split count, so a tree node's output is bit-identical to the output of the same token decoded alone at the
same position.

A node at depth d with prefix P sees the logical sequence 0..P+d: the prefix, then its ancestors in depth order (the
j-th allowed new key is its depth-j ancestor: new tokens are numbered parents first, and key j of the new tokens is at
position P + j). Every program holds a tile of 16 or 64 query rows (TOKS tokens of G heads; `_inv_rows` picks per
call: an MMA row's bits do not depend on the tile's rows, and the row sums are `fixed_sum1`'s, in an order written
out) and attends one leaf: `_INVARIANT_CHUNK` logical positions, in `_INVARIANT_BLOCK_N`-key tiles from the leaf's
start, from the sentinel state. A leaf whose keys are in every row's sequence (below the prefix; causal: below the
tile's first token) is attended once for the tile; a leaf that reaches the tree is attended by the tile's tree leaves,
each with its ancestors gathered into depth order, for its own rows and its ancestors' (their keys past their depth
masked). Each leaf's unnormalised state (m, l, acc) goes to the workspace; the merge combines a row's leaves by one
fixed tree, blocks of 16 leaves each a binary tree of adjacent pairs (`_inv_comb`, explicit FMAs), the blocks folded
in order, so a verify, a decode step and a prefill reduce alike.

Its cost against the split-KV kernel (results/tree_attention_notes.md): about the same at decode and at short
verifies, more at wide B=8 verifies and long prefixes: the leaves stay 128 keys whatever the batch, so a B=8 verify
still writes and merges more partial states than the split-KV kernel's plan, and the leaf that holds a verify's tree
is attended once per tree leaf of the tile.
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl

from eaglet.kernels._compile_cases import CompileCase, model_shapes
from eaglet.kernels._fixed_order import fixed_sum1
from eaglet.kernels._utils import is_hip
from eaglet.kernels.tree_attention_plan import case_calls, case_inputs, cdiv, check_call, merge_case, out_ptr

# The leaf length (a constant, so leaf boundaries never move with the batch or the context bound), and its key tile
# (fixed: tile boundaries must not move with an autotuner's choice).
_INVARIANT_CHUNK = 128
_INVARIANT_BLOCK_N = 64
_INVARIANT_BLOCK_N_HIP = 32  # gfx942, 8 waves: 64-key tiles spilled the 8B's 64-row tile (256 VGPRs); 32 take 154
# The leaf tree: blocks of 16 leaves (`_inv_node`: 2k keys), each a binary tree of adjacent pairs, the blocks folded
# in order. The forward stores every leaf: a program forming the nodes of several leaves walks them as a serial chain
# of dependent loads (slower in all but one case: results/tree_attention_notes.md).
# Packed rows a merge program combines, and its warps: the lowest sum over the sweep's cases
# (benchmarks/probes/sweep_tree_attention.py; results/tree_attention_notes.md).
_INVARIANT_MERGE_ROWS = 8
_INVARIANT_MERGE_WARPS = 8
# Query rows of a tile, chosen per call (`_inv_rows`; at most _INVARIANT_CHUNK: a causal tile's tokens cross one leaf
# end): 64, or 16 where a request's rows of a KV head fit in 16 and the call has this many (request, KV head) pairs,
# where the smaller tile's registers buy occupancy (the 8B's B=8 decode; 64 rows win the verifies:
# results/tree_attention_notes.md). A row's bits do not depend on the tile: an MMA row's do not
# (benchmarks/probes/mma_rows_probe.py: 16-128 rows, 4 and 8 warps), and the row sums are `fixed_sum1`'s.
_INVARIANT_ROWS = (16, 64)
_INVARIANT_SMALL_PAIRS = 64


@triton.jit
def _inv_tiles(acc, l_i, m_i, q, K, V, pt_row, kvh, lo, hi, row_hi, prefix, anc, qk_scale, stride_kp, stride_ks,
               stride_kh, stride_vp, stride_vs, stride_vh, GATHER: tl.constexpr, HEAD_DIM: tl.constexpr,
               PAGE_SIZE: tl.constexpr, DOT_DTYPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_NK: tl.constexpr):
    """Online softmax of the tile's rows over logical key positions [lo, hi) in BLOCK_N tiles from lo, row r's keys
    those below row_hi[r] (<= hi). GATHER: logical position prefix + e is the depth-e ancestor of the sub-program's
    token, new key anc[e] (a tree token's sequence, anc [BLOCK_NK] its keys in depth order); else a logical position is
    where it sits in the pool (the prefix, a causal row's keys). A key past a row's end gives p = 0 whatever K/V
    hold there (finite: written ancestors, or zero past hi), so the row's sums are those of its own sequence."""
    offs_d = tl.arange(0, HEAD_DIM)  # [D]
    ROWS: tl.constexpr = q.shape[0]
    for start in range(lo, hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)  # [BLOCK_N] logical key positions
        kv_ok = pos < hi  # [BLOCK_N]
        phys = pos  # [BLOCK_N] pool positions
        if GATHER and start + BLOCK_N > prefix:  # the tile reaches the ancestors
            e = tl.minimum(tl.maximum(pos - prefix, 0), BLOCK_NK - 1)  # [BLOCK_N] depth (clamped for the gather)
            phys = tl.where(pos >= prefix, prefix + tl.gather(anc, e, 0), pos)  # [BLOCK_N]
        page = tl.load(pt_row + phys // PAGE_SIZE, mask=kv_ok, other=0)  # [BLOCK_N]
        slot_k = page.to(tl.int64) * stride_kp + (phys % PAGE_SIZE) * stride_ks  # [BLOCK_N]
        slot_v = page.to(tl.int64) * stride_vp + (phys % PAGE_SIZE) * stride_vs  # [BLOCK_N]
        k = tl.load(K + kvh * stride_kh + slot_k[:, None] + offs_d[None, :], mask=kv_ok[:, None], other=0.0)
        v = tl.load(V + kvh * stride_vh + slot_v[:, None] + offs_d[None, :], mask=kv_ok[:, None], other=0.0)
        qk = tl.dot(q, tl.trans(k.to(DOT_DTYPE)), input_precision="ieee")  # [ROWS, BLOCK_N]
        qk = tl.where(pos[None, :] < row_hi[:, None], qk * qk_scale, float("-inf"))  # [ROWS, BLOCK_N]
        m_new = tl.maximum(m_i, tl.max(qk, 1))  # [ROWS] (`_softmax_update`, its row sum in a fixed order)
        p = tl.math.exp2(qk - m_new[:, None])  # [ROWS, BLOCK_N]
        alpha = tl.math.exp2(m_i - m_new)  # [ROWS]
        l_i = l_i * alpha + fixed_sum1(p, ROWS, BLOCK_N)
        acc = tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE), acc * alpha[:, None], input_precision="ieee")  # [ROWS, D]
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _inv_comb(m_a, l_a, acc_a, m_b, l_b, acc_b):
    """The combine of two unnormalised softmax states of adjacent key ranges, a before b, elementwise over any leading
    shape S: m [S] (running max, log2 units), l [S] (sum of exp2), acc [S, D]. The sentinel state of an empty range
    (m = -1e30, l = 0, acc = 0) is an exact identity on either side: exp2(0) is 1 and exp2(-1e30 - m) is 0."""
    m = tl.maximum(m_a, m_b)  # [S]
    a = tl.math.exp2(m_a - m)  # [S]
    b = tl.math.exp2(m_b - m)  # [S]
    l = tl.fma(l_a, a, l_b * b)  # [S]; explicit FMAs: no contraction left to the compiler
    acc = tl.fma(acc_a, tl.expand_dims(a, -1), acc_b * tl.expand_dims(b, -1))  # [S, D]
    return m, l, acc


@triton.jit
def _inv_leaf(q, K, V, pt_row, kvh, lo, hi, row_hi, prefix, anc, qk_scale, stride_kp, stride_ks, stride_kh,
              stride_vp, stride_vs, stride_vh, GATHER: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
              DOT_DTYPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_NK: tl.constexpr):
    """The unnormalised state (m, l, acc) of the leaf of logical keys [lo, hi) (`_inv_tiles`), from the sentinel."""
    ROWS: tl.constexpr = q.shape[0]
    m = tl.full([ROWS], -1.0e30, dtype=tl.float32)  # [ROWS]
    l = tl.zeros([ROWS], dtype=tl.float32)  # [ROWS]
    acc = tl.zeros([ROWS, HEAD_DIM], dtype=tl.float32)  # [ROWS, D]
    acc, l, m = _inv_tiles(acc, l, m, q, K, V, pt_row, kvh, lo, hi, row_hi, prefix, anc, qk_scale, stride_kp,
                           stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, GATHER, HEAD_DIM, PAGE_SIZE,
                           DOT_DTYPE, BLOCK_N, BLOCK_NK)
    return m, l, acc


@triton.jit
def _inv_shared(q, K, V, pt_row, kvh, lo, qk_scale, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
                HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, DOT_DTYPE: tl.constexpr, BLOCK_N: tl.constexpr,
                CHUNK: tl.constexpr):
    """A leaf every row of the tile sees whole: keys [lo, lo + CHUNK) at their pool positions."""
    ROWS: tl.constexpr = q.shape[0]
    rows_hi = lo + CHUNK + tl.zeros([ROWS], dtype=tl.int32)  # [ROWS]
    anc = tl.arange(0, 16)  # [16] unused without GATHER
    return _inv_leaf(q, K, V, pt_row, kvh, lo, lo + CHUNK, rows_hi, lo, anc, qk_scale, stride_kp, stride_ks,
                     stride_kh, stride_vp, stride_vs, stride_vh, False, HEAD_DIM, PAGE_SIZE, DOT_DTYPE, BLOCK_N, 16)


@triton.jit
def _inv_store(m, l, acc, O, pid_bh, slot, n_slots, N, b, kvh, Hkv, tok, grp, rows, GROUP: tl.constexpr,
               HEAD_DIM: tl.constexpr, SPLIT: tl.constexpr):
    """The state of leaf-tree slot `slot` for `rows` [ROWS] of the tile. SPLIT: into the workspace, acc [B*Hkv, S, N,
    G, D] then (m, l) [B*Hkv, S, N, G, 2]; else (one leaf: the row's whole sequence) its output acc / l."""
    offs_d = tl.arange(0, HEAD_DIM)  # [D]
    if SPLIT:
        part_row = ((pid_bh * n_slots + slot) * N + tok) * GROUP + grp  # [ROWS] row of [B*Hkv, S, N, G]
        tl.store(O + part_row[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=rows[:, None])
        ML = O + tl.num_programs(2) * n_slots * N * GROUP * HEAD_DIM  # after every slot's acc
        tl.store(ML + 2 * part_row, m, mask=rows)
        tl.store(ML + 2 * part_row + 1, l, mask=rows)
    else:
        o = acc / tl.where(l > 0, l, 1.0)[:, None]  # [ROWS, D]
        out_row = (b * N + tok) * (Hkv * GROUP) + kvh * GROUP + grp  # [ROWS] row of [B, N, Hq]
        tl.store(O + out_row[:, None] * HEAD_DIM + offs_d[None, :], o.to(O.dtype.element_ty), mask=rows[:, None])


@triton.jit
def _inv_fwd_kernel(
    Q, K, V, PT, PL, MASK, O, qk_scale, n_slots, tail, N, NK, Hkv,
    stride_qb, stride_qn, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
    stride_ptb, stride_mb, stride_mi,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, HAS_MASK: tl.constexpr,
    SPLIT: tl.constexpr, DOT_DTYPE: tl.constexpr, ROWS: tl.constexpr, TOKS: tl.constexpr, TOKS_P2: tl.constexpr,
    HEAD_TILES: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_NK: tl.constexpr, CHUNK: tl.constexpr,
):
    """Invariant mode (module doc). Grid (row tiles, n_slots + tail * TOKS, B * Hkv). A row tile is ROWS query rows:
    TOKS tokens of GROUP heads (GROUP <= ROWS), or ROWS heads of one token (HEAD_TILES tiles a token). Leaf s is the
    logical key positions [s * CHUNK, (s + 1) * CHUNK) of each row's sequence. Program j < n_slots of axis 1 attends
    leaf j for the whole tile where every token of the tile sees it whole (below the prefix; causal: below the tile's
    first token). The others are sub-program t of one of the first `tail` leaves from there on (the only leaves the
    tile's tokens do not share): token t's own keys (its ancestors gathered into depth order) with the whole tile's
    q, stored for the rows of t and of its ancestors in the tile that no later token of the tile descends from (an
    ancestor's sequence is the start of t's: it is attended with its rows' keys past their own depth masked), so only
    the tile's leaves work (causal: its last token). O: the workspace of `_inv_store`."""
    tile = tl.program_id(0)
    j = tl.program_id(1)
    pid_bh = tl.program_id(2)
    tok_tile = tile // HEAD_TILES
    b = pid_bh // Hkv
    kvh = pid_bh % Hkv
    prefix = tl.load(PL + b)
    GT: tl.constexpr = GROUP // HEAD_TILES  # heads of one token in a tile
    rr = tl.arange(0, ROWS)  # [ROWS] the tile's rows
    c = rr // GT  # [ROWS] each row's token, counted in the tile
    first = tok_tile * TOKS  # the tile's first token
    tok = first + c  # [ROWS] new-token index of each row
    grp = (tile % HEAD_TILES) * GT + rr % GT  # [ROWS] query head within the KV head's group
    row_ok = (c < TOKS) & (tok < N)  # [ROWS]
    offs_d = tl.arange(0, HEAD_DIM)  # [D]
    q_ptrs = Q + b * stride_qb + tok[:, None] * stride_qn + (kvh * GROUP + grp)[:, None] * stride_qh  # [ROWS, 1]
    pt_row = PT + b * stride_ptb
    if HAS_MASK:  # keys [0, shared_end) are in every row's sequence
        shared_end = prefix
    else:
        shared_end = prefix + first + 1
    n_shared = shared_end // CHUNK  # leaves every row of the tile sees whole
    if j < n_slots:
        if j < n_shared:
            q = tl.load(q_ptrs + offs_d[None, :], mask=row_ok[:, None], other=0.0).to(DOT_DTYPE)  # [ROWS, D]
            m, l, acc = _inv_shared(q, K, V, pt_row, kvh, j * CHUNK, qk_scale, stride_kp, stride_ks, stride_kh,
                                    stride_vp, stride_vs, stride_vh, HEAD_DIM, PAGE_SIZE, DOT_DTYPE, BLOCK_N, CHUNK)
            _inv_store(m, l, acc, O, pid_bh, j, n_slots, N, b, kvh, Hkv, tok, grp, row_ok, GROUP, HEAD_DIM, SPLIT)
    else:
        sub = (j - n_slots) // tail
        leaf = n_shared + (j - n_slots) % tail
        lo = leaf * CHUNK
        t = first + sub  # the token this sub-program attends for
        jj = tl.arange(0, BLOCK_NK)  # [BLOCK_NK] new-key index
        if HAS_MASK:
            # The tile's mask rows: each token's depth and each key's owner (the last tile token whose sequence holds
            # it). Key j is token j when the call writes its own keys (NK == N); else no token serves another.
            a = tl.arange(0, TOKS_P2)  # [TOKS_P2] tokens, counted in the tile
            a_ok = (a < TOKS) & (first + a < N)  # [TOKS_P2]
            blk = tl.load(MASK + b * stride_mb + (first + a)[:, None] * stride_mi + jj[None, :],
                          mask=a_ok[:, None] & (jj < NK)[None, :], other=0) != 0  # [TOKS_P2, BLOCK_NK]
            depth_r = tl.gather(tl.sum(blk.to(tl.int32), 1) - 1, tl.minimum(c, TOKS_P2 - 1), 0)  # [ROWS]
            owner_j = tl.max(tl.where(blk, a[:, None], -1), 0)  # [BLOCK_NK]
            owner_r = tl.gather(owner_j, tl.minimum(tok, BLOCK_NK - 1), 0)  # [ROWS]
            owner_r = tl.where(NK == N, owner_r, c)  # [ROWS]
            t_keys = tl.load(MASK + b * stride_mb + t * stride_mi + jj, mask=jj < tl.where(t < N, NK, 0), other=0) != 0
            anc = tl.sort(tl.where(t_keys, jj, BLOCK_NK + jj))  # [BLOCK_NK] t's ancestors-or-self, root first
            row_hi = tl.minimum(lo + CHUNK, prefix + depth_r + 1)  # [ROWS] row sequence [0, P + depth]
            row_st = row_ok & (owner_r == sub) & (row_hi > lo)  # [ROWS]
        else:  # causal: the tile's last token holds every row's sequence
            anc = jj
            row_hi = tl.minimum(lo + CHUNK, prefix + tok + 1)  # [ROWS]
            last = tl.minimum(N - first, TOKS) - 1  # the tile's last token, counted in the tile
            row_st = row_ok & (rr * 0 + sub == last) & (row_hi > lo)  # [ROWS]
        hi = tl.max(tl.where(row_st, row_hi, lo), 0)
        if (leaf < n_slots) & (hi > lo):
            q = tl.load(q_ptrs + offs_d[None, :], mask=row_ok[:, None], other=0.0).to(DOT_DTYPE)  # [ROWS, D]
            m, l, acc = _inv_leaf(q, K, V, pt_row, kvh, lo, hi, row_hi, prefix, anc, qk_scale, stride_kp, stride_ks,
                                  stride_kh, stride_vp, stride_vs, stride_vh, HAS_MASK, HEAD_DIM, PAGE_SIZE, DOT_DTYPE,
                                  BLOCK_N, BLOCK_NK)
            _inv_store(m, l, acc, O, pid_bh, leaf, n_slots, N, b, kvh, Hkv, tok, grp, row_st, GROUP, HEAD_DIM, SPLIT)


@triton.jit
def _inv_slot(WS, ML, rows, s, n_used, stride_s, HEAD_DIM: tl.constexpr):
    """Leaf s's state (m, l [R], acc [R, D]) of the rows [R] (slot 0 of each in the workspace; stride_s between
    slots), the sentinel past a row's leaves."""
    ok = s < n_used  # [R]
    p = rows + s * stride_s  # [R]
    m = tl.load(ML + 2 * p, mask=ok, other=-1.0e30)  # [R]
    l = tl.load(ML + 2 * p + 1, mask=ok, other=0.0)  # [R]
    acc = tl.load(WS + p[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :], mask=ok[:, None], other=0.0)
    return m, l, acc


@triton.jit
def _inv_node(WS, ML, rows, s, n_used, stride_s, HEAD_DIM: tl.constexpr, SIZE: tl.constexpr):
    """The tree node of leaves s .. s + SIZE - 1 (SIZE a power of two): the nodes of its two halves combined, down to
    single leaves; SIZE 16 is one block of the leaf tree. Unrolled at compile time."""
    if SIZE == 1:
        m, l, acc = _inv_slot(WS, ML, rows, s, n_used, stride_s, HEAD_DIM)
    else:
        m0, l0, a0 = _inv_node(WS, ML, rows, s, n_used, stride_s, HEAD_DIM, SIZE // 2)
        m1, l1, a1 = _inv_node(WS, ML, rows, s + SIZE // 2, n_used, stride_s, HEAD_DIM, SIZE // 2)
        m, l, acc = _inv_comb(m0, l0, a0, m1, l1, a1)
    return m, l, acc


@triton.jit
def _inv_merge_kernel(WS, PL, MASK, OUT, n_slots, N, NK, Hkv, stride_mb, stride_mi,
                      GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HAS_MASK: tl.constexpr, BLOCK_NK: tl.constexpr,
                      CHUNK: tl.constexpr, ROWS: tl.constexpr):
    """Invariant mode: ROWS packed rows of one (request, KV head), each row's leaves [0, cdiv(its sequence length,
    CHUNK)) combined by the fixed tree (module doc): blocks of 16 leaves, each a binary tree of adjacent pairs
    (`_inv_node`, elementwise over the rows: no layout conversion), folded in order from the sentinel. A block past
    a row's leaves is all sentinels (the identity), so a row's bits do not depend on ROWS or on its neighbours."""
    pid = tl.program_id(0)
    pid_bh = tl.program_id(1)
    ML = WS + tl.num_programs(1) * n_slots * N * GROUP * HEAD_DIM
    b = pid_bh // Hkv
    kvh = pid_bh % Hkv
    r = pid * ROWS + tl.arange(0, ROWS)  # [ROWS] packed rows of this (request, KV head)
    r_ok = r < N * GROUP  # [ROWS]
    tok = r // GROUP  # [ROWS]
    grp = r % GROUP  # [ROWS]
    prefix = tl.load(PL + b)
    if HAS_MASK:
        jj = tl.arange(0, BLOCK_NK)  # [BLOCK_NK]
        allowed = tl.load(MASK + b * stride_mb + tok[:, None] * stride_mi + jj[None, :],
                          mask=r_ok[:, None] & (jj < NK)[None, :], other=0) != 0  # [ROWS, BLOCK_NK]
        length = prefix + tl.sum(allowed.to(tl.int32), 1)  # [ROWS]
    else:
        length = prefix + tok + 1  # [ROWS]
    n_used = tl.where(r_ok, tl.cdiv(length, CHUNK), 0)  # [ROWS]
    offs_d = tl.arange(0, HEAD_DIM)  # [D]
    row0 = pid_bh * n_slots * N * GROUP + r  # [ROWS] slot 0 of each row in [B*Hkv, S, N, G]
    m = tl.full([ROWS], -1.0e30, dtype=tl.float32)  # [ROWS]
    l = tl.zeros([ROWS], dtype=tl.float32)  # [ROWS]
    acc = tl.zeros([ROWS, HEAD_DIM], dtype=tl.float32)  # [ROWS, D]
    for s0 in range(0, tl.max(n_used, 0), 16):
        mb, lb, ab = _inv_node(WS, ML, row0, s0, n_used, N * GROUP, HEAD_DIM, 16)  # [ROWS], [ROWS], [ROWS, D]
        m, l, acc = _inv_comb(m, l, acc, mb, lb, ab)
    out = acc / tl.where(l > 0, l, 1.0)[:, None]  # [ROWS, D]
    out_row = (b * N + tok) * (Hkv * GROUP) + kvh * GROUP + grp  # [ROWS] row of [B, N, Hq]
    tl.store(OUT + out_row[:, None] * HEAD_DIM + offs_d[None, :], out.to(OUT.dtype.element_ty), mask=r_ok[:, None])



def _inv_rows(b_hkv: int, n: int, group: int) -> int:
    """The row tile of an invariant call of b_hkv (request, KV head) pairs, n tokens of `group` heads."""
    small, wide = _INVARIANT_ROWS
    return small if n * group <= small and b_hkv >= _INVARIANT_SMALL_PAIRS else wide


def _inv_meta(group: int, n: int, nk: int, hip: bool, rows: int) -> tuple[dict, dict]:
    """The invariant kernels' meta-parameters for `group` query heads a KV head, n query tokens and nk new keys:
    (`_inv_fwd_kernel`'s, `_inv_merge_kernel`'s). `rows`-row tiles of TOKS tokens, at most n (HEAD_TILES tiles of one
    token's heads for larger groups; a row's bits do not depend on where in the tile it sits, nor on whether its leaf
    is attended for the tile or for a token of the tile), the fixed leaf and key tile. MI300 (`hip`): one software
    stage and 32-key tiles, as the split-KV kernel's AMD configs (`tree_attention_splitkv._fwd_configs`), and 8 waves
    (in 4, SmolLM2's verify of 60 tokens spilled 7 SGPRs on gfx942); the same for every call (a row's sums follow the
    layout)."""
    block_nk = max(16, triton.next_power_of_2(nk))
    toks = max(1, min(rows // group, n))
    fwd = dict(ROWS=rows, TOKS=toks, TOKS_P2=triton.next_power_of_2(toks), HEAD_TILES=max(1, group // rows),
               BLOCK_N=_INVARIANT_BLOCK_N_HIP if hip else _INVARIANT_BLOCK_N, BLOCK_NK=block_nk, CHUNK=_INVARIANT_CHUNK,
               num_warps=8 if hip else 4, num_stages=1 if hip else 2)
    merge = dict(BLOCK_NK=block_nk, CHUNK=_INVARIANT_CHUNK, ROWS=_INVARIANT_MERGE_ROWS,
                 num_warps=_INVARIANT_MERGE_WARPS)
    return fwd, merge


@functools.lru_cache(maxsize=512)
def prepare(q, k, v, pt, pl, mask, sm_scale, max_prefix_len, interpret: bool, hip: bool | None = None) -> tuple:
    """One call's launch recipe from its inputs' `meta`s (`check_call`), as the split-KV kernel's `prepare` returns
    it: fixed leaves and key tiles, no autotuning. Cached on the metas. None when an input needs .contiguous() first.
    hip: the vendor to plan for (`compile_cases` asks for GPUs this machine lacks); None: the running torch."""
    c = check_call(q, k, v, pt, pl, mask, sm_scale, max_prefix_len, interpret)
    if c is None:
        return None
    group, N, NK = c.group, c.N, c.nk
    if not (group <= 16 or group % 16 == 0):
        raise ValueError(f"invariant tree attention needs Hq/Hkv <= 16 or a multiple of 16, got {group}")
    hip = is_hip() if hip is None else hip
    fwd_meta, merge_meta = _inv_meta(group, N, NK, hip, _inv_rows(c.B * c.Hkv, N, group))
    toks, tiles = fwd_meta["TOKS"], cdiv(N, fwd_meta["TOKS"]) * fwd_meta["HEAD_TILES"]
    n_slots = cdiv(c.kv_max, _INVARIANT_CHUNK)  # leaves
    split = n_slots > 1
    # the leaves a tile's tokens do not share: their keys past shared_end, at most NK (a tree; causal: the
    # tile's other tokens, fewer than its rows), over at most one leaf boundary more than their length
    tail = min(n_slots, (cdiv(NK, _INVARIANT_CHUNK) if c.has_mask else 1) + 1)
    fwd_args = (c.qk_scale, n_slots, tail, N, NK, c.Hkv, *c.strides)
    fwd_kw = dict(GROUP=group, HEAD_DIM=c.D, PAGE_SIZE=c.page_size, HAS_MASK=c.has_mask, SPLIT=split,
                  DOT_DTYPE=c.dot_dtype, **fwd_meta)
    grid = (tiles, n_slots + tail * toks, c.B * c.Hkv)
    merge = None
    if split:
        merge = (_inv_merge_kernel, (cdiv(N * group, merge_meta["ROWS"]), c.B * c.Hkv),
                 (n_slots, N, NK, c.Hkv, *c.mask_strides),
                 dict(GROUP=group, HEAD_DIM=c.D, HAS_MASK=c.has_mask, **merge_meta), True)
    ws_numel = c.B * c.Hkv * n_slots * N * group * (c.D + 2) if split else 0  # acc, then (m, l), a leaf slot a row
    return _inv_fwd_kernel, grid, fwd_args, fwd_kw, ws_numel, merge


def _call_cases(s, B: int, N: int, tree: bool, prefix: int, hip: bool, used_by: str) -> list[CompileCase]:
    """The launches of one bf16 call (`case_inputs`, max_prefix_len = prefix) on an AMD GPU when `hip`, else an
    NVIDIA one: the forward, then the merge where the keys split."""
    metas, ptrs = case_inputs(s, B, N, tree, prefix)
    kernel, _, fwd_args, fwd_kw, _, merge = prepare(*metas, None, prefix, False, hip)
    args = dict(zip(kernel.arg_names, ptrs + (out_ptr(merge is not None),) + fwd_args), **fwd_kw)
    return [CompileCase.of(kernel, (used_by,), **args)] + ([merge_case(merge, ptrs, used_by)] if merge else [])


def compile_cases(hip: bool) -> list[CompileCase]:
    """kernels/_compile_cases.py: `_call_cases` on the target at both models' heads, for each of `case_calls`."""
    return [case for s in model_shapes() for label, B, N, tree, prefix in case_calls()
            for case in _call_cases(s, B, N, tree, prefix, hip, f"{s.name} {label} invariant")]
