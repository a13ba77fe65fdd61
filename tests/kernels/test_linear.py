"""Fused small-M linear layers (kernels/linear.py) against their torch references: norm_linear
(rmsnorm_ref + F.linear), silu_mul_linear (silu_and_mul_ref + F.linear) and linear (F.linear).

On CPU run with TRITON_INTERPRET=1 (CI does) so the Triton kernel itself is tested (fp32; there the
autotuners have one config: the GEMV at M == 1, tl.dot otherwise); on a GPU the same tests run
there, plus bf16/fp16 at SmolLM2 / Llama decode shapes, M-invariance of the rows and a CUDA graph.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import eaglet.kernels.linear as lin
from eaglet.kernels.activation import silu_and_mul_ref
from eaglet.kernels.linear import (
    MAX_FAST_M,
    linear,
    linear_ref,
    norm_linear,
    norm_linear_ref,
    silu_mul_linear,
    silu_mul_linear_ref,
)
from eaglet.kernels.rmsnorm import rmsnorm_ref
from kernel_testing import CUDA, DEVICE, gpu_only, needs_kernel, rel_err

EPS = 1e-6



def randn(*shape, gen, scale=1.0):
    return torch.randn(*shape, generator=gen) * scale


def make(M, K, N, dtype, seed=0, device=DEVICE):
    """x [M, K] with rows of very different norms, residual [M, K], norm weight [K], weight [N, K]
    (nn.Linear-like scale), bias [N]."""
    gen = torch.Generator().manual_seed(seed)
    x = randn(M, K, gen=gen) * torch.rand(M, 1, generator=gen).mul(8)  # [M, K]
    t = dict(x=x, res=randn(M, K, gen=gen), nw=randn(K, gen=gen), w=randn(N, K, gen=gen, scale=K**-0.5),
             b=randn(N, gen=gen))
    return {k: v.to(device, dtype) for k, v in t.items()}


def make_gu(M, I, dtype, seed=0, device=DEVICE):
    gen = torch.Generator().manual_seed(seed)
    return randn(M, 2 * I, gen=gen, scale=4.0).to(device, dtype)  # [M, 2I]; * 4 reaches silu's tails


# (M, K, N): M = 1 (GEMV), the M <= 16 and M <= 64 tl.dot buckets with one and two M tiles; K and N
# with tails (100, 7) and without (576, 960, 1536)
NORM_SHAPES = [
    pytest.param(1, 576, 960, id="M1-K576-N960-qkv"),
    pytest.param(3, 1536, 100, id="M3-K1536-N100"),
    pytest.param(37, 576, 7, id="M37-K576-N7"),
    pytest.param(1, 100, 7, id="M1-K100-N7"),
    pytest.param(16, 100, 960, id="M16-K100-N960"),
    pytest.param(64, 576, 100, id="M64-K576-N100"),
]


@needs_kernel
@pytest.mark.parametrize("M,K,N", NORM_SHAPES)
@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_norm_linear_fp32(M, K, N, with_residual):
    t = make(M, K, N, torch.float32)
    if with_residual:
        y, new_res = norm_linear(t["x"], t["nw"], EPS, t["w"], residual=t["res"])
        ref, ref_res = norm_linear_ref(t["x"], t["nw"], EPS, t["w"], residual=t["res"])
        assert torch.equal(new_res, ref_res)  # one fp32 add either way
        assert new_res.shape == (M, K) and new_res.is_contiguous()
    else:
        y = norm_linear(t["x"], t["nw"], EPS, t["w"])
        ref = norm_linear_ref(t["x"], t["nw"], EPS, t["w"])
    assert y.shape == (M, N) and y.dtype == torch.float32 and y.is_contiguous()
    assert rel_err(y, ref) < 1e-5


@needs_kernel
@pytest.mark.parametrize(
    "M,I,N",
    [
        pytest.param(1, 1536, 576, id="M1-I1536-N576-down"),
        pytest.param(3, 100, 7, id="M3-I100-N7"),
        pytest.param(37, 576, 100, id="M37-I576-N100"),
        pytest.param(64, 100, 7, id="M64-I100-N7"),
    ],
)
def test_silu_mul_linear_fp32(M, I, N):
    gu = make_gu(M, I, torch.float32)
    w = make(1, I, N, torch.float32, seed=1)["w"]  # [N, I]
    y = silu_mul_linear(gu, w)
    assert y.shape == (M, N) and y.dtype == torch.float32
    assert rel_err(y, silu_mul_linear_ref(gu, w)) < 1e-5


@needs_kernel
@pytest.mark.parametrize(
    "M,K,N",
    [
        pytest.param(1, 576, 576, id="M1-K576-N576-o"),
        pytest.param(3, 100, 7, id="M3-K100-N7"),
        pytest.param(37, 576, 960, id="M37-K576-N960"),
        pytest.param(64, 1536, 7, id="M64-K1536-N7"),
    ],
)
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_linear_fp32(M, K, N, with_bias):
    t = make(M, K, N, torch.float32, seed=2)
    b = t["b"] if with_bias else None
    y = linear(t["x"], t["w"], b)
    assert y.shape == (M, N) and y.dtype == torch.float32
    assert rel_err(y, linear_ref(t["x"], t["w"], b)) < 1e-5


@needs_kernel
@pytest.mark.parametrize("M", [1, 5])
def test_norm_linear_bias(M):
    """Qwen2's qkv_proj has a bias: added in fp32 before the one rounding."""
    t = make(M, 100, 37, torch.float32, seed=3)
    y, new_res = norm_linear(t["x"], t["nw"], EPS, t["w"], t["b"], t["res"])
    ref, ref_res = norm_linear_ref(t["x"], t["nw"], EPS, t["w"], t["b"], t["res"])
    assert torch.equal(new_res, ref_res) and rel_err(y, ref) < 1e-5


