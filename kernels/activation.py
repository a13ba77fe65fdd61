"""SwiGLU activation on the fused gate_up projection: silu(gate) * up in one launch.

Rounding order matches eager torch `F.silu(g) * u` in the input dtype: torch computes silu in
fp32 and rounds it to the input dtype, then the product is one fp32 multiply rounded once. The
kernel does the same, so in bf16/fp16 it differs from torch only where exp differs in the last
fp32 bit (Triton's exp is exp2-based) and that flips a rounding.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from eaglet.kernels._compile_cases import CompileCase, Ptr, model_shapes
from eaglet.kernels._utils import FLOAT_DTYPES, use_triton

_BLOCK = 1024  # columns per program: Llama-3-8B's I=14336 is 14 programs a row


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """Torch reference (the spec): x [..., 2*I] (gate first) -> silu(x[..., :I]) * x[..., I:] [..., I]."""
    g, u = x.chunk(2, dim=-1)  # [..., I] each
    return torch.nn.functional.silu(g) * u  # [..., I]


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, I, stride_x, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    mask = cols < I
    dtype = out_ptr.dtype.element_ty
    g = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)  # [BLOCK]
    u = tl.load(x_ptr + row * stride_x + I + cols, mask=mask, other=0.0).to(tl.float32)  # [BLOCK]
    s = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)  # [BLOCK]; torch rounds silu before the multiply
    tl.store(out_ptr + row * I + cols, (s * u).to(dtype), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2*I] (fp32/bf16/fp16; gate half first, as the fused gate_up projection writes it)
    -> silu(gate) * up [..., I], a new contiguous tensor in x's dtype. Row-strided x (e.g. a
    column slice of a wider buffer) is read in place; other strides are copied first."""
    if x.dim() < 1 or x.shape[-1] % 2 != 0:
        raise ValueError(f"x must be [..., 2*I] (gate then up), got shape {tuple(x.shape)}: last dim must be even")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"x must be float32/bfloat16/float16, got {x.dtype}")
    if not use_triton(x):
        return silu_and_mul_ref(x)
    I = x.shape[-1] // 2
    out = torch.empty(*x.shape[:-1], I, dtype=x.dtype, device=x.device)  # [..., I]
    x2 = x.reshape(-1, 2 * I)  # [M, 2I], a view when possible
    M = x2.shape[0]
    if M == 0 or I == 0:
        return out
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    meta = _launch_meta(I)
    _silu_and_mul_kernel[(M, triton.cdiv(I, meta["BLOCK"]))](x2, out, I, x2.stride(0), **meta)
    return out


def _launch_meta(I: int) -> dict:
    """Block and warps for I output columns."""
    return dict(BLOCK=min(_BLOCK, triton.next_power_of_2(I)), num_warps=4)


def compile_cases(hip: bool) -> list[CompileCase]:
    """kernels/_compile_cases.py: the model's FFN width; bf16 (the same on both vendors)."""
    p = Ptr(torch.bfloat16)
    return [CompileCase.of(_silu_and_mul_kernel, (s.name,), x_ptr=p, out_ptr=p, I=s.ffn, stride_x=2 * s.ffn,
                           **_launch_meta(s.ffn)) for s in model_shapes()]
