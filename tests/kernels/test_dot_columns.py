"""The property the invariant kernels build on: an element of `tl.dot` depends on its own row and column only, so a
column's bits do not change with how many columns the tile holds. On a GPU this is the MMA's (fp32 inputs: FMA dots);
under the interpreter it is conftest.py's element-wise dot (numpy's matmul does not have it on every BLAS)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from kernel_testing import DEVICE, needs_kernel


@triton.jit
def _dot_kernel(a_ptr, b_ptr, out_ptr, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr):
    i, k, j = tl.arange(0, M), tl.arange(0, K), tl.arange(0, N)
    a = tl.load(a_ptr + i[:, None] * K + k[None, :])  # [M, K]
    b = tl.load(b_ptr + k[:, None] * N + j[None, :])  # [K, N]
    acc = tl.dot(a, b, tl.zeros((M, N), tl.float32), input_precision="ieee")  # [M, N]
    tl.store(out_ptr + i[:, None] * N + j[None, :], acc)


def dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    out = torch.empty(a.shape[0], b.shape[1], device=DEVICE)  # [M, N]
    _dot_kernel[(1,)](a, b.contiguous(), out, a.shape[0], a.shape[1], b.shape[1])
    return out


@needs_kernel
@pytest.mark.parametrize("n", [16, 32])
def test_a_column_does_not_depend_on_the_other_columns(n):
    gen = torch.Generator().manual_seed(n)
    a = torch.randn(64, 64, generator=gen).to(DEVICE)  # [M, K]
    b = torch.randn(64, 64, generator=gen).to(DEVICE)  # [K, N]
    full = dot(a, b)  # [64, 64]
    assert torch.equal(dot(a, b[:, :n]), full[:, :n])
    torch.testing.assert_close(full, (a.double() @ b.double()).float(), rtol=1e-5, atol=1e-4)
