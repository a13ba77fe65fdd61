"""A candidate version of kernels/block_tree.py for `benchmarks/probes/probe_block_tree.py --alt`, not used by eaglet:
the same `grow_tree` (the same merge, layout and outputs; the module doc of kernels/block_tree.py), but a depth's
logits tile holds only the KP kept parents' rows, computed by broadcast multiply-adds over chunks of RC ranks, where
the kernel uses `tl.dot` on a tile of KD = 16 rows (tl.dot's least M): at K = 4 that is 4x the multiply-adds, all of
them on the FP32 pipes (`input_precision="ieee"`), 262k a program at 256 ids and rank 64. Why it may pay: over
8,192 ids a 7/4 tree takes ~60 µs (8 launches, ~7.5 µs each against a launch's 2-4), 32 programs of 2 warps.
The probe times it beside the kernel (and shorter chunks: more programs); the faster one stays in kernels/, the
other is deleted.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from eaglet.kernels._utils import use_triton
from eaglet.kernels.block_tree import _MERGE_KEYS, MAX_K, _top_keys_rows, grow_tree_ref
from eaglet.kernels.build_tree import num_candidates
from eaglet.kernels.topk import _EMPTY, _decode_keys, _keys, _top_keys


@triton.jit
def _level_kernel(BASE, stride_bb, stride_bs, DEP_IN, DEP_OUT, D2T, ROOTS, PMAX, PSUM, PKEY, ST_LP, ST_TOK, ST_FLAT,
                  SCORES, TOKENS, PARENTS, level, B, Vd, NC, C,
                  R: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, HAS_D2T: tl.constexpr, MERGE: tl.constexpr,
                  MERGE_ROOT: tl.constexpr, COMPUTE: tl.constexpr, RC: tl.constexpr,
                  BLOCK_V: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_CK: tl.constexpr):
    """Grid (B, NC). MERGE: depth `level - 1`'s partials into its candidates and kept nodes (MERGE_ROOT: it is depth 1,
    the root's children); COMPUTE: depth `level`'s logits and partials after the kept nodes (level 0: the root).
    Partials PMAX / PSUM [S, B, K, NC], PKEY [S, B, K, NC, K]; kept nodes ST_* [S, B, K]."""
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    t = tl.arange(0, KP)  # [KP] a kept node, or a child rank
    kept = t < K
    first = (tl.zeros([KP], tl.int32) + c) == 0  # [KP] the program that writes the candidates and kept nodes
    cur_tok = tl.zeros([KP], tl.int64)
    if MERGE:
        p = level - 1
        cell = (p * B + b) * K + t  # [KP] the partials' row of each parent
        rows = (t < 1) if MERGE_ROOT else kept  # [KP]
        cs = tl.arange(0, BLOCK_C)  # [BLOCK_C]
        io = rows[:, None] & (cs < NC)[None, :]  # [KP, BLOCK_C]
        m_c = tl.load(PMAX + cell[:, None] * NC + cs[None, :], mask=io, other=float("-inf"))  # [KP, BLOCK_C]
        s_c = tl.load(PSUM + cell[:, None] * NC + cs[None, :], mask=io, other=0.0)  # [KP, BLOCK_C]
        m = tl.max(m_c, 1)  # [KP]
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        lse = m + tl.log(tl.where(rows, tl.sum(s_c * tl.exp(m_c - m_safe[:, None]), 1), 1.0))  # [KP]
        kc = tl.arange(0, BLOCK_CK)  # [BLOCK_CK]
        key = tl.load(PKEY + cell[:, None] * NC * K + kc[None, :], mask=rows[:, None] & (kc < NC * K)[None, :],
                      other=_EMPTY)  # [KP, BLOCK_CK]
        val, ids = _decode_keys(_top_keys_rows(key, K, KP))  # [KP, KP] each: parent row x child rank
        ok = rows[:, None] & kept[None, :]  # [KP, KP]
        lp = val - lse[:, None]  # [KP, KP]
        if HAS_D2T:
            ids += tl.load(D2T + ids, mask=ok, other=0)
        if MERGE_ROOT:  # depth 1: row 0's children are the candidates and the kept nodes
            cur_lp = tl.sum(tl.where(ok, lp, 0.0), 0)  # [KP]
            cur_tok = tl.sum(tl.where(ok, ids, 0), 0)  # [KP]
            cur_flat = t.to(tl.int64)  # [KP]
            tl.store(SCORES + b * C + t, cur_lp, mask=kept & first)
            tl.store(TOKENS + b * C + t, cur_tok, mask=kept & first)
            tl.store(PARENTS + b * C + t, tl.full([KP], -1, tl.int64), mask=kept & first)
        else:  # after the kept nodes of depth p - 1: cumulative scores, then the K best
            prev = (p - 1) * B + b
            cum = tl.load(ST_LP + prev * K + t, mask=kept, other=0.0)[:, None] + lp  # [KP, KP]
            j = t[:, None] * K + t[None, :]  # [KP, KP] the candidate's index within the depth
            col = K + (p - 1) * K * K + j  # [KP, KP]
            tl.store(SCORES + b * C + col, cum, mask=ok & first[None, :])
            tl.store(TOKENS + b * C + col, ids, mask=ok & first[None, :])
            par = tl.load(ST_FLAT + prev * K + t, mask=kept, other=0)  # [KP]
            tl.store(PARENTS + b * C + col, tl.broadcast_to(par[:, None], (KP, KP)), mask=ok & first[None, :])
            cum1 = tl.reshape(cum, [KP * KP])
            j1 = tl.reshape(tl.where(ok, j, -1), [KP * KP])  # -1: a padding cell
            ids1 = tl.reshape(ids, [KP * KP])
            cur_lp, best = _decode_keys(_top_keys(_keys(cum1, j1, j1 >= 0), K, KP))  # [KP] each
            cur_tok = tl.sum(tl.where(j1[None, :] == best[:, None], ids1[None, :], 0), 1)  # [KP]
            cur_flat = K + (p - 1) * K * K + best  # [KP]
        st = p * B + b
        tl.store(ST_LP + st * K + t, cur_lp, mask=kept & first)
        tl.store(ST_TOK + st * K + t, cur_tok, mask=kept & first)
        tl.store(ST_FLAT + st * K + t, cur_flat, mask=kept & first)
    if COMPUTE:
        if MERGE:
            live = kept  # [KP] the kept nodes
            par = cur_tok  # [KP] their target ids
        else:
            live = t < 1  # [KP] the root alone
            par = tl.where(live, tl.load(ROOTS + b), 0)  # [KP]
        v = c * BLOCK_V + tl.arange(0, BLOCK_V)  # [BLOCK_V] draft ids
        vok = v < Vd
        # [KP, R] @ [R, BLOCK_V] as broadcast multiply-adds over chunks of RC ranks, unrolled
        rr = tl.arange(0, RC)  # [RC]
        acc = tl.zeros([KP, BLOCK_V], tl.float32)
        for r0 in tl.static_range(0, R, RC):
            rok = r0 + rr < R  # [RC]
            z = tl.load(DEP_IN + par[:, None] * R + (r0 + rr)[None, :], mask=live[:, None] & rok[None, :],
                        other=0.0)  # [KP, RC]
            w = tl.load(DEP_OUT + (r0 + rr)[:, None] * Vd + v[None, :], mask=rok[:, None] & vok[None, :],
                        other=0.0)  # [RC, BLOCK_V]
            acc += tl.sum(z[:, :, None] * w[None, :, :], axis=1)  # [KP, BLOCK_V]
        x = acc + tl.load(BASE + b * stride_bb + level * stride_bs + v, mask=vok, other=0.0)[None, :]
        x = tl.where(live[:, None] & vok[None, :], x, float("-inf"))  # [KP, BLOCK_V]
        mx = tl.max(x, 1)  # [KP]
        mx_safe = tl.where(mx == float("-inf"), 0.0, mx)
        s = tl.sum(tl.exp(x - mx_safe[:, None]), 1)  # [KP]
        keys = _top_keys_rows(_keys(x, tl.broadcast_to(v[None, :], (KP, BLOCK_V)), x > float("-inf")), K, KP)
        cell = (level * B + b) * K + t  # [KP]
        tl.store(PMAX + cell * NC + c, mx, mask=live)
        tl.store(PSUM + cell * NC + c, s, mask=live)
        tl.store(PKEY + (cell[:, None] * NC + c) * K + t[None, :], keys, mask=live[:, None] & kept[None, :])


def grow_tree(base, dep_in, dep_out, roots, S: int, K: int, d2t=None):
    """The tree's candidates (module doc): base [B, S', Vd] fp32 (S' >= S; depth d reads base[:, d - 1]), dep_in
    [V, r] and dep_out [r, Vd] fp32, roots [B] int64 target ids, d2t [Vd] int64 or None -> (scores [B, C] fp32,
    tokens [B, C] int64 target ids, parents [B, C] int64). Triton on GPU (and on CPU under TRITON_INTERPRET=1), else
    the reference; no host sync."""
    B, Vd = roots.shape[0], dep_out.shape[1]

    def need(cond, msg):
        if not cond:
            raise ValueError(msg)

    need(base.dim() == 3 and base.shape[0] == B and base.shape[1] >= S and base.shape[2] == Vd,
         f"base must be [B={B}, >= S={S}, Vd={Vd}], got {tuple(base.shape)}")
    need(base.dtype == dep_in.dtype == dep_out.dtype == torch.float32, "base, dep_in and dep_out must be float32")
    need(dep_in.dim() == 2 and dep_in.shape[1] == dep_out.shape[0], f"dep_in [V, r] and dep_out [r, Vd] must share "
         f"r, got {tuple(dep_in.shape)} and {tuple(dep_out.shape)}")
    need(isinstance(K, int) and 1 <= K <= Vd and isinstance(S, int) and S >= 1, f"S={S!r}, K={K!r}: S >= 1 and "
         f"K in [1, {Vd}]")
    need(roots.dtype == torch.int64 and (d2t is None or d2t.dtype == torch.int64), "roots and d2t must be int64")
    tensors = [base, dep_in, dep_out, roots] + ([d2t] if d2t is not None else [])
    need(all(x.device == roots.device for x in tensors), "all inputs must be on one device")
    if K > MAX_K or not use_triton(*tensors):
        return grow_tree_ref(base, dep_in, dep_out, roots, S, K, d2t)
    dev = roots.device
    C = num_candidates(K, S)
    scores = torch.empty(B, C, dtype=torch.float32, device=dev)  # [B, C]
    tokens = torch.empty(B, C, dtype=torch.int64, device=dev)  # [B, C]
    parents = torch.empty(B, C, dtype=torch.int64, device=dev)  # [B, C]
    if B == 0:
        return scores, tokens, parents
    if base.stride(2) != 1:
        base = base.contiguous()
    dep_in, dep_out, roots = dep_in.contiguous(), dep_out.contiguous(), roots.contiguous()
    meta = _launch_meta(Vd, K, dep_in.shape[1])
    NC = triton.cdiv(Vd, meta["BLOCK_V"])
    stats = torch.empty(2, S, B, K, NC, dtype=torch.float32, device=dev)  # [max, sum] x [S, B, K, NC]
    keys = torch.empty(S, B, K, NC, K, dtype=torch.int64, device=dev)  # [S, B, K, NC, K]
    st_lp = torch.empty(S, B, K, dtype=torch.float32, device=dev)  # [S, B, K] the kept nodes' scores
    state = torch.empty(2, S, B, K, dtype=torch.int64, device=dev)  # (tokens, flat indices) x [S, B, K]
    for level in range(S + 1):
        grid = (B, NC if level < S else 1)
        _level_kernel[grid](
            base, base.stride(0), base.stride(1), dep_in, dep_out, d2t if d2t is not None else roots, roots,
            stats[0], stats[1], keys, st_lp, state[0], state[1], scores, tokens, parents,
            level, B, Vd, NC, C, HAS_D2T=d2t is not None, MERGE=level > 0, MERGE_ROOT=level == 1,
            COMPUTE=level < S, **meta,
        )  # fmt: skip
    return scores, tokens, parents


def _launch_meta(Vd: int, K: int, R: int, block_v: int | None = None, num_warps: int | None = None) -> dict:
    """Chunk length and blocks for Vd draft ids, K children a node and rank R: chunks of 256 ids (a SmolLM2 8,192-id
    vocabulary in 32 programs), longer where the merge's parents x chunks x K keys would pass _MERGE_KEYS or, for
    K <= 4, where a parent's chunks x K keys would pass 512.
    block_v / num_warps: other settings (benchmarks/probes/probe_block_tree.py times them)."""
    # at least 2: with one parent row, triton 3.6 turned the merge over 128+ chunks into 542 shared stores and 67
    # barriers (~50 µs a depth on an H100; results/block_tree_k1_sass.md)
    KP = max(2, triton.next_power_of_2(K))
    KD = max(16, KP)  # rows of the logits tile (tl.dot's least M)
    if block_v is None:
        block_v = max(256, triton.next_power_of_2(triton.cdiv(Vd * K * KP, _MERGE_KEYS)))
        if KP <= 4:  # at most 512 keys a parent to merge: 512-id chunks over SmolLM2's 49,152 ids at K = 4, where
            # each depth took 10.3 µs against 12.0 with 256 (H100; results/block_drafter_h100/probe_block_tree_bv.md)
            block_v = max(block_v, triton.next_power_of_2(triton.cdiv(Vd * K, 512)))
    nc = triton.cdiv(Vd, block_v)
    block_ck = triton.next_power_of_2(nc * K)
    # K <= 4: 2 warps for 16 x 256 tiles, fastest at every timed shape (H100, 7/1 over 49,152 ids 60 -> 44 µs from 8;
    # results/block_tree_dot_h100.md), 4 for 16 x 512 (69.8 µs a 7/4 tree against 92.7 at 8); K = 8 spills at 2 on
    # sm_90 and, under triton 3.9, at 4 (tests/portability), so 8 there (175 µs a 7/8 tree over 49,152 ids)
    if num_warps is None:
        num_warps = 8 if KP > 4 else 2 if KD * block_v <= 4096 else 4 if KD * block_v <= 8192 else 8
    return dict(R=R, K=K, KP=KP, RC=4, BLOCK_V=block_v, BLOCK_C=triton.next_power_of_2(nc), BLOCK_CK=block_ck,
                num_warps=num_warps)
