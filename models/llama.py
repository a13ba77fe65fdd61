"""The target model family, gpt-fast style: Llama 2/3, Mistral, Qwen2 (qkv bias), Qwen3 (q/k norm), SmolLM2.

One flat module: `ModelArgs` (with a registry of named configs, a tiny one for tests), RMSNorm,
rotary embedding, attention over the paged KV pool through `eaglet.kernels.tree_attention`, SwiGLU.
The same forward serves prefill (causal over the new tokens), AR decode (one new token) and
tree verification (the new tokens are a tree: `attn_mask` is ancestor-or-self).

`Transformer.set_invariant(True)` makes every token's result independent of what else is in the forward
(the batch, the other tree nodes, the prompt padding): the projections and the attention take their
invariant kernels (kernels/projection.py, 4 launches a block, and kernels/tree_attention.py). Then a verify computes
each accepted tree node exactly as plain decoding computes that token, and greedy speculative decoding in bf16 emits
plain decoding's tokens, ties included. Without it (the stock path: the rmsnorm kernel, cuBLAS, the RoPE and SiLU·mul
kernels; models/kernel_paths.py holds the choice), bf16 runs diverge at near-ties of the two best logits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from eaglet.kernels import projection as proj
from eaglet.kernels.activation import silu_and_mul
from eaglet.kernels.rmsnorm import rmsnorm
from eaglet.kernels.rope import rope_store
from eaglet.kernels.tree_attention import tree_attention
from eaglet.models.kernel_paths import KernelPath, path_for
from eaglet.models.kv_cache import ForwardBatch, KVCache

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass
class ModelArgs:
    family: str = "llama"  # llama | mistral | qwen2 (qkv bias) | qwen3 (q/k RMSNorm)
    vocab_size: int = 32000
    dim: int = 4096  # hidden size
    n_layers: int = 32
    n_heads: int = 32  # query heads
    n_kv_heads: int = 8  # GQA: n_heads must be a multiple
    head_dim: int = 128
    intermediate_size: int = 14336  # SwiGLU width
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    rope_scaling: dict | None = None  # HF rope_scaling dict: None, {"rope_type": "llama3", ...} or "linear"
    max_seq_len: int = 8192  # context length (min of max_position_embeddings and a sliding window)
    tie_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: bias on q/k/v projections
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k before RoPE
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"ModelArgs.family={self.family!r} is not supported; choose one of {FAMILIES}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}")

    @classmethod
    def from_hf_config(cls, cfg: dict) -> "ModelArgs":
        """Map a Hugging Face config.json dict (as returned by `load_checkpoint`) to ModelArgs."""
        from eaglet.models.checkpoint import SUPPORTED_ARCHITECTURES

        arch = (cfg.get("architectures") or [None])[0]
        family = SUPPORTED_ARCHITECTURES.get(arch) or SUPPORTED_ARCHITECTURES.get(cfg.get("model_type"))
        if family is None:
            raise ValueError(
                f"unknown architecture {arch or cfg.get('model_type')!r}; supported: {sorted(SUPPORTED_ARCHITECTURES)}"
            )
        if cfg.get("mlp_bias"):
            raise ValueError("mlp_bias=True checkpoints are not supported by eaglet's model code")
        n_heads = cfg["num_attention_heads"]
        max_len = cfg.get("max_position_embeddings", 8192)
        # Sliding-window attention is not implemented: cap the context where it would apply.
        if cfg.get("sliding_window") and cfg.get("use_sliding_window", family == "mistral"):
            max_len = min(max_len, cfg["sliding_window"])
        # transformers 5 folds rope_theta / rope_scaling into `rope_parameters`
        rope = cfg.get("rope_parameters") or {}
        eos = cfg.get("eos_token_id")
        eos = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
        return cls(
            family=family,
            vocab_size=cfg["vocab_size"],
            dim=cfg["hidden_size"],
            n_layers=cfg["num_hidden_layers"],
            n_heads=n_heads,
            n_kv_heads=cfg.get("num_key_value_heads") or n_heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // n_heads,
            intermediate_size=cfg["intermediate_size"],
            norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=cfg.get("rope_theta") or rope.get("rope_theta", 10000.0),
            rope_scaling=cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None),
            max_seq_len=max_len,
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", family == "qwen2")),
            qk_norm=family == "qwen3",
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos,
        )

    @classmethod
    def from_name(cls, name: str) -> "ModelArgs":
        if name not in transformer_configs:
            raise ValueError(f"unknown model config {name!r}; known: {sorted(transformer_configs)}")
        return cls(**transformer_configs[name])


_LLAMA31_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": 8192}

transformer_configs: dict[str, dict] = {
    # tiny random configs for tests; one per family
    "tiny_llama": dict(family="llama", vocab_size=512, dim=256, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64,
                       intermediate_size=256, rope_theta=10000.0, max_seq_len=512),
    "smollm2_135m": dict(family="llama", vocab_size=49152, dim=576, n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64,
                         intermediate_size=1536, rope_theta=100000.0, max_seq_len=8192, tie_embeddings=True,
                         bos_token_id=1, eos_token_ids=(2,)),
    "llama2_7b": dict(family="llama", vocab_size=32000, dim=4096, n_layers=32, n_heads=32, n_kv_heads=32,
                      head_dim=128, intermediate_size=11008, rope_theta=10000.0, max_seq_len=4096),
    "llama3_8b": dict(family="llama", vocab_size=128256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8,
                      head_dim=128, intermediate_size=14336, rope_theta=500000.0, rope_scaling=_LLAMA31_ROPE,
                      max_seq_len=131072, bos_token_id=128000, eos_token_ids=(128001, 128008, 128009)),
    "mistral_7b": dict(family="mistral", vocab_size=32768, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8,
                       head_dim=128, intermediate_size=14336, rope_theta=1000000.0, max_seq_len=32768),
    "qwen2_5_7b": dict(family="qwen2", vocab_size=152064, dim=3584, n_layers=28, n_heads=28, n_kv_heads=4,
                       head_dim=128, intermediate_size=18944, rope_theta=1000000.0, max_seq_len=32768,
                       attention_bias=True, norm_eps=1e-6),
    "qwen3_8b": dict(family="qwen3", vocab_size=151936, dim=4096, n_layers=36, n_heads=32, n_kv_heads=8,
                     head_dim=128, intermediate_size=12288, rope_theta=1000000.0, max_seq_len=40960, qk_norm=True,
                     norm_eps=1e-6),
}


def rope_inv_freq(args: ModelArgs) -> torch.Tensor:
    """Rotary inverse frequencies [head_dim/2] (fp64 for the table), with Llama-3.1 / linear scaling."""
    even = torch.arange(0, args.head_dim, 2, dtype=torch.float64, device="cpu")  # [D/2]
    inv = 1.0 / (args.rope_theta ** (even / args.head_dim))  # [D/2]
    rs = args.rope_scaling
    if not rs:
        return inv
    kind = rs.get("rope_type", rs.get("type"))
    if kind in (None, "default"):
        return inv
    if kind == "linear":
        return inv / rs["factor"]
    if kind == "llama3":
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv  # [D/2]
        smooth = ((old / wavelen) - lo) / (hi - lo)  # [D/2]
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)  # [D/2]
        mid = (wavelen <= old / lo) & (wavelen >= old / hi)
        return torch.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
    raise ValueError(f"rope_scaling type {kind!r} is not supported (supported: default, linear, llama3)")


class RMSNorm(nn.Module):
    """Holds the weight; the math (with the residual add fused in) is `kernels.rmsnorm`."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """x [..., dim] -> normed [..., dim]; with `residual`, -> (normed(x + residual), x + residual)."""
        return rmsnorm(x, self.weight, self.eps, residual=residual)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        # q, k and v in one GEMM (one launch instead of three: decode is launch-bound)
        self.qkv_proj = nn.Linear(args.dim, (args.n_heads + 2 * args.n_kv_heads) * args.head_dim,
                                  bias=args.attention_bias)
        # HF: Llama/Qwen3 put attention_bias on o_proj too, Qwen2 never does
        self.o_proj = nn.Linear(args.n_heads * args.head_dim, args.dim,
                                bias=args.attention_bias and args.family != "qwen2")
        self.q_norm = RMSNorm(args.head_dim, args.norm_eps) if args.qk_norm else None
        self.k_norm = RMSNorm(args.head_dim, args.norm_eps) if args.qk_norm else None
        self.norm_eps = args.norm_eps

    def forward(self, x, positions, inv_freq, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        """The stock path (models/kernel_paths.py): x [B, T, H], the normed input -> [B, T, H]."""
        B, T, _ = x.shape
        Hkv, D = self.n_kv_heads, self.head_dim
        k_cache, v_cache = kv.layer(self.layer_id)  # [pages, page_size, Hkv, D] each
        qkv = self.qkv_proj(x).view(B * T, -1)  # [B*T, (Hq+2Hkv)*D]
        # q/k norm (Qwen3) + RoPE + the K/V store into the pool, one launch
        q = rope_store(qkv, positions.reshape(-1), inv_freq, k_cache.view(-1, Hkv, D), v_cache.view(-1, Hkv, D),
                       batch.out_slots.reshape(-1), self.n_heads, Hkv, D,
                       q_norm_weight=None if self.q_norm is None else self.q_norm.weight,
                       k_norm_weight=None if self.k_norm is None else self.k_norm.weight,
                       norm_eps=self.norm_eps)  # [B*T, Hq, D]
        o = tree_attention(q.view(B, T, self.n_heads, D), k_cache, v_cache, batch.page_table, batch.prefix_lens,
                           batch.attn_mask, max_prefix_len=batch.max_prefix_len, invariant=False)  # [B, T, Hq, D]
        return self.o_proj(o.reshape(B, T, -1))  # [B, T, H]

    def forward_stream(self, x2d, norm_weight, positions, inv_freq, batch: ForwardBatch, kv: KVCache, B: int,
                       embeds2d=None, norm_weight2=None) -> torch.Tensor:
        """The invariant path's attention half before o_proj: q/k/v of rmsnorm(x2d) (x2d [B*T, H], the residual
        stream; norm_weight: the norm's weight, projection.FOLDED when it is inside qkv_proj, None: no norm), RoPE,
        the K/V store, tree attention -> o [B*T, Hq*D]. With embeds2d (an EAGLE-3 midlayer) the projection's input is
        cat(norm(embeds2d), norm2(x2d))."""
        Hkv, D = self.n_kv_heads, self.head_dim
        k_cache, v_cache = kv.layer(self.layer_id)  # [pages, page_size, Hkv, D] each
        rope_args = (positions.reshape(-1), inv_freq, k_cache.view(-1, Hkv, D), v_cache.view(-1, Hkv, D),
                     batch.out_slots.reshape(-1), self.n_heads, Hkv, D)
        g = norm_weight
        w, b = self.qkv_proj.weight, self.qkv_proj.bias
        if self.q_norm is not None:  # Qwen3: the per-head q/k norms sit between the projection and RoPE
            qkv = proj.linear(x2d, w, b, norm_weight=g, eps=self.norm_eps)  # [B*T, (Hq+2Hkv)*D]
            q = rope_store(qkv, *rope_args, q_norm_weight=self.q_norm.weight, k_norm_weight=self.k_norm.weight,
                           norm_eps=self.norm_eps)  # [B*T, Hq, D]
        elif embeds2d is not None:
            q = proj.proj_rope_store(embeds2d, g, w, b, *rope_args, self.norm_eps, x2=x2d,
                                     norm_weight2=norm_weight2)  # [B*T, Hq, D]
        else:
            q = proj.proj_rope_store(x2d, g, w, b, *rope_args, self.norm_eps)  # [B*T, Hq, D]
        T = x2d.shape[0] // B
        o = tree_attention(q.view(B, T, self.n_heads, D), k_cache, v_cache, batch.page_table, batch.prefix_lens,
                           batch.attn_mask, max_prefix_len=batch.max_prefix_len, invariant=True)  # [B, T, Hq, D]
        return o.view(B * T, -1)


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.gate_up_proj = nn.Linear(args.dim, 2 * args.intermediate_size, bias=False)  # gate then up
        self.down_proj = nn.Linear(args.intermediate_size, args.dim, bias=False)
        self.norm_eps = args.norm_eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The stock path: x [B, T, H], the normed input -> [B, T, H]."""
        gu = self.gate_up_proj(x)  # [B, T, 2I]
        return self.down_proj(silu_and_mul(gu))  # [B, T, H]


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__()
        self.self_attn = Attention(args, layer_id)
        self.mlp = FeedForward(args)
        self.input_layernorm = RMSNorm(args.dim, args.norm_eps)
        self.post_attention_layernorm = RMSNorm(args.dim, args.norm_eps)
        self.invariant = False  # Transformer.set_invariant
        self.norms_folded = False  # Transformer.fold_norm_weights

    def forward(self, x, residual, positions, inv_freq, batch, kv, capture=None, owned=True):
        """Pre-norm block: takes and returns (block output, residual) whose sum is the residual stream; residual=None
        at layer 0. The path is models/kernel_paths.py's: the stock one fuses the residual adds into the norms
        (vLLM/SGLang style); the invariant one returns (the residual stream, None), x updated in place when `owned`
        (capture, owned: `_forward_invariant`'s, the invariant path's only)."""
        if path_for(self.invariant) is KernelPath.INVARIANT:
            if residual is not None:
                x, owned = x + residual, True
            return self._forward_invariant(x, positions, inv_freq, batch, kv, capture, owned)
        if residual is None:
            h, residual = self.input_layernorm(x), x
        else:
            h, residual = self.input_layernorm(x, residual)
        h = self.self_attn(h, positions, inv_freq, batch, kv)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual

    def _forward_invariant(self, x, positions, inv_freq, batch, kv, capture=None, owned=True):
        """The batch-invariant block (module doc): x [B, T, H] is the residual stream, returned as (stream, None).
        Four projection launches (kernels/projection.py: each norm inside the projection after it, RoPE and the K/V
        store in qkv's epilogue, SiLU·mul in gate_up's, the residual adds in o's and down's) around the tree
        attention. x is updated in place when `owned`; otherwise (the caller's embeds, a captured layer's stream) o's
        residual add writes a new stream. capture [B, T, H] (a slice of the captured layers' buffer, rows strided):
        down's residual add writes the stream there, which is then both the feature and the next layer's input: a
        captured layer costs no copy."""
        attn, mlp = self.self_attn, self.mlp
        B, T, H = x.shape
        x2d = x.reshape(B * T, H)  # [B*T, H] a view of our own streams (a copy only of an unviewable caller embeds)
        folded = self.norms_folded  # the norm weights are inside qkv_proj and gate_up_proj: only the row scale
        g1 = proj.FOLDED if folded else self.input_layernorm.weight
        g2 = proj.FOLDED if folded else self.post_attention_layernorm.weight
        o = attn.forward_stream(x2d, g1, positions, inv_freq, batch, kv, B)  # [B*T, Hq*D]
        if owned:
            proj.linear_add_(x2d, o, attn.o_proj.weight, attn.o_proj.bias)
        else:
            x2d = proj.linear_add(x2d, o, attn.o_proj.weight, attn.o_proj.bias)  # [B*T, H], x left as it was
        a = proj.gate_up_silu(x2d, g2, mlp.gate_up_proj.weight, mlp.norm_eps)  # [B*T, I]
        if capture is None:
            proj.linear_add_(x2d, a, mlp.down_proj.weight)
            return x2d.view(B, T, H), None
        proj.linear_add(x2d, a, mlp.down_proj.weight, out=capture.view(B * T, H))
        return capture, None