@needs_kernel
def test_dot_variant_at_m1(monkeypatch):
    """At M == 1 the GPU autotuner may pick the tl.dot variant (the interpreter runs the GEMV): test it."""
    monkeypatch.setattr(lin, "_kernel_for", lambda M: (lin._mma_kernel, {"BLOCK_M": 16}))
    t = make(1, 576, 100, torch.float32, seed=4)
    y, new_res = norm_linear(t["x"], t["nw"], EPS, t["w"], t["b"], t["res"])
    ref, ref_res = norm_linear_ref(t["x"], t["nw"], EPS, t["w"], t["b"], t["res"])
    assert torch.equal(new_res, ref_res) and rel_err(y, ref) < 1e-5
    gu = make_gu(1, 100, torch.float32, seed=4)
    assert rel_err(silu_mul_linear(gu, t["w"][:, :100]), silu_mul_linear_ref(gu, t["w"][:, :100])) < 1e-5


@needs_kernel
def test_eps_matters():
    t = make(3, 64, 16, torch.float32, seed=5)
    x = t["x"] * 1e-3  # mean(x^2) ~ 1e-6: eps = 1e-2 dominates
    y = norm_linear(x, t["nw"], 1e-2, t["w"])
    assert rel_err(y, norm_linear_ref(x, t["nw"], 1e-2, t["w"])) < 1e-5
    assert rel_err(y, norm_linear_ref(x, t["nw"], 1e-6, t["w"])) > 0.1


@needs_kernel
def test_3d_and_strided_inputs():
    """[B, T, K] inputs give [B, T, N]; column slices of wider buffers are read in place (row
    stride); a column-major residual is copied."""
    t = make(6, 96, 40, torch.float32, seed=6)
    wide = torch.randn(6, 300, device=DEVICE)  # [M, 300]
    wide[:, 100:196] = t["x"]
    x_slice = wide[:, 100:196]  # [M, K], row stride 300
    res_t = t["res"].t().contiguous().t()  # [M, K], column-major
    y, new_res = norm_linear(x_slice.view(2, 3, 96), t["nw"], EPS, t["w"], residual=res_t.reshape(2, 3, 96))
    ref, ref_res = norm_linear_ref(t["x"], t["nw"], EPS, t["w"], residual=t["res"])
    assert y.shape == (2, 3, 40) and new_res.shape == (2, 3, 96)
    assert rel_err(y.view(6, 40), ref) < 1e-5 and torch.equal(new_res.view(6, 96), ref_res)
    assert rel_err(linear(x_slice, t["w"]), linear_ref(t["x"], t["w"])) < 1e-5
    gu_wide = torch.randn(6, 500, device=DEVICE)  # [M, 500]
    gu = gu_wide[:, 50:242]  # [M, 2I] with I = 96, row stride 500
    assert rel_err(silu_mul_linear(gu, t["w"]), silu_mul_linear_ref(gu.contiguous(), t["w"])) < 1e-5
    x1 = t["x"][0]  # [K]: a single token without a batch dim
    assert linear(x1, t["w"]).shape == (40,) and rel_err(linear(x1, t["w"]), linear_ref(x1, t["w"])) < 1e-5


