"""Small-M linear layers for the decode step, with the op before the projection fused into its load.

    norm_linear(x, norm_weight, eps, weight, bias=None, residual=None)  # rmsnorm(x [+ residual]) @ weight.T
    silu_mul_linear(gu, weight)                                          # (silu(gate) * up) @ weight.T
    linear(x, weight, bias=None)                                         # x @ weight.T (+ bias)

Why: at batch 1 a SmolLM2-135M decode step is ~300 kernels of a few µs each; its GEMMs move about
1 MB (~0.3 µs of HBM time) but cost ~3.8 µs in cuBLAS, and each RMSNorm / SiLU·mul in front of a
GEMM is one more launch. Here the norm (with the residual add) and the SiLU·mul are computed while
the GEMM loads its input tile, so the normed / activated activations are never written, and one
launch replaces two.

Semantics (the `*_ref` functions are the spec): `rmsnorm_ref` / `silu_and_mul_ref` with their exact
roundings (kernels/rmsnorm.py, kernels/activation.py) followed by `F.linear`: the activations are
rounded to x's dtype before the product, the product accumulates in fp32, the bias is added in
fp32 and the output is rounded once to x's dtype.

Kernel (`_linear_kernel`): the grid is (M tiles x N tiles), flattened with the M tiles adjacent so
the programs that share a weight tile run together and the repeat reads hit L2. Each program
streams its [BLOCK_N, K] weight slab in BLOCK_K steps; no split-K, so every output element is
reduced by one program in a fixed order. Two variants of the product:
  * GEMV (BLOCK_M = 1, only for M == 1): CUDA-core FMAs into fp32 per-lane partial sums over the K
    loop, one tree reduction at the end. No tensor-core tile, so BLOCK_N can be 4-8 and even a
    576-wide output fills the GPU.
  * tl.dot with BLOCK_M = 16 (M <= 16) or 32 (M <= 64), the accumulator chained through the K loop.
At M == 1 the autotuner times both variants and keeps the faster per shape; 2 <= M <= 64 use tl.dot.
M > 64 is prefill, compute-bound: cuBLAS (F.linear) after the unfused eaglet norm / SiLU·mul kernels.

Reduction order and M: in the tl.dot variant each output element is one chain of 16-wide MMAs over
k = 0, 16, 32, ... whatever BLOCK_N / BLOCK_K / num_warps the autotuner picks, and BLOCK_M <= 32
keeps Hopper on mma.sync (wgmma needs BLOCK_M = 64; checked in the PTX), so `linear` and
`silu_mul_linear` give a row bit-identical results for any 2 <= M <= 64 (tests/kernels/test_linear.py
checks this on GPU). Not M-independent: M == 1 (when the GEMV wins, it sums in another order), and
`norm_linear`'s sum of squares, a tree reduction whose shape follows the tile layout, so its rstd
may differ in the last fp32 bit between the M <= 16 and M > 16 buckets.

The batch-invariant projections that `invariant=true` runs live in kernels/projection.py; these kernels are the
fastest per shape (`invariant=false`), and their rounding changes with M.

CUDA graphs: the first call of each (N, K, M bucket, mode, dtype) autotunes (benchmarks the
configs); make it before capture (the engines' warm-up does). EAGLET_AUTOTUNE=0 takes the first
config instead. No autograd: use the `*_ref` functions where gradients are needed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from eaglet.kernels._compile_cases import TARGET_SMS, CompileCase, Ptr, model_shapes
from eaglet.kernels._utils import FLOAT_DTYPES, autotune_configs, check_like, check_weight, is_hip, sm_count, use_triton
from eaglet.kernels.activation import silu_and_mul, silu_and_mul_ref
from eaglet.kernels.rmsnorm import MAX_HIDDEN, _as_rows, rmsnorm, rmsnorm_ref

MAX_FAST_M = 64  # rows up to which the fused kernels run; beyond, the GEMM is compute-bound: cuBLAS
_PLAIN, _NORM, _SILU = 0, 1, 2  # what the kernel computes on the input tile before the product


# ----------------------------------------------------------------------------------------------------
# Torch references (the spec)


def norm_linear_ref(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`rmsnorm_ref` then `F.linear`: y [..., N], or (y, x + residual) with a residual."""
    if residual is None:
        return F.linear(rmsnorm_ref(x, norm_weight, eps), weight, bias)  # [..., N]
    h, new_residual = rmsnorm_ref(x, norm_weight, eps, residual)  # [..., K] each
    return F.linear(h, weight, bias), new_residual


