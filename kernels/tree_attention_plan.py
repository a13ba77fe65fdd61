"""What both tree-attention kernels share (kernels/tree_attention_splitkv.py, kernels/tree_attention_invariant.py):
one call's input checks and the launch scalars both forwards take (`check_call`), and the calls and inputs their
compile cases stand for.

A kernel module's `prepare` is cached on the inputs' `meta`s (shape, strides, dtype, device), so a repeated shape
costs one dict lookup and no device value is read (a call is CUDA-graph capturable).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton.language as tl

from eaglet.kernels._compile_cases import TREES, CompileCase, Ptr

SUPPORTED_HEAD_DIMS = (64, 128)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
LOG2E = 1.4426950408889634


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def meta(t: torch.Tensor | None) -> tuple | None:
    """What `prepare` needs of a tensor: shape, strides, dtype, device (hashable)."""
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


class Call(NamedTuple):
    """One checked call: its sizes and the scalars both forwards take."""

    B: int
    N: int  # query tokens a request
    Hq: int
    Hkv: int
    D: int
    page_size: int
    group: int  # query heads a KV head
    nk: int  # new keys (after the prefix)
    kv_max: int  # host bound on a request's keys (prefix + nk): max_prefix_len's, else the page table's capacity
    pt_width: int  # page-table columns
    has_mask: bool
    qk_scale: float  # the softmax scale in log2 units
    dot_dtype: object  # the dots' operand type (a tl dtype)
    strides: tuple  # q's (3), k's (3), v's (3), the page table's (1), the mask's (2): the forwards' stride arguments
    mask_strides: tuple  # the mask's batch and row strides ((0, 0) when causal)
    device: torch.device  # q's


def check_call(q, k, v, pt, pl, mask, sm_scale, max_prefix_len, interpret: bool) -> Call | None:
    """Validate one call's metadata (`meta` tuples) and derive its `Call`. Raises ValueError naming the argument.
    Returns None when an input needs .contiguous() first."""

    def need(cond: bool, msg) -> None:
        if not cond:
            raise ValueError(msg())

    (q_shape, q_stride, q_dtype, q_dev), (k_shape, k_stride, k_dtype, _), (v_shape, v_stride, v_dtype, _) = q, k, v
    need(len(q_shape) == 4, lambda: f"q must be [B, N, Hq, D], got shape {tuple(q_shape)}")
    need(len(k_shape) == 4, lambda: f"k_cache must be [num_pages, page_size, Hkv, D], got shape {tuple(k_shape)}")
    need(v_shape == k_shape, lambda: f"v_cache shape {tuple(v_shape)} must equal k_cache shape {tuple(k_shape)}")
    B, N, Hq, D = q_shape
    page_size, Hkv, Dk = k_shape[1], k_shape[2], k_shape[3]
    need(q_dtype in SUPPORTED_DTYPES, lambda: f"q dtype {q_dtype} unsupported: use one of {SUPPORTED_DTYPES}")
    need(k_dtype == q_dtype, lambda: f"k_cache dtype {k_dtype} must equal q dtype {q_dtype}")
    need(v_dtype == q_dtype, lambda: f"v_cache dtype {v_dtype} must equal q dtype {q_dtype}")
    need(D in SUPPORTED_HEAD_DIMS, lambda: f"head_dim D={D} (q.shape[3]) unsupported: use one of {SUPPORTED_HEAD_DIMS}")
    need(Dk == D, lambda: f"k_cache head_dim {Dk} must equal q head_dim {D}")
    need(Hkv > 0 and Hq % Hkv == 0, lambda: f"q heads Hq={Hq} must be a multiple of k_cache heads Hkv={Hkv}")
    need(N > 0 and B > 0, lambda: f"q must have B > 0 and N > 0 tokens, got shape {tuple(q_shape)}")
    need(len(pt[0]) == 2 and pt[0][0] == B, lambda: f"page_table must be [B={B}, P], got shape {tuple(pt[0])}")
    need(pt[2] == torch.int32, lambda: f"page_table dtype must be torch.int32, got {pt[2]}")
    need(pl[0] == (B,), lambda: f"prefix_lens must be [B={B}], got shape {tuple(pl[0])}")
    need(pl[2] == torch.int32, lambda: f"prefix_lens dtype must be torch.int32, got {pl[2]}")
    if mask is not None:
        need(len(mask[0]) == 3 and mask[0][:2] == (B, N) and mask[0][2] > 0,
             lambda: f"tree_mask must be [B={B}, N={N}, NK>0], got shape {tuple(mask[0])}")
        need(mask[2] == torch.bool, lambda: f"tree_mask dtype must be torch.bool, got {mask[2]}")
    for name, m in (("k_cache", k), ("v_cache", v), ("page_table", pt), ("prefix_lens", pl), ("tree_mask", mask)):
        need(m is None or m[3] == q_dev,
             lambda: f"{name} is on {m[3]} but q is on {q_dev}: put all inputs on one device")
    need(k_stride[-1] == 1 and v_stride[-1] == 1, lambda: "k_cache and v_cache need a contiguous last (head_dim) axis")
    need(sm_scale is None or sm_scale > 0, lambda: f"sm_scale must be positive or None, got {sm_scale}")
    need(
        max_prefix_len is None or (isinstance(max_prefix_len, int) and max_prefix_len >= 0),
        lambda: f"max_prefix_len must be a host int >= 0 or None, got {max_prefix_len!r}",
    )
    # The kernels need a unit stride on q's, page_table's and the mask's last axis and a dense prefix_lens.
    if q_stride[-1] != 1 or pt[1][-1] != 1 or (B > 1 and pl[1][0] != 1) or (mask is not None and mask[1][-1] != 1):
        return None

    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(D)
    NK = N if mask is None else mask[0][2]  # new keys (after the prefix)
    kv_max = (pt[0][1] * page_size) if max_prefix_len is None else (max_prefix_len + NK)
    # fp32 inputs use exact fp32 dots (tf32 would miss 1e-4); the interpreter's bf16 is wrong, so upcast there.
    dot_dtype = tl.float32 if (q_dtype == torch.float32 or interpret) else (
        tl.bfloat16 if q_dtype == torch.bfloat16 else tl.float16
    )
    mask_strides = mask[1][:2] if mask is not None else (0, 0)
    strides = (*q_stride[:3], *k_stride[:3], *v_stride[:3], pt[1][0], *mask_strides)
    return Call(B, N, Hq, Hkv, D, page_size, Hq // Hkv, NK, kv_max, pt[0][1], mask is not None, scale * LOG2E,
                dot_dtype, strides, mask_strides, q_dev)


# ----------------------------------------------------------------------------------------------------
# Compile cases (kernels/_compile_cases.py)

CASE_PAGE = 16  # the KV pool's page size (KVCache's default)
CASE_PREFIX = 1024  # the decode and verify cases' prefix (and max_prefix_len)


def case_calls() -> list[tuple[str, int, int, bool, int]]:
    """(label, B, N, tree, prefix) of the calls both kernels' compile cases stand for: decode (B = 1 and 8, one
    token, a 1k prefix), the verify of a tree (B = 1 and 8, 8 tokens and the largest tree of TREES, a tree mask, a 1k
    prefix) and a causal prefill of 2048 tokens."""
    largest = max(t.num_draft_tokens for t in TREES)
    calls = [(f"decode B={B}", B, 1, False, CASE_PREFIX) for B in (1, 8)]
    calls += [(f"verify B={B} N={N}", B, N, True, CASE_PREFIX) for N in (8, largest) for B in (1, 8)]
    return calls + [("prefill N=2048", 1, 2048, False, 0)]


def _dense(shape: tuple, dtype: torch.dtype) -> tuple:
    """The `meta` of a fresh contiguous tensor on a GPU."""
    return tuple(shape), tuple(math.prod(shape[i + 1:]) for i in range(len(shape))), dtype, torch.device("cuda", 0)


def case_inputs(s, B: int, N: int, tree: bool, prefix: int) -> tuple[tuple, tuple]:
    """One bf16 call at shape `s`'s heads (q [B, N], pages of 16, a tree mask or causal): the `meta`s of its six
    inputs, and the pointers `tree_attention` passes for them (the mask a uint8 view, or the page table where
    causal)."""
    bf16, i32 = Ptr(torch.bfloat16), Ptr(torch.int32)
    pages = cdiv(prefix + N, CASE_PAGE)  # [B, pages] page table, a pool of B * pages pages
    cache = _dense((B * pages, CASE_PAGE, s.n_kv_heads, s.head_dim), torch.bfloat16)
    metas = (_dense((B, N, s.n_heads, s.head_dim), torch.bfloat16), cache, cache, _dense((B, pages), torch.int32),
             _dense((B,), torch.int32), _dense((B, N, N), torch.bool) if tree else None)
    return metas, (bf16, bf16, bf16, i32, i32, Ptr(torch.uint8) if tree else i32)


def out_ptr(split: bool) -> Ptr:
    """The forward's output: the fp32 workspace when split, else the bf16 output."""
    return Ptr(torch.float32) if split else Ptr(torch.bfloat16)


def merge_case(merge: tuple, ptrs: tuple, used_by: str) -> CompileCase:
    """The case of a recipe's merge launch (ptrs: `case_inputs`')."""
    merge_kernel, _, merge_args, merge_kw, takes_mask = merge
    merge_ptrs = (out_ptr(True), ptrs[4]) + (ptrs[5:6] if takes_mask else ()) + (Ptr(torch.bfloat16),)
    return CompileCase.of(merge_kernel, (used_by,), **dict(zip(merge_kernel.arg_names, merge_ptrs + merge_args)),
                          **merge_kw)
