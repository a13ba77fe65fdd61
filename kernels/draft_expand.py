"""One expansion step of the EAGLE-2 draft tree in one launch: the bookkeeping between two draft-head calls.

    expand_step(cur_lp, lp, ids, cur_flat, mask, h, scores, tokens, parents, base, d2t=None, keep_ancestors=True)
        -> (cur_lp [B, K], cur_tok [B, K], cur_flat [B, K], h_next [B, K, H], mask_next [B, K, W+K])

At draft step i >= 1 each of the K nodes kept at step i-1 proposed K children: lp, ids [B, K, K], the head's
`topk_logprobs` (draft-vocabulary ids). The step's K*K candidates take flat indices base + j, base = K + (i-1)*K*K
(kernels/build_tree.py's candidate layout), and are written into the draft's candidate tensors [B, C]:
  scores[:, base + j]   cur_lp[b, j // K] + lp[b, j // K, j % K] (cumulative log-probabilities);
  tokens[:, base + j]   the target id: ids + d2t[ids] with a reduced draft vocabulary (d2t, EAGLE-3), else ids;
  parents[:, base + j]  cur_flat[b, j // K], the flat index of the node that proposed it.
The K best candidates (ties: the lower flat index, like `build_tree`) are the nodes of step i+1: their scores,
tokens and flat indices; h_next, the head's hidden state h [B, K, H] of each one's parent; and mask_next, the
parent's row of mask [B, K, W] (the draft KV each node sees; all False when keep_ancestors is False: a
multi-layer head caches ancestors in other layers) followed by the identity [K, K] (the node itself).

Why: in torch this is 12 small kernels a step (add, d2t gather and add, parent expand copy, topk, div, three
gathers, an add, a mask gather and a cat) and three cats at the end. The kernel is one program per request;
the top K take K rounds of a max over packed (score, index) keys (kernels/topk.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from eaglet.kernels._compile_cases import TREES, CompileCase, Ptr, model_shapes
from eaglet.kernels._utils import use_triton
from eaglet.kernels.build_tree import num_candidates
from eaglet.kernels.topk import _decode_keys, _keys, _top_keys, top_ids_ref


def expand_step_ref(cur_lp, lp, ids, cur_flat, mask, h, scores, tokens, parents, base, d2t=None,
                    keep_ancestors=True):
    """Torch reference (the spec; module doc). Writes scores/tokens/parents[:, base:base+K*K]."""
    B, K = cur_lp.shape
    cum = (cur_lp[:, :, None] + lp).reshape(B, K * K)  # [B, K*K]
    tk = (ids if d2t is None else ids + d2t[ids]).reshape(B, K * K)  # [B, K*K]
    scores[:, base:base + K * K] = cum
    tokens[:, base:base + K * K] = tk
    parents[:, base:base + K * K] = cur_flat[:, :, None].expand(B, K, K).reshape(B, K * K)
    best = top_ids_ref(cum, K)  # [B, K] ties to the lower index
    parent = best // K  # [B, K]
    h_next = h.gather(1, parent[:, :, None].expand(B, K, h.shape[-1]))  # [B, K, H]
    seen = mask.gather(1, parent[:, :, None].expand(B, K, mask.shape[-1]))  # [B, K, W]
    if not keep_ancestors:
        seen = torch.zeros_like(seen)
    eye = torch.eye(K, dtype=torch.bool, device=mask.device).expand(B, K, K)
    return cum.gather(1, best), tk.gather(1, best), base + best, h_next, torch.cat([seen, eye], dim=2)


@triton.jit
def _expand_kernel(CUR_LP, LP, IDS, D2T, CUR_FLAT, MASK, H, SCORES, TOKENS, PARENTS,
                   OUT_LP, OUT_TOK, OUT_FLAT, H_OUT, MASK_OUT, base, C, W, HD,
                   stride_lpb, stride_fb, stride_mb, stride_mk, stride_hb, stride_hk,
                   K: tl.constexpr, KP: tl.constexpr, KK_P: tl.constexpr, HAS_D2T: tl.constexpr,
                   KEEP: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_H: tl.constexpr):
    """One program per request (module doc)."""
    b = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, KK_P)  # [KK_P] candidate of this step
    ok = j < K * K
    row = j // K  # [KK_P] the node that proposed it
    cum = (tl.load(CUR_LP + b * stride_lpb + row, mask=ok, other=0.0)
           + tl.load(LP + b * K * K + j, mask=ok, other=0.0))  # [KK_P]
    ids = tl.load(IDS + b * K * K + j, mask=ok, other=0)  # [KK_P]
    if HAS_D2T:
        ids += tl.load(D2T + ids, mask=ok, other=0)
    tl.store(SCORES + b * C + base + j, cum, mask=ok)
    tl.store(TOKENS + b * C + base + j, ids, mask=ok)
    tl.store(PARENTS + b * C + base + j, tl.load(CUR_FLAT + b * stride_fb + row, mask=ok, other=0), mask=ok)

    r = tl.arange(0, KP)  # [KP] the kept nodes
    kept = r < K
    val, best = _decode_keys(_top_keys(_keys(cum, j, ok), K, KP))  # [KP] each
    tok = tl.load(IDS + b * K * K + best, mask=kept, other=0)  # [KP]
    if HAS_D2T:
        tok += tl.load(D2T + tok, mask=kept, other=0)
    tl.store(OUT_LP + b * K + r, val, mask=kept)
    tl.store(OUT_TOK + b * K + r, tok, mask=kept)
    tl.store(OUT_FLAT + b * K + r, base + best, mask=kept)
    parent = best // K  # [KP]
    out_row = b * K + r  # [KP]
    for h0 in range(0, HD, BLOCK_H):
        c = h0 + tl.arange(0, BLOCK_H)  # [BLOCK_H]
        io = kept[:, None] & (c < HD)[None, :]  # [KP, BLOCK_H]
        v = tl.load(H + b * stride_hb + parent[:, None] * stride_hk + c[None, :], mask=io)  # [KP, BLOCK_H]
        tl.store(H_OUT + out_row[:, None] * HD + c[None, :], v, mask=io)
    for w0 in range(0, W + K, BLOCK_W):
        c = w0 + tl.arange(0, BLOCK_W)  # [BLOCK_W] mask column
        seen = tl.zeros([KP, BLOCK_W], dtype=tl.uint8)
        if KEEP:
            seen = tl.load(MASK + b * stride_mb + parent[:, None] * stride_mk + c[None, :],
                           mask=kept[:, None] & (c < W)[None, :], other=0)  # [KP, BLOCK_W]
        m = tl.where(c[None, :] - W == r[:, None], 1, seen).to(tl.uint8)  # [KP, BLOCK_W] then the identity block
        tl.store(MASK_OUT + out_row[:, None] * (W + K) + c[None, :], m, mask=kept[:, None] & (c < W + K)[None, :])


def expand_step(cur_lp, lp, ids, cur_flat, mask, h, scores, tokens, parents, base, d2t=None, keep_ancestors=True):
    """One expansion step (module doc): cur_lp [B, K] fp32, lp [B, K, K] fp32 and ids [B, K, K] int64 (the step's
    `topk_logprobs`), cur_flat [B, K] int64, mask [B, K, W] bool, h [B, K, H]; scores [B, C] fp32, tokens and
    parents [B, C] int64 (written at columns base .. base+K*K-1); d2t [Vd] int64 or None.
    -> (cur_lp [B, K] fp32, cur_tok [B, K] int64, cur_flat [B, K] int64, h_next [B, K, H], mask_next [B, K, W+K]).
    Triton on GPU (and on CPU under TRITON_INTERPRET=1), else the reference; no host sync."""
    B, K = cur_lp.shape
    C = scores.shape[-1]

    def need(cond, msg):
        if not cond:
            raise ValueError(msg)

    need(cur_lp.dtype == lp.dtype == scores.dtype == torch.float32, "cur_lp, lp and scores must be float32")
    need(tuple(lp.shape) == tuple(ids.shape) == (B, K, K), f"lp and ids must be [B={B}, K={K}, K], got "
         f"{tuple(lp.shape)} and {tuple(ids.shape)}")
    need(tuple(cur_flat.shape) == (B, K), f"cur_flat must be [B={B}, K={K}], got {tuple(cur_flat.shape)}")
    need(mask.dim() == 3 and tuple(mask.shape[:2]) == (B, K) and mask.dtype == torch.bool,
         f"mask must be bool [B={B}, K={K}, W], got {tuple(mask.shape)} {mask.dtype}")
    need(h.dim() == 3 and tuple(h.shape[:2]) == (B, K), f"h must be [B={B}, K={K}, H], got {tuple(h.shape)}")
    for name, t in (("scores", scores), ("tokens", tokens), ("parents", parents)):
        need(tuple(t.shape) == (B, C) and t.is_contiguous(), f"{name} must be contiguous [B={B}, C={C}]")
    need(ids.dtype == tokens.dtype == parents.dtype == cur_flat.dtype == torch.int64,
         "ids, cur_flat, tokens and parents must be int64")
    need(isinstance(base, int) and 0 <= base and base + K * K <= C,
         f"base={base!r}: the step's K*K={K * K} candidates must fit in columns [0, C={C})")
    need(d2t is None or (d2t.dim() == 1 and d2t.dtype == torch.int64), "d2t must be a [Vd] int64 tensor or None")
    tensors = [cur_lp, lp, ids, cur_flat, mask, h, scores, tokens, parents] + ([d2t] if d2t is not None else [])
    need(all(t.device == scores.device for t in tensors), "all inputs must be on one device")
    if not use_triton(*tensors):
        return expand_step_ref(cur_lp, lp, ids, cur_flat, mask, h, scores, tokens, parents, base, d2t,
                               keep_ancestors)
    W, HD = mask.shape[2], h.shape[2]
    lp, ids = lp.contiguous(), ids.contiguous()
    if d2t is not None:
        d2t = d2t.contiguous()
    if cur_lp.stride(1) != 1:
        cur_lp = cur_lp.contiguous()
    if cur_flat.stride(1) != 1:
        cur_flat = cur_flat.contiguous()
    if mask.stride(2) != 1:
        mask = mask.contiguous()
    if h.stride(2) != 1:
        h = h.contiguous()
    dev = scores.device
    out_lp = torch.empty(B, K, dtype=torch.float32, device=dev)  # [B, K]
    out_tok = torch.empty(B, K, dtype=torch.int64, device=dev)  # [B, K]
    out_flat = torch.empty(B, K, dtype=torch.int64, device=dev)  # [B, K]
    h_next = torch.empty(B, K, HD, dtype=h.dtype, device=dev)  # [B, K, H]
    mask_next = torch.empty(B, K, W + K, dtype=torch.bool, device=dev)  # [B, K, W+K]
    if B == 0:
        return out_lp, out_tok, out_flat, h_next, mask_next
    _expand_kernel[(B,)](
        cur_lp, lp, ids, d2t if d2t is not None else ids, cur_flat, mask.view(torch.uint8), h, scores, tokens,
        parents, out_lp, out_tok, out_flat, h_next, mask_next.view(torch.uint8), base, C, W, HD,
        cur_lp.stride(0), cur_flat.stride(0), mask.stride(0), mask.stride(1), h.stride(0), h.stride(1),
        **_launch_meta(K, W, HD, d2t is not None, keep_ancestors),
    )  # fmt: skip
    return out_lp, out_tok, out_flat, h_next, mask_next


def _launch_meta(K: int, W: int, HD: int, has_d2t: bool, keep_ancestors: bool) -> dict:
    """Blocks and warps for K nodes with W mask columns and hidden size HD."""
    return dict(K=K, KP=triton.next_power_of_2(K), KK_P=triton.next_power_of_2(K * K), HAS_D2T=has_d2t,
                KEEP=keep_ancestors, BLOCK_W=min(1024, triton.next_power_of_2(W + K)),
                BLOCK_H=min(1024, triton.next_power_of_2(max(HD, 1))), num_warps=4)  # HD 0: no hidden state


def compile_cases(hip: bool) -> list[CompileCase]:
    """kernels/_compile_cases.py: every draft step of every tree, for EAGLE-1 (target ids, ancestors cached),
    EAGLE-3 (d2t) and multi-layer heads (no ancestors), at the model's hidden size, with the strides the EAGLE
    drafter passes (engine/drafters/eagle.py: step 1 expands the root's broadcast node ids and identity mask); bf16
    hidden states, the same on both vendors."""
    f32, i64, u8, bf16 = Ptr(torch.float32), Ptr(torch.int64), Ptr(torch.uint8), Ptr(torch.bfloat16)
    heads = (("eagle1", False, True), ("eagle3", True, True), ("multi_layer", False, False))
    cases = []
    for s in model_shapes():
        H = s.hidden
        for t in TREES:
            K = t.topk
            for i in range(1, t.steps):
                W = i * K  # the draft KV that step i's nodes see
                strides = dict(stride_lpb=K, stride_fb=0 if i == 1 else K, stride_mb=0 if i == 1 else K * W,
                               stride_mk=W, stride_hb=K * H, stride_hk=H)
                for head, has_d2t, keep in heads:
                    cases.append(CompileCase.of(
                        _expand_kernel, (f"{s.name} {t.name} {head}",), CUR_LP=f32, LP=f32, IDS=i64, D2T=i64,
                        CUR_FLAT=i64, MASK=u8, H=bf16, SCORES=f32, TOKENS=i64, PARENTS=i64, OUT_LP=f32, OUT_TOK=i64,
                        OUT_FLAT=i64, H_OUT=bf16, MASK_OUT=u8, base=K + (i - 1) * K * K, C=num_candidates(K, t.steps),
                        W=W, HD=H, **strides, **_launch_meta(K, W, H, has_d2t, keep)))
    return cases
