"""rope_store: the rotary embedding and KV-cache store of an already-projected qkv (split into heads, optionally
q/k RMSNorm), one launch instead of ~20 torch kernels per layer: the stock path's (models/kernel_paths.py).
`proj_rope_store` (kernels/projection.py) computes the qkv projection too, in the same launch.

Per token row m of qkv [M, (Hq + 2*Hkv) * D] (q heads, then k heads, then v heads):
  1. Qwen3 only: per-head RMSNorm over D of q and k (HF semantics, see kernels/rmsnorm.py).
  2. Rotary embedding in Hugging Face's rotate-half layout, angle = position * inv_freq, with
     cos/sin computed in fp32 from positions and inv_freq (no cos/sin cache to index):
         x_rot = x * cos + rotate_half(x) * sin,   rotate_half(x) = cat(-x[D/2:], x[:D/2])
     in fp32, rounded to qkv's dtype.
  3. k (rotated) and v go to k_cache[out_slots[m]], v_cache[out_slots[m]] (cast to the cache
     dtype); the rotated q is returned as a new contiguous [M, Hq, D] tensor.

Difference from HF in bf16/fp16: HF rounds cos/sin to the model dtype and rotates in that dtype;
this op (like eaglet.models.llama.apply_rope) rotates in fp32 and rounds once, so it is the more
accurate of the two. In fp32 they agree to rounding (tests/kernels/test_rope.py ties the
reference to transformers' apply_rotary_pos_emb).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from eaglet.kernels._compile_cases import CompileCase, Ptr, model_shapes
from eaglet.kernels._utils import FLOAT_DTYPES, is_interpret, use_triton
from eaglet.kernels.rmsnorm import rmsnorm_ref

_INDEX_DTYPES = (torch.int32, torch.int64)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """HF's rotate_half: cat(-x[..., D/2:], x[..., :D/2])."""
    x1, x2 = x.chunk(2, dim=-1)  # [..., D/2] each
    return torch.cat((-x2, x1), dim=-1)  # [..., D]


def rope_store_ref(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out_slots: torch.Tensor,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
) -> torch.Tensor:
    """Torch reference (the spec) of `rope_store`: HF's apply_rotary_pos_emb with the
    rotation in fp32. Writes k_cache/v_cache in place, returns q [M, Hq, D] (Hq 0: qkv holds k and v alone, as
    `proj_rope_store_ref` may pass it)."""
    _check_args(qkv, positions, inv_freq, k_cache, v_cache, out_slots, n_heads, n_kv_heads, head_dim,
                q_norm_weight, k_norm_weight, min_heads=0)
    M, D = qkv.shape[0], head_dim
    q, k, v = qkv.split([n_heads * D, n_kv_heads * D, n_kv_heads * D], dim=-1)
    q = q.reshape(M, n_heads, D)  # [M, Hq, D]
    k = k.reshape(M, n_kv_heads, D)  # [M, Hkv, D]
    v = v.reshape(M, n_kv_heads, D)  # [M, Hkv, D]
    if q_norm_weight is not None:
        q = rmsnorm_ref(q, q_norm_weight, norm_eps)  # [M, Hq, D]
        k = rmsnorm_ref(k, k_norm_weight, norm_eps)  # [M, Hkv, D]
    freqs = positions.float()[:, None] * inv_freq[None, :]  # [M, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [M, D]
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]  # [M, 1, D] fp32 each
    q_rot = (q.float() * cos + rotate_half(q.float()) * sin).to(qkv.dtype)  # [M, Hq, D]
    k_rot = (k.float() * cos + rotate_half(k.float()) * sin).to(qkv.dtype)  # [M, Hkv, D]
    slots = out_slots.long()  # [M]
    k_cache.view(-1, n_kv_heads, D).index_copy_(0, slots, k_rot.to(k_cache.dtype))
    v_cache.view(-1, n_kv_heads, D).index_copy_(0, slots, v.to(v_cache.dtype))
    return q_rot.contiguous()


