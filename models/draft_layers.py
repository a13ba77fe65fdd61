"""The decoder layers of the draft heads (models/eagle.py): `DraftLayer`, a Llama layer in EAGLE's three variants, and
`FcLayer`, a multi-layer head's step (its own fc, then a layer), each on the head's kernel path (models/kernel_paths.py)
and with `forward_dense`, the training forward: the same weights and math with attention computed densely by
models/ttt_attention.py and the kernels' torch references (the inference path writes K/V into the paged pool, which no
gradient reaches, and its Triton kernels have no backward).
"""

from __future__ import annotations

import torch
from torch import nn

from eaglet.kernels import projection as proj
from eaglet.kernels.activation import silu_and_mul_ref
from eaglet.kernels.rmsnorm import rmsnorm_ref
from eaglet.models.kernel_paths import KernelPath, path_for
from eaglet.models.kv_cache import ForwardBatch, KVCache
from eaglet.models.llama import Attention, FeedForward, ModelArgs, RMSNorm
from eaglet.models.ttt_attention import DenseKV, attention_dense


def draft_linear(layer: nn.Linear, invariant: bool, x: torch.Tensor) -> torch.Tensor:
    """layer(x): x [..., in] -> [..., out], on the head's path (`DraftHead.set_invariant`, models/kernel_paths.py):
    cuBLAS, or the invariant projection kernel."""
    if path_for(invariant) is KernelPath.STOCK:
        return layer(x)
    return proj.linear(x.reshape(-1, x.shape[-1]), layer.weight, layer.bias).view(*x.shape[:-1], -1)


