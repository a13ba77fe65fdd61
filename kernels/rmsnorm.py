"""RMSNorm with the pre-norm residual add fused in: one launch instead of ~6 torch kernels.

Semantics are Hugging Face's LlamaRMSNorm, in its order of operations and roundings:

    h = x.float(); h = h * rsqrt(mean(h^2) + eps); out = weight * h.to(x.dtype)

(the final multiply in the input dtype, i.e. one fp32 product rounded once). With a residual,
HF's decoder layer first does `hidden = residual + hidden` in the input dtype; the kernel returns
that sum too (the next residual) and normalises the rounded sum, exactly as HF does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from eaglet.kernels._compile_cases import CompileCase, Ptr, model_shapes
from eaglet.kernels._utils import FLOAT_DTYPES, use_triton

MAX_HIDDEN = 16384  # one row lives in registers: 16384 fp32 over 16 warps is 32 values a thread


def rmsnorm_ref(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Torch reference (the spec) of `rmsnorm`: HF's LlamaRMSNorm, plus HF's residual add."""
    if residual is not None:
        x = x + residual  # [..., H], added in the input dtype like HF
    h = x.float()  # [..., H]
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)  # [..., H]
    out = weight * h.to(x.dtype)  # [..., H]
    return out if residual is None else (out, x)


def row_rstd_ref(x: torch.Tensor, eps: float) -> torch.Tensor:
    """1 / rms of each row of x [..., H], fp32 [...]: the scale that a norm folded into the projection after it
    (Transformer.fold_norm_weights) applies to the projection's output row (kernels/projection.py)."""
    return torch.rsqrt(x.float().pow(2).mean(-1) + eps)  # [...]


def _check_args(x, weight, residual) -> None:
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"x must be [..., H] with H >= 1, got shape {tuple(x.shape)}")
    H = x.shape[-1]
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"x must be float32/bfloat16/float16, got {x.dtype}")
    if H > MAX_HIDDEN:
        raise ValueError(f"x hidden size H={H} exceeds {MAX_HIDDEN} (one row must fit in registers)")
    if tuple(weight.shape) != (H,):
        raise ValueError(f"weight must be [H] = [{H}], got shape {tuple(weight.shape)}")
    if weight.dtype != x.dtype:
        raise ValueError(f"weight dtype {weight.dtype} != x dtype {x.dtype}: cast the weight to x.dtype")
    if weight.device != x.device:
        raise ValueError(f"weight is on {weight.device}, x on {x.device}")
    if residual is not None:
        if residual.shape != x.shape:
            raise ValueError(f"residual must have x's shape {tuple(x.shape)}, got {tuple(residual.shape)}")
        if residual.dtype != x.dtype:
            raise ValueError(f"residual dtype {residual.dtype} != x dtype {x.dtype}")
        if residual.device != x.device:
            raise ValueError(f"residual is on {residual.device}, x on {x.device}")


@triton.jit
def _rmsnorm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, new_res_ptr,
    M, H, stride_x, stride_res, eps,
    HAS_RESIDUAL: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # [ROWS]
    cols = tl.arange(0, BLOCK)  # [BLOCK]
    mask = (rows < M)[:, None] & (cols < H)[None, :]  # [ROWS, BLOCK]
    rows = rows.to(tl.int64)
    dtype = out_ptr.dtype.element_ty
    h = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)  # [ROWS, BLOCK]
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + rows[:, None] * stride_res + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        h = (h + r).to(dtype)  # [ROWS, BLOCK]; HF adds in the input dtype, then normalises that rounded sum
        tl.store(new_res_ptr + rows[:, None] * H + cols[None, :], h, mask=mask)
        h = h.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(h * h, axis=1) / H + eps)  # [ROWS]
    y = (h * rstd[:, None]).to(dtype).to(tl.float32)  # [ROWS, BLOCK]; HF rounds before the weight multiply
    w = tl.load(w_ptr + cols, mask=cols < H, other=0.0).to(tl.float32)  # [BLOCK]
    tl.store(out_ptr + rows[:, None] * H + cols[None, :], (y * w[None, :]).to(dtype), mask=mask)


def _as_rows(t: torch.Tensor, H: int) -> torch.Tensor:
    """[..., H] -> [M, H] with unit column stride; a view when possible (row slices stay views)."""
    t = t.reshape(-1, H)  # [M, H]
    return t if t.stride(1) == 1 or t.shape[0] == 0 else t.contiguous()


def rmsnorm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """HF RMSNorm over the last dim of x [..., H] (fp32/bf16/fp16, H <= 16384) with weight [H]
    (x's dtype). residual None -> out [..., H]. residual [..., H] -> (out, new_residual) with
    new_residual = x + residual (in x's dtype) and out = rmsnorm(new_residual). Outputs are new
    contiguous tensors; inputs may be row-strided (e.g. a column slice) or otherwise strided (copied)."""
    _check_args(x, weight, residual)
    if not use_triton(x, weight, *([residual] if residual is not None else [])):
        return rmsnorm_ref(x, weight, eps, residual)
    H = x.shape[-1]
    x2 = _as_rows(x, H)  # [M, H]
    M = x2.shape[0]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # [..., H]
    has_res = residual is not None
    r2 = _as_rows(residual, H) if has_res else x2  # [M, H]; a dummy pointer when there is no residual
    new_res = torch.empty_like(out) if has_res else out  # [..., H]
    if M > 0:
        meta = _launch_meta(H)
        _rmsnorm_kernel[(triton.cdiv(M, meta["ROWS"]),)](
            x2, r2, weight.contiguous(), out, new_res,
            M, H, x2.stride(0), r2.stride(0), float(eps), HAS_RESIDUAL=has_res, **meta,
        )
    return (out, new_res) if has_res else out


def _launch_meta(H: int) -> dict:
    """The kernel's block, rows a program and warps for rows of H values."""
    block = triton.next_power_of_2(H)
    rows = max(1, min(16, 1024 // block))  # small H: several rows a program, so programs are not tiny
    return dict(ROWS=rows, BLOCK=block, num_warps=4 if block * rows <= 2048 else 8 if block <= 8192 else 16)


def compile_cases(hip: bool) -> list[CompileCase]:
    """kernels/_compile_cases.py: the model's hidden size with and without the fused residual, for one row (a decode
    at B=1: Triton makes M == 1 a constant) and for several; bf16, the same on both vendors."""
    p = Ptr(torch.bfloat16)
    cases = []
    for s in model_shapes():
        for M in (1, 8):
            for res in (False, True):
                cases.append(CompileCase.of(
                    _rmsnorm_kernel, (f"{s.name} M={M}",), x_ptr=p, res_ptr=p, w_ptr=p, out_ptr=p, new_res_ptr=p, M=M,
                    H=s.hidden, stride_x=s.hidden, stride_res=s.hidden, eps=1e-5, HAS_RESIDUAL=res,
                    **_launch_meta(s.hidden)))
    return cases