def concat_captured(captured: list[torch.Tensor]) -> torch.Tensor:
    """The captured layers' streams [B, T, H] each, side by side -> [B, T, n*H] (a drafter's features): without a copy
    when they are the consecutive slices of one [B, T, n, H] buffer, as the invariant forward writes them; else
    concatenated."""
    c0, n = captured[0], len(captured)
    B, T, H = c0.shape
    strides = (T * n * H, n * H, 1)
    if all(c.shape == c0.shape and c.stride() == strides and c.data_ptr() == c0.data_ptr() + j * H * c0.element_size()
           for j, c in enumerate(captured)):
        return c0.as_strided((B, T, n * H), strides)  # [B, T, n*H]
    return torch.cat(captured, dim=-1)  # [B, T, n*H]


class _Body(nn.Module):
    """Holds the parameters under HF's `model.` prefix so HF state dicts load unchanged."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args, i) for i in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)


def _hf_names(name: str) -> list[str]:
    """eaglet parameter name -> the HF names it is built from."""
    if ".qkv_proj." in name:
        return [name.replace("qkv_proj", f"{p}_proj") for p in "qkv"]
    if ".gate_up_proj." in name:
        return [name.replace("gate_up_proj", f"{p}_proj") for p in ("gate", "up")]
    return [name]


def fuse_hf_state_dict(state_dict: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
    """HF parameter names -> eaglet's: q/k/v_proj -> qkv_proj, gate/up_proj -> gate_up_proj."""
    sd = dict(state_dict)
    for i in range(n_layers):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        for kind in ("weight", "bias"):
            parts = [sd.pop(f"{a}{p}_proj.{kind}", None) for p in "qkv"]
            if all(t is not None for t in parts):
                sd[f"{a}qkv_proj.{kind}"] = torch.cat(parts)
        parts = [sd.pop(f"{m}{p}_proj.weight", None) for p in ("gate", "up")]
        if all(t is not None for t in parts):
            sd[f"{m}gate_up_proj.weight"] = torch.cat(parts)
    return sd


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model = _Body(args)
        self.lm_head = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # A plain attribute, not a buffer: `model.to(bfloat16)` must not round the RoPE frequencies.
        self._inv_freq = rope_inv_freq(args).float()  # [D/2]
        self.invariant = False

    def fold_norm_weights(self) -> "Transformer":
        """Fold each layer's input and post-attention RMSNorm weight into the projection after it (W' = W diag(g),
        g = 1), in place. Both paths compute the same function (rounded differently: W' is rounded to the weights'
        dtype): the invariant projections then multiply no norm weight in their K loop, only each row's 1/rms is
        left (kernels/projection.py's FOLDED), and the stock path runs its rmsnorm kernel with unit weights.
        Models with a qkv or o_proj bias or q/k norms are refused (the row scale would have to skip the bias)."""
        a = self.args
        if a.attention_bias or a.qk_norm:
            raise ValueError(f"fold_norm_weights: {a.family} with attention_bias={a.attention_bias}, "
                             f"qk_norm={a.qk_norm} is not supported (the 1/rms row scale applies to the whole "
                             f"projection output); run without folding")
        with torch.no_grad():
            for layer in self.model.layers:
                for norm, lin in ((layer.input_layernorm, layer.self_attn.qkv_proj),
                                  (layer.post_attention_layernorm, layer.mlp.gate_up_proj)):
                    lin.weight.mul_(norm.weight[None, :])  # [out, H] * [1, H]
                    norm.weight.fill_(1.0)
                layer.norms_folded = True
        return self

    def set_invariant(self, invariant: bool) -> "Transformer":
        """Batch- and position-invariant numerics on (module doc) or off: the stock path (models/kernel_paths.py)."""
        self.invariant = bool(invariant)
        for layer in self.model.layers:
            layer.invariant = self.invariant
        return self

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def weight_read_bytes(self) -> int:
        """Weight bytes one decode step reads: every matrix once, the LM head included, but not an untied
        embedding table (a step gathers only its tokens' rows)."""
        total = sum(p.numel() * p.element_size() for p in self.parameters())  # a tied matrix counts once
        if not self.args.tie_embeddings:
            emb = self.model.embed_tokens.weight
            total -= emb.numel() * emb.element_size()
        return total

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        batch: ForwardBatch,
        kv: KVCache,
        capture_layers: tuple[int, ...] = (),
        embeds: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """tokens/positions [B, T] -> (final-normed hidden [B, T, dim], residual stream after each
        layer in `capture_layers` [B, T, dim] each, e.g. EAGLE-3's low/middle/high features)."""
        if self._inv_freq.device != positions.device:
            self._inv_freq = self._inv_freq.to(positions.device)
        x = self.model.embed_tokens(tokens) if embeds is None else embeds  # [B, T, dim]
        residual, captured = None, []
        if path_for(self.invariant) is KernelPath.INVARIANT:
            # the blocks update the stream in place, except the caller's embeds and a captured layer's stream, which
            # each next block leaves as they are; the captured layers' streams are written where they are kept
            # (`concat_captured` then takes them without a copy): 6 launches fewer a verify at 5 captured layers
            L = self.args.n_layers
            caps = x.new_empty(*x.shape[:2], sum(i in capture_layers for i in range(L)), x.shape[-1])  # [B, T, n, dim]
            owned = embeds is None
            for i, layer in enumerate(self.model.layers):
                cap = caps[:, :, len(captured)] if i in capture_layers else None  # [B, T, dim] or None
                x, _ = layer(x, None, positions, self._inv_freq, batch, kv, capture=cap, owned=owned)  # [B, T, dim]
                owned = cap is None
                if cap is not None:
                    captured.append(cap)
            return self.model.norm(x.contiguous()), captured  # a copy only when the last layer is captured
        for i, layer in enumerate(self.model.layers):
            x, residual = layer(x, residual, positions, self._inv_freq, batch, kv)  # [B, T, dim] each
            if i in capture_layers:
                captured.append(x + residual)
        return (self.model.norm(x) if residual is None else self.model.norm(x, residual)[0]), captured

    def logits(self, hidden: torch.Tensor, float32: bool = True) -> torch.Tensor:
        """hidden [..., dim] -> logits [..., V] in fp32 (softmax stability in bf16 runs). float32=False: in the
        projection's own dtype, for a greedy argmax: the same values (fp32 holds every bf16 exactly), the same ties,
        without a launch that writes [..., V] again in fp32 (5.9 MB a SmolLM2 verify of 30 nodes)."""
        shape = hidden.shape
        if path_for(self.invariant) is KernelPath.INVARIANT:
            y = proj.linear(hidden.reshape(-1, shape[-1]), self.lm_head.weight).view(*shape[:-1], -1)  # [..., V]
        else:
            y = self.lm_head(hidden)  # [..., V]
        return y.float() if float32 else y

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.float32, device="cpu") -> "Transformer":
        """Load a local HF directory (config.json + safetensors) or a GGUF file."""
        from eaglet.models.checkpoint import load_checkpoint

        hf_config, state_dict = load_checkpoint(path)
        return cls.from_state_dict(ModelArgs.from_hf_config(hf_config), state_dict, dtype, device)

    @classmethod
    def from_state_dict(cls, args: ModelArgs, state_dict: dict, dtype=torch.float32, device="cpu") -> "Transformer":
        with torch.device("meta"):
            model = cls(args)
        fused = fuse_hf_state_dict(state_dict, args.n_layers)  # HF names or eaglet's own
        absent = set(model.state_dict()) - set(fused) - ({"lm_head.weight"} if args.tie_embeddings else set())
        missing = sorted(hf for k in absent for hf in _hf_names(k) if hf not in state_dict)
        if missing:
            raise ValueError(f"checkpoint is missing {len(missing)} tensors for a {args.family} model, "
                             f"e.g. {missing[:4]}; is it the right checkpoint for this config?")
        state_dict = fused
        model = model.to_empty(device=device)
        model.load_state_dict({k: v for k, v in state_dict.items() if k in model.state_dict()}, strict=False)
        if args.tie_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
        return model.to(dtype).eval()