def _check_args(qkv, positions, inv_freq, k_cache, v_cache, out_slots, n_heads, n_kv_heads, head_dim,
                q_norm_weight, k_norm_weight, min_heads: int = 1) -> None:
    """min_heads 0: a projection of k and v alone (`proj_rope_store`'s n_heads = 0)."""
    if n_heads < min_heads or n_kv_heads < 1:
        raise ValueError(f"n_heads={n_heads} must be >= {min_heads} and n_kv_heads={n_kv_heads} >= 1")
    if head_dim < 2 or head_dim % 2 != 0:
        raise ValueError(f"head_dim={head_dim} must be even (rotate-half pairs x[j] with x[j + D/2])")
    width = (n_heads + 2 * n_kv_heads) * head_dim
    if qkv.dim() != 2 or qkv.shape[1] != width:
        raise ValueError(
            f"qkv must be [M, (n_heads + 2*n_kv_heads) * head_dim] = [M, {width}] for n_heads={n_heads}, "
            f"n_kv_heads={n_kv_heads}, head_dim={head_dim}; got shape {tuple(qkv.shape)}"
        )
    if qkv.dtype not in FLOAT_DTYPES:
        raise ValueError(f"qkv must be float32/bfloat16/float16, got {qkv.dtype}")
    M = qkv.shape[0]
    for name, t in (("positions", positions), ("out_slots", out_slots)):
        if tuple(t.shape) != (M,) or t.dtype not in _INDEX_DTYPES:
            raise ValueError(f"{name} must be [M] = [{M}] int64 (or int32), got {tuple(t.shape)} {t.dtype}")
    if tuple(inv_freq.shape) != (head_dim // 2,) or inv_freq.dtype != torch.float32:
        raise ValueError(f"inv_freq must be [head_dim/2] = [{head_dim // 2}] float32, got "
                         f"{tuple(inv_freq.shape)} {inv_freq.dtype} (keep it fp32: bf16 frequencies drift)")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() < 3 or tuple(t.shape[-2:]) != (n_kv_heads, head_dim):
            raise ValueError(f"{name} must be [S, n_kv_heads, head_dim] = [S, {n_kv_heads}, {head_dim}] (or "
                             f"[pages, page_size, {n_kv_heads}, {head_dim}]), got {tuple(t.shape)}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous: it is written in place through flat slots")
        if t.dtype not in FLOAT_DTYPES:
            raise ValueError(f"{name} must be float32/bfloat16/float16, got {t.dtype}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} must have one shape")
    if (q_norm_weight is None) != (k_norm_weight is None):
        raise ValueError("pass both q_norm_weight and k_norm_weight (Qwen3) or neither")
    for name, t in (("q_norm_weight", q_norm_weight), ("k_norm_weight", k_norm_weight)):
        if t is not None and (tuple(t.shape) != (head_dim,) or t.dtype != qkv.dtype):
            raise ValueError(f"{name} must be [head_dim] = [{head_dim}] in qkv's dtype {qkv.dtype}, "
                             f"got {tuple(t.shape)} {t.dtype}")
    for name, t in (("positions", positions), ("inv_freq", inv_freq), ("k_cache", k_cache), ("v_cache", v_cache),
                    ("out_slots", out_slots), ("q_norm_weight", q_norm_weight), ("k_norm_weight", k_norm_weight)):
        if t is not None and t.device != qkv.device:
            raise ValueError(f"{name} is on {t.device}, qkv on {qkv.device}")


@triton.jit
def _norm_rope(row_ptr, w_ptr, eps, cos, sin,
               N_HEADS: tl.constexpr, BLOCK_H: tl.constexpr, D: tl.constexpr, BLOCK_HALF: tl.constexpr,
               HAS_NORM: tl.constexpr):
    """Load N_HEADS heads at row_ptr as (first half, second half), per-head RMSNorm them if HAS_NORM, rotate;
    returns the halves in fp32, rounded to the input dtype."""
    HALF: tl.constexpr = D // 2
    dtype = row_ptr.dtype.element_ty
    h = tl.arange(0, BLOCK_H)  # [BLOCK_H]
    j = tl.arange(0, BLOCK_HALF)  # [BLOCK_HALF]
    mask = (h < N_HEADS)[:, None] & (j < HALF)[None, :]  # [BLOCK_H, BLOCK_HALF]
    offs = h[:, None] * D + j[None, :]  # [BLOCK_H, BLOCK_HALF]
    x1 = tl.load(row_ptr + offs, mask=mask, other=0.0).to(tl.float32)  # [BLOCK_H, BLOCK_HALF]
    x2 = tl.load(row_ptr + offs + HALF, mask=mask, other=0.0).to(tl.float32)  # [BLOCK_H, BLOCK_HALF]
    if HAS_NORM:
        rstd = tl.math.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / D + eps)  # [BLOCK_H]
        w1 = tl.load(w_ptr + j, mask=j < HALF, other=0.0).to(tl.float32)  # [BLOCK_HALF]
        w2 = tl.load(w_ptr + HALF + j, mask=j < HALF, other=0.0).to(tl.float32)  # [BLOCK_HALF]
        # HF order: normalise in fp32, round, multiply by the weight in the input dtype (round again).
        x1 = ((x1 * rstd[:, None]).to(dtype).to(tl.float32) * w1[None, :]).to(dtype).to(tl.float32)
        x2 = ((x2 * rstd[:, None]).to(dtype).to(tl.float32) * w2[None, :]).to(dtype).to(tl.float32)
    o1 = (x1 * cos[None, :] - x2 * sin[None, :]).to(dtype)  # [BLOCK_H, BLOCK_HALF]
    o2 = (x2 * cos[None, :] + x1 * sin[None, :]).to(dtype)  # [BLOCK_H, BLOCK_HALF]
    return o1, o2, offs, mask


