# One module past ~500 lines: the one `_proj_kernel` every projection runs, with its launchers, spec and compile cases
"""Every projection of a block, batch-invariant, with the op next to it fused in:

    linear(x, weight, bias=None, norm_weight=None, eps=0)       [rmsnorm(x) or x] @ W.T (+ b)         -> [M, N]
    proj_rope_store(x, norm_weight, weight, bias, positions, inv_freq, k_cache, v_cache, out_slots, Hq, Hkv, D, eps,
                    x2=None, norm_weight2=None)                  qkv of rmsnorm(x), RoPE, K/V store  -> q [M, Hq, D]
    gate_up_silu(x, norm_weight, weight, eps)                    silu(gate) * up of rmsnorm(x)       -> [M, I]
    linear_add_(out, a, weight, bias=None)                       out += a @ W.T (+ b), in place      -> out
    linear_add(res, a, weight, bias=None)                        res + a @ W.T (+ b), a new tensor   -> [M, N]

x is a block's residual stream [M, K]; the `*_ref` functions are the spec. The RMSNorm in front of a projection is
computed as the projection streams its input: x * g is rounded and multiplied, and each output row is scaled by its
input row's 1/rms (rmsnorm(x) @ W.T = rstd * ((x * g) @ W.T), rstd per row), so no normed activation is written.
With x2 (an EAGLE-3 midlayer's [embeds | hidden] input) the projection is of cat(rmsnorm(x), rmsnorm(x2)).

Batch invariance (why one kernel serves decode, verify and prefill): a row's result depends on that row and the
weight only, never on M or on the other rows, so a verify of 8 tree tokens computes each of them exactly as a decode
of that token does, and greedy speculative output equals plain decoding in bf16. The reduction order of an output
element is fixed by the weight's shape (kernels/projection_config.py, whose `launch_config` is the one launch table):
  * K is cut into SPLITS fixed ranges (split_k keys each, a multiple of BLOCK_K); split s's partial sum is one chain of
    MMAs over its range, k ascending, from a zero accumulator; the partials are added in split order. With two inputs
    each has its own SPLITS ranges and its own sum.
  * The norm's sum of squares: per split, elementwise over the K steps into [BLOCK_K, rows] lanes, then a pairwise
    tree written out in kernels/_fixed_order.py, so the order does not follow the register layout, which changes
    with the row tile. Decode and verify sum inside the projection's K loop; prefill in a pre-pass with the same
    arithmetic.
  * The MMA: the weight rows are its M dimension (BLOCK_N) and x's rows its N (BLOCK_M, zero-padded). An element of
    an MMA does not depend on the other elements, so a row gives the same bits in a 16-row tile as in a 128-row one
    (tests/kernels/test_projection.py checks this on the GPU in bf16; fp32 takes FMA dots, sequential in k).
Decode and verify calls (M <= MAX_SPLIT_M) run one program per (BLOCK_N weight rows, split, x tile): the split-K fills
the GPU where the weight has few row tiles (an 8B o_proj: 64 tiles of 64 rows for 132 SMs) and every program streams
its slab of the weight once. Their partials go to an fp32 workspace; the last program of a tile to finish (an atomic
counter, reset by that program) adds them in split order and runs the epilogue. Prefill (more rows) first sums each
row's squares once ([M] fp32 per input with a norm, `_sumsq_kernel`; in the K loop each of a row's N / BLOCK_N weight
tiles would sum them again), then runs one program per (weight tile, x tile) with x tiles of 128 or 256 rows
(`_prefill_tiles`), which loops over the same splits in the same order itself (a weight of long splits without a
norm: one program a split, on the split-K grid) and scales by the pre-pass's 1/rms: its K loop holds no
sum-of-squares lanes beside the accumulator, so its MMA's K tile need not be the plan's, and, with the norm folded,
leaves x in shared memory for the MMA.

The SiLU and RoPE epilogues need two weight rows per result (gate j with up j; dims i and i + D/2 of a head): their
programs load the rows in interleaved pairs, so that splitting the accumulator's row pairs gives both halves.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra import libdevice

from eaglet.kernels import projection_config
from eaglet.kernels import rope as _rope
from eaglet.kernels._compile_cases import TARGET_SMS, CompileCase, Ptr, model_shapes
from eaglet.kernels._fixed_order import fixed_sum0
from eaglet.kernels._utils import FLOAT_DTYPES, check_like, check_weight, is_interpret, use_triton
from eaglet.kernels.activation import silu_and_mul_ref
from eaglet.kernels.projection_config import _ADD, _PLAIN, _ROPE, _SILU, _table, launch_config
from eaglet.kernels.projection_config import MAX_SPLIT_M as MAX_SPLIT_M  # re-exported (tests, benchmarks)
from eaglet.kernels.rmsnorm import row_rstd_ref
from eaglet.kernels.rope import rope_store_ref

# norm_weight=FOLDED: the RMSNorm's weight is already inside the projection's weight (W' = W diag(g),
# `Transformer.fold_norm_weights`): only the row scale 1/rms(x) remains, and the K loop multiplies nothing
FOLDED = "folded"


# ----------------------------------------------------------------------------------------------------
# Torch references (the spec)


def _normed(x: torch.Tensor, norm_weight, eps: float) -> torch.Tensor:
    """x's projection input as the kernel forms it: x * g rounded to x's dtype (x itself without a norm weight)."""
    return x if _norm_mode(norm_weight) < 2 else (x.float() * norm_weight.float()).to(x.dtype)


def proj_ref(x, weight, norm_weight=None, eps=0.0, x2=None, norm_weight2=None) -> torch.Tensor:
    """The projection as the kernel rounds it, before the epilogue: [M, N] in x's dtype. Without a norm:
    x @ W.T rounded once. With one: (x * g) @ W.T rounded, times 1/rms(x) in fp32, rounded. With x2 (weight
    [W1 | W2]): the two inputs' scaled products summed in fp32 and rounded once."""
    K = x.shape[1]
    w1 = weight[:, :K] if x2 is not None else weight
    y = F.linear(_normed(x, norm_weight, eps), w1)  # [M, N]
    if norm_weight is not None:
        y = y.float() * row_rstd_ref(x, eps)[:, None]  # [M, N]
    if x2 is not None:
        y2 = F.linear(_normed(x2, norm_weight2, eps), weight[:, K:])  # [M, N]
        y2 = y2.float() * row_rstd_ref(x2, eps)[:, None] if norm_weight2 is not None else y2.float()
        y = y.float() + y2  # [M, N]
    return y.to(x.dtype)


