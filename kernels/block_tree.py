"""The block drafter's EAGLE-2 tree from its one forward, in S + 1 launches (one per depth, and one to finish):

    grow_tree(base, dep_in, dep_out, roots, S, K, d2t=None, root_children=None) -> (scores, tokens, parents) [B, C]

base [B, S, Vd] fp32: the block rows' logits over draft ids; the dependency term of a candidate after parent token p
(a target id) is dep_in[p] @ dep_out, dep_in [V, r] and dep_out [r, Vd] fp32 (models/block_head.py). Depth 1's K1
candidates (root_children, default K) are the top K1 of log_softmax(base[:, 0] + term(root)), its first K kept; each
later depth's are, for each of the K kept nodes, its K best children by log_softmax(base[:, d] + term(node)), scored
by cumulative log-prob, the K best of the K*K kept (ties: lower index). Outputs in `build_tree`'s candidate layout
(C = K1 + (S-1)*K*K; kernels/build_tree.py), tokens as target ids (id + d2t[id] with a draft vocabulary).
`grow_tree_ref` is the spec, in torch.

Why K1 > K: the root's siblings are one row's top-k, where another child a node at every depth is K more rows' (CPU
tau on 20 MT-bench turns, results/block_trees_h100/README.md: 16 root children with K = 4 took 5/4/16 from 3.79 to
3.90, 16 children a node everywhere to 3.93; MT-bench on an H100, results/root_children_h100: 3.57 to 3.67).

Why one kernel: in torch with the top-k and expand kernels a depth is five launches (the parents' gather, a batched
GEMM whose broadcast copies the base row, the two top-k launches, the expansion), ~35 for S = 7; at SmolLM2's size
that was ~10 µs of GPU time a depth, 73 of a 196 µs propose (results/draft_phase_h100.md).

Launch d (grid requests x chunks of BLOCK_V draft ids) computes depth d's logits: each program multiplies its K parents'
dep_in rows by its columns of dep_out ([K, r] @ [r, BLOCK_V], an fp32 tl.dot over a 16-row tile, its least M), adds the
base row and keeps, per parent row, the chunk's max, sum of exp and K best packed keys (kernels/topk.py). Launch d + 1's
programs each first merge those partials (depth d's log-sum-exp and children, the K best by cumulative score): every
program repeats the merge, a few hundred keys, which costs less than a launch between them. Its first program writes
depth d's candidates and kept nodes. The last launch only merges.
"""

from __future__ import annotations

import itertools

import torch
import triton
import triton.language as tl

from eaglet.kernels._compile_cases import TREES, CompileCase, Ptr, model_shapes
from eaglet.kernels._utils import use_triton
from eaglet.kernels.build_tree import num_candidates
from eaglet.kernels.draft_expand import expand_step_ref
from eaglet.kernels.topk import _EMPTY, _decode_keys, _keys, _top_keys, topk_logprobs_ref

# Above this K the reference runs: a program holds K x K cumulative scores, K rows of a chunk and K x chunks x K
# keys; at K = 10 over SmolLM2's 49,152 ids they spill (tests/portability). Timed up to K = 4.
MAX_K = 8
# The root's children: 16 passes of a row max over each chunk, then over the chunks' 16 best (16 cost ~11 µs a tree
# over 32,000 ids on an H100: results/root_children_h100).
MAX_ROOT_CHILDREN = 16
# Keys one merge holds in registers (parents x chunks x K): BLOCK_V grows with the vocabulary to stay under it.
_MERGE_KEYS = 8192