@triton.jit
def _rope_store_kernel(
    qkv_ptr, pos_ptr, inv_freq_ptr, k_cache_ptr, v_cache_ptr, slots_ptr, q_ptr, qw_ptr, kw_ptr,
    stride_qkv, eps,
    HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
    BLOCK_HQ: tl.constexpr, BLOCK_HKV: tl.constexpr, BLOCK_HALF: tl.constexpr,
    HAS_NORM: tl.constexpr, PRECISE_TRIG: tl.constexpr,
):
    """Grid (M, 3): program (m, 0) writes row m's q, (m, 1) its k, (m, 2) its v, side by side (Llama-3-8B heads at
    M=8: 2.49 µs a call, one program a row 3.03; results/verify_8b_h200/README.md, "In-place adds")."""
    m = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    HALF: tl.constexpr = D // 2
    j = tl.arange(0, BLOCK_HALF)  # [BLOCK_HALF]
    freq = tl.load(inv_freq_ptr + j, mask=j < HALF, other=0.0)  # [BLOCK_HALF]
    angle = tl.load(pos_ptr + m).to(tl.float32) * freq  # [BLOCK_HALF]; one fp32 product, as in torch
    if PRECISE_TRIG:  # libdevice's full range reduction: angles reach ~1e5 rad (positions * inv_freq[0] = 1)
        cos = libdevice.cos(angle)  # [BLOCK_HALF]
        sin = libdevice.sin(angle)  # [BLOCK_HALF]
    else:  # the interpreter has no libdevice; its numpy cos/sin are accurate
        cos = tl.cos(angle)  # [BLOCK_HALF]
        sin = tl.sin(angle)  # [BLOCK_HALF]
    row = qkv_ptr + m * stride_qkv
    if part == 0:
        q1, q2, offs, mask = _norm_rope(row, qw_ptr, eps, cos, sin, HQ, BLOCK_HQ, D, BLOCK_HALF, HAS_NORM)
        q_out = q_ptr + m * (HQ * D)
        tl.store(q_out + offs, q1, mask=mask)
        tl.store(q_out + offs + HALF, q2, mask=mask)
    elif part == 1:
        slot = tl.load(slots_ptr + m).to(tl.int64)
        k1, k2, offs, mask = _norm_rope(row + HQ * D, kw_ptr, eps, cos, sin, HKV, BLOCK_HKV, D, BLOCK_HALF,
                                        HAS_NORM)
        k_out = k_cache_ptr + slot * (HKV * D)
        cache_dtype = k_cache_ptr.dtype.element_ty
        tl.store(k_out + offs, k1.to(cache_dtype), mask=mask)
        tl.store(k_out + offs + HALF, k2.to(cache_dtype), mask=mask)
    else:
        slot = tl.load(slots_ptr + m).to(tl.int64)
        h = tl.arange(0, BLOCK_HKV)  # [BLOCK_HKV]
        j2 = tl.arange(0, 2 * BLOCK_HALF)  # [2 * BLOCK_HALF] a whole head
        vmask = (h < HKV)[:, None] & (j2 < D)[None, :]  # [BLOCK_HKV, 2 * BLOCK_HALF]
        voffs = h[:, None] * D + j2[None, :]  # [BLOCK_HKV, 2 * BLOCK_HALF]
        v = tl.load(row + (HQ + HKV) * D + voffs, mask=vmask)  # [BLOCK_HKV, 2 * BLOCK_HALF]
        tl.store(v_cache_ptr + slot * (HKV * D) + voffs, v.to(v_cache_ptr.dtype.element_ty), mask=vmask)