def row_sumsq_ref(x: torch.Tensor, splits: int, split_k: int, block_k: int) -> torch.Tensor:
    """Each row's sum of squares [M] fp32 in the kernels' order (`_split_dot`, `_sumsq_kernel`): per split of
    split_k columns, lane j sums x[:, k0 + j]^2 over the split's block_k-wide steps k0, ascending from zero; the
    lanes are added pairwise (lane j + lane j + n/2, halving n: `fixed_sum0`); the splits' sums in order from zero.
    The bits of the kernels' sums where x * x is exact in fp32 (bf16 / fp16 x) or, on CPU, always."""
    xf = x.float()  # [M, K]
    M, K = xf.shape
    tot = torch.zeros(M, dtype=torch.float32, device=x.device)  # [M]
    for s in range(splits):
        lo, hi = s * split_k, min(s * split_k + split_k, K)
        lanes = torch.zeros(M, block_k, dtype=torch.float32, device=x.device)  # [M, BK]
        for k0 in range(lo, hi, block_k):
            step = xf[:, k0:min(k0 + block_k, hi)]  # [M, <= BK]
            lanes[:, :step.shape[1]] += step * step
        n = block_k
        while n > 1:
            n //= 2
            lanes = lanes[:, :n] + lanes[:, n:]  # [M, n]
        tot = tot + lanes[:, 0]
    return tot


def linear_ref(x, weight, bias=None, norm_weight=None, eps=0.0) -> torch.Tensor:
    """`proj_ref`, plus the bias in fp32, rounded: [M, N]."""
    y = proj_ref(x, weight, norm_weight, eps)  # [M, N]
    return y if bias is None else (y.float() + bias.float()).to(x.dtype)


def proj_rope_store_ref(x, norm_weight, weight, bias, positions, inv_freq, k_cache, v_cache, out_slots, n_heads,
                        n_kv_heads, head_dim, eps, x2=None, norm_weight2=None, layers: int = 1,
                        layer_stride: int = 0) -> torch.Tensor:
    """`proj_ref` (+ bias), then `rope_store_ref` (each layer's rows into its caches): writes the caches, returns q
    [M, Hq, D]."""
    qkv = proj_ref(x, weight, norm_weight, eps, x2, norm_weight2)  # [M, layers * (Hq+2Hkv)*D]
    if bias is not None:
        qkv = (qkv.float() + bias.float()).to(x.dtype)
    n = qkv.shape[1] // layers
    for layer in range(layers):
        k_l, v_l = (c.as_strided(c.shape, c.stride(), c.storage_offset() + layer * layer_stride)
                    for c in (k_cache, v_cache))  # layer's caches
        q = rope_store_ref(qkv[:, layer * n:(layer + 1) * n], positions, inv_freq, k_l, v_l, out_slots, n_heads,
                           n_kv_heads, head_dim)
    return q


def gate_up_silu_ref(x, norm_weight, weight, eps) -> torch.Tensor:
    """`proj_ref`, then `silu_and_mul_ref`: x [M, H] -> [M, I]."""
    return silu_and_mul_ref(proj_ref(x, weight, norm_weight, eps))  # [M, I]


def linear_add_ref(res, a, weight, bias=None) -> torch.Tensor:
    """res + (a @ W.T (+ b)) in fp32 with one rounding, as a new tensor [M, N]."""
    y = a.float() @ weight.float().t()  # [M, N]
    if bias is not None:
        y = y + bias.float()
    return (res.float() + y).to(res.dtype)


# ----------------------------------------------------------------------------------------------------
# Kernel


@triton.jit
def _split_dot(x_ptr, stride_xm, g_ptr, w_rows, k_lo, k_hi, m, m_ok, row_ok, NORM: tl.constexpr, SUMSQ: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One split: acc [BN, BM] = w[:, k_lo:k_hi] @ a[m, k_lo:k_hi]^T, one MMA chain from zero, k ascending; a = x
    (NORM 0, 1) or x * g rounded (NORM 2); with SUMSQ also x's sum of squares over the range [BM] (`fixed_sum0`;
    `_sumsq_kernel` repeats this arithmetic for the prefill path). w_rows [BN, 1]: the tile's weight rows at their
    first column of this input."""
    dtype = x_ptr.dtype.element_ty
    x_rows = x_ptr + m[None, :].to(tl.int64) * stride_xm  # [1, BM]
    kk = tl.arange(0, BLOCK_K)  # [BK]
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    sq = tl.zeros((BLOCK_K, BLOCK_M), tl.float32)  # lane k: the sum of x[m, k0 + k]^2 over the steps k0
    for k0 in range(k_lo, k_hi, BLOCK_K):
        ks = k0 + kk  # [BK]
        k_ok = ks < k_hi  # [BK]
        w = tl.load(w_rows + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)  # [BN, BK]
        xt = tl.load(x_rows + ks[:, None], mask=k_ok[:, None] & m_ok[None, :], other=0.0)  # [BK, BM]
        if SUMSQ or NORM == 2:
            xf = xt.to(tl.float32)  # [BK, BM]
            if SUMSQ:
                sq += xf * xf
            if NORM == 2:
                g = tl.load(g_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)  # [BK]
                xt = (xf * g[:, None]).to(dtype)  # [BK, BM]
        # "ieee": fp32 inputs stay fp32 (FMA dots, no tf32); bf16/fp16 take the tensor cores either way
        acc = tl.dot(w, xt, acc, input_precision="ieee")  # [BN, BM]
    if SUMSQ:
        return acc, fixed_sum0(sq, BLOCK_K, BLOCK_M)
    return acc, tl.zeros((BLOCK_M,), tl.float32)


@triton.jit
def _input_sum(x_ptr, stride_xm, g_ptr, w_rows, K, SPLIT_K, s_lo, s_hi, m, m_ok, row_ok, NORM: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Splits [s_lo, s_hi) of one input, in one program, added in split order from zero (the prefill path): [BN, BM].
    No sum of squares: `_sumsq_kernel` computed it before."""
    tot = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    for s in range(s_lo, s_hi):
        acc, _ = _split_dot(x_ptr, stride_xm, g_ptr, w_rows, s * SPLIT_K, tl.minimum(s * SPLIT_K + SPLIT_K, K), m,
                            m_ok, row_ok, NORM, False, BLOCK_M, BLOCK_N, BLOCK_K)  # [BN, BM]
        tot += acc
    return tot


