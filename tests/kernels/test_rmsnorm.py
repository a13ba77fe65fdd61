"""RMSNorm (+ fused residual add), kernels/rmsnorm.py, against its torch reference, and the
reference against Hugging Face's LlamaRMSNorm.

On CPU run with TRITON_INTERPRET=1 (CI does) so the Triton kernel itself is tested (fp32); on a
GPU the same tests run there, plus bf16/fp16 at decode and prefill shapes and a CUDA graph.
"""

from __future__ import annotations

import pytest
import torch
from kernel_testing import DEVICE, gpu_only, needs_kernel, rel_err

import eaglet.kernels.rmsnorm as rn
from eaglet.kernels.rmsnorm import rmsnorm, rmsnorm_ref

EPS = 1e-6



def make(shape, dtype, seed=0, device=DEVICE):
    """x, weight, residual with a per-row scale spread (rows of very different norms)."""
    gen = torch.Generator().manual_seed(seed)
    H = shape[-1]
    x = torch.randn(shape, generator=gen) * torch.rand(*shape[:-1], 1, generator=gen).mul(8)  # [..., H]
    w = torch.randn(H, generator=gen)  # [H]
    r = torch.randn(shape, generator=gen)  # [..., H]
    return x.to(device, dtype), w.to(device, dtype), r.to(device, dtype)


SHAPES = [
    pytest.param((1, 576), id="M1-H576"),
    pytest.param((37, 576), id="M37-H576"),
    pytest.param((4, 4096), id="M4-H4096"),
    pytest.param((3, 100), id="M3-H100-odd"),
    pytest.param((37, 64), id="M37-H64-several-rows-a-program"),
    pytest.param((2, 16384), id="M2-H16384-max"),
    pytest.param((2, 3, 576), id="3d"),
]


@needs_kernel
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_fp32_matches_reference(shape, with_residual):
    x, w, r = make(shape, torch.float32)
    if with_residual:
        out, new_res = rmsnorm(x, w, EPS, r)
        ref, ref_res = rmsnorm_ref(x, w, EPS, r)
        assert torch.equal(new_res, ref_res)  # one fp32 add either way
    else:
        out, ref = rmsnorm(x, w, EPS), rmsnorm_ref(x, w, EPS)
    assert out.shape == x.shape and out.dtype == x.dtype and out.is_contiguous()
    assert rel_err(out, ref) < 1e-5


@needs_kernel
def test_strided_inputs():
    """A column slice of a wider buffer is read in place (row stride); a transposed tensor is copied."""
    x, w, r = make((37, 576), torch.float32, seed=1)
    wide = torch.randn(37, 1000, device=DEVICE)  # [M, 1000]
    wide[:, 200:776] = x
    x_slice = wide[:, 200:776]  # [M, H], row stride 1000
    r_t = r.t().contiguous().t()  # [M, H], column-major
    out, new_res = rmsnorm(x_slice, w, EPS, r_t)
    ref, ref_res = rmsnorm_ref(x, w, EPS, r)
    assert rel_err(out, ref) < 1e-5
    assert torch.equal(new_res, ref_res)


@needs_kernel
def test_eps_matters():
    x, w, _ = make((5, 64), torch.float32, seed=2)
    x = x * 1e-3  # mean(x^2) ~ 1e-6: eps = 1e-2 dominates
    assert rel_err(rmsnorm(x, w, 1e-2), rmsnorm_ref(x, w, 1e-2)) < 1e-5
    assert rel_err(rmsnorm(x, w, 1e-2), rmsnorm_ref(x, w, 1e-6)) > 0.1


@needs_kernel
def test_empty_rows():
    x, w, r = make((0, 576), torch.float32)
    assert rmsnorm(x, w, EPS).shape == (0, 576)
    out, new_res = rmsnorm(x, w, EPS, r)
    assert out.shape == new_res.shape == (0, 576)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_is_hf_llama_rmsnorm(dtype):
    """rmsnorm_ref is bit-identical to transformers' LlamaRMSNorm (CPU), residual add included."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    x, w, r = make((7, 576), dtype, seed=3, device="cpu")
    hf = LlamaRMSNorm(576, eps=EPS).to(dtype)
    with torch.no_grad():
        hf.weight.copy_(w)
        assert torch.equal(rmsnorm_ref(x, w, EPS), hf(x))
        out, new_res = rmsnorm_ref(x, w, EPS, r)
        hidden = r + x  # HF decoder layer: hidden_states = residual + hidden_states
        assert torch.equal(new_res, hidden) and torch.equal(out, hf(hidden))


def test_cpu_fallback_is_reference(monkeypatch):
    """Without the interpreter, CPU tensors take the reference path."""
    monkeypatch.setattr(rn, "use_triton", lambda *ts: False)
    x, w, r = make((4, 576), torch.float32, device="cpu")
    assert torch.equal(rmsnorm(x, w, EPS), rmsnorm_ref(x, w, EPS))
    out, new_res = rmsnorm(x, w, EPS, r)
    ref, ref_res = rmsnorm_ref(x, w, EPS, r)
    assert torch.equal(out, ref) and torch.equal(new_res, ref_res)


def test_validation_errors():
    x, w, r = make((4, 64), torch.float32, device="cpu")
    with pytest.raises(ValueError, match="weight"):
        rmsnorm(x, w[:32], EPS)
    with pytest.raises(ValueError, match="weight dtype"):
        rmsnorm(x, w.double(), EPS)
    with pytest.raises(ValueError, match="residual"):
        rmsnorm(x, w, EPS, r[:2])
    with pytest.raises(ValueError, match="residual dtype"):
        rmsnorm(x, w, EPS, r.half())
    with pytest.raises(ValueError, match="x must be float"):
        rmsnorm(x.int(), w, EPS)
    with pytest.raises(ValueError, match="16384"):
        rmsnorm(torch.randn(1, 16385), torch.randn(16385), EPS)


@gpu_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("M,H", [(1, 576), (64, 576), (4096, 576), (1, 4096), (4096, 4096), (7, 16384), (37, 100)])
@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_half_precision_gpu(dtype, M, H, with_residual):
    x, w, r = make((M, H), dtype, seed=4)
    if with_residual:
        out, new_res = rmsnorm(x, w, EPS, r)
        ref, ref_res = rmsnorm_ref(x, w, EPS, r)
        assert torch.equal(new_res, ref_res)  # fp32 add, one round-to-nearest-even in both
    else:
        out, ref = rmsnorm(x, w, EPS), rmsnorm_ref(x, w, EPS)
    assert out.dtype == dtype and not out.isnan().any()
    assert rel_err(out, ref) < 1e-2


@gpu_only
def test_cuda_graph_capture_and_replay():
    x, w, r = make((8, 576), torch.bfloat16, seed=5)
    rmsnorm(x, w, EPS, r)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, new_res = rmsnorm(x, w, EPS, r)
    x2, _, r2 = make((8, 576), torch.bfloat16, seed=6)
    x.copy_(x2)
    r.copy_(r2)
    graph.replay()
    ref, ref_res = rmsnorm_ref(x, w, EPS, r)
    assert torch.equal(new_res, ref_res) and rel_err(out, ref) < 1e-2