@needs_kernel
def test_large_m_takes_unfused_path(monkeypatch):
    """M > MAX_FAST_M (prefill) runs the eaglet norm / SiLU·mul kernel and cuBLAS, not the fused kernel."""
    def fail(*args, **kwargs):
        raise AssertionError("the fused kernel ran for M > MAX_FAST_M")

    monkeypatch.setattr(lin, "_launch", fail)
    M = MAX_FAST_M + 1
    t = make(M, 64, 24, torch.float32, seed=7)
    y, new_res = norm_linear(t["x"], t["nw"], EPS, t["w"], t["b"], t["res"])
    ref, ref_res = norm_linear_ref(t["x"], t["nw"], EPS, t["w"], t["b"], t["res"])
    assert torch.equal(new_res, ref_res) and rel_err(y, ref) < 1e-5
    assert rel_err(norm_linear(t["x"], t["nw"], EPS, t["w"]), norm_linear_ref(t["x"], t["nw"], EPS, t["w"])) < 1e-5
    gu = make_gu(M, 64, torch.float32, seed=7)
    assert rel_err(silu_mul_linear(gu, t["w"]), silu_mul_linear_ref(gu, t["w"])) < 1e-5
    assert rel_err(linear(t["x"], t["w"], t["b"]), linear_ref(t["x"], t["w"], t["b"])) < 1e-5


@needs_kernel
def test_empty_rows():
    t = make(0, 64, 24, torch.float32)
    assert norm_linear(t["x"], t["nw"], EPS, t["w"]).shape == (0, 24)
    y, new_res = norm_linear(t["x"], t["nw"], EPS, t["w"], residual=t["res"])
    assert y.shape == (0, 24) and new_res.shape == (0, 64)
    assert silu_mul_linear(torch.zeros(0, 128, device=DEVICE), t["w"]).shape == (0, 24)
    assert linear(t["x"], t["w"]).shape == (0, 24)


def test_references_are_the_unfused_ops():
    t = make(5, 64, 24, torch.bfloat16, device="cpu")
    h, new_res = rmsnorm_ref(t["x"], t["nw"], EPS, t["res"])
    y, r = norm_linear_ref(t["x"], t["nw"], EPS, t["w"], t["b"], t["res"])
    assert torch.equal(y, F.linear(h, t["w"], t["b"])) and torch.equal(r, new_res)
    gu = make_gu(5, 24, torch.bfloat16, device="cpu")
    w = t["w"][:, :24]  # [24, 24]
    assert torch.equal(silu_mul_linear_ref(gu, w), F.linear(silu_and_mul_ref(gu), w))


def test_cpu_fallback_is_reference(monkeypatch):
    """Without the interpreter, CPU tensors take the reference path."""
    monkeypatch.setattr(lin, "use_triton", lambda *ts: False)
    t = make(4, 64, 24, torch.float32, device="cpu")
    y, r = norm_linear(t["x"], t["nw"], EPS, t["w"], t["b"], t["res"])
    ref, ref_r = norm_linear_ref(t["x"], t["nw"], EPS, t["w"], t["b"], t["res"])
    assert torch.equal(y, ref) and torch.equal(r, ref_r)
    gu = make_gu(4, 32, torch.float32, device="cpu")
    w = t["w"][:, :32]  # [24, 32]
    assert torch.equal(silu_mul_linear(gu, w), silu_mul_linear_ref(gu, w))
    assert torch.equal(linear(t["x"], t["w"], t["b"]), linear_ref(t["x"], t["w"], t["b"]))


def test_validation_errors():
    t = make(4, 64, 24, torch.float32, device="cpu")
    x, nw, w, b, res = t["x"], t["nw"], t["w"], t["b"], t["res"]
    with pytest.raises(ValueError, match="x must be float"):
        norm_linear(x.int(), nw, EPS, w)
    with pytest.raises(ValueError, match="x must be"):
        linear(torch.zeros(4, 0), w)
    with pytest.raises(ValueError, match="norm_weight must have shape"):
        norm_linear(x, nw[:32], EPS, w)
    with pytest.raises(ValueError, match="norm_weight dtype"):
        norm_linear(x, nw.double(), EPS, w)
    with pytest.raises(ValueError, match=r"weight must be \[N, 64\]"):
        norm_linear(x, nw, EPS, w[:, :32])
    with pytest.raises(ValueError, match=r"weight must be \[N, 64\]"):
        linear(x, w[0])
    with pytest.raises(ValueError, match="weight dtype"):
        linear(x, w.half())
    with pytest.raises(ValueError, match="row-major"):
        linear(x, torch.randn(64, 24).t())
    with pytest.raises(ValueError, match="bias must have shape"):
        linear(x, w, b[:3])
    with pytest.raises(ValueError, match="bias dtype"):
        norm_linear(x, nw, EPS, w, b.half())
    with pytest.raises(ValueError, match="residual must have shape"):
        norm_linear(x, nw, EPS, w, residual=res[:2])
    with pytest.raises(ValueError, match="residual dtype"):
        norm_linear(x, nw, EPS, w, residual=res.half())
    with pytest.raises(ValueError, match="gu must be .*even"):
        silu_mul_linear(torch.randn(4, 7), w)
    with pytest.raises(ValueError, match=r"weight must be \[N, 32\]"):
        silu_mul_linear(torch.randn(4, 64), w)  # I = 32, w has K = 64
    with pytest.raises(ValueError, match="gu must be float"):
        silu_mul_linear(torch.ones(4, 128, dtype=torch.int32), w)
    if CUDA:
        with pytest.raises(ValueError, match="weight is on"):
            linear(x.cuda(), w)