def grow_tree_ref(base, dep_in, dep_out, roots, S: int, K: int, d2t=None, root_children: int | None = None):
    """Torch reference (the spec; module doc): per depth the children's logits base[:, d] + dep_in[parents] @ dep_out,
    `topk_logprobs_ref`, and `expand_step_ref`'s selection."""
    B = roots.shape[0]
    dev = roots.device
    K1 = root_children or K
    C = num_candidates(K, S, K1)
    scores = torch.empty(B, C, dtype=torch.float32, device=dev)  # [B, C]
    tokens = torch.empty(B, C, dtype=torch.long, device=dev)  # [B, C]
    parents = torch.empty(B, C, dtype=torch.long, device=dev)  # [B, C]

    def children(d, par):  # [B, n] target ids -> [B, n, Vd] fp32
        return base[:, d, None].float() + dep_in[par] @ dep_out

    lp1, tok1 = topk_logprobs_ref(children(0, roots[:, None])[:, 0], K1)  # [B, K1] each, draft ids
    if d2t is not None:
        tok1 = tok1 + d2t[tok1]  # [B, K1]
    scores[:, :K1], tokens[:, :K1], parents[:, :K1] = lp1, tok1, -1
    cur_lp, cur_tok = lp1[:, :K], tok1[:, :K]  # [B, K] each: the K best of the K1, kept
    cur_flat = torch.arange(K, device=dev).expand(B, K)  # [B, K]
    h = torch.zeros(B, K, 0, device=dev)  # [B, K, 0] no hidden state
    mask = torch.zeros(B, K, 0, dtype=torch.bool, device=dev)  # [B, K, 0] no draft mask
    for d in range(1, S):
        lp, tk = topk_logprobs_ref(children(d, cur_tok), K)  # [B, K, K] each
        cur_lp, cur_tok, cur_flat, _, _ = expand_step_ref(cur_lp, lp, tk, cur_flat, mask, h, scores, tokens,
                                                           parents, K1 + (d - 1) * K * K, d2t, keep_ancestors=False)
    return scores, tokens, parents


@triton.jit
def _top_keys_rows(key, K: tl.constexpr, KP: tl.constexpr):
    """The K largest of each row of key [ROWS, N] (distinct per row but for _EMPTY), largest first -> [ROWS, KP]."""
    t = tl.arange(0, KP)  # [KP]
    best = tl.full([key.shape[0], KP], _EMPTY, tl.int64)  # [ROWS, KP]
    for r in range(K):
        top = tl.max(key, 1)  # [ROWS]
        best = tl.where(t[None, :] == r, top[:, None], best)  # [ROWS, KP]
        key = tl.where(key == top[:, None], _EMPTY, key)  # [ROWS, N]
    return best


