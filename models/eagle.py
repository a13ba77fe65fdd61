"""EAGLE draft heads over the target's building blocks: EAGLE-1, EAGLE-3 and multi-layer.

Alignment (every head, as in EAGLE's cnets.py and SGLang): the draft input at position p is the pair
(feature at p, token at p+1); the output hidden state at p predicts the target's feature at p+1, and the
logits at p predict the token at p+2. Draft KV positions equal target positions, so the head's KV pool
is indexed exactly like the target's.

- `Eagle1Head` (EAGLE / EAGLE-2): fc over cat(embed(token), feature) (embedding first), one Llama decoder
  layer whose input RMSNorm is skipped (EAGLE's `if self.index != 0`), no final norm; logits through the
  target's frozen lm_head. Feature = the target's final-normed hidden state.
- `Eagle3Head`: fc over cat(low, mid, high) target features (3*H_target -> H, applied only to target
  features: on draft steps the hidden input is the head's own H-wide output), one "midlayer" whose
  attention sees cat(input_layernorm(embed), hidden_norm(hidden)) (q/k/v take 2H) with the fc output as
  residual, a final norm and its own lm_head over a reduced draft vocabulary (`d2t`: target = i + d2t[i]).
- `MultiLayerHead` (eaglet's): S EAGLE-1 layers, each with its own fc and KV layer; draft step i runs
  layer min(i, S-1); the extend runs every layer on the accepted (feature, token) pairs.

The embedding (and for EAGLE-1 / multi-layer the lm_head) is the target's, shared and frozen: the head
keeps a plain reference to the target, so `head.parameters()`, `head.state_dict()` and `head.to()` only
touch the head's own weights.

Checkpoints: the public layouts, matched against SafeAILab/EAGLE `eagle/model/cnets1.py` (EAGLE-1) and
`cnets.py` (EAGLE-3), SGLang `python/sglang/srt/models/llama_eagle.py` / `llama_eagle3.py` and SpecForge
`specforge/modeling/draft/llama3_eagle.py`. Tensor names are the public ones with q/k/v and gate/up
split (eaglet fuses them into `qkv_proj` / `gate_up_proj` in memory, as the target does):

    EAGLE-1      fc.{weight,bias}, layers.{i}.self_attn.{q,k,v,o}_proj.weight,
                 layers.{i}.mlp.{gate,up,down}_proj.weight, layers.{i}.post_attention_layernorm.weight,
                 layers.{i>0}.input_layernorm.weight (+ embed_tokens.weight)
    EAGLE-3      fc.weight, midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight,
                 midlayer.self_attn.{q,k,v,o}_proj.weight, midlayer.mlp.{gate,up,down}_proj.weight, norm.weight,
                 lm_head.weight, d2t [draft_vocab] int64, t2d [vocab] bool (+ embed_tokens.weight)
    multi-layer  layers.{i}.fc.{weight,bias}, layers.{i}.self_attn..., layers.{i}.mlp...,
                 layers.{i}.post_attention_layernorm.weight

Loading reads config.json plus safetensors or `pytorch_model.bin` (public EAGLE files; only ever through
`torch.load(..., weights_only=True)`); saving writes config.json + model.safetensors.

Training (`eaglet.training`) runs `forward_dense`: the same weights and math with attention computed densely
(SDPA over a given boolean mask, K/V of earlier calls kept in a `DenseKV` with their autograd history) and the
kernels' torch references, because the inference path writes K/V into the paged pool (no gradient reaches
k/v) and its Triton kernels have no backward.
"""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from eaglet.kernels.activation import silu_and_mul_ref
from eaglet.kernels.folded_linear import MAX_M as FOLDED_MAX_M
from eaglet.kernels.rmsnorm import rmsnorm_ref
from eaglet.kernels.rope import rotate_half
from eaglet.kernels.tree_attention import SUPPORTED_HEAD_DIMS
from eaglet.models.checkpoint import (
    SUPPORTED_ARCHITECTURES,
    CheckpointError,
    CheckpointNotFoundError,
    _rope_from_config,
    _safetensors_files,
    save_hf_checkpoint,
)
from eaglet.models.kv_cache import ForwardBatch, KVCache
from eaglet.models.llama import Attention, FeedForward, ModelArgs, RMSNorm, Transformer, rope_inv_freq

ARCH_EAGLE1 = "LlamaForCausalLMEagle"  # SGLang's name; EAGLE's own configs say LlamaForCausalLM
ARCH_EAGLE3 = "LlamaForCausalLMEagle3"
ARCH_MULTI_LAYER = "EagletMultiLayerEagle"
KINDS = ("eagle1", "eagle3", "multi_layer")


# ----------------------------------------------------------------------------------------------------
# Config and tensor-name plumbing


def _normalise_head_config(raw: dict, source) -> dict:
    """A copy of a draft head's config.json with the keys the layers need (LlamaConfig defaults)."""
    required = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
    absent = [k for k in required if raw.get(k) is None]
    if absent:
        raise CheckpointError(f"{source}: draft head config lacks {absent}; is it a complete EAGLE config.json?")
    if raw.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{source}: hidden_act={raw['hidden_act']!r}; eaglet's draft layers are SwiGLU (silu)")
    if raw.get("mlp_bias"):
        raise CheckpointError(f"{source}: mlp_bias=True draft heads are not supported")
    cfg = dict(raw)
    n_heads = cfg["num_attention_heads"]
    cfg["num_key_value_heads"] = cfg.get("num_key_value_heads") or n_heads
    cfg["head_dim"] = cfg.get("head_dim") or cfg["hidden_size"] // n_heads
    cfg["rms_norm_eps"] = cfg.get("rms_norm_eps") or 1e-6
    # A head has its own RoPE: public EAGLE-3 configs often omit rope_theta (LlamaConfig's 10000 then),
    # whatever the target uses. Draft positions equal target positions, the frequencies need not.
    cfg["rope_theta"], cfg["rope_scaling"] = _rope_from_config(cfg)
    cfg.pop("rope_parameters", None)  # folded into rope_theta/rope_scaling above
    cfg["max_position_embeddings"] = cfg.get("max_position_embeddings") or 2048
    cfg["attention_bias"] = bool(cfg.get("attention_bias", False))
    return cfg


