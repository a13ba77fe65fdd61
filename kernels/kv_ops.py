"""Commit the accepted path's KV: move it to contiguous positions and advance seq_lens.

The verify pass wrote the K/V of tree node j of request b at position seq_lens[b] + j. After
acceptance, node accept_index[b, i] must sit at position seq_lens[b] + i for
i < accept_len[b] (node 0, the root, is already there); then seq_lens[b] += accept_len[b].
Positions past the new length (rejected nodes) are simply overwritten by the next step, so
"freeing" them is a no-op for this per-request page table.

Pool: kv_cache [num_layers, 2, num_pages, page_size, Hkv, D] (one tensor, so one launch moves
every layer's K and V); the slot of position p of request b is
page_table[b, p // page_size] * page_size + p % page_size.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from eaglet.kernels._compile_cases import TREES, CompileCase, Ptr, model_shapes
from eaglet.kernels._utils import use_triton


def _check_args(kv_cache, page_table, page_size, seq_lens, accept_index, accept_len):
    if kv_cache.dim() != 6:
        raise ValueError(
            f"kv_cache must be [num_layers, 2, num_pages, page_size, Hkv, D], got shape {tuple(kv_cache.shape)}"
        )
    if kv_cache.shape[1] != 2:
        raise ValueError(f"kv_cache dim 1 must be 2 (K and V), got {kv_cache.shape[1]}")
    if kv_cache.shape[3] != page_size:
        raise ValueError(f"page_size={page_size} but kv_cache.shape[3]={kv_cache.shape[3]}")
    if not kv_cache.is_contiguous():
        raise ValueError("kv_cache must be contiguous (it is moved in place as flat slots)")
    if page_table.dim() != 2 or page_table.dtype != torch.int32:
        raise ValueError(f"page_table must be [B, P] int32, got {tuple(page_table.shape)} {page_table.dtype}")
    B = page_table.shape[0]
    if accept_index.dim() != 2 or accept_index.shape[0] != B or accept_index.dtype != torch.int64:
        raise ValueError(f"accept_index must be [B, S+1] int64 with B={B}, got "
                         f"{tuple(accept_index.shape)} {accept_index.dtype}")
    for name, t in (("seq_lens", seq_lens), ("accept_len", accept_len)):
        if tuple(t.shape) != (B,) or t.dtype != torch.int32:
            raise ValueError(f"{name} must be [B] = [{B}] int32, got {tuple(t.shape)} {t.dtype}")
    if not seq_lens.is_contiguous():
        raise ValueError("seq_lens must be contiguous (it is updated in place)")
    for name, t in (("page_table", page_table), ("seq_lens", seq_lens), ("accept_index", accept_index),
                    ("accept_len", accept_len)):
        if t.device != kv_cache.device:
            raise ValueError(f"{name} is on {t.device}, kv_cache on {kv_cache.device}")


def commit_kv_ref(
    kv_cache: torch.Tensor,
    page_table: torch.Tensor,
    page_size: int,
    seq_lens: torch.Tensor,
    accept_index: torch.Tensor,
    accept_len: torch.Tensor,
) -> None:
    """Torch reference (the spec) of `commit_kv`; updates kv_cache and seq_lens in place."""
    _check_args(kv_cache, page_table, page_size, seq_lens, accept_index, accept_len)

    def slot(b: int, pos: int) -> tuple[int, int]:
        return int(page_table[b, pos // page_size]), pos % page_size

    for b in range(page_table.shape[0]):
        base = int(seq_lens[b])
        for i in range(1, int(accept_len[b])):  # ascending: see commit_kv
            src, dst = slot(b, base + int(accept_index[b, i])), slot(b, base + i)
            kv_cache[:, :, dst[0], dst[1]] = kv_cache[:, :, src[0], src[1]]  # [L, 2, Hkv, D]
    seq_lens += accept_len


@triton.jit
def _commit_kv_kernel(
    kv_ptr, page_table_ptr, seq_lens_ptr, accept_index_ptr, accept_len_ptr,
    P, page_size, stride_lkv, HD,
    S1: tl.constexpr, BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    offs = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < HD
    base = kv_ptr + tl.program_id(1).to(tl.int64) * stride_lkv + offs  # [BLOCK], one layer's K or V
    seq_len = tl.load(seq_lens_ptr + b)
    n = tl.load(accept_len_ptr + b)
    pages = page_table_ptr + b.to(tl.int64) * P
    # Ascending i, in this one program: accept_index is strictly increasing along the path and
    # accept_index[i] >= i, so a destination seq_len+i can be the source of an EARLIER move
    # (accept_index[k] == i for k < i), which has already been read, but never of a later one.
    # Parallel moves could clobber such a source before it is read. (One [S+1, Hkv*D] tile of all
    # moves, loads, a CTA barrier, then stores, was slower at the 8B's shape: results/tree_verify_h200.md.)
    for i in range(1, n):
        src = seq_len + tl.load(accept_index_ptr + b.to(tl.int64) * S1 + i)
        dst = (seq_len + i).to(tl.int64)
        src_slot = tl.load(pages + src // page_size).to(tl.int64) * page_size + src % page_size
        dst_slot = tl.load(pages + dst // page_size).to(tl.int64) * page_size + dst % page_size
        if src_slot != dst_slot:
            vals = tl.load(base + src_slot * HD, mask=inside)  # [BLOCK]
            tl.store(base + dst_slot * HD, vals, mask=inside)


_SAME_SIZE_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def commit_kv(
    kv_cache: torch.Tensor,
    page_table: torch.Tensor,
    page_size: int,
    seq_lens: torch.Tensor,
    accept_index: torch.Tensor,
    accept_len: torch.Tensor,
) -> None:
    """Move each request's accepted KV to positions seq_lens[b] + i and add accept_len to
    seq_lens, in place, without a host sync.

    kv_cache [L, 2, num_pages, page_size, Hkv, D] (any dtype), page_table [B, P] int32,
    seq_lens [B] int32, accept_index [B, S+1] int64 (-1 padded), accept_len [B] int32.
    """
    _check_args(kv_cache, page_table, page_size, seq_lens, accept_index, accept_len)
    if not use_triton(kv_cache, page_table, seq_lens, accept_index, accept_len):
        commit_kv_ref(kv_cache, page_table, page_size, seq_lens, accept_index, accept_len)
        return
    B = page_table.shape[0]
    L2 = kv_cache.shape[0] * 2
    HD = kv_cache.shape[4] * kv_cache.shape[5]
    if B > 0 and kv_cache.numel() > 0:
        bits = kv_cache.view(_SAME_SIZE_INT[kv_cache.element_size()])  # a move is a bit copy (fp8/bf16 too)
        meta = _launch_meta(HD, accept_index.shape[1])
        _commit_kv_kernel[(B, L2, triton.cdiv(HD, meta["BLOCK"]))](
            bits, page_table.contiguous(), seq_lens, accept_index.contiguous(), accept_len.contiguous(),
            page_table.shape[1], page_size, kv_cache.stride(1), HD, **meta,
        )
    # After the moves, in stream order: every program above read the old seq_lens.
    seq_lens += accept_len


def _launch_meta(HD: int, S1: int) -> dict:
    """Block and warps for moving rows of HD = Hkv * D values along an accepted path of up to S1 nodes."""
    return dict(S1=S1, BLOCK=min(triton.next_power_of_2(HD), 1024), num_warps=4)


def compile_cases(hip: bool) -> list[CompileCase]:
    """kernels/_compile_cases.py: the model's KV heads (a bf16 pool moved as int16), every tree's path length; the
    same on both vendors. The pool: 16-token pages (the engine's default), 4,096-token requests."""
    cases = []
    for s in model_shapes():
        HD = s.n_kv_heads * s.head_dim
        for t in TREES:
            cases.append(CompileCase.of(
                _commit_kv_kernel, (f"{s.name} {t.name}",), kv_ptr=Ptr(torch.int16), page_table_ptr=Ptr(torch.int32),
                seq_lens_ptr=Ptr(torch.int32), accept_index_ptr=Ptr(torch.int64), accept_len_ptr=Ptr(torch.int32),
                P=256, page_size=16, stride_lkv=4096 * 16 * HD, HD=HD, **_launch_meta(HD, t.steps + 1)))
    return cases
