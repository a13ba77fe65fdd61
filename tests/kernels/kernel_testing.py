"""Shared by the kernel tests: where the Triton kernel can run, and the relative error they check."""

from __future__ import annotations

import pytest
import torch

from eaglet.kernels._utils import is_interpret

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
# the kernel itself runs on a GPU, or on CPU under the Triton interpreter (CI); otherwise the launcher
# would only call its reference
needs_kernel = pytest.mark.skipif(
    not (CUDA or is_interpret()), reason="no GPU: set TRITON_INTERPRET=1 to test the Triton kernel on CPU"
)
gpu_only = pytest.mark.skipif(not CUDA, reason="bf16/fp16 (wrong in the interpreter) and large shapes need a GPU")


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()