# ----------------------------------------------------------------------------------------------------
# GPU: half precision at decode shapes, M-invariance, CUDA graphs

GPU_SHAPES = [  # (M, K, N): SmolLM2 qkv / gate_up / down / lm_head, Llama-3-8B o / down, odd tails
    (1, 576, 960), (8, 576, 3072), (32, 1536, 576), (1, 576, 49152), (64, 576, 49152),
    (3, 4096, 4096), (1, 14336, 4096), (37, 100, 7),
]


@gpu_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("M,K,N", GPU_SHAPES)
def test_half_precision_gpu(dtype, M, K, N):
    t = make(M, K, N, dtype, seed=8)
    y, new_res = norm_linear(t["x"], t["nw"], EPS, t["w"], t["b"], t["res"])
    ref, ref_res = norm_linear_ref(t["x"], t["nw"], EPS, t["w"], t["b"], t["res"])
    assert torch.equal(new_res, ref_res)  # one fp32 add, one round-to-nearest-even in both
    assert y.dtype == dtype and not y.isnan().any() and rel_err(y, ref) < 1e-2
    assert rel_err(norm_linear(t["x"], t["nw"], EPS, t["w"]), norm_linear_ref(t["x"], t["nw"], EPS, t["w"])) < 1e-2
    y = linear(t["x"], t["w"], t["b"])
    assert y.dtype == dtype and rel_err(y, linear_ref(t["x"], t["w"], t["b"])) < 1e-2
    gu = make_gu(M, K // 2, dtype, seed=8)
    w = t["w"][:, : K // 2].contiguous()  # [N, I]
    assert rel_err(silu_mul_linear(gu, w), silu_mul_linear_ref(gu, w)) < 1e-2


@gpu_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rows_do_not_depend_on_m_gpu(dtype):
    """tl.dot variant: a row's result is the same bits for any 2 <= M <= 64 (both M buckets)."""
    t = make(MAX_FAST_M, 576, 960, dtype, seed=9)
    gu = make_gu(MAX_FAST_M, 768, dtype, seed=9)  # [64, 1536]
    w_down = make(1, 768, 960, dtype, seed=10)["w"]  # [960, 768]: the down projection 768 -> 960
    full = linear(t["x"], t["w"], t["b"])  # [64, N], BLOCK_M = 32
    full_silu = silu_mul_linear(gu, w_down)  # [64, N]
    for m in (2, 16, 17, 37):
        assert torch.equal(linear(t["x"][:m], t["w"], t["b"]), full[:m]), m
        assert torch.equal(silu_mul_linear(gu[:m], w_down), full_silu[:m]), m


@gpu_only
def test_cuda_graph_capture_and_replay():
    t = make(8, 576, 960, torch.bfloat16, seed=10)
    gu = make_gu(8, 480, torch.bfloat16, seed=10)  # [8, 960]: down projection 480 -> 960

    def step():
        y, r = norm_linear(t["x"], t["nw"], EPS, t["w"], t["b"], t["res"])
        return y, r, silu_mul_linear(gu, t["w"][:, :480]), linear(t["x"], t["w"])

    step()  # autotune and compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    t2 = make(8, 576, 960, torch.bfloat16, seed=11)
    for k in ("x", "res"):
        t[k].copy_(t2[k])
    gu.copy_(make_gu(8, 480, torch.bfloat16, seed=11))
    graph.replay()
    ref, ref_res = norm_linear_ref(t["x"], t["nw"], EPS, t["w"], t["b"], t["res"])
    assert torch.equal(outs[1], ref_res) and rel_err(outs[0], ref) < 1e-2
    assert rel_err(outs[2], silu_mul_linear_ref(gu, t["w"][:, :480])) < 1e-2
    assert rel_err(outs[3], linear_ref(t["x"], t["w"])) < 1e-2