@triton.jit
def _level_kernel(BASE, stride_bb, stride_bs, DEP_IN, DEP_OUT, D2T, ROOTS, PMAX, PSUM, PKEY, RKEY, ST_LP, ST_TOK,
                  ST_FLAT, SCORES, TOKENS, PARENTS, level, B, Vd, NC, C,
                  R: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, K1: tl.constexpr, K1P: tl.constexpr,
                  HAS_D2T: tl.constexpr, MERGE: tl.constexpr, MERGE_ROOT: tl.constexpr, COMPUTE: tl.constexpr,
                  ROWS: tl.constexpr,
                  BLOCK_V: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_CK: tl.constexpr, BLOCK_CK1: tl.constexpr):
    """Grid (B, NC). MERGE: depth `level - 1`'s partials into its candidates and kept nodes (MERGE_ROOT: it is depth 1,
    the root's children); COMPUTE: depth `level`'s logits and partials after the kept nodes (level 0: the root).
    Partials PMAX / PSUM [S, B, K, NC], PKEY [S, B, K, NC, K] (level 0's keys: RKEY [B, NC, K1]); kept nodes
    ST_* [S, B, K]."""
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    t = tl.arange(0, KP)  # [KP] a kept node, or a child rank
    kept = t < K
    first = (tl.zeros([KP], tl.int32) + c) == 0  # [KP] the program that writes the candidates and kept nodes
    cur_tok = tl.zeros([KP], tl.int64)
    cs = tl.arange(0, BLOCK_C)  # [BLOCK_C] a chunk
    if MERGE_ROOT:  # depth 1: the root's K1 best children are the candidates, their first K the kept nodes
        m_c = tl.load(PMAX + b * K * NC + cs, mask=cs < NC, other=float("-inf"))  # [BLOCK_C] (depth 0, row 0)
        s_c = tl.load(PSUM + b * K * NC + cs, mask=cs < NC, other=0.0)  # [BLOCK_C]
        m = tl.max(m_c, 0)
        lse = m + tl.log(tl.sum(s_c * tl.exp(m_c - m), 0))
        k1 = tl.arange(0, BLOCK_CK1)  # [BLOCK_CK1] chunk-major keys
        key = tl.load(RKEY + b * NC * K1 + k1, mask=k1 < NC * K1, other=_EMPTY)  # [BLOCK_CK1]
        val, ids = _decode_keys(_top_keys(key, K1, K1P))  # [K1P] each, largest first
        t1 = tl.arange(0, K1P)  # [K1P] a child of the root
        ok1 = t1 < K1
        lp1 = val - lse  # [K1P]
        if HAS_D2T:
            ids += tl.load(D2T + ids, mask=ok1, other=0)
        w1 = ok1 & ((tl.zeros([K1P], tl.int32) + c) == 0)  # [K1P] the program that writes the candidates
        tl.store(SCORES + b * C + t1, lp1, mask=w1)
        tl.store(TOKENS + b * C + t1, ids, mask=w1)
        tl.store(PARENTS + b * C + t1, tl.full([K1P], -1, tl.int64), mask=w1)
        pick = t[:, None] == t1[None, :]  # [KP, K1P] kept node i is child i
        cur_lp = tl.sum(tl.where(pick, lp1[None, :], 0.0), 1)  # [KP]
        cur_tok = tl.sum(tl.where(pick, ids[None, :], 0), 1)  # [KP]
        cur_flat = t.to(tl.int64)  # [KP]
        tl.store(ST_LP + b * K + t, cur_lp, mask=kept & first)  # depth 0's slot of the kept nodes
        tl.store(ST_TOK + b * K + t, cur_tok, mask=kept & first)
        tl.store(ST_FLAT + b * K + t, cur_flat, mask=kept & first)
    elif MERGE:  # after the kept nodes of depth p - 1: each one's K best children, then the K best by cumulative score
        p = level - 1
        cell = (p * B + b) * K + t  # [KP] the partials' row of each parent
        io = kept[:, None] & (cs < NC)[None, :]  # [KP, BLOCK_C]
        m_c = tl.load(PMAX + cell[:, None] * NC + cs[None, :], mask=io, other=float("-inf"))  # [KP, BLOCK_C]
        s_c = tl.load(PSUM + cell[:, None] * NC + cs[None, :], mask=io, other=0.0)  # [KP, BLOCK_C]
        m = tl.max(m_c, 1)  # [KP]
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        lse = m + tl.log(tl.where(kept, tl.sum(s_c * tl.exp(m_c - m_safe[:, None]), 1), 1.0))  # [KP]
        kc = tl.arange(0, BLOCK_CK)  # [BLOCK_CK]
        key = tl.load(PKEY + cell[:, None] * NC * K + kc[None, :], mask=kept[:, None] & (kc < NC * K)[None, :],
                      other=_EMPTY)  # [KP, BLOCK_CK]
        val, ids = _decode_keys(_top_keys_rows(key, K, KP))  # [KP, KP] each: parent row x child rank
        ok = kept[:, None] & kept[None, :]  # [KP, KP]
        lp = val - lse[:, None]  # [KP, KP]
        if HAS_D2T:
            ids += tl.load(D2T + ids, mask=ok, other=0)
        prev = (p - 1) * B + b
        cum = tl.load(ST_LP + prev * K + t, mask=kept, other=0.0)[:, None] + lp  # [KP, KP]
        j = t[:, None] * K + t[None, :]  # [KP, KP] the candidate's index within the depth
        col = K1 + (p - 1) * K * K + j  # [KP, KP]
        tl.store(SCORES + b * C + col, cum, mask=ok & first[None, :])
        tl.store(TOKENS + b * C + col, ids, mask=ok & first[None, :])
        par = tl.load(ST_FLAT + prev * K + t, mask=kept, other=0)  # [KP]
        tl.store(PARENTS + b * C + col, tl.broadcast_to(par[:, None], (KP, KP)), mask=ok & first[None, :])
        cum1 = tl.reshape(cum, [KP * KP])
        j1 = tl.reshape(tl.where(ok, j, -1), [KP * KP])  # -1: a padding cell
        ids1 = tl.reshape(ids, [KP * KP])
        cur_lp, best = _decode_keys(_top_keys(_keys(cum1, j1, j1 >= 0), K, KP))  # [KP] each
        cur_tok = tl.sum(tl.where(j1[None, :] == best[:, None], ids1[None, :], 0), 1)  # [KP]
        cur_flat = K1 + (p - 1) * K * K + best  # [KP]
        st = p * B + b
        tl.store(ST_LP + st * K + t, cur_lp, mask=kept & first)
        tl.store(ST_TOK + st * K + t, cur_tok, mask=kept & first)
        tl.store(ST_FLAT + st * K + t, cur_flat, mask=kept & first)
    if COMPUTE:
        # ROWS rows of the logits tile (16: tl.dot's least M), the first K live (the root alone at level 0). The dead
        # rows cost less than FMAs over the K live ones: at K = 4 over 32,000 ids a depth took 10.6 µs as a tl.dot
        # against 13.8 as FMAs (H100, results/root_children_h100)
        tr = tl.arange(0, ROWS)  # [ROWS]
        if MERGE:
            live = tr < K  # [ROWS]
            # the kept nodes' target ids, spread from [KP] onto the tile's rows
            par = tl.sum(tl.where(tr[:, None] == t[None, :], cur_tok[None, :], 0), 1)  # [ROWS]
        else:
            live = tr < 1  # [ROWS] the root alone
            par = tl.where(live, tl.load(ROOTS + b), 0)  # [ROWS]
        v = c * BLOCK_V + tl.arange(0, BLOCK_V)  # [BLOCK_V] draft ids
        vok = v < Vd
        # [ROWS, R] @ [R, BLOCK_V] in chunks of 16 ranks, unrolled: the chunks' loads do not wait on each other (a loop
        # of rank-1 updates waited on one load of dep_out a step)
        rr = tl.arange(0, 16)  # [16]
        acc = tl.zeros([ROWS, BLOCK_V], tl.float32)
        for r0 in tl.static_range(0, R, 16):
            rok = r0 + rr < R  # [16]
            z = tl.load(DEP_IN + par[:, None] * R + (r0 + rr)[None, :], mask=live[:, None] & rok[None, :],
                        other=0.0)  # [ROWS, 16]
            w = tl.load(DEP_OUT + (r0 + rr)[:, None] * Vd + v[None, :], mask=rok[:, None] & vok[None, :],
                        other=0.0)  # [16, BLOCK_V]
            acc = tl.dot(z, w, acc, input_precision="ieee")  # [ROWS, BLOCK_V]
        x = acc + tl.load(BASE + b * stride_bb + level * stride_bs + v, mask=vok, other=0.0).to(tl.float32)[None, :]
        x = tl.where(live[:, None] & vok[None, :], x, float("-inf"))  # [ROWS, BLOCK_V]
        mx = tl.max(x, 1)  # [ROWS]
        mx_safe = tl.where(mx == float("-inf"), 0.0, mx)
        s = tl.sum(tl.exp(x - mx_safe[:, None]), 1)  # [ROWS]
        keys = _keys(x, tl.broadcast_to(v[None, :], (ROWS, BLOCK_V)), x > float("-inf"))  # [ROWS, BLOCK_V]
        cell = (level * B + b) * K + tr  # [ROWS]
        tl.store(PMAX + cell * NC + c, mx, mask=live)
        tl.store(PSUM + cell * NC + c, s, mask=live)
        if MERGE:
            tl.store(PKEY + (cell[:, None] * NC + c) * K + t[None, :], _top_keys_rows(keys, K, KP),
                     mask=live[:, None] & kept[None, :])
        else:  # the root's K1 best of the chunk
            t1 = tl.arange(0, K1P)  # [K1P]
            tl.store(RKEY + (b * NC + c) * K1 + tr[:, None] * 0 + t1[None, :], _top_keys_rows(keys, K1, K1P),
                     mask=live[:, None] & (t1 < K1)[None, :])