@triton.jit
def _sumsq_step(x_rows, k0, k_hi, m_ok, BLOCK_K: tl.constexpr):
    """x[m, k0 : k0 + BLOCK_K] as `_split_dot` loads it, in fp32: [BK, BM], zeros past k_hi (a whole step past it
    adds zeros, which leave a sum of squares as it is)."""
    ks = k0 + tl.arange(0, BLOCK_K)  # [BK]
    return tl.load(x_rows + ks[:, None], mask=(ks < k_hi)[:, None] & m_ok[None, :], other=0.0).to(tl.float32)


@triton.jit
def _sumsq_kernel(x_ptr, out_ptr, M, K, stride_xm, SPLIT_K, SPLITS: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_K: tl.constexpr):
    """The prefill path's pre-pass: out[m] = x[m]'s sum of squares [M] fp32 with the split-K path's arithmetic (per
    split the lanes of `_split_dot` over its k steps, ascending from zero, then `fixed_sum0`; the splits added in
    order from zero as `_partial_sum` adds them), so that a prefill row's 1/rms has a decode row's bits. Each row is
    its own lanes, so BLOCK_M (any power of two) does not change a row's bits. Four steps' loads go out before their
    adds, in step order (Triton does not pipeline this loop's plain loads: a program would wait on one step's load
    at a time). Grid: cdiv(M, BLOCK_M)."""
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    m_ok = m < M  # [BM]
    x_rows = x_ptr + m[None, :].to(tl.int64) * stride_xm  # [1, BM]
    tot = tl.zeros((BLOCK_M,), tl.float32)
    for s in range(0, SPLITS):
        k_lo = s * SPLIT_K
        k_hi = tl.minimum(k_lo + SPLIT_K, K)
        sq = tl.zeros((BLOCK_K, BLOCK_M), tl.float32)
        for k0 in range(k_lo, k_hi, 4 * BLOCK_K):
            x0 = _sumsq_step(x_rows, k0, k_hi, m_ok, BLOCK_K)  # [BK, BM]
            x1 = _sumsq_step(x_rows, k0 + BLOCK_K, k_hi, m_ok, BLOCK_K)  # [BK, BM]
            x2 = _sumsq_step(x_rows, k0 + 2 * BLOCK_K, k_hi, m_ok, BLOCK_K)  # [BK, BM]
            x3 = _sumsq_step(x_rows, k0 + 3 * BLOCK_K, k_hi, m_ok, BLOCK_K)  # [BK, BM]
            sq += x0 * x0
            sq += x1 * x1
            sq += x2 * x2
            sq += x3 * x3
        tot += fixed_sum0(sq, BLOCK_K, BLOCK_M)  # [BM]
    tl.store(out_ptr + m, tot, mask=m_ok)


