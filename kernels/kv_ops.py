"""KV-pool operations: the pool slots of positions, and the commit of the accepted path's KV.

    pool_slots(page_table, positions, page_size, valid=None) -> slots [B, T] int64
    step_slots(req_to_page, rows, seq_lens, T, page_size, index=None) -> (page_table, positions, slots)
    commit_kv(kv_cache, page_table, page_size, seq_lens, accept_index, accept_len)

pool_slots: one launch for what torch does in five to seven (the division, the gather, two casts, the product, the
remainder, the sum, the mask), each a few µs inside a CUDA graph; every store of a decode step asks for slots (the
verify, each drafter's propose and update).

step_slots: a drafter's step stores at seq_len .. seq_len + T - 1 of its requests: their page tables (gathered by
row), those positions and their slots in one launch, for the four a step took (the row gather, the add, the mask,
pool_slots); a drafter's propose and update each ask once.

commit_kv: move the accepted path's KV to contiguous positions and advance seq_lens.

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


def pool_slots_ref(page_table: torch.Tensor, positions: torch.Tensor, page_size: int,
                   valid: torch.Tensor | None = None) -> torch.Tensor:
    """Torch reference (the spec) of `pool_slots`."""
    pages = page_table.gather(1, (positions // page_size).long()).long()  # [B, T]
    slots = pages * page_size + positions.long() % page_size  # [B, T]
    return slots if valid is None else torch.where(valid, slots, 0)


@triton.jit
def _pool_slots_kernel(PT, stride_pt, POS, stride_pos, VALID, stride_valid, OUT, T, page_size,
                       HAS_VALID: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    t = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    inside = t < T
    ok = inside
    if HAS_VALID:  # a masked position reads nothing (it may lie past the page table) and gets slot 0
        ok = ok & (tl.load(VALID + b * stride_valid + t, mask=inside, other=0) != 0)
    pos = tl.load(POS + b * stride_pos + t, mask=ok, other=0).to(tl.int64)  # [BLOCK]
    page = tl.load(PT + b * stride_pt + pos // page_size, mask=ok, other=0).to(tl.int64)  # [BLOCK]
    tl.store(OUT + b * T + t, page * page_size + pos % page_size, mask=inside)


def pool_slots(page_table: torch.Tensor, positions: torch.Tensor, page_size: int,
               valid: torch.Tensor | None = None) -> torch.Tensor:
    """page_table [B, P] int (pool pages), positions [B, T] int, each in [0, P * page_size) where valid, valid [B, T]
    bool or None -> flat pool slots [B, T] int64: page_table[b, p // page_size] * page_size + p % page_size, 0 where
    not valid (the dummy page's first slot, where a masked row's store lands). No host sync."""
    if page_table.dim() != 2 or positions.dim() != 2 or positions.shape[0] != page_table.shape[0]:
        raise ValueError(f"page_table [B, P] and positions [B, T] must share B, got {tuple(page_table.shape)} and "
                         f"{tuple(positions.shape)}")
    if page_table.is_floating_point() or positions.is_floating_point():
        raise ValueError(f"page_table and positions must be integers, got {page_table.dtype} and {positions.dtype}")
    if valid is not None and (valid.shape != positions.shape or valid.dtype != torch.bool):
        raise ValueError(f"valid must be [B, T] = {tuple(positions.shape)} bool, got {tuple(valid.shape)} "
                         f"{valid.dtype}")
    tensors = [page_table, positions] + ([valid] if valid is not None else [])
    if not use_triton(*tensors):
        return pool_slots_ref(page_table, positions, page_size, valid)
    B, T = positions.shape
    out = torch.empty(B, T, dtype=torch.int64, device=positions.device)  # [B, T]
    if B == 0 or T == 0:
        return out
    # the last dim contiguous (a no-op for the engine's tensors); rows may be strided
    pt, pos = (t if t.stride(1) == 1 else t.contiguous() for t in (page_table, positions))
    # without a mask VALID is read nowhere: any int8 pointer (out's), so that one variant serves both
    v = (out if valid is None else valid if valid.stride(1) == 1 else valid.contiguous()).view(torch.int8)
    meta = _slots_meta(T)
    _pool_slots_kernel[(B, triton.cdiv(T, meta["BLOCK"]))](
        pt, pt.stride(0), pos, pos.stride(0), v, v.stride(0), out, T, page_size, HAS_VALID=valid is not None, **meta,
    )
    return out


def step_slots_ref(req_to_page: torch.Tensor, rows: torch.Tensor, seq_lens: torch.Tensor, T: int, page_size: int,
                   index: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Torch reference (the spec) of `step_slots`."""
    page_table = req_to_page[rows]  # [B, P]
    positions = seq_lens.long()[:, None] + torch.arange(T, device=seq_lens.device)  # [B, T]
    valid = None if index is None else index >= 0  # [B, T]
    return page_table, positions, pool_slots_ref(page_table, torch.where(valid, positions, 0) if valid is not None
                                                 else positions, page_size, valid)


@triton.jit
def _step_slots_kernel(R2P, stride_r2p, ROWS, SEQ, INDEX, stride_index, PT, POS, OUT, P, T, page_size,
                       HAS_INDEX: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_P: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    src = R2P + tl.load(ROWS + b).to(tl.int64) * stride_r2p
    for p0 in range(0, P, BLOCK_P):  # the request's page table, copied
        p = p0 + tl.arange(0, BLOCK_P)  # [BLOCK_P]
        tl.store(PT + b * P + p, tl.load(src + p, mask=p < P), mask=p < P)
    t = tl.arange(0, BLOCK_T)  # [BLOCK_T]
    inside = t < T
    pos = tl.load(SEQ + b).to(tl.int64) + t  # [BLOCK_T]
    ok = inside
    if HAS_INDEX:  # index -1: no position (slot 0, the dummy page's first), the page table not read
        ok = ok & (tl.load(INDEX + b * stride_index + t, mask=inside, other=-1) >= 0)
    page = tl.load(src + pos // page_size, mask=ok & (pos // page_size < P), other=0).to(tl.int64)  # [BLOCK_T]
    tl.store(POS + b * T + t, pos, mask=inside)
    tl.store(OUT + b * T + t, tl.where(ok, page * page_size + pos % page_size, 0), mask=inside)


def step_slots(req_to_page: torch.Tensor, rows: torch.Tensor, seq_lens: torch.Tensor, T: int, page_size: int,
               index: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """req_to_page [R, P] int32 (a pool's pages by request row), rows [B] int64, seq_lens [B] int32, T >= 0, index
    [B, T] int64 or None (e.g. accept_index: -1 marks a position with no store) -> (page_table [B, P] =
    req_to_page[rows], positions [B, T] int64 = seq_len + t, slots [B, T] int64: `pool_slots` of those positions, 0
    where index < 0). One launch, no host sync."""
    B = rows.shape[0]
    if req_to_page.dim() != 2 or rows.dim() != 1 or tuple(seq_lens.shape) != (B,):
        raise ValueError(f"req_to_page [R, P], rows [B] and seq_lens [B] expected, got {tuple(req_to_page.shape)}, "
                         f"{tuple(rows.shape)} and {tuple(seq_lens.shape)}")
    if index is not None and tuple(index.shape) != (B, T):
        raise ValueError(f"index must be [B, T] = [{B}, {T}], got {tuple(index.shape)}")
    tensors = [req_to_page, rows, seq_lens] + ([index] if index is not None else [])
    if not use_triton(*tensors):
        return step_slots_ref(req_to_page, rows, seq_lens, T, page_size, index)
    P, dev = req_to_page.shape[1], rows.device
    page_table = torch.empty(B, P, dtype=req_to_page.dtype, device=dev)  # [B, P]
    positions = torch.empty(B, T, dtype=torch.int64, device=dev)  # [B, T]
    slots = torch.empty(B, T, dtype=torch.int64, device=dev)  # [B, T]
    if B > 0:
        r2p = req_to_page if req_to_page.stride(1) == 1 else req_to_page.contiguous()
        idx = positions if index is None else index if index.stride(1) == 1 else index.contiguous()
        _step_slots_kernel[(B,)](r2p, r2p.stride(0), rows, seq_lens, idx, idx.stride(0), page_table, positions, slots,
                                 P, T, page_size, HAS_INDEX=index is not None, **_step_meta(T))
    return page_table, positions, slots


def _step_meta(T: int) -> dict:
    """One program a request: its page table in chunks of 512, its T positions in one block (T = 0: EAGLE's scratch
    at tree.steps = 1, the page table alone)."""
    return dict(BLOCK_T=max(triton.next_power_of_2(T), 1), BLOCK_P=512, num_warps=4)


def _slots_meta(T: int) -> dict:
    """A block of up to 1,024 positions a program: one program for a decode step's few (B x T programs at prefill)."""
    block = min(triton.next_power_of_2(T), 1024)
    return dict(BLOCK=block, num_warps=1 if block <= 128 else 4)


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
    """kernels/_compile_cases.py: the slots of a step's stores (a drafter's few positions, a tree's, a 1k-token
    prefill; int32 and int64 positions, with and without a mask) and the commit of the model's KV heads (a bf16 pool
    moved as int16) at every tree's path length; the same on both vendors. The pool: 16-token pages (the engine's
    default), 4,096-token requests."""
    cases = []
    for T, use in ((8, "draft"), (64, "tree"), (1024, "prefill")):
        for pos_dtype in (torch.int32, torch.int64):
            for has_valid in (False, True):
                cases.append(CompileCase.of(
                    _pool_slots_kernel, (f"slots {use}",), PT=Ptr(torch.int32), stride_pt=256, POS=Ptr(pos_dtype),
                    stride_pos=T, VALID=Ptr(torch.int8), stride_valid=T, OUT=Ptr(torch.int64), T=T, page_size=16,
                    HAS_VALID=has_valid, **_slots_meta(T)))
    for T in sorted({8} | {t.steps + 1 for t in TREES} | {(t.steps - 1) * t.topk for t in TREES if t.steps > 1}):
        for has_index in (False, True):  # the block drafter's block and every tree's path (update), EAGLE's scratch
            cases.append(CompileCase.of(
                _step_slots_kernel, (f"step slots T={T}",), R2P=Ptr(torch.int32), stride_r2p=256, ROWS=Ptr(torch.int64),
                SEQ=Ptr(torch.int32), INDEX=Ptr(torch.int64), stride_index=T, PT=Ptr(torch.int32),
                POS=Ptr(torch.int64), OUT=Ptr(torch.int64), P=256, T=T, page_size=16, HAS_INDEX=has_index,
                **_step_meta(T)))
    for s in model_shapes():
        HD = s.n_kv_heads * s.head_dim
        for t in TREES:
            cases.append(CompileCase.of(
                _commit_kv_kernel, (f"{s.name} {t.name}",), kv_ptr=Ptr(torch.int16), page_table_ptr=Ptr(torch.int32),
                seq_lens_ptr=Ptr(torch.int32), accept_index_ptr=Ptr(torch.int64), accept_len_ptr=Ptr(torch.int32),
                P=256, page_size=16, stride_lkv=4096 * 16 * HD, HD=HD, **_launch_meta(HD, t.steps + 1)))
    return cases