def grow_tree(base, dep_in, dep_out, roots, S: int, K: int, d2t=None, root_children: int | None = None):
    """The tree's candidates (module doc): base [B, S', Vd] fp32, bf16 or fp16, read as fp32 (S' >= S; depth d reads
    base[:, d - 1]; a bf16 LM head's logits need no fp32 copy), dep_in
    [V, r] and dep_out [r, Vd] fp32, roots [B] int64 target ids, d2t [Vd] int64 or None, root_children K1 >= K or None
    (K) -> (scores [B, C] fp32, tokens [B, C] int64 target ids, parents [B, C] int64). Triton on GPU (and on CPU under
    TRITON_INTERPRET=1), else the reference; no host sync."""
    B, Vd = roots.shape[0], dep_out.shape[1]

    def need(cond, msg):
        if not cond:
            raise ValueError(msg)

    need(base.dim() == 3 and base.shape[0] == B and base.shape[1] >= S and base.shape[2] == Vd,
         f"base must be [B={B}, >= S={S}, Vd={Vd}], got {tuple(base.shape)}")
    need(dep_in.dtype == dep_out.dtype == torch.float32, "dep_in and dep_out must be float32")
    need(base.dtype in (torch.float32, torch.bfloat16, torch.float16),
         f"base must be float32, bfloat16 or float16 (read as float32), got {base.dtype}")
    need(dep_in.dim() == 2 and dep_in.shape[1] == dep_out.shape[0], f"dep_in [V, r] and dep_out [r, Vd] must share "
         f"r, got {tuple(dep_in.shape)} and {tuple(dep_out.shape)}")
    need(isinstance(K, int) and 1 <= K <= Vd and isinstance(S, int) and S >= 1, f"S={S!r}, K={K!r}: S >= 1 and "
         f"K in [1, {Vd}]")
    K1 = K if root_children is None else root_children
    need(isinstance(K1, int) and K <= K1 <= Vd, f"root_children={root_children!r}: in [K={K}, {Vd}] or None")
    need(roots.dtype == torch.int64 and (d2t is None or d2t.dtype == torch.int64), "roots and d2t must be int64")
    tensors = [base, dep_in, dep_out, roots] + ([d2t] if d2t is not None else [])
    need(all(x.device == roots.device for x in tensors), "all inputs must be on one device")
    if K > MAX_K or K1 > MAX_ROOT_CHILDREN or not use_triton(*tensors):
        return grow_tree_ref(base, dep_in, dep_out, roots, S, K, d2t, K1)
    dev = roots.device
    C = num_candidates(K, S, K1)
    scores = torch.empty(B, C, dtype=torch.float32, device=dev)  # [B, C]
    tokens = torch.empty(B, C, dtype=torch.int64, device=dev)  # [B, C]
    parents = torch.empty(B, C, dtype=torch.int64, device=dev)  # [B, C]
    if B == 0:
        return scores, tokens, parents
    if base.stride(2) != 1:
        base = base.contiguous()
    dep_in, dep_out, roots = dep_in.contiguous(), dep_out.contiguous(), roots.contiguous()
    meta = _launch_meta(Vd, K, dep_in.shape[1], K1)
    warps = (meta.pop("num_warps"), meta.pop("num_warps_root"))  # the other levels', depth 1's
    NC = triton.cdiv(Vd, meta["BLOCK_V"])
    stats = torch.empty(2, S, B, K, NC, dtype=torch.float32, device=dev)  # [max, sum] x [S, B, K, NC]
    keys = torch.empty(S, B, K, NC, K, dtype=torch.int64, device=dev)  # [S, B, K, NC, K] (level 0's slot unused)
    root_keys = torch.empty(B, NC, K1, dtype=torch.int64, device=dev)  # [B, NC, K1] the root's best of each chunk
    st_lp = torch.empty(S, B, K, dtype=torch.float32, device=dev)  # [S, B, K] the kept nodes' scores
    state = torch.empty(2, S, B, K, dtype=torch.int64, device=dev)  # (tokens, flat indices) x [S, B, K]
    for level in range(S + 1):
        grid = (B, NC if level < S else 1)
        _level_kernel[grid](
            base, base.stride(0), base.stride(1), dep_in, dep_out, d2t if d2t is not None else roots, roots,
            stats[0], stats[1], keys, root_keys, st_lp, state[0], state[1], scores, tokens, parents,
            level, B, Vd, NC, C, HAS_D2T=d2t is not None, MERGE=level > 0, MERGE_ROOT=level == 1,
            COMPUTE=level < S, num_warps=warps[level == 1], **meta,
        )  # fmt: skip
    return scores, tokens, parents