def rope_store(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out_slots: torch.Tensor,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
) -> torch.Tensor:
    """Rotate q and k of the fused projection output, store k and v in the cache, return q.

    qkv [M, (Hq + 2*Hkv) * D] (fp32/bf16/fp16; row-strided is fine), positions [M] and out_slots
    [M] (int64 or int32), inv_freq [D/2] fp32, k_cache/v_cache [S, Hkv, D] contiguous (a paged
    pool [pages, page_size, Hkv, D] works too: slot = page * page_size + offset), any float dtype.
    q_norm_weight/k_norm_weight [D] in qkv's dtype: Qwen3's per-head q/k RMSNorm before RoPE.
    Returns q [M, Hq, D] in qkv's dtype. Rows sharing an out_slot (padding -> dummy slot 0) race:
    one of them wins. Slots are not bounds-checked (that would need a host sync).
    """
    _check_args(qkv, positions, inv_freq, k_cache, v_cache, out_slots, n_heads, n_kv_heads, head_dim,
                q_norm_weight, k_norm_weight)
    extra = [t for t in (q_norm_weight, k_norm_weight) if t is not None]
    if not use_triton(qkv, positions, inv_freq, k_cache, v_cache, out_slots, *extra):
        return rope_store_ref(qkv, positions, inv_freq, k_cache, v_cache, out_slots, n_heads, n_kv_heads,
                              head_dim, q_norm_weight, k_norm_weight, norm_eps)
    M, D = qkv.shape[0], head_dim
    q = torch.empty(M, n_heads, D, dtype=qkv.dtype, device=qkv.device)  # [M, Hq, D]
    if M == 0:
        return q
    if qkv.stride(1) != 1:
        qkv = qkv.contiguous()
    has_norm = q_norm_weight is not None
    _rope_store_kernel[(M, 3)](
        qkv, positions.contiguous(), inv_freq.contiguous(), k_cache, v_cache, out_slots.contiguous(), q,
        q_norm_weight.contiguous() if has_norm else q, k_norm_weight.contiguous() if has_norm else q,
        qkv.stride(0), float(norm_eps), **_launch_meta(n_heads, n_kv_heads, D, has_norm),
        PRECISE_TRIG=not is_interpret(),
    )
    return q


def _launch_meta(n_heads: int, n_kv_heads: int, D: int, has_norm: bool) -> dict:
    """Blocks and warps for one row's heads."""
    block_hq, block_half = triton.next_power_of_2(n_heads), triton.next_power_of_2(D // 2)
    return dict(HQ=n_heads, HKV=n_kv_heads, D=D, BLOCK_HQ=block_hq, BLOCK_HKV=triton.next_power_of_2(n_kv_heads),
                BLOCK_HALF=block_half, HAS_NORM=has_norm, num_warps=4 if block_hq * block_half <= 1024 else 8)


def compile_cases(hip: bool) -> list[CompileCase]:
    """kernels/_compile_cases.py: the model's heads; bf16, the libdevice (CUDA) / OCML (HIP) sine and cosine (the
    same on both vendors)."""
    p, i64 = Ptr(torch.bfloat16), Ptr(torch.int64)
    return [CompileCase.of(
        _rope_store_kernel, (s.name,), qkv_ptr=p, pos_ptr=i64, inv_freq_ptr=Ptr(torch.float32), k_cache_ptr=p,
        v_cache_ptr=p, slots_ptr=i64, q_ptr=p, qw_ptr=p, kw_ptr=p,
        stride_qkv=(s.n_heads + 2 * s.n_kv_heads) * s.head_dim, eps=1e-5, PRECISE_TRIG=True,
        **_launch_meta(s.n_heads, s.n_kv_heads, s.head_dim, False)) for s in model_shapes()]