def _draft_args(cfg: dict) -> ModelArgs:
    """ModelArgs of the draft decoder layer(s) (a Llama layer) from a normalised head config."""
    return ModelArgs(
        family="llama", vocab_size=cfg["vocab_size"], dim=cfg["hidden_size"], n_layers=cfg["num_hidden_layers"],
        n_heads=cfg["num_attention_heads"], n_kv_heads=cfg["num_key_value_heads"], head_dim=cfg["head_dim"],
        intermediate_size=cfg["intermediate_size"], norm_eps=cfg["rms_norm_eps"], rope_theta=cfg["rope_theta"],
        rope_scaling=cfg["rope_scaling"], max_seq_len=cfg["max_position_embeddings"],
        attention_bias=cfg["attention_bias"],
    )


_SPLIT = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
_PUBLIC_PART = re.compile(r"(.*)\.(q_proj|gate_proj)\.(weight|bias)")


def fuse_public_names(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Public names -> eaglet's, under any prefix: `*.{q,k,v}_proj.*` -> `*.qkv_proj.*`, `*.{gate,up}_proj.*`
    -> `*.gate_up_proj.*` (only where every part is present; the rest is left for the missing-tensor check)."""
    out = dict(sd)
    for name in list(sd):
        m = _PUBLIC_PART.fullmatch(name)
        if m is None:
            continue
        fused = "qkv_proj" if m[2] == "q_proj" else "gate_up_proj"
        parts = [f"{m[1]}.{p}.{m[3]}" for p in _SPLIT[fused]]
        if all(p in out for p in parts):
            out[f"{m[1]}.{fused}.{m[3]}"] = torch.cat([out.pop(p) for p in parts])
    return out


def split_fused_names(sd: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    """eaglet names -> public ones: the inverse of `fuse_public_names` for layers shaped by `args`."""
    qkv = [args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim, args.n_kv_heads * args.head_dim]
    out = {}
    for name, t in sd.items():
        for fused, parts in _SPLIT.items():
            if f".{fused}." in name:
                pieces = t.split(qkv) if fused == "qkv_proj" else t.chunk(2)
                out.update({name.replace(fused, p): x for p, x in zip(parts, pieces)})
                break
        else:
            out[name] = t
    return out


# ----------------------------------------------------------------------------------------------------
# Layers


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


# SDPA backends of the causal step-0 attention, cuDNN left out: it builds an execution plan per new shape, and
# training batches come in every length; an H200 profile of EAGLE-3 training spent 50 ms of host time per
# cuDNN call there (5x the step's device time), flash attention needs no plan
_CAUSAL_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def _ttt_attention(q: torch.Tensor, ks: list[torch.Tensor], vs: list[torch.Tensor], scale: float) -> torch.Tensor:
    """TTTPattern attention: causal over ks[0] (the step-0 keys), each query's own position in ks[1:] (the steps
    it attends). q [B, Hq, T, D]; ks, vs: keys/values [B, Hkv, T, D] each (Hq = G * Hkv, query head h reads KV
    head h // G) -> [B, Hq, T, D]. The unrolled steps' keys are stacked, not looped over, and the KV heads are
    not repeated: the op count is the same at every step (the training step is host-bound on its ops)."""
    B, Hq, T, D = q.shape
    Hkv = ks[0].shape[1]
    G = Hq // Hkv
    if len(ks) == 1:
        k0, v0 = (t.repeat_interleave(G, dim=1) for t in (ks[0], vs[0]))  # [B, Hq, T, D] each
        with sdpa_kernel(_CAUSAL_BACKENDS):
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


def _attention_dense(attn: Attention, a, positions, inv_freq, mask, cache: DenseKV | None) -> torch.Tensor:
    """`Attention.forward` without the pool: rotate-half RoPE in fp32 as `rope_qkv_store_ref`, then SDPA of the
    T queries over the cached keys plus their own. a [B, T, in], mask [T, L] or [B, T, L] bool -> [B, T, H]."""
    if attn.q_norm is not None:
        raise ValueError("dense attention has no q/k norm (draft layers are Llama layers)")
    B, T, _ = a.shape
    Hq, Hkv, D = attn.n_heads, attn.n_kv_heads, attn.head_dim
    q, k, v = attn.qkv_proj(a).split([Hq * D, Hkv * D, Hkv * D], dim=-1)  # [B, T, Hq*D], [B, T, Hkv*D] x2
    freqs = positions.float()[..., None] * inv_freq  # [B, T, D/2]
    emb = torch.cat([freqs, freqs], dim=-1)[:, :, None, :]  # [B, T, 1, D]
    cos, sin = emb.cos(), emb.sin()

    def rope(x, heads):  # [B, T, heads*D] -> [B, heads, T, D], rotated in fp32 and rounded once
        xf = x.reshape(B, T, heads, D).float()
        return (xf * cos + rotate_half(xf) * sin).to(x.dtype).transpose(1, 2)

    q, k = rope(q, Hq), rope(k, Hkv)  # [B, Hq, T, D], [B, Hkv, T, D]
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
        o = _ttt_attention(q, ks, vs, D**-0.5)  # [B, Hq, T, D]
    else:
        m = mask if mask.dim() == 2 else mask[:, None]  # [T, L] or [B, 1, T, L]
        o = F.scaled_dot_product_attention(q, heads(torch.cat(ks, 2)), heads(torch.cat(vs, 2)), attn_mask=m)
    return attn.o_proj(o.transpose(1, 2).reshape(B, T, Hq * D))


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

    def fold_norm_weights(self) -> bool:
        """Fold the norm weights into the projections after them, in place (as `Transformer.fold_norm_weights`):
        input_layernorm (and hidden_norm, EAGLE-3) into qkv_proj's columns, post_attention_layernorm into
        gate_up_proj; the norms' weights become 1, so every path computes the same function. Up to 16 rows the
        layer then runs kernels/folded_linear.py's 4 fused launches and no norm kernel (an EAGLE-3 draft step:
        9 fewer launches). A layer without an input norm (EAGLE-1 layer 0, whose qkv reads x unscaled) is left as
        it is. Returns whether the layer folded."""
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
        if self.norms_folded and x.numel() <= FOLDED_MAX_M * x.shape[-1]:
            # x + attention as a new tensor (x, the caller's, is left as it is), then the MLP adds into it. Above
            # FOLDED_MAX_M rows the plain path below runs (unit norm weights: the same function).
            h = self.self_attn(x, positions, inv_freq, batch, kv, folded=True, in_place=False,
                               embeds=embeds if self.hidden_norm is not None else None)  # [B, T, H]
            return self.mlp(h, folded=True)  # [B, T, H]
        if self.hidden_norm is not None:
            a = torch.cat([self.input_layernorm(embeds), self.hidden_norm(x)], dim=-1)  # [B, T, 2H]
        elif self.input_layernorm is not None:
            a = self.input_layernorm(x)  # [B, T, H]
        else:
            a = x
        h = self.self_attn(a, positions, inv_freq, batch, kv)  # [B, T, H]
        h, residual = self.post_attention_layernorm(h, x)  # [B, T, H] each; residual = x + attn
        return self.mlp(h) + residual  # [B, T, H]

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
        h = _attention_dense(self.self_attn, a, positions, inv_freq, mask, cache)  # [B, T, H]
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
        return super().forward(self.fc(embed_feature), positions, inv_freq, batch, kv)

    def forward_dense(self, embed_feature, positions, inv_freq, mask, cache: DenseKV | None = None) -> torch.Tensor:
        """`forward` with dense attention (DraftLayer.forward_dense). embed_feature [B, T, 2H] -> [B, T, H]."""
        return super().forward_dense(self.fc(embed_feature), positions, inv_freq, mask, cache)


# ----------------------------------------------------------------------------------------------------
# Heads


class DraftHead(nn.Module):
    """Common API of the draft heads (see the module docstring for the three kinds)."""

    KIND: str
    ARCHITECTURE: str
    FC_BIAS: bool  # default of config["bias"] (EAGLE: fc has a bias unless the config says otherwise)
    # Whether a draft step's KV layer holds the tokens drafted at earlier steps (their ancestors):
    # true when one layer runs every step; the engine's draft mask follows it.
    DRAFT_ANCESTORS_CACHED = True

    def __init__(self, config: dict, target: Transformer):
        """`config`: a normalised HF-style config dict (see `new_draft_head` / `from_pretrained`)."""
        super().__init__()
        self.config = config
        self.args = _draft_args(config)
        # A plain attribute, not a submodule: the shared embedding / lm_head stay the target's.
        object.__setattr__(self, "target", target)
        t = target.args
        if self.args.head_dim not in SUPPORTED_HEAD_DIMS:
            raise ValueError(f"draft head head_dim={self.args.head_dim} (hidden_size {self.args.dim} / "
                             f"{self.args.n_heads} heads) is not supported by the attention kernel "
                             f"(head_dim in {SUPPORTED_HEAD_DIMS}); choose num_attention_heads accordingly")
        if self.args.vocab_size != t.vocab_size:
            raise ValueError(f"draft head vocab_size={self.args.vocab_size} but the target's vocabulary has "
                             f"{t.vocab_size} tokens: the head was trained for another tokenizer; load the target "
                             f"it was trained for, or train a head for this target")
        try:  # A plain attribute like the target's: `head.to(bfloat16)` must not round the RoPE frequencies.
            self._inv_freq = rope_inv_freq(self.args).float()  # [D/2]
        except ValueError as e:
            raise ValueError(f"draft head RoPE: {e}") from None
        self.embed_tokens: nn.Embedding | None = None  # own embedding only when it cannot be the target's

    # ---- properties ---------------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def hidden_size(self) -> int:
        """H: width of hidden_out (and of the hidden input on draft steps)."""
        return self.args.dim

    @property
    def feature_size(self) -> int:
        """F: width of the target features the extend takes (H_target, or 3*H_target for EAGLE-3)."""
        return self.feature_widths[0]

    @property
    def num_kv_layers(self) -> int:
        return self.args.n_layers

    @property
    def draft_vocab_size(self) -> int:
        return self.target.args.vocab_size

    @property
    def feature_widths(self) -> tuple[int, ...]:
        """Accepted widths of the `hidden` input."""
        return (self.args.dim,)

    # ---- what the engine needs besides forward -------------------------------------------------
    def capture_layers(self, target_n_layers: int) -> tuple[int, ...]:
        """Target layers whose output residual streams the head consumes (`Transformer.forward`'s
        `capture_layers`); () = only the final-normed hidden state."""
        return ()

    def target_feature(self, final_hidden: torch.Tensor, captured: list[torch.Tensor]) -> torch.Tensor:
        """The head's `hidden` input from a target forward: (final-normed hidden, captured) -> [B, T, F]."""
        return final_hidden

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> target ids (identity unless the head has a reduced vocabulary)."""
        d2t = self.d2t_offsets
        return draft_ids if d2t is None else draft_ids + d2t[draft_ids]

    @property
    def d2t_offsets(self) -> torch.Tensor | None:
        """[draft_vocab] int64 with target id = draft id + d2t_offsets[draft id], or None: the same ids."""
        return None

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, T] -> [B, T, H] in the head's dtype."""
        table = self.embed_tokens if self.embed_tokens is not None else self.target.model.embed_tokens
        return table(tokens).to(self.dtype)

    def kv_cache(self, max_reqs: int, max_context: int, page_size: int = 16, num_pages: int | None = None,
                 dtype: torch.dtype | None = None, device=None) -> KVCache:
        """A paged KV pool with `num_kv_layers` layers shaped for this head."""
        return KVCache(self.num_kv_layers, self.args.n_kv_heads, self.args.head_dim, max_reqs=max_reqs,
                       max_context=max_context, page_size=page_size, num_pages=num_pages,
                       dtype=dtype or self.dtype, device=device if device is not None else self.device)

    def fold_norm_weights(self) -> "DraftHead":
        """Fold the norm weights of every layer with an input norm into its projections, in place
        (`DraftLayer.fold_norm_weights`; serving only: `fold_norms=true` folds the target and the head). The final
        norm before the LM head stays: the logits need their rows' scale."""
        for m in self.modules():
            if isinstance(m, DraftLayer):
                m.fold_norm_weights()
        return self

    # ---- forward ------------------------------------------------------------------------------
    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch,
                kv: KVCache, step: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens [B, T] (token at p+1), hidden [B, T, F] (feature at p), positions [B, T] (= p) ->
        (hidden_out [B, T, H], logits [B, T, draft_vocab] fp32).

        step=None: draft-extend over target features (every layer of a multi-layer head writes its KV); its
        output is the step-0 distribution (depth-1 candidates). step=i >= 1: the draft step that consumes the
        depth-i tokens (hidden = step i-1's hidden_out) and gives the depth-(i+1) distribution; a multi-layer
        head runs layer min(i, S-1) only, single-layer heads ignore `step`."""
        self._check_inputs(tokens, hidden, positions)
        if step is not None and step < 0:
            raise ValueError(f"step={step} must be None (extend) or >= 0")
        return self._forward(tokens, hidden.to(self.dtype), positions, batch, kv, step)

    def forward_dense(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                      attn_mask: torch.Tensor | TTTPattern, cache: DenseKV | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """The training forward: `forward`'s inputs and outputs, attention computed densely over `attn_mask`
        [T, L] or [B, T, L] bool (True = attend; the first L-T columns are the keys already in `cache`, the last
        T this call's own) or the training-time test's pattern (`TTTPattern`), no KV pool, differentiable on
        every device. With `cache`, this call's K/V are appended to it for the next call (the unrolled
        training-time test). Equals `forward` on the same pattern."""
        self._check_inputs(tokens, hidden, positions)
        if isinstance(attn_mask, TTTPattern):
            if attn_mask.ancestors != self.DRAFT_ANCESTORS_CACHED:  # else training and the engine's draft differ
                raise ValueError(f"{attn_mask} but a {self.KIND} head's draft steps "
                                 f"{'see' if self.DRAFT_ANCESTORS_CACHED else 'do not see'} their ancestors: pass "
                                 f"TTTPattern(step, ancestors=head.DRAFT_ANCESTORS_CACHED)")
            return self._forward_dense(tokens, hidden.to(self.dtype), positions, attn_mask, cache)
        if attn_mask.dtype != torch.bool or attn_mask.shape[-2] != tokens.shape[1]:
            raise ValueError(f"attn_mask must be bool [T, L] or [B, T, L] with T={tokens.shape[1]}, got "
                             f"{attn_mask.dtype} {tuple(attn_mask.shape)}")
        return self._forward_dense(tokens, hidden.to(self.dtype), positions, attn_mask, cache)

    def _forward_dense(self, tokens, hidden, positions, attn_mask, cache):
        raise NotImplementedError

    def _check_inputs(self, tokens, hidden, positions) -> None:
        if tokens.dim() != 2 or positions.shape != tokens.shape:
            raise ValueError(f"tokens and positions must both be [B, T], got {tuple(tokens.shape)} and "
                             f"{tuple(positions.shape)}")
        if hidden.shape[:-1] != tokens.shape or hidden.shape[-1] not in self.feature_widths:
            raise ValueError(f"hidden must be [B, T, F] = [{tokens.shape[0]}, {tokens.shape[1]}, F] with F in "
                             f"{self.feature_widths} for a {self.KIND} head, got {tuple(hidden.shape)}; pass "
                             f"head.target_feature(...) of the target forward, or the head's own hidden_out")
        if self._inv_freq.device != positions.device:
            self._inv_freq = self._inv_freq.to(positions.device)

    def _forward(self, tokens, hidden, positions, batch, kv, step):
        raise NotImplementedError

    def target_logits(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, H] -> fp32 logits [B, T, V] through the target's frozen lm_head."""
        return self.target.logits(x.to(self.target.dtype))

    # ---- checkpoints --------------------------------------------------------------------------
    def hf_config(self, dtype: torch.dtype | None = None) -> dict:
        """The config.json this head is saved with (its loaded config, refreshed from the head)."""
        a = self.args
        cfg = dict(self.config)
        cfg.update(
            architectures=[self.ARCHITECTURE], model_type="llama", hidden_size=a.dim,
            intermediate_size=a.intermediate_size, num_hidden_layers=a.n_layers, num_attention_heads=a.n_heads,
            num_key_value_heads=a.n_kv_heads, head_dim=a.head_dim, hidden_act="silu", rms_norm_eps=a.norm_eps,
            rope_theta=a.rope_theta, rope_scaling=a.rope_scaling, max_position_embeddings=a.max_seq_len,
            vocab_size=a.vocab_size, attention_bias=a.attention_bias, bias=self.config["bias"],
            # tied heads would make save_hf_checkpoint drop lm_head.weight; no head ties its own
            tie_word_embeddings=False, torch_dtype=str(dtype or self.dtype).removeprefix("torch."),
        )
        return cfg

    def public_state_dict(self, dtype: torch.dtype | None = None, include_embedding: bool = False) -> dict:
        """The head's weights under the public names (q/k/v, gate/up split), floats cast to `dtype`;
        `include_embedding` adds the (shared) `embed_tokens.weight`, as public EAGLE-1 files carry it."""
        sd = split_fused_names({k: v.detach() for k, v in self.state_dict().items()}, self.args)
        if include_embedding and "embed_tokens.weight" not in sd:
            sd["embed_tokens.weight"] = self.target.model.embed_tokens.weight.detach()
        return {k: v.to(dtype) if dtype is not None and v.is_floating_point() else v for k, v in sd.items()}

    def save_pretrained(self, directory: str | Path, dtype: torch.dtype | None = None,
                        include_embedding: bool | None = None) -> Path:
        """Write config.json + model.safetensors in the public layout (dtype: the head's by default).
        include_embedding defaults to True for EAGLE-1 (EAGLE's loader wants `embed_tokens.weight`)."""
        if include_embedding is None:
            include_embedding = self.KIND == "eagle1"
        dtype = dtype or self.dtype  # the shared embedding too, whatever the target's dtype
        sd = self.public_state_dict(dtype, include_embedding)
        return save_hf_checkpoint(directory, self.hf_config(dtype), sd)

    @classmethod
    def from_pretrained(cls, path: str | Path, target: Transformer, dtype: torch.dtype | None = None,
                        device=None) -> "DraftHead":
        """Load a head directory (config.json + safetensors or pytorch_model.bin) for `target`; dtype and
        device default to the target's. On `DraftHead` itself, dispatches on the config (= load_draft_head)."""
        raw, sd, source = _read_head_dir(path)
        head_cls = head_class(raw, source)
        if cls is not DraftHead and head_cls is not cls:
            raise ValueError(f"{source} holds a draft head of kind {head_cls.KIND!r} ({head_cls.__name__}), not "
                             f"{cls.KIND!r}; use eaglet.models.eagle.load_draft_head to load whatever it holds")
        return head_cls._from_state_dict(raw, sd, target, dtype or target.dtype,
                                         device if device is not None else target.device, source)

    @classmethod
    def _config_from(cls, raw: dict, sd: dict, source) -> dict:
        cfg = _normalise_head_config(raw, source)
        cfg["bias"] = bool(raw.get("bias", cls.FC_BIAS))
        return cfg

    def _optional_tensors(self) -> set[str]:
        return set()

    def _check_tensors(self, sd: dict, source) -> None:
        """Head-specific checks of the loaded tensors against the target (before the generic name/shape check)."""

    def _check_embedding(self, weight: torch.Tensor, source) -> None:
        """A checkpoint's copy of the shared embedding: its shape must be the target's; values are not used
        (the target's are), but a different table means the head was trained for another target."""
        tw = self.target.model.embed_tokens.weight
        if tuple(weight.shape) != tuple(tw.shape):
            raise ValueError(f"{source}: embed_tokens.weight is {list(weight.shape)} but the target's embedding is "
                             f"{list(tw.shape)} ([vocab, hidden]): the head was trained for another target; load "
                             f"the target it was trained for")
        rows = torch.linspace(0, tw.shape[0] - 1, 64).long()  # [64] sampled rows: cheap on a 128k vocabulary
        ours = tw.detach()[rows.to(tw.device)].float().cpu()  # [64, H]
        if not torch.allclose(weight[rows].float(), ours, rtol=2e-2, atol=1e-3):  # bf16/fp16 copies of one table
            warnings.warn(f"{source}: embed_tokens.weight differs from the target's embedding beyond bf16/fp16 "
                          f"rounding (the head keeps using the target's): it was trained for another (or a "
                          f"differently quantised) target with the same vocabulary; expect lower acceptance",
                          stacklevel=3)

    @classmethod
    def _from_state_dict(cls, raw, sd, target, dtype, device, source) -> "DraftHead":
        config = cls._config_from(raw, sd, source)
        with torch.device("meta"):
            head = cls(config, target)
        sd = {k: v for k, v in sd.items() if not k.endswith("rotary_emb.inv_freq")}  # derived from the config
        expected = {k: tuple(v.shape) for k, v in head.public_state_dict().items()}
        if "embed_tokens.weight" in sd and "embed_tokens.weight" not in expected:
            head._check_embedding(sd.pop("embed_tokens.weight"), source)
        head._check_tensors(sd, source)
        optional = head._optional_tensors()
        missing = [k for k in expected if k not in sd and k not in optional]
        if missing:
            raise CheckpointError(f"{source}: {len(missing)} of {len(expected)} tensors of a {cls.KIND} head with "
                                  f"this config are missing, e.g. {missing[:4]}; the file is incomplete or "
                                  f"config.json does not belong to these weights")
        wrong = [f"{k} {list(sd[k].shape)} != {list(s)}" for k, s in expected.items()
                 if k in sd and tuple(sd[k].shape) != s]
        if wrong:
            raise CheckpointError(f"{source}: tensor shapes disagree with config.json (hidden_size, heads, head_dim, "
                                  f"intermediate_size, vocab sizes): {wrong[:4]}")
        extra = [k for k in sd if k not in expected]
        if extra:
            warnings.warn(f"{source}: ignoring {len(extra)} tensors a {cls.KIND} head does not use, e.g. {extra[:4]}",
                          stacklevel=3)
        head = head.to(dtype).to_empty(device=device)
        result = head.load_state_dict(fuse_public_names({k: v for k, v in sd.items() if k in expected}), strict=False)
        unloaded = set(result.missing_keys) - optional
        if unloaded:  # the name mapping and the checks above disagree: a bug here, not in the file
            raise RuntimeError(f"{source}: internal error, {sorted(unloaded)[:4]} were not loaded")
        head._fill_optional({k for k in optional if k not in sd})
        return head.eval()

    def _fill_optional(self, absent: set[str]) -> None:
        """Initialise optional tensors the checkpoint did not carry."""


class Eagle1Head(DraftHead):
    """EAGLE-1: fc over cat(embed, feature), decoder layer(s) (layer 0 without input norm), target lm_head.
    Public heads have one layer; EAGLE's code stacks `num_hidden_layers` of them, all run every step."""

    KIND, ARCHITECTURE, FC_BIAS = "eagle1", ARCH_EAGLE1, True

    def __init__(self, config: dict, target: Transformer):
        super().__init__(config, target)
        if self.args.dim != target.args.dim:
            raise ValueError(f"EAGLE-1 head hidden_size={self.args.dim} but the target's hidden size is "
                             f"{target.args.dim}: its features are the target's hidden states, so the head must be "
                             f"trained for this target")
        H = self.args.dim
        self.fc = nn.Linear(2 * H, H, bias=config["bias"])
        self.layers = nn.ModuleList(DraftLayer(self.args, i, input_norm=i > 0) for i in range(self.args.n_layers))

    def _forward(self, tokens, hidden, positions, batch, kv, step):
        x = self.fc(torch.cat([self.embed(tokens), hidden], dim=-1))  # [B, T, H]
        for layer in self.layers:
            x = layer(x, positions, self._inv_freq, batch, kv)  # [B, T, H]
        return x, self.target_logits(x)

    def _forward_dense(self, tokens, hidden, positions, attn_mask, cache):
        x = self.fc(torch.cat([self.embed(tokens), hidden], dim=-1))  # [B, T, H]
        for layer in self.layers:
            x = layer.forward_dense(x, positions, self._inv_freq, attn_mask, cache)  # [B, T, H]
        return x, self.target_logits(x)


class MultiLayerHead(DraftHead):
    """S EAGLE-1 layers, one per draft step (step i -> layer min(i, S-1)), each with its own fc and KV layer.

    Layer i's KV holds the accepted sequence (every extend writes all layers) plus what layer i itself wrote;
    tokens drafted at other steps are cached in other layers, so a draft step's attention must cover the
    accepted prefix and the step's own tokens only (not ancestors drafted by another layer).

    Training (`forward_dense`): a bool mask or `TTTPattern(0)` is the extend (every layer runs and caches its
    keys in the DenseKV, the output is layer 0's); `TTTPattern(k >= 1, ancestors=False)` is draft step k (layer
    min(k, S-1) over that layer's step-0 keys and its own)."""

    KIND, ARCHITECTURE, FC_BIAS = "multi_layer", ARCH_MULTI_LAYER, True
    DRAFT_ANCESTORS_CACHED = False

    def __init__(self, config: dict, target: Transformer):
        super().__init__(config, target)
        if self.args.dim != target.args.dim:
            raise ValueError(f"multi-layer head hidden_size={self.args.dim} but the target's hidden size is "
                             f"{target.args.dim}: the head must be trained for this target")
        self.layers = nn.ModuleList(FcLayer(self.args, i, config["bias"]) for i in range(self.args.n_layers))

    def _forward(self, tokens, hidden, positions, batch, kv, step):
        return self._run_layers(tokens, hidden, step,
                                lambda layer, pair: layer(pair, positions, self._inv_freq, batch, kv))

    def _forward_dense(self, tokens, hidden, positions, attn_mask, cache):
        # unrolled step 0 is the extend (over the target's features), as the engine's draft-extend
        step = attn_mask.step if isinstance(attn_mask, TTTPattern) and attn_mask.step > 0 else None
        return self._run_layers(tokens, hidden, step, lambda layer, pair: layer.forward_dense(
            pair, positions, self._inv_freq, attn_mask, cache))

    def _run_layers(self, tokens, hidden, step, run_layer):
        """Run the layers of `step` (None = extend) as run_layer(layer, pair [B, T, 2H]) -> [B, T, H]
        -> (hidden_out [B, T, H], logits [B, T, V]) of layer 0 (extend) or of the step's layer."""
        pair = torch.cat([self.embed(tokens), hidden], dim=-1)  # [B, T, 2H]
        # Extend: every layer caches the accepted sequence for its own later steps; the output is layer 0's,
        # the step-0 prediction (the one made from the target's own features).
        run = range(len(self.layers)) if step is None else (min(step, len(self.layers) - 1),)
        outs = [run_layer(self.layers[i], pair) for i in run]  # [B, T, H] each
        return outs[0], self.target_logits(outs[0])


class Eagle3Head(DraftHead):
    """EAGLE-3: fc over three target features, a midlayer over [embed, hidden], own norm + reduced-vocab lm_head."""

    KIND, ARCHITECTURE, FC_BIAS = "eagle3", ARCH_EAGLE3, False

    def __init__(self, config: dict, target: Transformer):
        super().__init__(config, target)
        a, t = self.args, target.args
        if a.n_layers != 1:
            raise ValueError(f"EAGLE-3 heads with num_hidden_layers={a.n_layers} are not supported (only the "
                             f"public one-midlayer design)")
        H, Ht = a.dim, config.get("target_hidden_size") or a.dim
        if Ht != t.dim:
            raise ValueError(f"EAGLE-3 head expects target features of width 3 x {Ht} (target_hidden_size, else "
                             f"hidden_size) but the target's hidden size is {t.dim}: the head was trained for "
                             f"another target; load the matching target or train a head for this one")
        Vd = config.get("draft_vocab_size") or t.vocab_size
        if not 0 < Vd <= t.vocab_size:
            raise ValueError(f"EAGLE-3 draft_vocab_size={Vd} must be in [1, {t.vocab_size}] (the target's vocabulary)")
        aux = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        self.aux_layer_ids = tuple(aux) if aux else None
        self.capture_layers(t.n_layers)  # validates the choice against this target now, not at the first forward
        self.fc = nn.Linear(3 * Ht, H, bias=config["bias"])
        self.midlayer = DraftLayer(a, 0, input_norm=True, hidden_norm=True)
        self.norm = RMSNorm(H, a.norm_eps)
        self.lm_head = nn.Linear(H, Vd, bias=False)
        if H != Ht:  # the target's embedding has the wrong width: the head brings its own (as SGLang does)
            self.embed_tokens = nn.Embedding(t.vocab_size, H)
        self.register_buffer("d2t", torch.zeros(Vd, dtype=torch.int64))  # target id = draft id + d2t[draft id]
        self.register_buffer("t2d", torch.arange(t.vocab_size) < Vd)  # [V] target id is in the draft vocabulary

    @property
    def draft_vocab_size(self) -> int:
        return self.lm_head.out_features

    @property
    def feature_widths(self) -> tuple[int, ...]:
        return (self.fc.in_features, self.args.dim)  # target features at extend, own output on draft steps

    def capture_layers(self, target_n_layers: int) -> tuple[int, ...]:
        """EAGLE-3 reads the residual stream at the INPUT of target layers [2, L//2, L-3] (EAGLE's / SGLang's
        default); eaglet's `capture_layers` returns layer OUTPUTS, and the input of layer i is the output of
        layer i-1, hence (1, L//2 - 1, L - 4). A config's `eagle_config.eagle_aux_hidden_state_layer_ids`
        (SpecForge; SGLang adds 1 to turn them into layer inputs) already counts outputs and is used as is."""
        L = target_n_layers
        ids = self.aux_layer_ids or (1, L // 2 - 1, L - 4)
        if len(ids) != 3 or not all(0 <= i < L for i in ids) or list(ids) != sorted(set(ids)):
            raise ValueError(f"EAGLE-3 head captures target layers {list(ids)} (outputs) but the target has {L} "
                             f"layers: they must be three increasing indices in [0, {L}); the default needs a "
                             f"target of >= 7 layers, else set eagle_config.eagle_aux_hidden_state_layer_ids")
        return tuple(ids)

    def target_feature(self, final_hidden, captured):
        if len(captured) != 3:
            raise ValueError(f"EAGLE-3 needs the 3 captured target layers (capture_layers="
                             f"head.capture_layers(L)), got {len(captured)}")
        return torch.cat(captured, dim=-1)  # [B, T, 3*Ht] low, mid, high

    @property
    def d2t_offsets(self) -> torch.Tensor:
        return self.d2t

    def set_draft_vocab(self, target_ids: torch.Tensor) -> None:
        """Make the draft vocabulary the given distinct target ids [draft_vocab] (sorted here, as EAGLE-3's
        and SpecForge's frequency-based maps are), e.g. the most frequent tokens of the training data."""
        ids = torch.unique(target_ids.long())  # [Vd] sorted
        if ids.numel() != self.draft_vocab_size or int(ids[0]) < 0 or int(ids[-1]) >= self.t2d.numel():
            raise ValueError(f"need {self.draft_vocab_size} distinct target ids in [0, {self.t2d.numel()}), got "
                             f"{ids.numel()} distinct in [{int(ids[0])}, {int(ids[-1])}]")
        self.d2t.copy_(ids - torch.arange(ids.numel(), device=ids.device))
        self.t2d.zero_()
        self.t2d[ids.to(self.t2d.device)] = True

    def with_draft_vocab(self, target_ids: torch.Tensor) -> "Eagle3Head":
        """A copy of this head over another draft vocabulary (the given distinct target ids), e.g. a trained
        8,192-token head grown to 32,768 tokens: every weight is copied except the LM head, whose rows carry
        over for the tokens in both vocabularies; the rows of tokens new to it keep a fresh head's init."""
        ids = torch.unique(target_ids.long())  # [Vd'] sorted
        with torch.device(self.device):
            twin = type(self)({**self.config, "draft_vocab_size": ids.numel()}, self.target)
        twin.to(self.lm_head.weight.dtype)
        own = {"lm_head.weight", "d2t", "t2d"}
        res = twin.load_state_dict({k: v for k, v in self.state_dict().items() if k not in own}, strict=False)
        assert set(res.missing_keys) == own and not res.unexpected_keys, res  # every other weight copied
        twin.set_draft_vocab(ids)
        old_draft = torch.full_like(self.t2d, -1, dtype=torch.long)  # [V] target id -> this head's draft id
        old_draft[self.to_target_ids(torch.arange(self.draft_vocab_size, device=self.d2t.device))] = torch.arange(
            self.draft_vocab_size, device=self.d2t.device)
        src = old_draft[ids.to(old_draft.device)]  # [Vd'] this head's draft id of each new draft id, or -1
        keep = src >= 0
        with torch.no_grad():
            twin.lm_head.weight[keep] = self.lm_head.weight[src[keep]]
        return twin.train(self.training)

    def _forward(self, tokens, hidden, positions, batch, kv, step):
        if hidden.shape[-1] == self.fc.in_features:  # target features: project; own output: already H-wide
            hidden = self.fc(hidden)  # [B, T, H]
        x = self.midlayer(hidden, positions, self._inv_freq, batch, kv, embeds=self.embed(tokens))  # [B, T, H]
        # x (pre-norm) is what the next draft step takes as hidden, as in EAGLE's topK_genrate and SGLang
        return x, self.lm_head(self.norm(x)).float()

    def _forward_dense(self, tokens, hidden, positions, attn_mask, cache):
        if hidden.shape[-1] == self.fc.in_features:
            hidden = self.fc(hidden)  # [B, T, H]
        x = self.midlayer.forward_dense(hidden, positions, self._inv_freq, attn_mask, cache,
                                        embeds=self.embed(tokens))  # [B, T, H]
        return x, self.lm_head(rmsnorm_ref(x, self.norm.weight, self.norm.eps)).float()

    def hf_config(self, dtype=None) -> dict:
        cfg = super().hf_config(dtype)
        cfg["draft_vocab_size"] = self.draft_vocab_size
        if self.fc.in_features != 3 * self.args.dim:
            cfg["target_hidden_size"] = self.fc.in_features // 3
        return cfg

    @classmethod
    def _config_from(cls, raw, sd, source):
        cfg = super()._config_from(raw, sd, source)
        # EAGLE's cnets.py never gives the EAGLE-3 fc a bias whatever `bias` says; the weights decide.
        cfg["bias"] = "fc.bias" in sd
        return cfg

    def _optional_tensors(self) -> set[str]:
        # A full-vocabulary head needs no map (EAGLE deletes d2t/t2d then).
        return {"d2t", "t2d"} if self.draft_vocab_size == self.target.args.vocab_size else set()

    def _fill_optional(self, absent):
        if absent:
            self.d2t.zero_()
            self.t2d.fill_(True)

    def _check_tensors(self, sd, source):
        V, Vd = self.target.args.vocab_size, self.draft_vocab_size
        t2d, d2t = sd.get("t2d"), sd.get("d2t")
        if t2d is not None and tuple(t2d.shape) != (V,):
            raise ValueError(f"{source}: t2d has {list(t2d.shape)} entries but the target's vocabulary has {V} "
                             f"tokens: the head was trained for another tokenizer; load the matching target")
        if d2t is None or t2d is None:
            if Vd < V:
                raise CheckpointError(f"{source}: a draft vocabulary of {Vd} < {V} tokens needs both d2t and t2d "
                                      f"to map draft ids to target ids; the file is incomplete")
            return
        if tuple(d2t.shape) != (Vd,):
            raise CheckpointError(f"{source}: d2t has {list(d2t.shape)} entries but draft_vocab_size is {Vd}; "
                                  f"config.json does not belong to these weights")
        ids = torch.arange(Vd) + d2t.long()  # [Vd] target id of each draft id
        if int(ids.min()) < 0 or int(ids.max()) >= V:
            raise ValueError(f"{source}: d2t maps draft ids to target ids in [{int(ids.min())}, {int(ids.max())}], "
                             f"outside the target's vocabulary [0, {V}): wrong target or a corrupt d2t")
        # Full-vocabulary heads may carry an all-False t2d (EAGLE's zero-initialised buffer): only check a real map.
        if Vd < V and (int(t2d.sum()) != Vd or not bool(t2d.bool()[ids].all())):
            raise ValueError(f"{source}: d2t and t2d disagree (t2d marks {int(t2d.sum())} tokens, draft_vocab_size "
                             f"is {Vd}); the vocabulary map is corrupt")


HEAD_CLASSES: dict[str, type[DraftHead]] = {c.KIND: c for c in (Eagle1Head, Eagle3Head, MultiLayerHead)}
_BY_ARCHITECTURE = {c.ARCHITECTURE: c for c in HEAD_CLASSES.values()}


def head_class(config: dict, source="config") -> type[DraftHead]:
    """The head class of a config.json: by `architectures`; a target architecture (EAGLE's own configs) is
    EAGLE-3 when the config has a `draft_vocab_size`, else EAGLE-1."""
    archs = config.get("architectures") or []
    for arch in archs:
        if arch in _BY_ARCHITECTURE:
            return _BY_ARCHITECTURE[arch]
    # EAGLE's own configs copy the target's (LlamaForCausalLM, Qwen2ForCausalLM, ...); its draft layer is a
    # Llama layer whatever they say.
    if not archs or any(a in SUPPORTED_ARCHITECTURES for a in archs):
        return Eagle3Head if config.get("draft_vocab_size") is not None else Eagle1Head
    raise CheckpointError(f"{source}: unknown draft head architecture {archs}; supported: "
                          f"{sorted(_BY_ARCHITECTURE)}, or a target architecture such as LlamaForCausalLM "
                          f"(EAGLE-1, or EAGLE-3 when the config has draft_vocab_size)")


def _read_head_dir(path: str | Path) -> tuple[dict, dict[str, torch.Tensor], Path]:
    """(raw config.json dict, public-name state dict, directory) of a head checkpoint."""
    path = Path(path).expanduser()
    if not path.exists():
        raise CheckpointNotFoundError(f"{path}: no such file or directory; pass a draft head directory")
    directory = path.parent if path.is_file() else path
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{directory}: no config.json; a draft head directory holds config.json and "
                              f"model.safetensors (or EAGLE's pytorch_model.bin)")
    try:
        raw = json.loads(config_path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{config_path}: invalid JSON ({e}); re-download config.json") from e
    files = _safetensors_files(directory)
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            sd.update(load_file(f))
        except SafetensorError as e:
            raise CheckpointError(f"{f}: corrupt or truncated safetensors file ({e}); re-download it") from e
    binary = directory / "pytorch_model.bin"
    if not files and binary.is_file():
        try:  # weights_only: a pickle can run code; public EAGLE heads are plain tensor dicts
            sd = torch.load(binary, map_location="cpu", weights_only=True)
        except Exception as e:  # torch raises RuntimeError, UnpicklingError, EOFError... depending on the damage
            raise CheckpointError(f"{binary}: cannot be read as a weights-only tensor file ({type(e).__name__}: "
                                  f"{e}); it is truncated/corrupt (re-download it) or holds more than tensors") from e
        if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
            raise CheckpointError(f"{binary}: expected a dict of tensors (a state dict), got {type(sd).__name__}")
    elif not files:
        raise CheckpointError(f"{directory}: config.json but no model.safetensors / *.safetensors / "
                              f"pytorch_model.bin weights")
    return raw, sd, directory


def load_draft_head(path: str | Path, target: Transformer, dtype: torch.dtype | None = None,
                    device=None) -> DraftHead:
    """Load any supported head (EAGLE-1, EAGLE-3, multi-layer) for `target`, dispatching on config.json."""
    return DraftHead.from_pretrained(path, target, dtype, device)


def new_draft_head(kind: str, target: Transformer, num_layers: int | None = None,
                   draft_vocab_size: int | None = None, dtype: torch.dtype | None = None, device=None,
                   **config) -> DraftHead:
    """A randomly initialised head sized from the target's ModelArgs (hidden size, heads, head_dim,
    intermediate size, RoPE). num_layers: EAGLE-1 1 (public), EAGLE-3 1, multi-layer S (required).
    draft_vocab_size: EAGLE-3 only (default: the full vocabulary; set the map with `set_draft_vocab`).
    `config` overrides config.json keys, e.g. intermediate_size=..., bias=False."""
    if kind not in HEAD_CLASSES:
        raise ValueError(f"unknown draft head kind {kind!r}; choose one of {KINDS}")
    if kind == "multi_layer" and num_layers is None:
        raise ValueError("a multi_layer head needs num_layers (one layer per draft step, e.g. the tree's steps)")
    if kind != "eagle3" and draft_vocab_size not in (None, target.args.vocab_size):
        raise ValueError(f"draft_vocab_size={draft_vocab_size}: only EAGLE-3 heads have a reduced vocabulary "
                         f"({kind} heads use the target's lm_head over all {target.args.vocab_size} tokens)")
    cls, t = HEAD_CLASSES[kind], target.args
    raw = dict(
        architectures=[cls.ARCHITECTURE], model_type="llama", hidden_size=t.dim, intermediate_size=t.intermediate_size,
        num_hidden_layers=num_layers or 1, num_attention_heads=t.n_heads, num_key_value_heads=t.n_kv_heads,
        head_dim=t.head_dim, rms_norm_eps=t.norm_eps, rope_theta=t.rope_theta, rope_scaling=t.rope_scaling,
        max_position_embeddings=t.max_seq_len, vocab_size=t.vocab_size, bias=cls.FC_BIAS,
    )
    if kind == "eagle3":
        raw["draft_vocab_size"] = draft_vocab_size or t.vocab_size
    raw.update(config)
    cfg = _normalise_head_config(raw, "new_draft_head")
    cfg["bias"] = bool(raw["bias"])
    with torch.device(device if device is not None else target.device):
        head = cls(cfg, target)
    return head.to(dtype or target.dtype)