def _launch_meta(Vd: int, K: int, R: int, K1: int | None = None, block_v: int | None = None,
                 num_warps: int | None = None) -> dict:
    """Chunk length and blocks for Vd draft ids, K children a node, K1 (None: K) the root's and rank R: chunks of 256
    ids (a SmolLM2 8,192-id vocabulary in 32 programs), longer where the merge's parents x chunks x K keys (or the
    root's chunks x K1) would pass _MERGE_KEYS or, for K <= 4, where a parent's chunks x K keys would pass 512.
    block_v / num_warps: other settings (benchmarks/probes/probe_block_tree.py times them). num_warps_root: depth 1's
    level's (grow_tree pops both)."""
    # at least 2: with one parent row, triton 3.6 turned the merge over 128+ chunks into 542 shared stores and 67
    # barriers (~50 µs a depth on an H100; results/block_tree_k1_sass.md)
    KP = max(2, triton.next_power_of_2(K))
    K1 = K if K1 is None else K1
    K1P = max(2, triton.next_power_of_2(K1))
    if block_v is None:
        block_v = max(256, triton.next_power_of_2(triton.cdiv(Vd * max(K * KP, K1P), _MERGE_KEYS)))
        if KP <= 4:  # at most 512 keys a parent to merge: 512-id chunks over SmolLM2's 49,152 ids at K = 4, where
            # each depth took 10.3 µs against 12.0 with 256 (H100; results/block_drafter_h100/probe_block_tree_bv.md)
            block_v = max(block_v, triton.next_power_of_2(triton.cdiv(Vd * K, 512)))
    nc = triton.cdiv(Vd, block_v)
    block_ck = triton.next_power_of_2(nc * K)
    # K <= 4: 2 warps for 256-id chunks, fastest at every timed shape (H100, 7/1 over 49,152 ids 60 -> 44 µs from 8;
    # results/block_tree_dot_h100.md), 4 for 512 (69.8 µs a 7/4 tree against 92.7 at 8); K = 8 spills at 2 on
    # sm_90 and, under triton 3.9, at 4 (tests/portability), so 8 there (175 µs a 7/8 tree over 49,152 ids)
    root_warps = num_warps
    if num_warps is None:
        num_warps = 8 if KP > 4 else 2 if block_v <= 256 else 4 if block_v <= 512 else 8
        # depth 1's level with K1 <= 4 (the root's children merged as one row, then the 16-row tl.dot) took 255
        # registers and spilled 24-40 B on sm_90 at these warps; at twice them 167-170 and none (tests/portability).
        # With 16 root children it fits at these (168-180)
        root_warps = 2 * num_warps if KP == K1P == 4 else num_warps
    return dict(R=R, K=K, KP=KP, K1=K1, K1P=K1P, ROWS=max(16, KP),
                BLOCK_V=block_v, BLOCK_C=triton.next_power_of_2(nc), BLOCK_CK=block_ck,
                BLOCK_CK1=triton.next_power_of_2(nc * K1), num_warps=num_warps, num_warps_root=root_warps)


