"""silu_and_mul (kernels/activation.py) against its torch reference `F.silu(g) * u`.

On CPU run with TRITON_INTERPRET=1 (CI does) so the Triton kernel itself is tested (fp32); on a
GPU the same tests run there, plus bf16/fp16 at decode and prefill shapes and a CUDA graph.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_testing import DEVICE, gpu_only, needs_kernel, rel_err

import eaglet.kernels.activation as act
from eaglet.kernels.activation import silu_and_mul, silu_and_mul_ref


def make(shape, dtype, seed=0, device=DEVICE):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * 4).to(device, dtype)  # [..., 2I]; * 4 reaches silu's tails


@needs_kernel
@pytest.mark.parametrize(
    "shape",
    [
        pytest.param((1, 2 * 1536), id="M1-I1536"),
        pytest.param((37, 2 * 1536), id="M37-I1536"),
        pytest.param((3, 2 * 14336), id="M3-I14336"),
        pytest.param((5, 2 * 100), id="M5-I100-odd"),
        pytest.param((2, 3, 2 * 96), id="3d"),
    ],
)
def test_fp32_matches_reference(shape):
    x = make(shape, torch.float32)
    out = silu_and_mul(x)
    ref = silu_and_mul_ref(x)
    assert out.shape == (*shape[:-1], shape[-1] // 2) and out.dtype == x.dtype and out.is_contiguous()
    assert rel_err(out, ref) < 1e-5


@needs_kernel
def test_strided_inputs():
    """A column slice of a wider buffer is read in place (row stride); a transposed tensor is copied."""
    x = make((37, 2 * 192), torch.float32, seed=1)
    wide = torch.randn(37, 1000, device=DEVICE)  # [M, 1000]
    wide[:, 100:484] = x
    assert rel_err(silu_and_mul(wide[:, 100:484]), silu_and_mul_ref(x)) < 1e-5
    assert rel_err(silu_and_mul(x.t().contiguous().t()), silu_and_mul_ref(x)) < 1e-5


@needs_kernel
@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # the interpreter's numpy exp(200) = inf, as meant
def test_extremes():
    """silu's tails: large negative gates give -0 (exp overflows to inf), large positive ones the gate
    itself. rtol 1e-5: Triton's exp is exp2(x * log2 e), whose product rounding costs ~5e-6 at |x| = 80."""
    g = torch.tensor([[-200.0, -80.0, -1.0, 0.0, 1.0, 80.0, 200.0, 3.0]], device=DEVICE)  # [1, 8]
    u = torch.full_like(g, 2.0)  # [1, 8]
    out = silu_and_mul(torch.cat([g, u], dim=1))  # [1, 8]
    assert not out.isnan().any()
    torch.testing.assert_close(out, F.silu(g) * u, rtol=1e-5, atol=1e-30)


def test_reference_is_silu_times_up():
    x = make((4, 2 * 64), torch.bfloat16, device="cpu")
    assert torch.equal(silu_and_mul_ref(x), F.silu(x[:, :64]) * x[:, 64:])


def test_cpu_fallback_is_reference(monkeypatch):
    monkeypatch.setattr(act, "use_triton", lambda *ts: False)
    x = make((4, 2 * 64), torch.float32, device="cpu")
    assert torch.equal(silu_and_mul(x), silu_and_mul_ref(x))


def test_validation_errors():
    with pytest.raises(ValueError, match="x must be .*even"):
        silu_and_mul(torch.randn(4, 7))
    with pytest.raises(ValueError, match="x must be float"):
        silu_and_mul(torch.ones(4, 8, dtype=torch.int32))


@gpu_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("M,I", [(1, 1536), (64, 1536), (4096, 1536), (1, 14336), (4096, 14336), (37, 100)])
def test_half_precision_gpu(dtype, M, I):
    x = make((M, 2 * I), dtype, seed=2)
    out = silu_and_mul(x)
    assert out.dtype == dtype and not out.isnan().any()
    assert rel_err(out, silu_and_mul_ref(x)) < 1e-2


@gpu_only
def test_cuda_graph_capture_and_replay():
    x = make((8, 2 * 1536), torch.bfloat16, seed=3)
    silu_and_mul(x)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = silu_and_mul(x)
    x.copy_(make((8, 2 * 1536), torch.bfloat16, seed=4))
    graph.replay()
    assert rel_err(out, silu_and_mul_ref(x)) < 1e-2
