"""The block drafter's EAGLE-2 tree from its one forward, in three launches whatever the depth:

    dependency_top(dep_in, dep_rows) -> dep_top [V, DEP_TOP] int32          (once, at the drafter's setup)
    grow_tree(base, dep_in, dep_rows, dep_top, roots, S, K, d2t=None) -> (scores, tokens, parents) [B, C] each

base [B, S, Vd]: the block rows' logits over draft ids; the dependency term of a child v after parent token p (a
target id) is dep_in[p] . dep_rows[v], dep_in [V, r] and dep_rows [Vd, r] fp32 (models/block_head.py). Depth 1's K
candidates are the root's K best children; each later depth's are, for each of the K kept nodes, its K best
children, scored by cumulative log-prob, the K best of the K*K kept (ties: lower index). Outputs in `build_tree`'s
candidate layout (C = K + (S-1)*K*K; kernels/build_tree.py), tokens as target ids (id + d2t[id] with a draft
vocabulary). `grow_tree_ref` is the spec, in torch.

A node's children are sought among the union U of two small sets, not the whole draft vocabulary: the BASE_TOP
largest ids of its depth's base row, and the DEP_TOP largest ids of its own token's dependency term (a function of
the token alone, so `dependency_top` tables it for every token once). A child among its parent's K best of base +
term over the whole vocabulary is almost surely in one of them. Its log-prob is log_softmax over U of base + term:
where U is the whole vocabulary (Vd <= BASE_TOP) the exact log_softmax(base + term). Why: over the whole vocabulary
depth d's logits need depth d - 1's kept parents, so a depth was one launch over Vd ids: ~9 µs a depth at 8,192 ids on
an H100, 60 µs of a ~200 µs propose at 7/4/16 (results/block_drafter_h100/probe_block_tree_bv.md). With U every
depth's base top-k runs at once (kernels/topk.py, two launches) and the tree is one program per request over a few
hundred candidates a parent. The shipped drafter's tau on 10 MT-bench turns (CPU, the same texts every run): 2.709
over the whole vocabulary, 2.719 over U, 2.709 over U's children with the whole vocabulary's normaliser
(results/block_drafter_h100/union_children.md).

Kernel (`_tree_kernel`, grid (B,), one program per request, the depths in a loop): per depth, the K kept parents'
dep_in rows and dep_top rows; the terms of the base top ids ([K, BASE_TOP]) and of each parent's own ids ([K,
DEP_TOP]) as broadcast multiply-adds over chunks of RC ranks (the gathered dep_rows rows); a tabled id that is also a
base top id is dropped (its key (base logit, id) is at least the BASE_TOP-th's); the log-sum-exp over U; K rounds of
max over packed (value, id) keys (kernels/topk.py) per parent; then EAGLE-2's K best of K*K by cumulative score.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from eaglet.kernels._compile_cases import TREES, CompileCase, Ptr, model_shapes
from eaglet.kernels._utils import use_triton
from eaglet.kernels.build_tree import num_candidates
from eaglet.kernels.draft_expand import expand_step_ref
from eaglet.kernels.topk import _EMPTY, _decode_keys, _keys, _top_keys, top_ids_ref, topk_logprobs

# Above this K the reference runs: a program holds K x DEP_TOP x RC addresses of a rank chunk (`_launch_meta`).
MAX_K = 8
# U's two halves (module doc): 64 + 64 kept the shipped drafter's tau on 10 MT-bench turns (CPU: 2.719 against 2.709
# over all 8,192 ids); 32 + 32 gave 2.694 against 64 + 64's 2.698 under another normaliser
# (results/block_drafter_h100/union_children.md)
BASE_TOP = 64
DEP_TOP = 64


def dependency_top(dep_in: torch.Tensor, dep_rows: torch.Tensor, n: int = DEP_TOP) -> torch.Tensor:
    """dep_in [V, r], dep_rows [Vd, r] fp32 -> [V, min(n, Vd)] int32: each parent token's largest dependency terms'
    draft ids (ties as torch.topk's). Made once per drafter (outside any graph), in chunks of 2,048 parents."""
    n = min(n, dep_rows.shape[0])
    out = torch.empty(dep_in.shape[0], n, dtype=torch.int32, device=dep_in.device)  # [V, n]
    for i in range(0, dep_in.shape[0], 2048):
        out[i:i + 2048] = (dep_in[i:i + 2048] @ dep_rows.t()).topk(n, dim=-1).indices  # [<=2048, n]
    return out


def grow_tree_ref(base, dep_in, dep_rows, dep_top, roots, S: int, K: int, d2t=None):
    """Torch reference (the spec; module doc): per depth each parent's children over U, and `expand_step_ref`'s
    selection."""
    B, Vd = roots.shape[0], dep_rows.shape[0]
    dev = roots.device
    C = num_candidates(K, S)
    scores = torch.empty(B, C, dtype=torch.float32, device=dev)  # [B, C]
    tokens = torch.empty(B, C, dtype=torch.long, device=dev)  # [B, C]
    parents = torch.empty(B, C, dtype=torch.long, device=dev)  # [B, C]
    m = min(BASE_TOP, Vd)

    def children(d, par):  # [B, n] target ids -> (log-probs, draft ids) [B, n, K]
        n = par.shape[1]
        row = base[:, d].float()  # [B, Vd]
        in_u = torch.zeros(B, n, Vd, dtype=torch.bool, device=dev)  # [B, n, Vd]
        in_u.scatter_(2, top_ids_ref(row, m)[:, None].expand(B, n, m), True)
        in_u.scatter_(2, dep_top[par].long(), True)
        x = torch.where(in_u, row[:, None] + dep_in[par] @ dep_rows.t(), float("-inf"))  # [B, n, Vd]
        ids = top_ids_ref(x, K)  # [B, n, K]
        return x.gather(-1, ids) - x.logsumexp(-1, keepdim=True), ids

    lp, cur_tok = children(0, roots[:, None])  # [B, 1, K] each, draft ids
    cur_lp, cur_tok = lp[:, 0], cur_tok[:, 0]  # [B, K]
    if d2t is not None:
        cur_tok = cur_tok + d2t[cur_tok]  # [B, K]
    scores[:, :K], tokens[:, :K], parents[:, :K] = cur_lp, cur_tok, -1
    cur_flat = torch.arange(K, device=dev).expand(B, K)  # [B, K]
    h = torch.zeros(B, K, 0, device=dev)  # [B, K, 0] no hidden state
    mask = torch.zeros(B, K, 0, dtype=torch.bool, device=dev)  # [B, K, 0] no draft mask
    for d in range(1, S):
        lp, tk = children(d, cur_tok)  # [B, K, K] each
        cur_lp, cur_tok, cur_flat, _, _ = expand_step_ref(cur_lp, lp, tk, cur_flat, mask, h, scores, tokens,
                                                           parents, K + (d - 1) * K * K, d2t, keep_ancestors=False)
    return scores, tokens, parents


@triton.jit
def _children(BASE, base_row, TOP_IDS, top_row, DEP_IN, DEP_ROWS, DEP_TOP, D2T, par, live, M, MP,
              R: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, HAS_D2T: tl.constexpr, MB: tl.constexpr,
              MPB: tl.constexpr, RC: tl.constexpr):
    """The K best children over U of each parent par [KP] (target ids; rows not live: none) -> (log-probs, target
    ids) [KP, KP]: parent row x child rank."""
    mb = tl.arange(0, MB)  # [MB] a base top id's rank
    mok = mb < M
    ids_b = tl.load(TOP_IDS + top_row + mb, mask=mok, other=0)  # [MB] draft ids
    raw_b = tl.load(BASE + base_row + ids_b, mask=mok, other=0.0).to(tl.float32)  # [MB] base logits
    # the M-th base key: a tabled id at or above it is one of the base top ids (a duplicate in U)
    key_m = tl.sum(tl.where(mb == M - 1, _keys(raw_b, ids_b, mok), 0), 0)
    j = tl.arange(0, MPB)  # [MPB] a tabled id's rank
    tok = live[:, None] & (j < MP)[None, :]  # [KP, MPB]
    ids_t = tl.load(DEP_TOP + par[:, None] * MP + j[None, :], mask=tok, other=0).to(tl.int64)  # [KP, MPB]
    raw_t = tl.load(BASE + base_row + ids_t, mask=tok, other=0.0).to(tl.float32)  # [KP, MPB]
    tok = tok & (_keys(raw_t, ids_t, tok) < key_m)  # [KP, MPB] not also a base top id
    # the terms: dep_in[par] . dep_rows[id] for both halves, over chunks of RC ranks
    rr = tl.arange(0, RC)  # [RC]
    t_b = tl.zeros([KP, MB], tl.float32)
    t_t = tl.zeros([KP, MPB], tl.float32)
    for r0 in tl.static_range(0, R, RC):
        rok = r0 + rr < R  # [RC]
        z = tl.load(DEP_IN + par[:, None] * R + (r0 + rr)[None, :], mask=live[:, None] & rok[None, :],
                    other=0.0)  # [KP, RC]
        wb = tl.load(DEP_ROWS + ids_b[:, None] * R + (r0 + rr)[None, :], mask=mok[:, None] & rok[None, :],
                     other=0.0)  # [MB, RC]
        t_b += tl.sum(z[:, None, :] * wb[None, :, :], 2)  # [KP, MB]
        wt = tl.load(DEP_ROWS + ids_t[:, :, None] * R + (r0 + rr)[None, None, :],
                     mask=tok[:, :, None] & rok[None, None, :], other=0.0)  # [KP, MPB, RC]
        t_t += tl.sum(z[:, None, :] * wt, 2)  # [KP, MPB]
    okb = live[:, None] & mok[None, :]  # [KP, MB]
    x_b = tl.where(okb, raw_b[None, :] + t_b, float("-inf"))  # [KP, MB] logits
    x_t = tl.where(tok, raw_t + t_t, float("-inf"))  # [KP, MPB]
    # normaliser: the log-sum-exp over U (1 for a row that is not live)
    mx = tl.maximum(tl.max(x_b, 1), tl.max(x_t, 1))  # [KP]
    mx = tl.where(mx == float("-inf"), 0.0, mx)
    s = tl.sum(tl.exp(x_b - mx[:, None]), 1) + tl.sum(tl.exp(x_t - mx[:, None]), 1)  # [KP]
    lse = mx + tl.log(tl.where(live, s, 1.0))  # [KP]
    # the K best of both halves per parent: K rounds of max over their packed keys
    key_b = _keys(x_b, tl.broadcast_to(ids_b[None, :], (KP, MB)), okb)  # [KP, MB]
    key_t = _keys(x_t, ids_t, tok)  # [KP, MPB]
    t = tl.arange(0, KP)  # [KP] a child rank
    best = tl.full([KP, KP], _EMPTY, tl.int64)  # [KP, KP]
    for i in range(K):
        top = tl.maximum(tl.max(key_b, 1), tl.max(key_t, 1))  # [KP]
        best = tl.where(t[None, :] == i, top[:, None], best)
        key_b = tl.where(key_b == top[:, None], _EMPTY, key_b)
        key_t = tl.where(key_t == top[:, None], _EMPTY, key_t)
    val, ids = _decode_keys(best)  # [KP, KP] each
    ok = live[:, None] & (t < K)[None, :]  # [KP, KP]
    if HAS_D2T:
        ids += tl.load(D2T + ids, mask=ok, other=0)
    return val - lse[:, None], ids


@triton.jit
def _tree_kernel(BASE, stride_bb, stride_bs, TOP_IDS, DEP_IN, DEP_ROWS, DEP_TOP, D2T, ROOTS, SCORES, TOKENS,
                 PARENTS, S, M, MP, C,
                 R: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, HAS_D2T: tl.constexpr, MB: tl.constexpr,
                 MPB: tl.constexpr, RC: tl.constexpr):
    """Grid (B,): request b's tree, depth by depth (module doc). TOP_IDS [B, S, M]: each depth's base top ids."""
    b = tl.program_id(0).to(tl.int64)
    t = tl.arange(0, KP)  # [KP] a kept node, or a child rank
    kept = t < K
    # depth 1: the root's children are the candidates and the kept nodes
    root = t < 1
    par = tl.where(root, tl.load(ROOTS + b), 0)  # [KP]
    lp, ids = _children(BASE, b * stride_bb, TOP_IDS, (b * S) * M, DEP_IN, DEP_ROWS, DEP_TOP, D2T, par, root,
                        M, MP, R, K, KP, HAS_D2T, MB, MPB, RC)  # [KP, KP]
    ok = root[:, None] & kept[None, :]  # [KP, KP]
    cur_lp = tl.sum(tl.where(ok, lp, 0.0), 0)  # [KP]
    cur_tok = tl.sum(tl.where(ok, ids, 0), 0)  # [KP]
    cur_flat = t.to(tl.int64)  # [KP]
    tl.store(SCORES + b * C + t, cur_lp, mask=kept)
    tl.store(TOKENS + b * C + t, cur_tok, mask=kept)
    tl.store(PARENTS + b * C + t, tl.full([KP], -1, tl.int64), mask=kept)
    ok = kept[:, None] & kept[None, :]  # [KP, KP]
    j = t[:, None] * K + t[None, :]  # [KP, KP] a candidate's index within its depth
    for d in range(1, S):  # after the kept nodes of depth d: cumulative scores, then the K best
        lp, ids = _children(BASE, b * stride_bb + d * stride_bs, TOP_IDS, (b * S + d) * M, DEP_IN, DEP_ROWS,
                            DEP_TOP, D2T, cur_tok, kept, M, MP, R, K, KP, HAS_D2T, MB, MPB, RC)  # [KP, KP]
        cum = cur_lp[:, None] + lp  # [KP, KP]
        col = K + (d - 1) * K * K + j  # [KP, KP]
        tl.store(SCORES + b * C + col, cum, mask=ok)
        tl.store(TOKENS + b * C + col, ids, mask=ok)
        tl.store(PARENTS + b * C + col, tl.broadcast_to(cur_flat[:, None], (KP, KP)), mask=ok)
        cum1 = tl.reshape(cum, [KP * KP])
        j1 = tl.reshape(tl.where(ok, j, -1), [KP * KP])  # -1: a padding cell
        ids1 = tl.reshape(ids, [KP * KP])
        cur_lp, best = _decode_keys(_top_keys(_keys(cum1, j1, j1 >= 0), K, KP))  # [KP] each
        cur_tok = tl.sum(tl.where(j1[None, :] == best[:, None], ids1[None, :], 0), 1)  # [KP]
        cur_flat = K + (d - 1) * K * K + best  # [KP]


def grow_tree(base, dep_in, dep_rows, dep_top, roots, S: int, K: int, d2t=None):
    """The tree's candidates (module doc): base [B, S', Vd] fp32, bf16 or fp16, read as fp32 (S' >= S; depth d reads
    base[:, d - 1]; a bf16 LM head's logits need no fp32 copy), dep_in [V, r] and dep_rows [Vd, r] fp32, dep_top
    [V, n] int32 (`dependency_top`), roots [B] int64 target ids, d2t [Vd] int64 or None -> (scores [B, C] fp32,
    tokens [B, C] int64 target ids, parents [B, C] int64). Triton on GPU (and on CPU under TRITON_INTERPRET=1), else
    the reference; no host sync."""
    B, Vd = roots.shape[0], dep_rows.shape[0]

    def need(cond, msg):
        if not cond:
            raise ValueError(msg)

    need(base.dim() == 3 and base.shape[0] == B and base.shape[1] >= S and base.shape[2] == Vd,
         f"base must be [B={B}, >= S={S}, Vd={Vd}], got {tuple(base.shape)}")
    need(dep_in.dtype == dep_rows.dtype == torch.float32, "dep_in and dep_rows must be float32")
    need(base.dtype in (torch.float32, torch.bfloat16, torch.float16),
         f"base must be float32, bfloat16 or float16 (read as float32), got {base.dtype}")
    need(dep_in.dim() == 2 and dep_rows.dim() == 2 and dep_in.shape[1] == dep_rows.shape[1],
         f"dep_in [V, r] and dep_rows [Vd, r] must share r, got {tuple(dep_in.shape)} and {tuple(dep_rows.shape)}")
    need(dep_top.dtype == torch.int32 and dep_top.dim() == 2 and dep_top.shape[0] == dep_in.shape[0],
         f"dep_top must be int32 [V={dep_in.shape[0]}, n] (dependency_top), got {dep_top.dtype} "
         f"{tuple(dep_top.shape)}")
    need(isinstance(K, int) and 1 <= K <= Vd and isinstance(S, int) and S >= 1, f"S={S!r}, K={K!r}: S >= 1 and "
         f"K in [1, {Vd}]")
    need(roots.dtype == torch.int64 and (d2t is None or d2t.dtype == torch.int64), "roots and d2t must be int64")
    tensors = [base, dep_in, dep_rows, dep_top, roots] + ([d2t] if d2t is not None else [])
    need(all(x.device == roots.device for x in tensors), "all inputs must be on one device")
    if K > MAX_K or not use_triton(*tensors):
        return grow_tree_ref(base, dep_in, dep_rows, dep_top, roots, S, K, d2t)
    dev = roots.device
    C = num_candidates(K, S)
    scores = torch.empty(B, C, dtype=torch.float32, device=dev)  # [B, C]
    tokens = torch.empty(B, C, dtype=torch.int64, device=dev)  # [B, C]
    parents = torch.empty(B, C, dtype=torch.int64, device=dev)  # [B, C]
    if B == 0:
        return scores, tokens, parents
    if base.stride(2) != 1:
        base = base.contiguous()
    M = min(BASE_TOP, Vd)
    _, top_ids = topk_logprobs(base[:, :S], M)  # [B, S, M]: every depth's base top ids at once
    dep_in, dep_rows, dep_top, roots = dep_in.contiguous(), dep_rows.contiguous(), dep_top.contiguous(), \
        roots.contiguous()
    _tree_kernel[(B,)](
        base, base.stride(0), base.stride(1), top_ids, dep_in, dep_rows, dep_top,
        d2t if d2t is not None else roots, roots, scores, tokens, parents, S, M, dep_top.shape[1], C,
        HAS_D2T=d2t is not None, **_launch_meta(K, dep_in.shape[1], M, dep_top.shape[1]),
    )  # fmt: skip
    return scores, tokens, parents


def _launch_meta(K: int, R: int, M: int, MP: int) -> dict:
    """Blocks for K children a node, rank R and U's halves of M and MP ids, 4 warps. A rank chunk's gather of the
    tabled ids' rows is KP x MPB x RC addresses (64-bit): RC = 64 / KP keeps it at 4,096 (131 registers at K = 4 on
    sm_90; at K = 8 with 16 ranks a chunk, 255 and spills, at 4 warps and at 8)."""
    KP = max(2, triton.next_power_of_2(K))
    return dict(R=R, K=K, KP=KP, MB=triton.next_power_of_2(M), MPB=triton.next_power_of_2(MP), RC=64 // KP,
                num_warps=4)


def compile_cases(hip: bool) -> list[CompileCase]:
    """kernels/_compile_cases.py: every tree's K over the block drafter's vocabularies (SmolLM2's whole one and
    8,192-id draft vocabulary, Llama-3.1-8B's 32,000-id draft vocabulary), rank 64 (conf/draft/block.yaml), with and
    without a map, the logits in fp32 (the stock path) and bf16 (the invariant path's LM head); the same on both
    vendors. (The base top-k's launches are kernels/topk.py's cases.)"""
    f32, bf16, i32, i64 = Ptr(torch.float32), Ptr(torch.bfloat16), Ptr(torch.int32), Ptr(torch.int64)
    cases = []
    shapes = {s.name: s for s in model_shapes()}
    vocabs = [("smollm2_135m", shapes["smollm2_135m"].vocab, False), ("smollm2_135m", 8192, True),
              ("llama3_8b", 32000, True)]
    for t in TREES:
        if t.topk > MAX_K:
            continue
        for model, Vd, has_d2t in vocabs:
            M, MP = min(BASE_TOP, Vd), min(DEP_TOP, Vd)
            for base, name in ((f32, ""), (bf16, " bf16 logits")):
                cases.append(CompileCase.of(
                    _tree_kernel, (f"{model} Vd={Vd} {t.name}{name}",), BASE=base, stride_bb=t.steps * Vd,
                    stride_bs=Vd, TOP_IDS=i64, DEP_IN=f32, DEP_ROWS=f32, DEP_TOP=i32, D2T=i64, ROOTS=i64,
                    SCORES=f32, TOKENS=i64, PARENTS=i64, S=t.steps, M=M, MP=MP, C=num_candidates(t.topk, t.steps),
                    HAS_D2T=has_d2t, **_launch_meta(t.topk, 64, M, MP)))
    return cases