def _levels(S: int) -> dict[tuple, int]:
    """The variants one tree of S depths launches, (MERGE, MERGE_ROOT, COMPUTE) -> the first level launching it:
    level 0 computes, 1 merges the root's children (and computes, S > 1), the middle ones merge and compute, the
    last merges."""
    levels = {}
    for level in range(S + 1):
        levels.setdefault((level > 0, level == 1, level < S), level)
    return levels


def compile_cases(hip: bool) -> list[CompileCase]:
    """kernels/_compile_cases.py: every tree's levels over the block drafter's vocabularies (SmolLM2's whole one and
    8,192-id draft vocabulary, Llama-3.1-8B's 32,000-id draft vocabulary), rank 64 (conf/draft/block.yaml), with and
    without a map, the logits in fp32 (the stock path) and bf16 (the invariant path's LM head); the same on both
    vendors."""
    f32, bf16, i64 = Ptr(torch.float32), Ptr(torch.bfloat16), Ptr(torch.int64)
    cases = []
    shapes = {s.name: s for s in model_shapes()}
    vocabs = [("smollm2_135m", shapes["smollm2_135m"].vocab, False), ("smollm2_135m", 8192, True),
              ("llama3_8b", 32000, True)]
    for t in TREES:
        if t.topk > MAX_K:
            continue
        for model, Vd, has_d2t in vocabs:
            meta = _launch_meta(Vd, t.topk, 64, t.root_children)
            warps = (meta.pop("num_warps"), meta.pop("num_warps_root"))
            NC = triton.cdiv(Vd, meta["BLOCK_V"])
            for ((merge, root, compute), level), (base, name) in itertools.product(
                    _levels(t.steps).items(), ((f32, ""), (bf16, " bf16 logits"))):
                if base is bf16 and not compute:
                    continue  # the last level reads no logits
                cases.append(CompileCase.of(
                    _level_kernel, (f"{model} Vd={Vd} {t.name}{name}",), BASE=base, stride_bb=t.steps * Vd,
                    stride_bs=Vd, DEP_IN=f32, DEP_OUT=f32, D2T=i64, ROOTS=i64, PMAX=f32, PSUM=f32, PKEY=i64, RKEY=i64,
                    ST_LP=f32, ST_TOK=i64, ST_FLAT=i64, SCORES=f32, TOKENS=i64, PARENTS=i64, level=level, B=8,
                    Vd=Vd, NC=NC, C=num_candidates(t.topk, t.steps, t.root_children), HAS_D2T=has_d2t, MERGE=merge,
                    MERGE_ROOT=root, COMPUTE=compute, num_warps=warps[root], **meta))
    return cases