@triton.jit
def _partial_sum(ws_ptr, base, s_lo, s_hi, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The workspace's partials of splits [s_lo, s_hi) of one tile, added in split order from zero: ([BN, BM], [BM]).
    base: the tile's first partial; a split's record is BN * BM products, then BM sums of squares."""
    rec: tl.constexpr = BLOCK_N * BLOCK_M + BLOCK_M
    r = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]  # [BN, BM]
    tot = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    sq = tl.zeros((BLOCK_M,), tl.float32)
    for s in range(s_lo, s_hi):
        p = ws_ptr + base + s * rec
        # .cg: another program wrote these; read them from L2, never from a stale L1 line
        tot += tl.load(p + r, cache_modifier=".cg")
        sq += tl.load(p + BLOCK_N * BLOCK_M + tl.arange(0, BLOCK_M), cache_modifier=".cg")
    return tot, sq


@triton.jit
def _proj_kernel(
    x_ptr, x2_ptr, g_ptr, g2_ptr, w_ptr, b_ptr, res_ptr, out_ptr, ws_ptr, cnt_ptr,
    pos_ptr, freq_ptr, slots_ptr, k_ptr, v_ptr,
    M, N, K, K2, stride_xm, stride_x2m, stride_wn, stride_rm, stride_om, eps, layer_stride,
    EPI: tl.constexpr, NORM: tl.constexpr, NORM2: tl.constexpr, TWO_INPUTS: tl.constexpr, HAS_BIAS: tl.constexpr,
    HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, PRECISE_TRIG: tl.constexpr,
    SPLITS: tl.constexpr, SPLIT_K, SPLITS2: tl.constexpr, SPLIT_K2, IN_PROGRAM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Grid: split-K (IN_PROGRAM false) n_tiles * (SPLITS + SPLITS2) * m_tiles programs, m fastest; prefill
    (IN_PROGRAM) n_tiles * m_tiles, m fastest. ws / cnt: the split-K partials and per-tile arrival counters; in
    prefill ws holds the inputs' sums of squares (`_sumsq_kernel`) and cnt is unused. EPI 3 with HQ 0 (a context
    store, k and v rows alone): the weight holds one or more layers' [N, K] k/v rows one after another, layer l's
    caches layer_stride elements past k_ptr / v_ptr; n_tiles covers them all, a tile within one layer."""
    pid = tl.program_id(0)
    m_tiles = tl.cdiv(M, BLOCK_M)
    n_splits: tl.constexpr = SPLITS + SPLITS2
    pid_m = pid % m_tiles
    if IN_PROGRAM:
        pid_n = pid // m_tiles
        split = 0
    else:
        split = (pid // m_tiles) % n_splits
        pid_n = pid // (m_tiles * n_splits)
    HALF: tl.constexpr = BLOCK_N // 2
    r = tl.arange(0, BLOCK_N)  # [BN] the tile's accumulator rows
    n0 = pid_n * BLOCK_N
    if EPI == 3 and HQ == 0:  # the tile's layer: its weight rows and caches, n0 its first row in that layer's N
        layer = n0 // N
        n0 -= layer * N
        w_ptr += layer.to(tl.int64) * N * stride_wn
        b_ptr += layer.to(tl.int64) * N  # read only with HAS_BIAS
        k_ptr += layer.to(tl.int64) * layer_stride
        v_ptr += layer.to(tl.int64) * layer_stride
    pair = False  # rows interleaved in pairs (even r: first of the pair)
    if EPI == 2:  # gate j, up j; N = 2I
        j = pid_n * HALF + r // 2  # [BN] the output column of the pair
        wrow = j + (r % 2) * (N // 2)  # [BN]
        row_ok = j < N // 2  # [BN]
    elif EPI == 3:  # q and k heads: dims i and i + D/2 of head n0 // D; v heads: plain rows
        pair = n0 < (HQ + HKV) * D
        i = (n0 % D) // 2 + r // 2  # [BN] the rotary frequency index
        wrow = tl.where(pair, (n0 // D) * D + i + (r % 2) * (D // 2), n0 + r)  # [BN]
        row_ok = wrow < N  # [BN]
    else:
        wrow = n0 + r  # [BN]
        row_ok = wrow < N  # [BN]
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    m_ok = m < M  # [BM]
    w_rows = w_ptr + wrow[:, None].to(tl.int64) * stride_wn  # [BN, 1]

    # ---- the reduction: (tot, sq) of input 1 and (tot2, sq2) of input 2, each in split order from zero
    if IN_PROGRAM:
        # the sums of squares come from `_sumsq_kernel`: ws [M] of input 1, then [M] of input 2
        tot = _input_sum(x_ptr, stride_xm, g_ptr, w_rows, K, SPLIT_K, 0, SPLITS, m, m_ok, row_ok, NORM, BLOCK_M,
                         BLOCK_N, BLOCK_K)  # [BN, BM]
        sq = tl.zeros((BLOCK_M,), tl.float32)
        if NORM >= 1:
            sq = tl.load(ws_ptr + m, mask=m_ok, other=0.0)  # [BM]
        tot2, sq2 = tot, sq
        if TWO_INPUTS:
            tot2 = _input_sum(x2_ptr, stride_x2m, g2_ptr, w_rows + K, K2, SPLIT_K2, 0, SPLITS2, m, m_ok, row_ok,
                              NORM2, BLOCK_M, BLOCK_N, BLOCK_K)  # [BN, BM]
            if NORM2 >= 1:
                sq2 = tl.load(ws_ptr + M + m, mask=m_ok, other=0.0)  # [BM]
        _epilogue(tot, sq, tot2, sq2, out_ptr, b_ptr, res_ptr, pos_ptr, freq_ptr, slots_ptr, k_ptr, v_ptr, M, N, K,
                  K2, stride_rm, stride_om, eps, pid_n, m, m_ok, r, wrow, row_ok, pair, n0, EPI, NORM, NORM2,
                  TWO_INPUTS, HAS_BIAS, HQ, HKV, D, PRECISE_TRIG, BLOCK_M, BLOCK_N)
    elif n_splits == 1:
        tot, sq = _split_dot(x_ptr, stride_xm, g_ptr, w_rows, 0, K, m, m_ok, row_ok, NORM, NORM >= 1, BLOCK_M,
                             BLOCK_N, BLOCK_K)  # [BN, BM], [BM]
        _epilogue(tot, sq, tot, sq, out_ptr, b_ptr, res_ptr, pos_ptr, freq_ptr, slots_ptr, k_ptr, v_ptr, M, N, K,
                  K2, stride_rm, stride_om, eps, pid_n, m, m_ok, r, wrow, row_ok, pair, n0, EPI, NORM, NORM2,
                  TWO_INPUTS, HAS_BIAS, HQ, HKV, D, PRECISE_TRIG, BLOCK_M, BLOCK_N)
    else:
        if split < SPLITS:
            acc, q = _split_dot(x_ptr, stride_xm, g_ptr, w_rows, split * SPLIT_K,
                                tl.minimum(split * SPLIT_K + SPLIT_K, K), m, m_ok, row_ok, NORM, NORM >= 1, BLOCK_M,
                                BLOCK_N, BLOCK_K)  # [BN, BM], [BM]
        else:
            s2 = split - SPLITS
            acc, q = _split_dot(x2_ptr, stride_x2m, g2_ptr, w_rows + K, s2 * SPLIT_K2,
                                tl.minimum(s2 * SPLIT_K2 + SPLIT_K2, K2), m, m_ok, row_ok, NORM2, NORM2 >= 1,
                                BLOCK_M, BLOCK_N, BLOCK_K)  # [BN, BM], [BM]
        rec: tl.constexpr = BLOCK_N * BLOCK_M + BLOCK_M
        tile = pid_n * m_tiles + pid_m
        base = tile.to(tl.int64) * (n_splits * rec)
        p = ws_ptr + base + split * rec
        tl.store(p + r[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :], acc)
        tl.store(p + BLOCK_N * BLOCK_M + tl.arange(0, BLOCK_M), q)
        # Every thread's partial stores precede the arrival (the barrier), which releases them at GPU scope; the last
        # program to arrive acquires them all, adds them in split order and runs the epilogue.
        tl.debug_barrier()
        arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == n_splits - 1:
            tl.store(cnt_ptr + tile, 0)  # ready for the next launch (graph replays included)
            tot, sq = _partial_sum(ws_ptr, base, 0, SPLITS, BLOCK_M, BLOCK_N)  # [BN, BM], [BM]
            tot2, sq2 = tot, sq
            if TWO_INPUTS:
                tot2, sq2 = _partial_sum(ws_ptr, base, SPLITS, n_splits, BLOCK_M, BLOCK_N)  # [BN, BM], [BM]
            _epilogue(tot, sq, tot2, sq2, out_ptr, b_ptr, res_ptr, pos_ptr, freq_ptr, slots_ptr, k_ptr, v_ptr, M, N, K,
                      K2, stride_rm, stride_om, eps, pid_n, m, m_ok, r, wrow, row_ok, pair, n0, EPI, NORM, NORM2,
                      TWO_INPUTS, HAS_BIAS, HQ, HKV, D, PRECISE_TRIG, BLOCK_M, BLOCK_N)


@triton.jit
def _epilogue(tot, sq, tot2, sq2, out_ptr, b_ptr, res_ptr, pos_ptr, freq_ptr, slots_ptr, k_ptr, v_ptr, M, N, K, K2,
              stride_rm, stride_om, eps, pid_n, m, m_ok, r, wrow, row_ok, pair, n0,
              EPI: tl.constexpr, NORM: tl.constexpr, NORM2: tl.constexpr, TWO_INPUTS: tl.constexpr,
              HAS_BIAS: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
              PRECISE_TRIG: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """y = the tile's projection [BM, BN] from the reduced sums (tot [BN, BM] and x's sum of squares sq [BM]; tot2 /
    sq2 the second input's), rounded as the references round, then the epilogue's op and store."""
    dtype = out_ptr.dtype.element_ty
    HALF: tl.constexpr = BLOCK_N // 2
    y = tl.trans(tot)  # [BM, BN]
    if EPI == 1:  # res + product (+ bias), one rounding
        if HAS_BIAS:
            y += tl.load(b_ptr + wrow, mask=row_ok, other=0.0).to(tl.float32)[None, :]  # [BM, BN]
        mask = m_ok[:, None] & row_ok[None, :]  # [BM, BN]
        res = tl.load(res_ptr + m[:, None].to(tl.int64) * stride_rm + wrow[None, :], mask=mask, other=0.0)  # [BM, BN]
        offs = m[:, None].to(tl.int64) * stride_om + wrow[None, :]  # [BM, BN]
        tl.store(out_ptr + offs, (res.to(tl.float32) + y).to(dtype), mask=mask)
    else:
        y = y.to(dtype).to(tl.float32)  # the product rounded, as F.linear rounds it
        if NORM >= 1:
            y = y * tl.math.rsqrt(sq / K + eps)[:, None]  # [BM, BN]
        if TWO_INPUTS:
            y2 = tl.trans(tot2).to(dtype).to(tl.float32)  # [BM, BN]
            if NORM2 >= 1:
                y2 = y2 * tl.math.rsqrt(sq2 / K2 + eps)[:, None]  # [BM, BN]
            y = y + y2  # [BM, BN]
        y = y.to(dtype).to(tl.float32)  # [BM, BN]
        if HAS_BIAS:
            y = (y + tl.load(b_ptr + wrow, mask=row_ok, other=0.0).to(tl.float32)[None, :]).to(dtype).to(tl.float32)
        if EPI == 0:
            offs = m[:, None].to(tl.int64) * stride_om + wrow[None, :]  # [BM, BN]
            tl.store(out_ptr + offs, y.to(dtype), mask=m_ok[:, None] & row_ok[None, :])
        elif EPI == 2:
            g, u = tl.split(tl.reshape(y, (BLOCK_M, HALF, 2)))  # [BM, HALF] each
            s = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)  # torch rounds silu before the multiply
            cols = pid_n * HALF + tl.arange(0, HALF)  # [HALF]
            offs = m[:, None].to(tl.int64) * stride_om + cols[None, :]  # [BM, HALF]
            tl.store(out_ptr + offs, (s * u).to(dtype), mask=m_ok[:, None] & (cols < N // 2)[None, :])
        else:
            slot = tl.load(slots_ptr + m, mask=m_ok, other=0).to(tl.int64)  # [BM]
            if pair:
                x1, x2 = tl.split(tl.reshape(y, (BLOCK_M, HALF, 2)))  # [BM, HALF]: dims i and i + D/2
                fi = (n0 % D) // 2 + tl.arange(0, HALF)  # [HALF]
                pos = tl.load(pos_ptr + m, mask=m_ok, other=0).to(tl.float32)  # [BM]
                angle = pos[:, None] * tl.load(freq_ptr + fi)[None, :]  # [BM, HALF]; one fp32 product, as torch
                if PRECISE_TRIG:  # libdevice's full range reduction (angles reach ~1e5 rad); see kernels/rope.py
                    cos = libdevice.cos(angle)  # [BM, HALF]
                    sin = libdevice.sin(angle)  # [BM, HALF]
                else:  # the interpreter has no libdevice; its numpy cos/sin are accurate
                    cos = tl.cos(angle)  # [BM, HALF]
                    sin = tl.sin(angle)  # [BM, HALF]
                o1 = x1 * cos - x2 * sin  # [BM, HALF]
                o2 = x2 * cos + x1 * sin  # [BM, HALF]
                head = n0 // D
                if head < HQ:
                    q_dst = out_ptr + m[:, None].to(tl.int64) * (HQ * D) + head * D + fi[None, :]  # [BM, HALF]
                    tl.store(q_dst, o1.to(dtype), mask=m_ok[:, None])
                    tl.store(q_dst + D // 2, o2.to(dtype), mask=m_ok[:, None])
                else:
                    cache_dtype = k_ptr.dtype.element_ty
                    k_dst = k_ptr + slot[:, None] * (HKV * D) + (head - HQ) * D + fi[None, :]  # [BM, HALF]
                    tl.store(k_dst, o1.to(dtype).to(cache_dtype), mask=m_ok[:, None])
                    tl.store(k_dst + D // 2, o2.to(dtype).to(cache_dtype), mask=m_ok[:, None])
            else:
                v_dst = v_ptr + slot[:, None] * (HKV * D) + (n0 - (HQ + HKV) * D + r)[None, :]  # [BM, BN]
                tl.store(v_dst, y.to(v_ptr.dtype.element_ty), mask=m_ok[:, None])


# ----------------------------------------------------------------------------------------------------
# Launchers


_COUNTERS: dict = {}  # device -> int32 arrival counters, zero between launches


def _counters(device: torch.device, n: int) -> torch.Tensor:
    """The split-K arrival counters of a device (each launch leaves them at zero). One buffer per device: eaglet runs
    projections on one stream per device (the stream plan's side stream runs no projection); two launches that
    overlap on two streams would need two buffers."""
    buf = _COUNTERS.get(device)
    if buf is None or buf.numel() < n:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("projection counters must be allocated before CUDA-graph capture: run the graph's "
                               "shapes once eagerly first (the engines' warm-up does)")
        buf = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        _COUNTERS[device] = buf
    return buf


def _check_rows(name: str, x: torch.Tensor) -> None:
    if x.dim() != 2 or x.shape[1] == 0:
        raise ValueError(f"{name} must be [M, K] with K >= 1, got shape {list(x.shape)}")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be float32/bfloat16/float16, got {x.dtype}")


def _check_proj(x, weight, bias=None, norm_weight=None, x2=None, norm_weight2=None, x_name: str = "x") -> None:
    """x [M, K] (and x2 [M, K2]) float, weight [N, K (+ K2)] row-major, bias [N], norm weights [K] / [K2], all in x's
    dtype on x's device."""
    _check_rows(x_name, x)
    K = x.shape[1]
    if x2 is not None:
        _check_rows("x2", x2)
        if x2.shape[0] != x.shape[0] or x2.dtype != x.dtype or x2.device != x.device:
            raise ValueError(f"x2 must be [M, K2] with M = {x.shape[0]} rows, {x.dtype} on {x.device} like x, got "
                             f"{list(x2.shape)} {x2.dtype} on {x2.device}")
        K += x2.shape[1]
    check_weight(weight, K, x, bias)
    for name, g, width in (("norm_weight", norm_weight, K if x2 is None else x.shape[1]),
                           ("norm_weight2", norm_weight2, None if x2 is None else x2.shape[1])):
        if isinstance(g, str) and g != FOLDED:
            raise ValueError(f"{name} must be a tensor, None or projection.FOLDED, got {g!r}")
        if _norm_mode(g) == 2:
            check_like(name, g, (width,), x)


def _tensors(*ts) -> list[torch.Tensor]:
    return [t for t in ts if isinstance(t, torch.Tensor)]


def _norm_mode(norm_weight) -> int:
    """The kernel's NORM: 0 no norm, 1 the norm's weight folded into the projection (FOLDED), 2 a norm weight."""
    return 0 if norm_weight is None else 1 if isinstance(norm_weight, str) else 2


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(1) == 1 else t.contiguous()


# rows of a `_sumsq_kernel` program: 128 programs at a 2,048-row prefill; a row's bits do not depend on it
_SUMSQ_ROWS = 16


def _row_sumsq(x: torch.Tensor, out: torch.Tensor, splits: int, split_k: int, block_k: int) -> None:
    """out [M] fp32 = each row of x [M, K]'s sum of squares as the split-K path sums it (`_sumsq_kernel`)."""
    M, K = x.shape
    _sumsq_kernel[(triton.cdiv(M, _SUMSQ_ROWS),)](x, out, M, K, x.stride(0), split_k, SPLITS=splits,
                                                  BLOCK_M=_SUMSQ_ROWS, BLOCK_K=block_k, num_warps=4)


def _launch(epi: int, x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, *, norm_weight=None, eps: float = 0.0,
            x2=None, norm_weight2=None, bias=None, res=None, rope: tuple = (), heads: tuple = (1, 1, 1),
            layers: int = 1, layer_stride: int = 0, cfg: dict | None = None) -> None:
    """Run `_proj_kernel`; res: the residual the add epilogue reads (out itself when None: in place). layers: the
    weight holds that many layers' k/v rows (`proj_rope_store`), each with its own caches layer_stride apart, each
    layer's the plan and tiles of its own weight. cfg: a launch config instead of the table's (benchmarks)."""
    two = x2 is not None
    x = _rows(x)
    x2 = _rows(x2) if two else x
    res = out if res is None else res
    positions, inv_freq, out_slots, k_cache, v_cache = rope or (x, x, x, x, x)  # dummies without RoPE
    hq, hkv, d = heads
    M, K = x.shape
    N = weight.shape[0] // layers  # a layer's rows
    K2 = x2.shape[1] if two else 0
    norm, norm2 = _norm_mode(norm_weight), _norm_mode(norm_weight2) if two else 0
    if cfg is None:
        cfg = launch_config(N, K, M, epi, x.dtype, x.device, d, two, max(norm, norm2))
    cfg = dict(cfg)
    splits, split_k = cfg.pop("SPLITS"), cfg.pop("SPLIT_K")
    splits2, split_k2 = 0, 1
    if two:
        c2 = launch_config(N, K2, M, epi, x.dtype, x.device, d)
        splits2, split_k2 = c2["SPLITS"], c2["SPLIT_K"]
    block_m, block_n = cfg["BLOCK_M"], cfg["BLOCK_N"]
    in_program = cfg.pop("IN_PROGRAM", M > projection_config.MAX_SPLIT_M)  # the table's; a hand-made cfg: by rows
    sumsq_k = cfg.pop("SUMSQ_K", cfg["BLOCK_K"])  # the plan's BLOCK_K: the pre-pass's lanes (the order)
    if layers > 1 and N % block_n:
        raise ValueError(f"{layers} layers' k/v rows of {N} each: a tile of {block_n} rows would span two layers")
    m_tiles, n_tiles = triton.cdiv(M, block_m), layers * triton.cdiv(N, block_n)
    n_splits = splits + splits2
    ws = cnt = out
    if not in_program and n_splits > 1:
        ws = torch.empty(n_tiles * m_tiles * n_splits * (block_n * block_m + block_m), dtype=torch.float32,
                         device=x.device)
        cnt = _counters(x.device, n_tiles * m_tiles)
    elif in_program and (norm or norm2):
        ws = torch.empty((2 if two else 1) * M, dtype=torch.float32, device=x.device)  # [M] per input
        if norm:
            _row_sumsq(x, ws[:M], splits, split_k, sumsq_k)
        if norm2:
            _row_sumsq(x2, ws[M:], splits2, split_k2, sumsq_k)
    grid = (n_tiles * m_tiles * (1 if in_program else n_splits),)
    _proj_kernel[grid](
        x, x2, norm_weight if _norm_mode(norm_weight) == 2 else x, norm_weight2 if _norm_mode(norm_weight2) == 2 else x,
        weight,
        weight if bias is None else bias, res, out, ws, cnt, positions, inv_freq, out_slots, k_cache, v_cache,
        M, N, K, K2, x.stride(0), x2.stride(0), weight.stride(0), res.stride(0), out.stride(0), float(eps),
        layer_stride, EPI=epi, NORM=norm, NORM2=norm2, TWO_INPUTS=two,
        HAS_BIAS=bias is not None, HQ=hq, HKV=hkv, D=d, PRECISE_TRIG=not is_interpret(),
        SPLITS=splits, SPLIT_K=split_k, SPLITS2=splits2, SPLIT_K2=split_k2, IN_PROGRAM=in_program, **cfg,
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           norm_weight: torch.Tensor | None = None, eps: float = 0.0, cfg: dict | None = None) -> torch.Tensor:
    """x [M, K] @ weight [N, K].T (+ bias [N]) -> [M, N]; with norm_weight [K]: rmsnorm(x) (eps) @ weight.T, the norm
    fused (module doc). Any row stride; weight row-major; all in x's dtype."""
    _check_proj(x, weight, bias, norm_weight)
    if not use_triton(x, weight, *_tensors(bias, norm_weight)):
        return linear_ref(x, weight, bias, norm_weight, eps)
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)  # [M, N]
    if x.shape[0]:
        _launch(_PLAIN, x, weight, out, norm_weight=norm_weight, eps=eps, bias=bias, cfg=cfg)
    return out


def proj_rope_store(x, norm_weight, weight, bias, positions, inv_freq, k_cache, v_cache, out_slots, n_heads: int,
                    n_kv_heads: int, head_dim: int, eps: float, x2=None, norm_weight2=None, layers: int = 1,
                    layer_stride: int = 0, cfg: dict | None = None) -> torch.Tensor:
    """The qkv projection of rmsnorm(x) (x [M, H], norm_weight [H]; None: of x itself), weight
    [(Hq + 2 Hkv) D, H], bias or None, then RoPE on q and k (positions [M], inv_freq [D/2] fp32), k and v stored at
    out_slots [M] of k_cache / v_cache ([slots, Hkv, D] or paged); returns q [M, Hq, D]. With x2 [M, H2] (and
    norm_weight2): the projection of cat(rmsnorm(x), rmsnorm(x2)), weight [(Hq + 2 Hkv) D, H + H2], an EAGLE-3
    midlayer's. n_heads 0: k and v alone, weight [2 Hkv D, H] (the qkv weight's last rows: a block drafter's context
    store, which needs no q), q [M, 0, D]; with layers L > 1 too, weight [L * 2 Hkv D, H] (and bias) is L layers' k
    and v rows one after another, layer l's stored into the caches l * layer_stride elements past k_cache / v_cache
    (layers of one pool tensor: one launch for a drafter's every layer). head_dim a multiple of 64 (a 64-row tile
    holds 32 rotary pairs of one head)."""
    _check_proj(x, weight, bias, norm_weight, x2, norm_weight2)
    if layers > 1 and (n_heads or x2 is not None or weight.shape[0] % layers):
        raise ValueError(f"layers={layers}: k and v rows alone (n_heads 0, one input), {layers} equal blocks of "
                         f"weight rows, got n_heads={n_heads}, {weight.shape[0]} rows")
    qkv_like = x[:, :1].expand(x.shape[0], weight.shape[0] // layers)  # [M, (Hq+2Hkv)*D]: rope's checks, no data
    _rope._check_args(qkv_like, positions, inv_freq, k_cache, v_cache, out_slots, n_heads, n_kv_heads, head_dim,
                      None, None, min_heads=0)
    if head_dim % 64:
        raise ValueError(f"proj_rope_store needs head_dim a multiple of 64, got {head_dim}")
    tensors = _tensors(bias, norm_weight, x2, norm_weight2)
    if not use_triton(x, weight, positions, inv_freq, k_cache, v_cache, out_slots, *tensors):
        return proj_rope_store_ref(x, norm_weight, weight, bias, positions, inv_freq, k_cache, v_cache, out_slots,
                                   n_heads, n_kv_heads, head_dim, eps, x2, norm_weight2, layers, layer_stride)
    # one head's room at n_heads 0: the kernel is passed a real buffer, never written (no q rows)
    q = torch.empty(x.shape[0], max(n_heads, 1), head_dim, dtype=x.dtype, device=x.device)  # [M, Hq, D]
    if x.shape[0]:
        _launch(_ROPE, x, weight, q, norm_weight=norm_weight, eps=eps, x2=x2, norm_weight2=norm_weight2, bias=bias,
                rope=(positions.contiguous(), inv_freq.contiguous(), out_slots.contiguous(), k_cache, v_cache),
                heads=(n_heads, n_kv_heads, head_dim), layers=layers, layer_stride=layer_stride, cfg=cfg)
    return q[:, :n_heads]


def gate_up_silu(x: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor, eps: float,
                 cfg: dict | None = None) -> torch.Tensor:
    """silu(gate) * up of the gate_up projection of rmsnorm(x): x [M, H], norm_weight [H], weight [2I, H] (gate rows,
    then up rows) -> [M, I]."""
    _check_proj(x, weight, None, norm_weight)
    if weight.shape[0] % 2:
        raise ValueError(f"weight must be [2I, H] (gate rows, then up rows), got {weight.shape[0]} rows")
    if not use_triton(x, weight, *_tensors(norm_weight)):
        return gate_up_silu_ref(x, norm_weight, weight, eps)
    out = torch.empty(x.shape[0], weight.shape[0] // 2, dtype=x.dtype, device=x.device)  # [M, I]
    if x.shape[0]:
        _launch(_SILU, x, weight, out, norm_weight=norm_weight, eps=eps, cfg=cfg)
    return out


def _check_add(name: str, t: torch.Tensor, a: torch.Tensor, weight: torch.Tensor) -> None:
    if tuple(t.shape) != (a.shape[0], weight.shape[0]) or t.dtype != a.dtype or t.device != a.device:
        raise ValueError(f"{name} must be [M, N] = [{a.shape[0]}, {weight.shape[0]}] {a.dtype} on {a.device}, got "
                         f"{list(t.shape)} {t.dtype} on {t.device}")
    if t.stride(1) != 1:
        raise ValueError(f"{name} must have unit stride along N, got strides {t.stride()}")


def linear_add_(out: torch.Tensor, a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                cfg: dict | None = None) -> torch.Tensor:
    """out [M, N] += a [M, K] @ weight [N, K].T (+ bias) in place, one rounding per element (the residual adds of
    o_proj and down); returns out."""
    _check_proj(a, weight, bias, x_name="a")
    _check_add("out", out, a, weight)
    if not use_triton(a, weight, out, *([bias] if bias is not None else [])):
        return out.copy_(linear_add_ref(out, a, weight, bias))
    if a.shape[0]:
        _launch(_ADD, a, weight, out, bias=bias, cfg=cfg)
    return out


def linear_add(res: torch.Tensor, a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               cfg: dict | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """res [M, N] + a [M, K] @ weight [N, K].T (+ bias) as a new tensor [M, N], or into `out` [M, N] (any row stride:
    a slice of a wider buffer, e.g. the target's captured layers): `linear_add_` for a residual the caller still needs
    (a draft layer's input, a stream kept as a feature)."""
    _check_proj(a, weight, bias, x_name="a")
    _check_add("res", res, a, weight)
    if out is not None:
        _check_add("out", out, a, weight)
    if not use_triton(a, weight, res, *([bias] if bias is not None else [])):
        y = linear_add_ref(res, a, weight, bias)  # [M, N]
        return y if out is None else out.copy_(y)
    if out is None:
        out = torch.empty(res.shape, dtype=res.dtype, device=res.device)  # [M, N]
    if a.shape[0]:
        _launch(_ADD, a, weight, out, bias=bias, res=res, cfg=cfg)
    return out


# ----------------------------------------------------------------------------------------------------
# Compile cases (kernels/_compile_cases.py)

# a row count per bucket of `_table`: the split-K grid's 16-64-row x tiles (128 rows: the 8B's 128-row ones), the
# prefill's tiles and grids (`_prefill_tiles` picks them by their programs: 2,048 and 16,384 rows differ)
_CASE_ROWS = (1, 32, 64, 128, 2048, 16384)


def _case(epi: int, M: int, N: int, K: int, K2: int, norm: int, norm2: int, bias: bool, heads: tuple, sms: int,
          hip: bool, used_by: str) -> list[CompileCase]:
    """The launches of one bf16 call on a GPU of `sms` SMs (AMD's when `hip`), contiguous rows: `_proj_kernel` with
    its arguments as `_launch` passes them (where a tensor is absent, the dummy it passes: x, or the output for ws /
    cnt), then a prefill's `_sumsq_kernel` per input with a norm (`_sumsq_cases`). A context store (heads (0, Hkv,
    D)): N is one layer's rows, the layers' count only the grid's (`proj_rope_store`)."""
    bf16, f32, i32, i64 = Ptr(torch.bfloat16), Ptr(torch.float32), Ptr(torch.int32), Ptr(torch.int64)
    hq, hkv, d = heads
    cfg = _table(N, K, M, epi, torch.bfloat16, sms, hip, d, K2 > 0, max(norm, norm2))
    splits, split_k = cfg.pop("SPLITS"), cfg.pop("SPLIT_K")
    splits2, split_k2 = 0, 1
    if K2:
        c2 = _table(N, K2, M, epi, torch.bfloat16, sms, hip, d)
        splits2, split_k2 = c2["SPLITS"], c2["SPLIT_K"]
    in_program = cfg.pop("IN_PROGRAM")
    sumsq_k = cfg.pop("SUMSQ_K", cfg["BLOCK_K"])
    partials = not in_program and splits + splits2 > 1
    sumsq = in_program and (norm or norm2)  # ws: the rows' sums of squares
    out_stride = hq * d if epi == _ROPE else N // 2 if epi == _SILU else N  # q [M, Hq, D], silu [M, I], else [M, N]
    rope = epi == _ROPE
    proj = CompileCase.of(
        _proj_kernel, (used_by,), x_ptr=bf16, x2_ptr=bf16, g_ptr=bf16, g2_ptr=bf16, w_ptr=bf16, b_ptr=bf16,
        res_ptr=bf16, out_ptr=bf16, ws_ptr=f32 if partials or sumsq else bf16, cnt_ptr=i32 if partials else bf16,
        pos_ptr=i64 if rope else bf16, freq_ptr=f32 if rope else bf16, slots_ptr=i64 if rope else bf16,
        k_ptr=bf16, v_ptr=bf16, M=M, N=N, K=K, K2=K2, stride_xm=K, stride_x2m=K2 or K, stride_wn=K + K2,
        stride_rm=out_stride, stride_om=out_stride, eps=1e-5, layer_stride=2 ** 20 if rope and hq == 0 else 0,
        EPI=epi, NORM=norm, NORM2=norm2, TWO_INPUTS=K2 > 0, HAS_BIAS=bias, HQ=hq, HKV=hkv, D=d, PRECISE_TRIG=True,
        SPLITS=splits, SPLIT_K=split_k,
        SPLITS2=splits2, SPLIT_K2=split_k2, IN_PROGRAM=in_program, **cfg)
    return [proj, *_sumsq_cases(proj, sumsq_k)]


def _sumsq_cases(proj: CompileCase, block_k: int) -> list[CompileCase]:
    """The `_sumsq_kernel` launches of the prefill `_launch` that `proj` stands for (none without a norm): one per
    input with a norm, in the plan's BLOCK_K lanes, input 2's sums at ws[M:] (16-byte aligned when M is a multiple
    of 4)."""
    a = proj.args
    if not a["IN_PROGRAM"]:
        return []
    M, inputs = a["M"], ((a["NORM"], a["K"], a["SPLITS"], a["SPLIT_K"], True),
                         (a["NORM2"], a["K2"], a["SPLITS2"], a["SPLIT_K2"], a["M"] % 4 == 0))
    return [CompileCase.of(_sumsq_kernel, proj.used_by, x_ptr=Ptr(torch.bfloat16), out_ptr=Ptr(torch.float32, aligned),
                           M=M, K=k, stride_xm=k, SPLIT_K=split_k, SPLITS=splits, BLOCK_M=_SUMSQ_ROWS,
                           BLOCK_K=block_k, num_warps=4)
            for norm, k, splits, split_k, aligned in inputs if norm]


def compile_cases(hip: bool) -> list[CompileCase]:
    """kernels/_compile_cases.py: bf16, both models, every projection the invariant block launches
    (models/llama.py `TransformerBlock._forward_invariant`, `Attention.forward_stream`, `Transformer.logits`), at
    one row count of each bucket of the table (`_CASE_ROWS`: split-K tiles of 16 / 32 / 64 rows, the prefill tiles,
    with their sum-of-squares pre-pass): qkv (RoPE, the K/V store) with the norm folded and with its weight, with a
    bias (Qwen2), with two inputs (an EAGLE-3 midlayer); o and down (the residual add); gate_up (SiLU) folded and
    not; the LM head, plain and with the final norm's weight."""
    cases = []
    for s in model_shapes():
        qkv, attn = (s.n_heads + 2 * s.n_kv_heads) * s.head_dim, s.n_heads * s.head_dim
        heads = (s.n_heads, s.n_kv_heads, s.head_dim)
        launches = (  # name, EPI, N, K, K2, NORM, NORM2, HAS_BIAS
            ("qkv folded", _ROPE, qkv, s.hidden, 0, 1, 0, False), ("qkv", _ROPE, qkv, s.hidden, 0, 2, 0, False),
            ("qkv bias", _ROPE, qkv, s.hidden, 0, 2, 0, True),
            ("kv", _ROPE, 2 * s.n_kv_heads * s.head_dim, s.hidden, 0, 2, 0, False),  # a block drafter's context
            ("kv folded", _ROPE, 2 * s.n_kv_heads * s.head_dim, s.hidden, 0, 1, 0, False),  # (serving)
            ("eagle3 qkv", _ROPE, qkv, s.hidden, s.hidden, 1, 1, False),
            ("o", _ADD, s.hidden, attn, 0, 0, 0, False), ("down", _ADD, s.hidden, s.ffn, 0, 0, 0, False),
            ("gate_up folded", _SILU, 2 * s.ffn, s.hidden, 0, 1, 0, False),
            ("gate_up", _SILU, 2 * s.ffn, s.hidden, 0, 2, 0, False),
            ("lm_head", _PLAIN, s.vocab, s.hidden, 0, 0, 0, False),
            ("lm_head normed", _PLAIN, s.vocab, s.hidden, 0, 2, 0, False),
        )
        for M in _CASE_ROWS:
            for name, epi, N, K, K2, norm, norm2, bias in launches:
                h = (0, *heads[1:]) if name.startswith("kv") else heads if epi == _ROPE else (1, 1, 1)
                cases += _case(epi, M, N, K, K2, norm, norm2, bias, h,
                               TARGET_SMS[hip], hip, f"{s.name} {name} M={M}")
    return cases