class DraftLayer(nn.Module):
    """A Llama decoder layer in EAGLE's three variants, chosen by which input norms it has:

    - neither (EAGLE-1 layer 0): attention over x itself;
    - input_norm (EAGLE-1 layers > 0): attention over input_layernorm(x), a plain pre-norm layer;
    - input_norm + hidden_norm (EAGLE-3 midlayer): attention over cat(input_layernorm(embeds), hidden_norm(x)),
      so q/k/v take 2H.
    The residual is x in every variant."""

    def __init__(self, args: ModelArgs, kv_layer: int, *, input_norm: bool, hidden_norm: bool = False):
        super().__init__()
        self.self_attn = Attention(args, kv_layer)
        if hidden_norm:
            # Attention only knows args.dim-wide inputs: widen the fused projection to the 2H concatenation.
            qkv_out = (args.n_heads + 2 * args.n_kv_heads) * args.head_dim
            self.self_attn.qkv_proj = nn.Linear(2 * args.dim, qkv_out, bias=args.attention_bias)
        self.mlp = FeedForward(args)
        self.input_layernorm = RMSNorm(args.dim, args.norm_eps) if input_norm else None
        self.hidden_norm = RMSNorm(args.dim, args.norm_eps) if hidden_norm else None
        self.post_attention_layernorm = RMSNorm(args.dim, args.norm_eps)
        self.norms_folded = False  # fold_norm_weights
        self.invariant = False  # DraftHead.set_invariant

    def fold_norm_weights(self) -> bool:
        """Fold the norm weights into the projections after them, in place (as `Transformer.fold_norm_weights`):
        input_layernorm (and hidden_norm, EAGLE-3) into qkv_proj's columns, post_attention_layernorm into
        gate_up_proj; the norms' weights become 1, so both paths compute the same function (the invariant one then
        applies only each row's 1/rms, projection.FOLDED). A layer without an input norm (EAGLE-1 layer 0, whose qkv
        reads x unscaled) is left as it is. Returns whether the layer folded."""
        attn = self.self_attn
        if self.input_layernorm is None or self.norms_folded:
            return self.norms_folded
        if attn.qkv_proj.bias is not None or attn.o_proj.bias is not None:
            raise ValueError("fold_norm_weights: a draft layer with attention_bias is not supported (the 1/rms row "
                             "scale applies to the whole projection output); run without folding")
        norms = [self.input_layernorm] + ([self.hidden_norm] if self.hidden_norm is not None else [])
        with torch.no_grad():
            attn.qkv_proj.weight.mul_(torch.cat([n.weight for n in norms])[None, :])  # [N, H or 2H] * [1, H or 2H]
            self.mlp.gate_up_proj.weight.mul_(self.post_attention_layernorm.weight[None, :])  # [2I, H] * [1, H]
            for n in norms + [self.post_attention_layernorm]:
                n.weight.fill_(1.0)
        self.norms_folded = True
        return True

    def forward(self, x, positions, inv_freq, batch: ForwardBatch, kv: KVCache, embeds=None) -> torch.Tensor:
        """x [B, T, H] (residual stream) -> [B, T, H]; `embeds` [B, T, H] only for the EAGLE-3 variant."""
        if path_for(self.invariant) is KernelPath.INVARIANT:
            return self._forward_invariant(x, positions, inv_freq, batch, kv, embeds)
        if self.hidden_norm is not None:
            a = torch.cat([self.input_layernorm(embeds), self.hidden_norm(x)], dim=-1)  # [B, T, 2H]
        elif self.input_layernorm is not None:
            a = self.input_layernorm(x)  # [B, T, H]
        else:
            a = x
        h = self.self_attn(a, positions, inv_freq, batch, kv)  # [B, T, H]
        h, residual = self.post_attention_layernorm(h, x)  # [B, T, H] each; residual = x + attn
        return self.mlp(h) + residual  # [B, T, H]

    def _forward_invariant(self, x, positions, inv_freq, batch, kv, embeds) -> torch.Tensor:
        """The target block's invariant kernels (`TransformerBlock._forward_invariant`): four projection launches,
        each norm inside the projection after it, around the invariant tree attention; with embeds (EAGLE-3) the
        qkv projection's input is cat(norm(embeds), hidden_norm(x)). x [B, T, H], the caller's, is left as it is:
        the residual add of o_proj writes a new stream. -> [B, T, H]."""
        attn, mlp = self.self_attn, self.mlp
        B, T, H = x.shape
        x2d = x.reshape(B * T, H)  # [B*T, H]

        def weight(norm: RMSNorm | None):
            return None if norm is None else proj.FOLDED if self.norms_folded else norm.weight

        if self.hidden_norm is not None:
            o = attn.forward_stream(x2d, weight(self.input_layernorm), positions, inv_freq, batch, kv, B,
                                    embeds2d=embeds.reshape(B * T, -1),
                                    norm_weight2=weight(self.hidden_norm))  # [B*T, Hq*D]
        else:
            o = attn.forward_stream(x2d, weight(self.input_layernorm), positions, inv_freq, batch, kv,
                                    B)  # [B*T, Hq*D]
        h = proj.linear_add(x2d, o, attn.o_proj.weight, attn.o_proj.bias)  # [B*T, H] the new stream
        a = proj.gate_up_silu(h, weight(self.post_attention_layernorm), mlp.gate_up_proj.weight,
                              mlp.norm_eps)  # [B*T, I]
        proj.linear_add_(h, a, mlp.down_proj.weight)
        return h.view(B, T, H)

    def forward_dense(self, x, positions, inv_freq, mask, cache: DenseKV | None = None, embeds=None) -> torch.Tensor:
        """`forward` with dense attention over `mask` and the kernels' differentiable torch references."""
        def norm(m: RMSNorm, t):
            return rmsnorm_ref(t, m.weight, m.eps)

        if self.hidden_norm is not None:
            a = torch.cat([norm(self.input_layernorm, embeds), norm(self.hidden_norm, x)], dim=-1)  # [B, T, 2H]
        elif self.input_layernorm is not None:
            a = norm(self.input_layernorm, x)  # [B, T, H]
        else:
            a = x
        h = attention_dense(self.self_attn, a, positions, inv_freq, mask, cache)  # [B, T, H]
        post = self.post_attention_layernorm
        h, residual = rmsnorm_ref(h, post.weight, post.eps, residual=x)  # [B, T, H] each
        return self.mlp.down_proj(silu_and_mul_ref(self.mlp.gate_up_proj(h))) + residual  # [B, T, H]


class FcLayer(DraftLayer):
    """One multi-layer step: its own fc over cat(embed, feature), then an EAGLE-1 layer-0 decoder layer."""

    def __init__(self, args: ModelArgs, kv_layer: int, bias: bool):
        super().__init__(args, kv_layer, input_norm=False)
        self.fc = nn.Linear(2 * args.dim, args.dim, bias=bias)

    def forward(self, embed_feature, positions, inv_freq, batch, kv) -> torch.Tensor:
        """embed_feature [B, T, 2H] = cat(embed, feature) -> [B, T, H]."""
        x = draft_linear(self.fc, self.invariant, embed_feature)  # [B, T, H]
        return super().forward(x, positions, inv_freq, batch, kv)

    def forward_dense(self, embed_feature, positions, inv_freq, mask, cache: DenseKV | None = None) -> torch.Tensor:
        """`forward` with dense attention (DraftLayer.forward_dense). embed_feature [B, T, 2H] -> [B, T, H]."""
        return super().forward_dense(self.fc(embed_feature), positions, inv_freq, mask, cache)