def silu_mul_linear_ref(gu: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`silu_and_mul_ref` then `F.linear`: gu [..., 2I] -> [..., N]."""
    return F.linear(silu_and_mul_ref(gu), weight)  # [..., N]


def linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear`: x [..., K] -> [..., N]."""
    return F.linear(x, weight, bias)  # [..., N]


# ----------------------------------------------------------------------------------------------------
# Autotuning


def _mma_configs(block_m: int | None = None, hip: bool | None = None) -> list:
    """tl.dot tiles (first entry = default) on AMD (`hip`; None: the running torch) or NVIDIA. BLOCK_M comes from the
    M bucket (the launcher passes it) unless `block_m` puts it in the configs."""
    fixed = {} if block_m is None else {"BLOCK_M": block_m}
    if is_hip() if hip is None else hip:
        # MI300: compiled only (PORTABILITY.md); a 32 x 256 tile in 8 waves spilled 45 VGPRs (SiLU, 32 rows)
        return [
            triton.Config({**fixed, "BLOCK_N": bn, "BLOCK_K": bk, "waves_per_eu": 2}, num_warps=w, num_stages=2)
            for bn, bk, w in ((32, 128, 4), (16, 256, 4), (64, 128, 4), (32, 128, 8))
        ]
    # Stage counts at which ptxas spills in no mode at either row tile (sm_90, PORTABILITY.md): 32 x 256 in 3 stages
    # (the autotuner's pick for the 8B qkv and o at M=8, results/linear_8b_h200.md) spilled 12 B a thread
    # in the plain mode, 128 x 128 in 3 (gate_up's pick) 8 B; 16 x 128 spilled 8-16 B at 32 rows in each stage count
    # from 2 to 5, so that entry is 16 x 64.
    return [
        triton.Config({**fixed, "BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s)
        for bn, bk, w, s in (
            (32, 128, 4, 4), (16, 64, 4, 4), (16, 256, 4, 3), (32, 256, 4, 4),
            (64, 128, 4, 4), (64, 256, 8, 3), (128, 128, 8, 2),
        )
    ]


def _m1_configs(hip: bool | None = None) -> list:
    """M == 1 (first entry = default): the GEMV (BLOCK_M = 1) and a few tl.dot tiles; timing picks
    per shape. For the GEMV a small BLOCK_N gives enough programs for narrow outputs (576 / 8 = 72);
    num_stages is 1 because Triton pipelines only loads that feed a tl.dot (the kernel prefetches
    the GEMV's weight tiles itself), so BLOCK_K sets the bytes in flight per program. `hip` as in
    `_mma_configs`."""
    hip = is_hip() if hip is None else hip
    if hip:
        # MI300: 64-wide wavefronts, so 4 warps are 256 lanes
        gemv = ((8, 512, 4), (4, 1024, 4), (16, 512, 4), (16, 1024, 8))
        return [
            triton.Config({"BLOCK_M": 1, "BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=1) for bn, bk, w in gemv
        ] + _mma_configs(16, hip)[:2]
    gemv = ((8, 512, 4), (4, 1024, 4), (8, 1024, 4), (4, 512, 2), (16, 512, 4), (16, 1024, 8), (8, 2048, 8))
    return [
        triton.Config({"BLOCK_M": 1, "BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=1) for bn, bk, w in gemv
    ] + _mma_configs(16, hip)[:3]


def _prune_configs(configs: list, named_args: dict, **kwargs) -> list:
    """The autotuner's pruning: `_kept_configs` on the launch's device."""
    return _kept_configs(configs, named_args["M"], named_args["N"], named_args["K"], kwargs.get("BLOCK_M"),
                         sm_count(named_args["y_ptr"].device.index or 0))


def _kept_configs(configs: list, M: int, N: int, K: int, launch_block_m: int | None, sms: int) -> list:
    """Per variant (GEMV, tl.dot): drop tiles wider than the problem (masked lanes only) and tiles
    so wide that fewer programs than half the SMs run while a narrower tile would fill them.
    launch_block_m: the BLOCK_M the launcher passes (None: the configs' own)."""

    def block_m(c):
        return c.kwargs.get("BLOCK_M", launch_block_m)

    def programs(c):
        return triton.cdiv(M, block_m(c)) * triton.cdiv(N, c.kwargs["BLOCK_N"])

    kept = []
    for gemv in (True, False):
        group = [c for c in configs if (block_m(c) == 1) == gemv]
        if not group:
            continue
        max_bn = max(min(c.kwargs["BLOCK_N"] for c in group), triton.next_power_of_2(N))
        max_bk = max(min(c.kwargs["BLOCK_K"] for c in group), triton.next_power_of_2(K))
        fill = min(sms, max(programs(c) for c in group))
        kept += [
            c for c in group
            if c.kwargs["BLOCK_N"] <= max_bn and c.kwargs["BLOCK_K"] <= max_bk and 2 * programs(c) >= fill
        ]
    return kept or configs[:1]


# ----------------------------------------------------------------------------------------------------
# Kernel


@triton.jit
def _load_h(x_ptr, res_ptr, x_off, r_off, mask, HAS_RESIDUAL: tl.constexpr, dtype: tl.constexpr):
    """x (+ residual, rounded to dtype as HF adds) as fp32, in the shape of the offsets."""
    h = tl.load(x_ptr + x_off, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + r_off, mask=mask, other=0.0).to(tl.float32)
        h = (h + r).to(dtype).to(tl.float32)
    return h


@triton.jit
def _load_a(
    x_ptr, res_ptr, nw_ptr, x_off, r_off, ks, mask, kmask, rstd, K,
    MODE: tl.constexpr, HAS_RESIDUAL: tl.constexpr, dtype: tl.constexpr,
):
    """The GEMM's input tile in dtype, in the shape of the offsets: x, rmsnorm(x [+ res]) or
    silu(gate) * up, rounded exactly as the unfused kernels round their outputs."""
    if MODE == 1:
        h = _load_h(x_ptr, res_ptr, x_off, r_off, mask, HAS_RESIDUAL, dtype)
        nw = tl.load(nw_ptr + ks, mask=kmask, other=0.0).to(tl.float32)
        # rmsnorm_ref: round the normed value, then one fp32 product with the weight rounded once
        a = ((h * rstd).to(dtype).to(tl.float32) * nw).to(dtype)
    elif MODE == 2:
        g = tl.load(x_ptr + x_off, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + x_off + K, mask=mask, other=0.0).to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)  # torch rounds silu before the multiply
        a = (s * u).to(dtype)
    else:
        a = tl.load(x_ptr + x_off, mask=mask, other=0.0)
    return a


@triton.jit
def _load_w(w_ptr, w_col, col_ok, k0, kk, K):
    """Weight tile [BK, BN] at k0 (w_col: the columns' row offsets [1, BN]); zeros past K and N."""
    kw = (k0 + kk)[:, None]  # [BK, 1]
    return tl.load(w_ptr + w_col + kw, mask=(kw < K) & col_ok, other=0.0)


@triton.jit
def _linear_kernel(
    x_ptr, res_ptr, nw_ptr, w_ptr, b_ptr, y_ptr, new_res_ptr,
    M, N, K, stride_xm, stride_rm, stride_wn, eps,
    MODE: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    GEMV: tl.constexpr = BLOCK_M == 1
    pid = tl.program_id(0)
    m_tiles = tl.cdiv(M, BLOCK_M)
    pid_m = pid % m_tiles  # M tiles adjacent: the programs that read one weight tile run together
    pid_n = pid // m_tiles
    dtype = y_ptr.dtype.element_ty
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    kk = tl.arange(0, BLOCK_K)  # [BK]
    # The input tile is [BK, 1] for the GEMV (it broadcasts over the weight tile's columns) and
    # [BM, BK] for tl.dot; r2 / k2 are its row and k index in that shape.
    if GEMV:
        r2 = rows[None, :].to(tl.int64)  # [1, 1]
        k2 = kk[:, None]  # [BK, 1]
        ss = tl.zeros((BLOCK_K, 1), tl.float32)
        acc = tl.zeros((BLOCK_K, BLOCK_N), tl.float32)  # per-lane partial sums, reduced once at the end
    else:
        r2 = rows[:, None].to(tl.int64)  # [BM, 1]
        k2 = kk[None, :]  # [1, BK]
        ss = tl.zeros((BLOCK_M, BLOCK_K), tl.float32)
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    row_ok = r2 < M
    x_row = r2 * stride_xm
    r_row = r2 * stride_rm
    w_col = cols[None, :].to(tl.int64) * stride_wn  # [1, BN]
    col_ok = cols[None, :] < N  # [1, BN]

    if GEMV:
        # Triton software-pipelines only the loads that feed a tl.dot: prefetch by hand one weight
        # tile ahead, the first before the norm's pass so that its HBM latency overlaps the pass.
        w_next = _load_w(w_ptr, w_col, col_ok, 0, kk, K)  # [BK, BN]
    rstd = 0.0
    if MODE == 1:
        # Sum of squares of the (rounded) residual sum over the whole row: every program recomputes
        # it (K values from L2, cheap next to its weight slab); the pid_n == 0 program of each M tile
        # stores the sum.
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + k2
            mask = row_ok & (ks < K)
            h = _load_h(x_ptr, res_ptr, x_row + ks, r_row + ks, mask, HAS_RESIDUAL, dtype)
            if HAS_RESIDUAL:
                if pid_n == 0:
                    tl.store(new_res_ptr + r2 * K + ks, h.to(dtype), mask=mask)
            ss += h * h  # per-lane partial sums, reduced once after the loop
        rstd = tl.math.rsqrt(tl.sum(ss, axis=0 if GEMV else 1, keep_dims=True) / K + eps)  # [1, 1] or [BM, 1]

    for k0 in range(0, K, BLOCK_K):
        ks = k0 + k2
        kmask = ks < K
        a = _load_a(x_ptr, res_ptr, nw_ptr, x_row + ks, r_row + ks, ks, row_ok & kmask, kmask, rstd, K,
                    MODE, HAS_RESIDUAL, dtype)  # [BK, 1] or [BM, BK]
        if GEMV:
            w = w_next  # [BK, BN]
            w_next = _load_w(w_ptr, w_col, col_ok, k0 + BLOCK_K, kk, K)  # all masked (no traffic) past K
            acc += a.to(tl.float32) * w.to(tl.float32)  # [BK, BN]
        else:
            w = _load_w(w_ptr, w_col, col_ok, k0, kk, K)  # [BK, BN]
            # "ieee": fp32 inputs stay fp32 (no tf32); bf16/fp16 take the tensor cores either way
            acc = tl.dot(a, w, acc, input_precision="ieee")  # [BM, BN]
    if GEMV:
        out = tl.sum(acc, axis=0)[None, :]  # [1, BN]
    else:
        out = acc  # [BM, BN]
    if HAS_BIAS:
        out += tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    y_mask = (rows[:, None] < M) & col_ok
    tl.store(y_ptr + rows[:, None].to(tl.int64) * N + cols[None, :], out.to(dtype), mask=y_mask)


_KEY = ["N", "K", "BLOCK_M", "MODE"]  # (the autotuner adds the tensors' dtypes)
_PRUNE = {"early_config_prune": _prune_configs}
_m1_kernel = triton.autotune(configs=autotune_configs(_m1_configs()), key=_KEY, prune_configs_by=_PRUNE)(
    _linear_kernel
)
_mma_kernel = triton.autotune(configs=autotune_configs(_mma_configs()), key=_KEY, prune_configs_by=_PRUNE)(
    _linear_kernel
)


# ----------------------------------------------------------------------------------------------------
# Launchers


def _check_input(name: str, x: torch.Tensor) -> None:
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"{name} must be [..., K] with K >= 1, got shape {list(x.shape)}")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be float32/bfloat16/float16, got {x.dtype}")


def _kernel_for(M: int):
    """The autotuner for M rows and the BLOCK_M it is launched with (M == 1: the config's own)."""
    if M == 1:
        return _m1_kernel, {}
    return _mma_kernel, {"BLOCK_M": 16 if M <= 16 else 32}


def _launch(mode: int, x: torch.Tensor, K: int, weight: torch.Tensor, *, residual=None, norm_weight=None,
            eps: float = 0.0, bias=None):
    """Run `_linear_kernel` on x [..., K or 2K] (1 <= M <= MAX_FAST_M rows): y [..., N] (, new_residual)."""
    N = weight.shape[0]
    x2 = _as_rows(x, x.shape[-1])  # [M, K] or [M, 2K]
    M = x2.shape[0]
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)  # [M, N]
    r2 = _as_rows(residual, K) if residual is not None else x2  # [M, K]; a dummy pointer without residual
    new_res = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual is not None else y  # [..., K]
    kernel, kw = _kernel_for(M)
    if M > 0:
        kernel[lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)](
            x2, r2, x2 if norm_weight is None else norm_weight.contiguous(), weight, weight if bias is None else bias,
            y, new_res, M, N, K, x2.stride(0), r2.stride(0), weight.stride(0), float(eps),
            MODE=mode, HAS_RESIDUAL=residual is not None, HAS_BIAS=bias is not None, **kw,
        )
    y = y.view(*x.shape[:-1], N)  # [..., N]
    return y if residual is None else (y, new_res)


def _rows(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1]


def norm_linear(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm fused into the projection after it (input_layernorm -> qkv_proj,
    post_attention_layernorm -> gate_up_proj).

    x [..., K] (fp32/bf16/fp16, any row stride), norm_weight [K], weight [N, K] (row-major), bias [N]
    or None, all in x's dtype. residual None -> y = rmsnorm(x) @ weight.T (+ bias) [..., N].
    residual [..., K] -> (y, new_residual) with new_residual = x + residual (x's dtype, a new tensor)
    and y computed from rmsnorm(new_residual), as `kernels.rmsnorm.rmsnorm` returns them."""
    _check_input("x", x)
    K = x.shape[-1]
    check_like("norm_weight", norm_weight, (K,), x)
    check_weight(weight, K, x, bias)
    if residual is not None:
        check_like("residual", residual, tuple(x.shape), x)
    extra = [t for t in (bias, residual) if t is not None]
    if not use_triton(x, norm_weight, weight, *extra):
        return norm_linear_ref(x, norm_weight, eps, weight, bias, residual)
    if not 1 <= _rows(x) <= MAX_FAST_M:
        norm = rmsnorm if K <= MAX_HIDDEN else rmsnorm_ref
        if residual is None:
            return F.linear(norm(x, norm_weight, eps), weight, bias)
        h, new_residual = norm(x, norm_weight, eps, residual)  # [..., K] each
        return F.linear(h, weight, bias), new_residual
    return _launch(_NORM, x, K, weight, residual=residual, norm_weight=norm_weight, eps=eps, bias=bias)


def silu_mul_linear(gu: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """SiLU·mul fused into the down projection: gu [..., 2I] (gate half first, as gate_up_proj writes
    it; fp32/bf16/fp16, any row stride), weight [N, I] (row-major, gu's dtype) ->
    (silu(gate) * up) @ weight.T [..., N]. The activation is formed on load, never written."""
    _check_input("gu", gu)
    if gu.shape[-1] % 2:
        raise ValueError(f"gu must be [..., 2*I] (gate then up), got shape {list(gu.shape)}: last dim must be even")
    I = gu.shape[-1] // 2
    check_weight(weight, I, gu, None)
    if not use_triton(gu, weight):
        return silu_mul_linear_ref(gu, weight)
    if not 1 <= _rows(gu) <= MAX_FAST_M:
        return F.linear(silu_and_mul(gu), weight)
    return _launch(_SILU, gu, I, weight)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] (fp32/bf16/fp16, any row stride) @ weight.T (+ bias) -> [..., N]; weight [N, K]
    (row-major), bias [N] or None, in x's dtype. For o_proj and the LM head at decode sizes."""
    _check_input("x", x)
    check_weight(weight, x.shape[-1], x, bias)
    if not use_triton(x, weight, *([bias] if bias is not None else [])):
        return linear_ref(x, weight, bias)
    if not 1 <= _rows(x) <= MAX_FAST_M:
        return F.linear(x, weight, bias)
    return _launch(_PLAIN, x, x.shape[-1], weight, bias=bias)


# ----------------------------------------------------------------------------------------------------
# Compile cases (kernels/_compile_cases.py)

_CASE_ROWS = (1, 8, 32)  # the GEMV and M == 1 tiles, then tl.dot with BLOCK_M 16 and 32


def compile_cases(hip: bool) -> list[CompileCase]:
    """kernels/_compile_cases.py: bf16, both models, each projection with the op the block fuses into it
    (`TransformerBlock._forward_fused_linear`): qkv after the norm (with the residual add and, at layer 0, without),
    gate_up after the norm and the add, down after SiLU·mul; o and the LM head plain (`linear`). At one row count of
    each M bucket (`_CASE_ROWS`), every entry of the full autotune grid that `_kept_configs` keeps on the target."""
    cases = []
    for s in model_shapes():
        qkv = (s.n_heads + 2 * s.n_kv_heads) * s.head_dim
        launches = (  # name, MODE, N, K, HAS_RESIDUAL
            ("qkv layer 0", _NORM, qkv, s.hidden, False), ("qkv", _NORM, qkv, s.hidden, True),
            ("gate_up", _NORM, 2 * s.ffn, s.hidden, True), ("down", _SILU, s.hidden, s.ffn, False),
            ("o", _PLAIN, s.hidden, s.n_heads * s.head_dim, False), ("lm_head", _PLAIN, s.vocab, s.hidden, False),
        )
        for M in _CASE_ROWS:
            kernel, kw = _kernel_for(M)
            configs = _m1_configs(hip) if kernel is _m1_kernel else _mma_configs(hip=hip)
            for name, mode, N, K, res in launches:
                args = _case_args(mode, M, N, K, res)
                for c in _kept_configs(configs, M, N, K, kw.get("BLOCK_M"), TARGET_SMS[hip]):
                    cases.append(CompileCase.from_config(kernel.fn, args, c, (f"{s.name} {name} M={M}",)))
    return cases


def _case_args(mode: int, M: int, N: int, K: int, residual: bool) -> dict:
    """The arguments `_launch` passes for one bf16 call of M contiguous rows (where a tensor is absent, the dummy it
    passes: x, or y for new_res), with the BLOCK_M it adds for M; the autotune entry supplies the rest."""
    p = Ptr(torch.bfloat16)
    stride_x = 2 * K if mode == _SILU else K  # silu_mul_linear reads gu [M, 2I]
    return dict(x_ptr=p, res_ptr=p, nw_ptr=p, w_ptr=p, b_ptr=p, y_ptr=p, new_res_ptr=p, M=M, N=N, K=K,
                stride_xm=stride_x, stride_rm=K if residual else stride_x, stride_wn=K, eps=1e-5, MODE=mode,
                HAS_RESIDUAL=residual, HAS_BIAS=False, **_kernel_for(M)[1])
