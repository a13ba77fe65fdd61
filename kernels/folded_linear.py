"""The projections of a block whose RMSNorm weights are folded into them (`Transformer.fold_norm_weights`), at small M
(the verify of a tree at batch 1), each fused with the op next to it:

    proj_rope_store(x, weight, positions, inv_freq, k_cache, v_cache, out_slots, n_heads, n_kv_heads, head_dim, eps)
        = rope_store(x @ weight.T, ..., row_norm_of=x): the input norm's 1/rms, RoPE, the K/V store -> q [M, Hq, D]
        (x2=...: the projection of cat(norm(x), norm(x2)), an EAGLE-3 midlayer's [embeds | hidden] input)
    gate_up_silu(x, weight, eps) = silu_and_mul(x @ weight.T, row_norm_of=x)                         -> a [M, I]
    linear_add_(out, a, weight):   out += a @ weight.T in place (o_proj and down: the residual adds)   -> out
    linear_add(res, a, weight):    res + a @ weight.T, a new tensor (a draft layer's residual stays)  -> [M, N]

x is the residual stream [M, H]; the `*_ref` functions are the spec (the unfused ops, rounded as they round).

Why: unfused, Llama-3-8B's B=1 verify (8 tree tokens) runs per layer qkv (cuBLAS), rope_store, o (cuBLAS split-K GEMM
+ its reduce kernel), gate_up, silu_and_mul, down (+ reduce): 8 launches for the projections, each ~0.5 µs of graph
gap besides its run time, and the small GEMMs far from the weight-read floor (qkv 16.0 µs = 3.1 TB/s, o 12.8 µs
= 2.6 TB/s). Here 4 launches do the same work: a layer's projections at M=8 take 117.2 instead of 129.2 µs (floor
103.5; CUDA graphs, cold weights, H200: `results/folded_linear_h200.md`), and the verify 4.36 instead of
4.84 ms (`results/verify_8b_h200/README.md`). A folded EAGLE-3 draft head's midlayer
(`DraftHead.fold_norm_weights`) runs the same launches: 129.0 instead of 146.4 µs a draft step for the 8B head.

Kernel (`_folded_kernel`): one program per BLOCK_N weight rows, over the whole K, so every output element is reduced
by one program (no split-K reduce kernel) and the folded norm's sum of squares comes from the x tiles the program
loads anyway. The product is acc [BLOCK_N, 16] = w [BLOCK_N, BK] @ x^T [BK, 16]: the weight rows are the MMA's M
dimension and x's M <= 16 rows its N (padded), which a probe at M=8 found 0.1-0.5 µs faster per projection than
x [16, BK] @ w^T, and 0.6 µs faster than split-K with the last program reducing
(`results/verify_8b_h200/s14_skinny_probe.txt`). The SiLU and RoPE epilogues need two weight rows per
result (gate j with up j; dim i with dim i + D/2 of a head): their programs load the rows in interleaved pairs, so
that splitting the accumulator's row pairs gives both halves, and the folded weights keep the layout every other
path reads. Above 16 rows (B > 1 verifies, prefill) the launchers run the references' composition: cuBLAS, then
`rope_store` / `silu_and_mul` (their Triton kernels on the GPU).

Launch configs are fixed per (epilogue, shape, dtype) (`_config`), not autotuned: the autotuner's picks varied
between processes (its cold single-call timings differ by < 1 µs between the good tiles), and the 8B verify with them
by 4% (4.43 to 4.59 ms); the rule holds the tiles of the fastest verify measured.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra import libdevice

from eaglet.kernels import rope as _rope
from eaglet.kernels._compile_cases import TARGET_SMS, CompileCase, Ptr, model_shapes
from eaglet.kernels._utils import check_weight, is_hip, is_interpret, sm_count, use_triton
from eaglet.kernels.activation import silu_and_mul, silu_and_mul_ref
from eaglet.kernels.linear import _check_input
from eaglet.kernels.rmsnorm import row_rstd_ref
from eaglet.kernels.rope import rope_store, rope_store_ref

MAX_M = 16  # rows the fused kernels take: one 16-wide MMA tile of x (the B=1 verify of <= 16 tree tokens)
_ADD, _SILU, _ROPE = 0, 1, 2  # the epilogue


# ----------------------------------------------------------------------------------------------------
# Torch references (the spec)


def proj_rope_store_ref(x, weight, positions, inv_freq, k_cache, v_cache, out_slots, n_heads, n_kv_heads, head_dim,
                        eps, x2=None):
    """`F.linear` then `rope_store_ref` with x's rows as the row scale: writes the caches, returns q [M, Hq, D].
    With x2 (weight = [W1 | W2], W1 over x's columns): the projection is x @ W1.T and x2 @ W2.T, each rounded and
    scaled by its own rows' 1/rms, summed in fp32 and rounded once (the projection of cat(norm(x), norm(x2)))."""
    if x2 is None:
        return rope_store_ref(F.linear(x, weight), positions, inv_freq, k_cache, v_cache, out_slots, n_heads,
                              n_kv_heads, head_dim, norm_eps=eps, row_norm_of=x)
    return rope_store_ref(_two_input_proj(x, x2, weight, eps), positions, inv_freq, k_cache, v_cache, out_slots,
                          n_heads, n_kv_heads, head_dim)


def _two_input_proj(x, x2, weight, eps):
    """The projection of cat(x / rms(x), x2 / rms(x2)) as the two-input kernel rounds it: [M, N]."""
    K = x.shape[1]
    y = F.linear(x, weight[:, :K]).float() * row_rstd_ref(x, eps)[:, None]  # [M, N]
    y += F.linear(x2, weight[:, K:]).float() * row_rstd_ref(x2, eps)[:, None]  # [M, N]
    return y.to(x.dtype)


def gate_up_silu_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`F.linear` then `silu_and_mul_ref` with x's rows as the row scale: x [M, H] -> [M, I]."""
    return silu_and_mul_ref(F.linear(x, weight), row_norm_of=x, eps=eps)  # [M, I]


def linear_add_ref(res: torch.Tensor, a: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """res + a @ weight.T with one rounding (a GEMM's beta = 1 epilogue), as a new tensor [M, N]."""
    return torch.addmm(res, a, weight.t())  # [M, N]


# ----------------------------------------------------------------------------------------------------
# Launch configs


def _config(epi: int, N: int, K: int, dtype: torch.dtype, sms: int, hip: bool | None = None) -> dict:
    """BLOCK_N / BLOCK_K / warps / stages. CUDA: the autotuner's picks in the fastest of four Llama-3-8B verify
    processes at M=8 on an H200 (4.43 ms; fixed, 4.364-4.369 ms in five runs): 64x128 w4 s5 (qkv, o), 64x256 w4 s5
    (down, K=14336), 128x128 w8 s3 (gate_up, 224 tiles; `results/verify_8b_h200/s14_autotune_picks.txt`).
    64 rows: every head_dim the RoPE epilogue takes is a multiple of it. fp32 inputs take BLOCK_K=128 (a 64x256 fp32
    tile in 5 stages is 400 KB of shared memory). `hip`: MI300's (None: the running torch)."""
    if is_hip() if hip is None else hip:  # MI300: not measured; 2 stages as in kernels/linear.py
        return dict(BLOCK_N=64, BLOCK_K=128, waves_per_eu=2, num_warps=4, num_stages=2)
    if epi == _SILU and N // 128 >= sms:
        return dict(BLOCK_N=128, BLOCK_K=128, num_warps=8, num_stages=3)
    wide = epi == _ADD and K >= 8192 and dtype.itemsize == 2
    return dict(BLOCK_N=64, BLOCK_K=256 if wide else 128, num_warps=4, num_stages=5)


# ----------------------------------------------------------------------------------------------------
# Kernel


@triton.jit
def _rows_dot_x(x_ptr, stride_xm, w_cols, K, m, m_ok, row_ok, SUM_SQ: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc [BN, BM] = w [BN, K] @ x[m, :K]^T over K in BLOCK_K steps (w_cols [BN, 1]: the tile's weight rows at
    their first column), and with SUM_SQ each x row's sum of squares [BM]."""
    x_rows = x_ptr + m[None, :].to(tl.int64) * stride_xm  # [1, BM]
    kk = tl.arange(0, BLOCK_K)  # [BK]
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    sq = tl.zeros((BLOCK_K, BLOCK_M), tl.float32)  # per-lane partial sums of squares of x's rows
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + kk  # [BK]
        k_ok = ks < K  # [BK]
        w = tl.load(w_cols + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)  # [BN, BK]
        xt = tl.load(x_rows + ks[:, None], mask=k_ok[:, None] & m_ok[None, :], other=0.0)  # [BK, BM]
        # "ieee": fp32 inputs stay fp32 (no tf32); bf16/fp16 take the tensor cores either way
        acc = tl.dot(w, xt, acc, input_precision="ieee")  # [BN, BM]
        if SUM_SQ:
            # The norm's sum of squares from the same tile, reduced once after the loop. Not as a second MMA
            # (x^T x's diagonal): that took the qkv at M=8 from 16.3 to 25.3 µs (verify_8b_h200/s14_qkv_variants.txt).
            xf = xt.to(tl.float32)  # [BK, BM]
            sq += xf * xf  # [BK, BM]
    return acc, tl.sum(sq, axis=0)


@triton.jit
def _folded_kernel(
    x_ptr, x2_ptr, w_ptr, res_ptr, out_ptr, pos_ptr, freq_ptr, slots_ptr, k_ptr, v_ptr,
    M, N, K, K2, stride_xm, stride_x2m, stride_wn, stride_rm, stride_om, eps,
    EPI: tl.constexpr, TWO_INPUTS: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
    PRECISE_TRIG: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    dtype = x_ptr.dtype.element_ty
    HALF: tl.constexpr = BLOCK_N // 2
    r = tl.arange(0, BLOCK_N)  # [BN] the tile's accumulator rows
    n0 = pid * BLOCK_N
    pair = False  # rows interleaved in pairs (even r: first of the pair)
    if EPI == 1:  # gate j, up j; N = 2I
        j = pid * HALF + r // 2  # [BN] the output column of the pair
        wrow = j + (r % 2) * (N // 2)  # [BN]
        row_ok = j < N // 2  # [BN]
    elif EPI == 2:  # q and k heads: dims i and i + D/2 of head n0 // D; v heads: plain rows
        pair = n0 < (HQ + HKV) * D
        i = (n0 % D) // 2 + r // 2  # [BN] the rotary frequency index
        wrow = tl.where(pair, (n0 // D) * D + i + (r % 2) * (D // 2), n0 + r)  # [BN]
        row_ok = wrow < N  # [BN]
    else:
        wrow = n0 + r  # [BN]
        row_ok = wrow < N  # [BN]
    m = tl.arange(0, BLOCK_M)  # [BM]
    m_ok = m < M  # [BM]
    w_rows = w_ptr + wrow[:, None].to(tl.int64) * stride_wn  # [BN, 1]
    acc, sq = _rows_dot_x(x_ptr, stride_xm, w_rows, K, m, m_ok, row_ok, EPI != 0, BLOCK_M, BLOCK_N,
                          BLOCK_K)  # [BN, BM], [BM]
    y = tl.trans(acc)  # [BM, BN]

    if EPI == 0:
        mask = m_ok[:, None] & row_ok[None, :]  # [BM, BN]
        res = tl.load(res_ptr + m[:, None].to(tl.int64) * stride_rm + wrow[None, :], mask=mask, other=0.0)  # [BM, BN]
        offs = m[:, None].to(tl.int64) * stride_om + wrow[None, :]  # [BM, BN]
        tl.store(out_ptr + offs, (res.to(tl.float32) + y).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        rstd = tl.math.rsqrt(sq / K + eps)  # [BM]
        # as the references round: the GEMM output to dtype, then the row-scaled value to dtype
        y = y.to(dtype).to(tl.float32) * rstd[:, None]  # [BM, BN]
        if TWO_INPUTS:  # the second input's columns follow the first's in w, with its own 1/rms
            acc2, sq2 = _rows_dot_x(x2_ptr, stride_x2m, w_rows + K, K2, m, m_ok, row_ok, True, BLOCK_M, BLOCK_N,
                                    BLOCK_K)  # [BN, BM], [BM]
            y += tl.trans(acc2).to(dtype).to(tl.float32) * tl.math.rsqrt(sq2 / K2 + eps)[:, None]  # [BM, BN]
        y = y.to(dtype).to(tl.float32)  # [BM, BN]
        if EPI == 1:
            g, u = tl.split(tl.reshape(y, (BLOCK_M, HALF, 2)))  # [BM, HALF] each
            s = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)  # torch rounds silu before the multiply
            cols = pid * HALF + tl.arange(0, HALF)  # [HALF]
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


def _check_proj(x: torch.Tensor, weight: torch.Tensor, x_name: str = "x", x2: torch.Tensor | None = None) -> None:
    """x [M, K] float, weight [N, K] row-major in x's dtype and on x's device (kernels/linear.py's checks); with x2
    [M, K2] in x's dtype, weight [N, K + K2]."""
    for name, t in ((x_name, x), ("x2", x2)):
        if t is not None and t.dim() != 2:
            raise ValueError(f"{name} must be [M, K], got shape {list(t.shape)}")
    _check_input(x_name, x)
    K = x.shape[1]
    if x2 is not None:
        _check_input("x2", x2)
        if x2.shape[0] != x.shape[0] or x2.dtype != x.dtype or x2.device != x.device:
            raise ValueError(f"x2 must be [M, K2] with M = {x.shape[0]} rows, {x.dtype} on {x.device} like x, got "
                             f"{list(x2.shape)} {x2.dtype} on {x2.device}")
        K += x2.shape[1]
    check_weight(weight, K, x, None)


def _fused(*tensors: torch.Tensor) -> bool:
    """The fused kernel runs: at most MAX_M rows (tensors[0] is x) and Triton for these tensors."""
    return 1 <= tensors[0].shape[0] <= MAX_M and use_triton(*tensors)


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(1) == 1 else t.contiguous()


def _launch(epi: int, x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, grid_rows: int, *, eps: float = 0.0,
            rope: tuple = (), heads: tuple = (1, 1, 1), x2: torch.Tensor | None = None,
            res: torch.Tensor | None = None) -> None:
    """Run `_folded_kernel` over grid_rows accumulator rows (tiles of BLOCK_N); res: the residual the add epilogue
    reads (out itself when None: in place)."""
    two = x2 is not None
    x = _rows(x)
    x2 = _rows(x2) if two else x
    res = out if res is None else res
    positions, inv_freq, out_slots, k_cache, v_cache = rope or (x, x, x, x, x)  # dummies without RoPE
    hq, hkv, d = heads
    K = x.shape[1]
    # the interpreter (CPU) takes the widest tiles
    cfg = _config(epi, weight.shape[0], K, x.dtype, sm_count(x.device.index or 0) if x.is_cuda else 0)
    _folded_kernel[(triton.cdiv(grid_rows, cfg["BLOCK_N"]),)](
        x, x2, weight, res, out, positions, inv_freq, out_slots, k_cache, v_cache,
        x.shape[0], weight.shape[0], K, weight.shape[1] - K, x.stride(0), x2.stride(0), weight.stride(0),
        res.stride(0), out.stride(0), float(eps),
        EPI=epi, TWO_INPUTS=two, HQ=hq, HKV=hkv, D=d, PRECISE_TRIG=not is_interpret(), BLOCK_M=MAX_M, **cfg,
    )


def proj_rope_store(
    x: torch.Tensor,
    weight: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out_slots: torch.Tensor,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    eps: float,
    x2: torch.Tensor | None = None,
) -> torch.Tensor:
    """The folded qkv projection of the residual stream x [M, H] (weight [(Hq + 2 Hkv) D, H], the input norm's
    weight folded in), scaled by each row's 1/rms(x) (eps), RoPE on q and k, k and v stored at out_slots [M] of the
    caches; returns q [M, Hq, D]. Arguments and caches as in `kernels.rope.rope_store`. Fused for M <= MAX_M
    and head_dim a multiple of 64 (a 64-row tile holds 32 rotary pairs of one head).
    x2 [M, H2]: a second input with its own norm, whose columns follow x's (weight [(Hq + 2 Hkv) D, H + H2]): the
    projection of cat(norm(x), norm(x2)), as in an EAGLE-3 midlayer (embeddings, then hidden states). Its fallback
    (more rows, no Triton) is the reference's composition, two GEMMs and elementwise ops; above MAX_M rows a draft
    layer runs its unfolded path instead (`DraftLayer.forward`)."""
    _check_proj(x, weight, x2=x2)
    # the projection's shape, dtype and device for rope's checks (a view of x, no data)
    qkv_like = x[:, :1].expand(x.shape[0], weight.shape[0])  # [M, (Hq+2Hkv)*D]
    _rope._check_args(qkv_like, positions, inv_freq, k_cache, v_cache, out_slots, n_heads, n_kv_heads, head_dim,
                      None, None, x)
    rope_args = (positions, inv_freq, k_cache, v_cache, out_slots, n_heads, n_kv_heads, head_dim)
    if not (_fused(x, weight, positions, inv_freq, k_cache, v_cache, out_slots) and head_dim % 64 == 0):
        if x2 is None:
            return rope_store(F.linear(x, weight), *rope_args, norm_eps=eps, row_norm_of=x)
        return rope_store(_two_input_proj(x, x2, weight, eps), *rope_args)
    q = torch.empty(x.shape[0], n_heads, head_dim, dtype=x.dtype, device=x.device)  # [M, Hq, D]
    _launch(_ROPE, x, weight, q, weight.shape[0], eps=eps, x2=x2,
            rope=(positions.contiguous(), inv_freq.contiguous(), out_slots.contiguous(), k_cache, v_cache),
            heads=(n_heads, n_kv_heads, head_dim))
    return q


def gate_up_silu(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The folded gate_up projection of the residual stream x [M, H] (weight [2I, H], gate rows first, the
    post-attention norm's weight folded in), scaled by each row's 1/rms(x) (eps), then silu(gate) * up: [M, I]."""
    _check_proj(x, weight)
    if weight.shape[0] % 2:
        raise ValueError(f"weight must be [2I, H] (gate rows, then up rows), got {weight.shape[0]} rows")
    if not _fused(x, weight):
        return silu_and_mul(F.linear(x, weight), row_norm_of=x, eps=eps)  # [M, I]
    out = torch.empty(x.shape[0], weight.shape[0] // 2, dtype=x.dtype, device=x.device)  # [M, I]
    _launch(_SILU, x, weight, out, weight.shape[0], eps=eps)
    return out


def _check_add(name: str, t: torch.Tensor, a: torch.Tensor, weight: torch.Tensor) -> None:
    if tuple(t.shape) != (a.shape[0], weight.shape[0]) or t.dtype != a.dtype or t.device != a.device:
        raise ValueError(f"{name} must be [M, N] = [{a.shape[0]}, {weight.shape[0]}] {a.dtype} on {a.device}, got "
                         f"{list(t.shape)} {t.dtype} on {t.device}")
    if t.stride(1) != 1:
        raise ValueError(f"{name} must have unit stride along N, got strides {t.stride()}")


def linear_add_(out: torch.Tensor, a: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """out [M, N] += a [M, K] @ weight [N, K].T in place, one rounding per element (the residual add of the o_proj and
    down projections); returns out."""
    _check_proj(a, weight, "a")
    _check_add("out", out, a, weight)
    if not _fused(a, weight, out):
        return out.addmm_(a, weight.t())
    _launch(_ADD, a, weight, out, weight.shape[0])
    return out


def linear_add(res: torch.Tensor, a: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """res [M, N] + a [M, K] @ weight [N, K].T as a new tensor [M, N], one rounding per element: `linear_add_` for a
    residual the caller still needs (a draft layer's input)."""
    _check_proj(a, weight, "a")
    _check_add("res", res, a, weight)
    if not _fused(a, weight, res):
        return torch.addmm(res, a, weight.t())  # [M, N]
    out = torch.empty_like(res, memory_format=torch.contiguous_format)  # [M, N]
    _launch(_ADD, a, weight, out, weight.shape[0], res=res)
    return out


# ----------------------------------------------------------------------------------------------------
# Compile cases (kernels/_compile_cases.py)



def _case(epi: int, M: int, N: int, K: int, K2: int, heads: tuple, sms: int, hip: bool, used_by: str) -> CompileCase:
    """The `_launch` of one bf16 call on a GPU of `sms` SMs (AMD's when `hip`), contiguous rows: its arguments as
    `_launch` passes them (where a tensor is absent, the dummy it passes: x)."""
    bf16, f32, i64 = Ptr(torch.bfloat16), Ptr(torch.float32), Ptr(torch.int64)
    rope = epi == _ROPE
    hq, hkv, d = heads
    out_stride = hq * d if rope else N // 2 if epi == _SILU else N  # q [M, Hq, D], a [M, I], out [M, N]
    return CompileCase.of(
        _folded_kernel, (used_by,), x_ptr=bf16, x2_ptr=bf16, w_ptr=bf16, res_ptr=bf16, out_ptr=bf16,
        pos_ptr=i64 if rope else bf16, freq_ptr=f32 if rope else bf16, slots_ptr=i64 if rope else bf16, k_ptr=bf16,
        v_ptr=bf16, M=M, N=N, K=K, K2=K2, stride_xm=K, stride_x2m=K2 or K, stride_wn=K + K2, stride_rm=out_stride,
        stride_om=out_stride, eps=1e-5, EPI=epi, TWO_INPUTS=K2 > 0, HQ=hq, HKV=hkv, D=d, PRECISE_TRIG=True,
        BLOCK_M=MAX_M, **_config(epi, N, K, torch.bfloat16, sms, hip))


def compile_cases(hip: bool) -> list[CompileCase]:
    """kernels/_compile_cases.py: bf16, both models, every epilogue as the folded block launches it (o and down: the
    residual add; gate_up: SiLU; qkv: RoPE and the K/V store, and with two inputs, an EAGLE-3 midlayer's), at one row
    (Triton makes M == 1 a constant) and at 8 (the B=1 verify); BLOCK_M = MAX_M, `_config`'s tiles on the target."""
    cases = []
    for s in model_shapes():
        qkv, attn = (s.n_heads + 2 * s.n_kv_heads) * s.head_dim, s.n_heads * s.head_dim
        heads = (s.n_heads, s.n_kv_heads, s.head_dim)
        launches = (  # name, EPI, N, K, K2
            ("o", _ADD, s.hidden, attn, 0), ("down", _ADD, s.hidden, s.ffn, 0),
            ("gate_up", _SILU, 2 * s.ffn, s.hidden, 0), ("qkv", _ROPE, qkv, s.hidden, 0),
            ("eagle3 qkv", _ROPE, qkv, s.hidden, s.hidden),
        )
        for M in (1, 8):
            for name, epi, N, K, K2 in launches:
                cases.append(_case(epi, M, N, K, K2, heads if epi == _ROPE else (1, 1, 1), TARGET_SMS[hip], hip,
                                   f"{s.name} {name} M={M}"))
    return cases
