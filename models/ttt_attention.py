"""The training forward's attention: dense, differentiable, over K/V kept with their autograd history.

The draft heads' `forward_dense` (models/eagle.py) runs the inference forward's weights and math with this
attention in place of the paged-pool kernels: the inference path writes K/V into the pool (no gradient reaches
k/v) and its Triton kernels have no backward. `TTTPattern` is the unrolled training-time test's attention
pattern, computed without materialising its mask; `DenseKV` holds the K/V of earlier unrolled steps.

Only kernel references are imported here, so models/eagle.py can import this module without a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from eaglet.kernels.rope import rotate_half

if TYPE_CHECKING:
    from eaglet.models.llama import Attention


class DenseKV:
    """K/V of earlier `forward_dense` calls, per KV layer and call, with their autograd history: the training-time
    test attends over the keys of earlier unrolled steps (the training twin of the paged pool)."""

    def __init__(self):
        self.k: dict[int, list[torch.Tensor]] = {}
        self.v: dict[int, list[torch.Tensor]] = {}

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Append this call's k/v [B, Hkv, T, D] to layer's -> the keys and values of every call so far, in order."""
        self.k.setdefault(layer, []).append(k)
        self.v.setdefault(layer, []).append(v)
        return self.k[layer], self.v[layer]


@dataclass(frozen=True)
class TTTPattern:
    """`forward_dense`'s attention for unrolled step `step` of the training-time test, computed without its
    dense mask: causal over the step-0 keys (the first call's, kept in the DenseKV), and each query's own
    position in the keys of steps 1..step. `training.losses.ttt_attention_mask` is the same pattern as a
    [T, (step+1)*T] mask; SDPA over that mask costs (step+1)*T^2 scores per step (28*T^2 over 7 steps, and the
    fp32 score matrices of a long batch filled 23.7 GB of an H200), this T^2 + step*T.

    ancestors=False (the head's DRAFT_ANCESTORS_CACHED, False for multi-layer heads): the engine's draft step
    sees the accepted prefix and its own key only, its ancestors having been cached by other layers; then
    step k attends the step-0 keys and the key of step k alone (the layer's DenseKV holds the calls of every
    step that ran it, as its paged KV holds their scratch writes, masked there)."""

    step: int
    ancestors: bool = True


# SDPA backends of every training attention (causal, masked), cuDNN left out: it builds an execution plan per new
# shape, and training batches come in every length. An H200 profile of EAGLE-3 training spent 50 ms of host time per
# cuDNN call (5x the step's device time); an H100 profile of block-drafter training 20-28 ms per call, ~97 ms of
# host time a step against ~127 ms steps (results/block_drafter_h100). Flash and memory-efficient attention need
# no plan.
SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def ttt_attention(q: torch.Tensor, ks: list[torch.Tensor], vs: list[torch.Tensor], scale: float) -> torch.Tensor:
    """TTTPattern attention: causal over ks[0] (the step-0 keys), each query's own position in ks[1:] (the steps
    it attends). q [B, Hq, T, D]; ks, vs: keys/values [B, Hkv, T, D] each (Hq = G * Hkv, query head h reads KV
    head h // G) -> [B, Hq, T, D]. The unrolled steps' keys are stacked, not looped over, and the KV heads are
    not repeated: the op count is the same at every step (the training step is host-bound on its ops)."""
    B, Hq, T, D = q.shape
    Hkv = ks[0].shape[1]
    G = Hq // Hkv
    if len(ks) == 1:
        k0, v0 = (t.repeat_interleave(G, dim=1) for t in (ks[0], vs[0]))  # [B, Hq, T, D] each
        with sdpa_kernel(SDPA_BACKENDS):
            return F.scaled_dot_product_attention(q, k0, v0, is_causal=True)  # [B, Hq, T, D]
    qg = q.reshape(B, Hkv, G * T, D)  # a group's query heads share their KV head
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()  # [T, T]
    s0 = (qg @ ks[0].transpose(-1, -2)).view(B, Hq, T, T).float().masked_fill(~causal, float("-inf"))  # [B, Hq, T, T]
    K, V = torch.stack(ks[1:], dim=2), torch.stack(vs[1:], dim=2)  # [B, Hkv, k, T, D] each
    diag = torch.einsum("bhgtd,bhktd->bhgtk", qg.view(B, Hkv, G, T, D).float(), K.float())  # [B, Hkv, G, T, k]
    p = torch.softmax(torch.cat([s0, diag.reshape(B, Hq, T, -1)], dim=-1) * scale, dim=-1)  # [B, Hq, T, T + k]
    p = p.to(vs[0].dtype)
    o = p[..., :T].reshape(B, Hkv, G * T, T) @ vs[0]  # [B, Hkv, G*T, D]
    o_steps = torch.einsum("bhgtk,bhktd->bhgtd", p[..., T:].reshape(B, Hkv, G, T, -1), V)  # [B, Hkv, G, T, D]
    return (o.view(B, Hkv, G, T, D) + o_steps).view(B, Hq, T, D)


