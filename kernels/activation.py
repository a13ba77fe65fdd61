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
from eaglet.kernels.rmsnorm import MAX_HIDDEN, row_rstd, row_rstd_ref

_BLOCK = 1024  # columns per program: Llama-3-8B's I=14336 is 14 programs a row


def silu_and_mul_ref(x: torch.Tensor, row_norm_of: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """Torch reference (the spec): x [..., 2*I] (gate first) -> silu(x[..., :I]) * x[..., I:] [..., I];
    with row_norm_of [..., H], x's rows are first scaled by 1 / rms(row_norm_of) (rounded to x's dtype)."""
    if row_norm_of is not None:
        x = (x.float() * row_rstd_ref(row_norm_of, eps)[..., None]).to(x.dtype)  # [..., 2I]
    g, u = x.chunk(2, dim=-1)  # [..., I] each
    return torch.nn.functional.silu(g) * u  # [..., I]


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, r_ptr, I, stride_x, stride_r, H, eps, BLOCK: tl.constexpr,
                         SCALE: tl.constexpr, BLOCK_R: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    mask = cols < I
    dtype = out_ptr.dtype.element_ty
    g = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)  # [BLOCK]
    u = tl.load(x_ptr + row * stride_x + I + cols, mask=mask, other=0.0).to(tl.float32)  # [BLOCK]
    if SCALE:  # the post-attention norm folded into gate_up: its 1/rms applied here, rounded like its output
        rstd = row_rstd(r_ptr + row * stride_r, H, eps, BLOCK_R)
        g = (g * rstd).to(dtype).to(tl.float32)  # [BLOCK]
        u = (u * rstd).to(dtype).to(tl.float32)  # [BLOCK]
    s = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)  # [BLOCK]; torch rounds silu before the multiply
    tl.store(out_ptr + row * I + cols, (s * u).to(dtype), mask=mask)


def silu_and_mul(x: torch.Tensor, row_norm_of: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """x [..., 2*I] (fp32/bf16/fp16; gate half first, as the fused gate_up projection writes it)
    -> silu(gate) * up [..., I], a new contiguous tensor in x's dtype. Row-strided x (e.g. a
    column slice of a wider buffer) is read in place; other strides are copied first.
    row_norm_of [..., H]: scale x's rows by 1 / rms(row_norm_of) (eps) first, the post-attention norm of a layer
    whose norm weight is folded into gate_up (x = row_norm_of @ W'^T)."""
    if x.dim() < 1 or x.shape[-1] % 2 != 0:
        raise ValueError(f"x must be [..., 2*I] (gate then up), got shape {tuple(x.shape)}: last dim must be even")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"x must be float32/bfloat16/float16, got {x.dtype}")
    if row_norm_of is not None and (row_norm_of.shape[:-1] != x.shape[:-1] or row_norm_of.dtype not in FLOAT_DTYPES
                                    or not 0 < row_norm_of.shape[-1] <= MAX_HIDDEN
                                    or row_norm_of.device != x.device):
        raise ValueError(f"row_norm_of must be float [..., H] with x's leading shape {tuple(x.shape[:-1])}, "
                         f"0 < H <= {MAX_HIDDEN}, on {x.device}; got {tuple(row_norm_of.shape)} {row_norm_of.dtype} "
                         f"on {row_norm_of.device}")
    if not use_triton(x, *([row_norm_of] if row_norm_of is not None else [])):
        return silu_and_mul_ref(x, row_norm_of, eps)
    I = x.shape[-1] // 2
    out = torch.empty(*x.shape[:-1], I, dtype=x.dtype, device=x.device)  # [..., I]
    x2 = x.reshape(-1, 2 * I)  # [M, 2I], a view when possible
    M = x2.shape[0]
    if M == 0 or I == 0:
        return out
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    scale = row_norm_of is not None
    r = row_norm_of.reshape(M, -1) if scale else x2  # [M, H] rows of the row scale, else a dummy pointer
    if r.stride(1) != 1:
        r = r.contiguous()
    meta = _launch_meta(I, r.shape[1] if scale else None)
    _silu_and_mul_kernel[(M, triton.cdiv(I, meta["BLOCK"]))](
        x2, out, r, I, x2.stride(0), r.stride(0), r.shape[1], float(eps), **meta)
    return out


def _launch_meta(I: int, H: int | None) -> dict:
    """Block and warps for I output columns; H: the width of the rows whose 1/rms scales x (None: no scale)."""
    return dict(BLOCK=min(_BLOCK, triton.next_power_of_2(I)), SCALE=H is not None,
                BLOCK_R=1 if H is None else triton.next_power_of_2(H), num_warps=4)


def compile_cases(hip: bool) -> list[CompileCase]:
    """kernels/_compile_cases.py: the model's FFN width, plain and with the folded post-attention norm's scale;
    bf16 (the same on both vendors)."""
    p = Ptr(torch.bfloat16)
    cases = []
    for s in model_shapes():
        for H in (None, s.hidden):
            cases.append(CompileCase.of(
                _silu_and_mul_kernel, (s.name,), x_ptr=p, out_ptr=p, r_ptr=p, I=s.ffn, stride_x=2 * s.ffn,
                stride_r=H or 2 * s.ffn, H=H or 2 * s.ffn, eps=1e-5, **_launch_meta(s.ffn, H)))
    return cases
