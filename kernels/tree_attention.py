"""Tree attention over a paged KV pool: the public op (`tree_attention`, its torch reference `tree_attention_ref`).

For each request b the N query tokens (tree nodes, or a prefill chunk) attend
  * every cached prefix token at positions [0, prefix_lens[b]) of the request, and
  * the new keys j < NK at positions prefix_lens[b] + j for which tree_mask[b, i, j] is True
    (tree_mask [B, N, NK]; None means NK = N and causal: j <= i).
The new keys' K/V must already be written to the pool at positions prefix_lens[b] + j. Usually
NK = N (a verify or prefill writes its own keys); a draft step's K queries attend all the
draft-tree nodes written so far (NK = step * K).

Pool layout: k_cache / v_cache [num_pages, page_size, Hkv, D]; the slot of position p of
request b is page_table[b, p // page_size] * page_size + p % page_size.

Two kernels, one per numerics path, over the checks and scalars they share (kernels/tree_attention_plan.py):
  * `invariant=False`: split-KV flash decoding, autotuned (kernels/tree_attention_splitkv.py);
  * `invariant=True`: fixed leaves merged by a fixed tree, so a row's bits do not depend on the batch, the tree or
    the grid (kernels/tree_attention_invariant.py).
Each kernel module's `prepare` turns a call's input metadata into a cached launch recipe, which this launcher runs.
"""

from __future__ import annotations

import contextlib
import math

import torch

from eaglet.kernels import tree_attention_invariant, tree_attention_splitkv
from eaglet.kernels._utils import is_interpret, use_triton
from eaglet.kernels.tree_attention_plan import SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS, meta

__all__ = ["SUPPORTED_DTYPES", "SUPPORTED_HEAD_DIMS", "tree_attention", "tree_attention_ref"]


def tree_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    prefix_lens: torch.Tensor,
    tree_mask: torch.Tensor | None = None,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """Torch reference. q [B, N, Hq, D] -> out [B, N, Hq, D] (dtype of q); fp32 math (fp64 for fp64 q)."""
    B, N, Hq, D = q.shape
    page_size, Hkv = k_cache.shape[1], k_cache.shape[2]
    group = Hq // Hkv
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(D)
    acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    k_flat = k_cache.reshape(-1, Hkv, D)  # [slots, Hkv, D]
    v_flat = v_cache.reshape(-1, Hkv, D)  # [slots, Hkv, D]
    out = torch.empty_like(q)  # [B, N, Hq, D]
    NK = N if tree_mask is None else tree_mask.shape[2]
    new = torch.arange(N, device=q.device)  # [N]
    causal = new[None, :] <= new[:, None]  # [N, N]
    for b in range(B):
        P = int(prefix_lens[b])
        pos = torch.arange(P + NK, device=q.device)  # [P+NK]
        slots = page_table[b, pos // page_size].long() * page_size + pos % page_size  # [P+NK]
        k = k_flat[slots].to(acc_dtype).repeat_interleave(group, dim=1)  # [P+NK, Hq, D]
        v = v_flat[slots].to(acc_dtype).repeat_interleave(group, dim=1)  # [P+NK, Hq, D]
        s = torch.einsum("nhd,khd->hnk", q[b].to(acc_dtype), k) * scale  # [Hq, N, P+NK]
        tree = causal if tree_mask is None else tree_mask[b].bool()  # [N, NK]
        allowed = torch.cat([torch.ones(N, P, dtype=torch.bool, device=q.device), tree], dim=1)  # [N, P+NK]
        s = s.masked_fill(~allowed, float("-inf"))  # [Hq, N, P+NK]
        p = torch.softmax(s, dim=-1)  # [Hq, N, P+NK]
        out[b] = torch.einsum("hnk,khd->nhd", p, v).to(q.dtype)  # [N, Hq, D]
    return out


def _empty(shape: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Every buffer the launcher allocates goes through here (tests poison it with NaN)."""
    return torch.empty(shape, dtype=dtype, device=device)


def tree_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    prefix_lens: torch.Tensor,
    tree_mask: torch.Tensor | None = None,
    sm_scale: float | None = None,
    max_prefix_len: int | None = None,
    invariant: bool = False,
) -> torch.Tensor:
    """Public launcher: Triton on GPU (and on CPU under TRITON_INTERPRET=1), else the reference.

    q [B, N, Hq, D] fp16/bf16/fp32, D in (64, 128); k_cache/v_cache [num_pages, page_size, Hkv, D];
    page_table [B, P] int32; prefix_lens [B] int32; tree_mask [B, N, NK] bool or None (causal, NK = N);
    max_prefix_len: host upper bound on prefix_lens that sizes the split grid (None: the page
    table's capacity; a tight bound avoids empty splits). invariant: each row's output independent of
    the batch, the tree and the split plan (kernels/tree_attention_invariant.py; needs a tree whose new tokens are
    numbered parents first, as `build_tree` numbers them). Returns out [B, N, Hq, D] (q's dtype).
    """
    kernel_module = tree_attention_invariant if invariant else tree_attention_splitkv
    recipe = kernel_module.prepare(
        meta(q), meta(k_cache), meta(v_cache), meta(page_table), meta(prefix_lens), meta(tree_mask),
        sm_scale, max_prefix_len, is_interpret(),
    )  # fmt: skip
    if not use_triton(q, k_cache, v_cache, page_table, prefix_lens):
        return tree_attention_ref(q, k_cache, v_cache, page_table, prefix_lens, tree_mask, sm_scale)
    if recipe is None:  # rare: a strided input, copied once here
        return tree_attention(
            q.contiguous(), k_cache, v_cache, page_table.contiguous(), prefix_lens.contiguous(),
            None if tree_mask is None else tree_mask.contiguous(), sm_scale, max_prefix_len, invariant,
        )  # fmt: skip
    kernel, grid, fwd_args, fwd_kw, ws_numel, merge = recipe
    # bool -> uint8 view (same bytes). page_table is a dummy when causal.
    mask = tree_mask.view(torch.uint8) if tree_mask is not None else page_table
    out = _empty(q.shape, q.dtype, q.device)  # [B, N, Hq, D]
    ws = _empty((ws_numel,), torch.float32, q.device) if merge else out  # partial outputs (leaf states) when split

    # Triton launches on the current device: switch only when q lives elsewhere (cheap common path).
    on_other_gpu = q.is_cuda and q.device.index != torch.cuda.current_device()
    with torch.cuda.device(q.device) if on_other_gpu else contextlib.nullcontext():
        kernel[grid](q, k_cache, v_cache, page_table, prefix_lens, mask, ws, *fwd_args, **fwd_kw)
        if merge:
            merge_kernel, merge_grid, merge_args, merge_kw, takes_mask = merge
            if takes_mask:  # the invariant merge reads each row's sequence length from its mask row
                merge_kernel[merge_grid](ws, prefix_lens, mask, out, *merge_args, **merge_kw)
            else:
                merge_kernel[merge_grid](ws, prefix_lens, out, *merge_args, **merge_kw)
    return out