def rope_dense(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, heads: int) -> torch.Tensor:
    """Rotate-half RoPE as `rope_store_ref`, rotated in fp32 and rounded once: x [B, T, heads*D], positions
    [B, T] -> [B, heads, T, D]."""
    B, T, _ = x.shape
    freqs = positions.float()[..., None] * inv_freq  # [B, T, D/2]
    emb = torch.cat([freqs, freqs], dim=-1)[:, :, None, :]  # [B, T, 1, D]
    xf = x.reshape(B, T, heads, -1).float()  # [B, T, heads, D]
    return (xf * emb.cos() + rotate_half(xf) * emb.sin()).to(x.dtype).transpose(1, 2)


def attention_dense(attn: Attention, a, positions, inv_freq, mask, cache: DenseKV | None) -> torch.Tensor:
    """`Attention.forward` without the pool: rotate-half RoPE in fp32 as `rope_store_ref`, then SDPA of the
    T queries over the cached keys plus their own. a [B, T, in], mask [T, L] or [B, T, L] bool -> [B, T, H]."""
    if attn.q_norm is not None:
        raise ValueError("dense attention has no q/k norm (draft layers are Llama layers)")
    B, T, _ = a.shape
    Hq, Hkv, D = attn.n_heads, attn.n_kv_heads, attn.head_dim
    q, k, v = attn.qkv_proj(a).split([Hq * D, Hkv * D, Hkv * D], dim=-1)  # [B, T, Hq*D], [B, T, Hkv*D] x2
    q, k = rope_dense(q, positions, inv_freq, Hq), rope_dense(k, positions, inv_freq, Hkv)  # [B, H*, T, D]
    v = v.reshape(B, T, Hkv, D).transpose(1, 2)  # [B, Hkv, T, D]
    ks, vs = cache.extend(attn.layer_id, k, v) if cache is not None else ([k], [v])  # per call [B, Hkv, T_i, D]

    def heads(t):  # [B, Hkv, L, D] -> [B, Hq, L, D]
        return t.repeat_interleave(Hq // Hkv, dim=1)

    if isinstance(mask, TTTPattern):
        if not mask.ancestors:  # step 0's keys and this call's only, as the engine's draft mask without ancestors
            ks, vs = ks[:1] + ks[1:][-1:], vs[:1] + vs[1:][-1:]
        if len(ks) != (mask.step + 1 if mask.ancestors else min(mask.step, 1) + 1):
            needs = f"steps 0..{mask.step}" if mask.ancestors else "step 0 and of this call"
            raise ValueError(f"TTTPattern(step={mask.step}) needs the keys of {needs} in the DenseKV, it holds "
                             f"{len(ks)} calls")
        o = ttt_attention(q, ks, vs, D**-0.5)  # [B, Hq, T, D]
    else:
        m = mask if mask.dim() == 2 else mask[:, None]  # [T, L] or [B, 1, T, L]
        with sdpa_kernel(SDPA_BACKENDS):
            o = F.scaled_dot_product_attention(q, heads(torch.cat(ks, 2)), heads(torch.cat(vs, 2)), attn_mask=m)
    return attn.o_proj(o.transpose(1, 2).reshape(B, T, Hq * D))
