"""The block drafter (DFlash-style, with a DSpark-style dependency term): a few decoder layers propose a whole
block of tokens in one forward.

Alignment: a request with seq_len cached tokens and its root (the last emitted token, not yet cached) at position
seq_len. The block is [root, mask, ..., mask] at positions seq_len .. seq_len + block_size - 1; block row j >= 1
predicts the token at seq_len + j. Inside the block attention is non-causal; every layer also attends the
context: the target's features of the cached positions p < seq_len (the residual streams of `target_layer_ids`,
concatenated, fused by `fc` and normed by `hidden_norm`), projected by that layer's own k/v weights and kept in
the head's paged KV pool like a prefix (`store_context`, run by the drafter's prefill and after each accept).

The mask rows take a learned embedding (`mask_embedding`): no spare id of the target's vocabulary is needed.
The target's embedding and LM head are shared and frozen, as for EAGLE heads (models/eagle.py).

Draft vocabulary (`draft_vocab_size`, EAGLE-3's mechanism: models/eagle.py's `DraftVocab`, d2t / t2d): the logits
cover Vd <= V tokens, through the target LM head's rows of those tokens, and dep_out is r -> Vd. Why: at
Llama-3.1-8B's shape the full LM head is 128,256 x 4,096 bf16 = 1.05 GB read per propose (~0.3 ms at 3.3 TB/s of
a 0.6 ms draft budget), its 32,000 rows 0.26 GB. None (default) = the whole vocabulary, no map.

Dependency term: logits of row j = lm_head(norm(h_j)) + dep_out(dep_in(embed(parent))), a rank-`dep_rank` bias
from the token at the previous block position (a target id, any of the V; the parent in a tree: the root for
j = 1). The forward itself sees no drafted token, so this term is what makes row j's distribution depend on which
candidate it continues: a tree (per-depth top-k conditioned on the parent) comes from one forward plus one launch a
depth (kernels/block_tree.py). `dep_out` starts at zero: an untrained term is no bias.

`forward_dense` is the training forward: the same weights and math, attention computed densely over several
anchors' blocks at once (training/block_loss.py).

Folded norms (`fold_norm_weights`, serving's fold_norms=true): the invariant projections then apply only each row's
1/rms (projection.FOLDED), as the target's and the EAGLE heads' do; a folded head is serving-only (`check_unfolded`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import sdpa_kernel

from eaglet.kernels import projection as proj
from eaglet.kernels.activation import silu_and_mul_ref
from eaglet.kernels.rmsnorm import rmsnorm_ref
from eaglet.kernels.rope import rope_store
from eaglet.models.draft_layers import DraftLayer, draft_linear
from eaglet.models.eagle import DraftHead, DraftVocab
from eaglet.models.kernel_paths import KernelPath, path_for
from eaglet.models.kv_cache import ForwardBatch, KVCache
from eaglet.models.llama import RMSNorm, concat_captured
from eaglet.models.ttt_attention import SDPA_BACKENDS, rope_dense

ARCH_BLOCK = "EagletBlockDrafter"


def default_layer_ids(target_n_layers: int, n: int = 5) -> list[int]:
    """n target layers (outputs) evenly spread from layer 1 to layer L-3, as DFlash picks its ~5 layers."""
    L = target_n_layers
    if n == 1:
        return [L // 2]
    return sorted({round(1 + i * (L - 4) / (n - 1)) for i in range(n)})


class BlockHead(DraftVocab, DraftHead):
    """A DraftHead for what heads share (config.json and checkpoint layout, the target's embedding, the paged pool,
    the kernel path) and EAGLE-3's draft vocabulary; its forwards are its own: `forward_block` (inference) and
    `forward_dense` (training)."""

    KIND, ARCHITECTURE, FC_BIAS = "block", ARCH_BLOCK, False
    VOCAB_WEIGHTS, MAP_AT_FULL_VOCAB = ("dep_out.weight",), False

    def __init__(self, config: dict, target):
        super().__init__(config, target)
        a, t = self.args, target.args
        if a.dim != t.dim:
            raise ValueError(f"block drafter hidden_size={a.dim} must equal the target's ({t.dim}): it reads the "
                             f"target's embedding and LM head")
        ids = list(config.get("target_layer_ids") or default_layer_ids(t.n_layers))
        if not ids or ids != sorted(set(ids)) or not all(0 <= i < t.n_layers for i in ids):
            raise ValueError(f"block drafter target_layer_ids={ids}: increasing layer indices in [0, {t.n_layers})")
        self.block_size = int(config.get("block_size") or 8)
        if self.block_size < 2:
            raise ValueError(f"block drafter block_size={self.block_size}: the root and at least one mask row")
        rank = int(config.get("dep_rank") or 64)
        Vd = self._init_draft_vocab(config)
        self.config = dict(config, target_layer_ids=ids, block_size=self.block_size, dep_rank=rank,
                           draft_vocab_size=Vd)  # config.json
        # The target LM head's rows of the draft vocabulary [Vd, H], derived (not a weight, not saved): made on first
        # use and kept, as a plain attribute (head.to() must not cast the target's rows); see `lm_head_rows`.
        self._rows: tuple[tuple, torch.Tensor] | None = None
        self._folded_rows: tuple[tuple, torch.Tensor] | None = None  # those rows times the final norm's weight
        self.norms_folded = False  # fold_norm_weights
        self.fc = nn.Linear(len(ids) * t.dim, a.dim, bias=False)
        self.hidden_norm = RMSNorm(a.dim, a.norm_eps)
        self.layers = nn.ModuleList(DraftLayer(a, i, input_norm=True) for i in range(a.n_layers))
        self.norm = RMSNorm(a.dim, a.norm_eps)
        self.mask_embedding = nn.Parameter(torch.randn(a.dim) * 0.02)  # [H]
        self.dep_in = nn.Linear(t.dim, rank, bias=False)
        self.dep_out = nn.Linear(rank, Vd, bias=False)  # draft ids
        nn.init.zeros_(self.dep_out.weight)

    def forward(self, *args, **kwargs):
        raise TypeError("a block drafter runs forward_block (inference) or forward_dense (training)")

    # ---- what the engine and the trainer ask ----------------------------------------------------------------
    @property
    def feature_widths(self) -> tuple[int, ...]:
        return (self.fc.in_features,)

    def capture_layers(self, target_n_layers: int) -> tuple[int, ...]:
        ids = self.config["target_layer_ids"]
        if max(ids) >= target_n_layers:
            raise ValueError(f"block drafter captures target layers {ids} but the target has {target_n_layers}")
        return tuple(ids)

    def target_feature(self, final_hidden, captured):
        return concat_captured(captured)  # [B, T, n*Ht]

    def with_layers(self, n: int) -> "BlockHead":
        """A copy of this drafter with n >= its layers, the new ones appended with their output projections (o_proj,
        down_proj) at zero: each adds nothing to the residual stream until trained, so the grown drafter drafts what
        this one does and training continues from it (a deeper drafter without starting over)."""
        L = self.args.n_layers
        if n < L:
            raise ValueError(f"train.head.num_layers={n}: the warm-start drafter has {L} layers and layers are not "
                             f"dropped; set num_layers >= {L}")
        if n == L:
            return self
        self.check_unfolded("grown")
        with torch.device(self.device):
            twin = type(self)({**self.config, "num_hidden_layers": n}, self.target)
        twin.to(self.dep_out.weight.dtype)
        res = twin.load_state_dict(self.state_dict(), strict=False)  # the draft map (d2t, t2d buffers) too
        assert not res.unexpected_keys and all(k.startswith(tuple(f"layers.{i}." for i in range(L, n)))
                                               for k in res.missing_keys), res  # every old weight copied
        with torch.no_grad():
            for layer in twin.layers[L:]:
                for out in (layer.self_attn.o_proj, layer.mlp.down_proj):
                    out.weight.zero_()
                    if out.bias is not None:  # attention_bias configs
                        out.bias.zero_()
        return twin.train(self.training)

    def fold_norm_weights(self) -> "BlockHead":
        """Fold the norm weights into the projections after them, in place, for serving (fold_norms=true): each
        layer's input and post-attention norms (`DraftLayer.fold_norm_weights`). A layer's qkv_proj also projects the
        context, which hidden_norm scales, not the layer's input norm: the head first keeps every layer's k/v rows
        times hidden_norm's weight, one after another (`context_kv` [L*2*Hkv*D, H], a buffer no checkpoint holds; one
        projection stores them all, `store_context`) and hidden_norm's weight becomes 1. The
        final norm keeps its weight (the stock path applies it; a new draft map's rows are folded from it): the
        invariant LM head reads a kept copy of its rows times it (`logit_rows`). Both paths compute the function of
        the unfolded head."""
        if self.norms_folded:
            return self
        if self.args.attention_bias:
            raise ValueError("fold_norm_weights: a block drafter with attention_bias is not supported (the 1/rms row "
                             "scale applies to the whole projection output); run without folding")
        with torch.no_grad():
            g = self.hidden_norm.weight  # [H]
            rows = [self._context_kv(layer)[0] * g[None, :] for layer in self.layers]  # [2*Hkv*D, H] each
            self.register_buffer("context_kv", torch.cat(rows).contiguous(), persistent=False)  # [L*2*Hkv*D, H]
            for layer in self.layers:
                layer.fold_norm_weights()
            g.fill_(1.0)
        self.norms_folded = True
        return self

    def check_unfolded(self, what: str) -> None:
        """A folded head is serving-only: its qkv_proj no longer projects the context (`fold_norm_weights`), so it is
        neither trained, saved nor copied."""
        if self.norms_folded:
            raise ValueError(f"a block drafter with folded norm weights (fold_norm_weights, serving only) is not "
                             f"{what}: its qkv_proj no longer projects the context; use the head before folding")

    def state_dict(self, *args, **kwargs):
        self.check_unfolded("saved")  # save_draft_head, training checkpoints, with_draft_vocab's copy
        return super().state_dict(*args, **kwargs)

    # ---- inference (paged pool, the head's kernel path) -----------------------------------------------------
    def store_context(self, feature: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, kv: KVCache) -> None:
        """feature [B, T, F] (target_feature at positions [B, T]) -> every layer's context K/V at slots [B, T]."""
        if self._inv_freq.device != positions.device:
            self._inv_freq = self._inv_freq.to(positions.device)
        x = draft_linear(self.fc, self.invariant, feature.to(self.dtype)).reshape(-1, self.args.dim)  # [B*T, H]
        pos, out = positions.reshape(-1), slots.reshape(-1)  # [B*T] each
        attn = self.layers[0].self_attn
        Hkv, D = attn.n_kv_heads, attn.head_dim
        if path_for(self.invariant) is KernelPath.STOCK:  # rope_store takes >= 1 q head: a zero one before k and v
            x = self.hidden_norm(x)  # [B*T, H]; unit weights when folded (context_kv holds them)
            for layer in self.layers:
                w, bias = self._context_kv(layer)  # [2*Hkv*D, H], [2*Hkv*D] or None
                k_cache, v_cache = kv.layer(layer.self_attn.layer_id)  # [pages, page_size, Hkv, D] each
                rope_store(F.pad(F.linear(x, w, bias), (D, 0)), pos, self._inv_freq, k_cache.view(-1, Hkv, D),
                           v_cache.view(-1, Hkv, D), out, 1, Hkv, D)
            return
        # every layer in one launch (a launch a layer took 5-7 µs of a ~30 µs SmolLM2 extend graph on an H100,
        # results/widened_h100/profile_block_5_4_16.txt), hidden_norm inside the projection (its 1/rms alone when
        # folded), each layer's plan that of its own k/v rows. Unfolded, the rows are gathered a call (a copy)
        if self.norms_folded:
            w, bias, g = self.context_kv, None, proj.FOLDED  # [L*2*Hkv*D, H]
        else:
            parts = [self._context_kv(layer) for layer in self.layers]
            w, g = torch.cat([w for w, _ in parts]), self.hidden_norm.weight  # [L*2*Hkv*D, H], [H]
            bias = None if parts[0][1] is None else torch.cat([b for _, b in parts])  # [L*2*Hkv*D]
        k_cache, v_cache = kv.layer(attn.layer_id)  # layer 0's [pages, page_size, Hkv, D]; layer l's kv.kv[l]
        proj.proj_rope_store(x, g, w, bias, pos, self._inv_freq, k_cache.view(-1, Hkv, D), v_cache.view(-1, Hkv, D),
                             out, 0, Hkv, D, self.args.norm_eps, layers=len(self.layers),
                             layer_stride=kv.kv.stride(0))

    def _context_kv(self, layer: DraftLayer) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The layer's k and v rows of qkv_proj [2*Hkv*D, H] and their bias (or None): what projects the context, which
        needs no q (the q rows are 2/3 of the weight at Llama-3.1-8B's shape: 33 MB a layer a step not read). Folded
        (fold_norm_weights), those rows times hidden_norm's weight: the head's `context_kv` rows of the layer."""
        attn = layer.self_attn
        q_rows, n = attn.n_heads * attn.head_dim, 2 * attn.n_kv_heads * attn.head_dim
        if self.norms_folded:
            i = attn.layer_id
            return self.context_kv[i * n:(i + 1) * n], None
        bias = None if attn.qkv_proj.bias is None else attn.qkv_proj.bias[q_rows:]
        return attn.qkv_proj.weight[q_rows:], bias

    def forward_block(self, roots: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch,
                      kv: KVCache) -> torch.Tensor:
        """roots [B], positions [B, K] (seq_len + j), batch: out_slots [B, K], attn_mask [B, K, K] all True ->
        the last layer's stream [B, K, H] (block_logits takes it)."""
        if self._inv_freq.device != positions.device:
            self._inv_freq = self._inv_freq.to(positions.device)
        B, K = positions.shape
        x = torch.cat([self.embed(roots[:, None]), self.mask_embedding.expand(B, K - 1, -1)], dim=1)  # [B, K, H]
        for layer in self.layers:
            x = layer(x.contiguous(), positions, self._inv_freq, batch, kv)  # [B, K, H]
        return x

    # ---- the draft vocabulary -------------------------------------------------------------------------------
    def lm_head_rows(self) -> torch.Tensor:
        """The target LM head's rows of the draft vocabulary [Vd, H] (its whole weight without a map), frozen.

        Gathered once and kept, for training and inference alike: per call, the gather would write and re-read Vd x H
        on every propose (at Llama-3.1-8B's shape 0.26 GB, as much again as the rows' own read) and could not sit in a
        CUDA graph captured before a map change; BlockDrafter.setup makes it before capture. Rebuilt when the map
        changes (set_draft_vocab, a loaded state dict: `_draft_vocab_changed`) or the target's weight moves (its
        storage is part of the key)."""
        w = self.target.lm_head.weight
        if self.d2t is None:
            return w
        self._rows = self._kept_rows(self._rows, None)
        return self._rows[1]

    def logit_rows(self) -> tuple[torch.Tensor, torch.Tensor | str]:
        """block_logits' LM-head rows [Vd, H] on the invariant path and the final norm's weight its projection takes:
        `lm_head_rows()` and the weight; folded (fold_norm_weights), a copy of those rows times the weight (the
        target's own rows are never scaled), kept and rebuilt as lm_head_rows' are, and projection.FOLDED.
        BlockDrafter.setup makes them before capture."""
        if not self.norms_folded:
            w = self.lm_head_rows()  # [Vd, H]
            return w, self.norm.weight.to(w.dtype)
        self._folded_rows = self._kept_rows(self._folded_rows, self.norm.weight)
        return self._folded_rows[1], proj.FOLDED

    def _kept_rows(self, kept: tuple[tuple, torch.Tensor] | None, g: torch.Tensor | None) -> tuple[tuple, torch.Tensor]:
        """(key, the target LM head's rows of the draft vocabulary [Vd, H], times g [H] when given): `kept` while its
        key (the target weight's storage) holds, else made anew."""
        w = self.target.lm_head.weight
        key = (w.data_ptr(), w.dtype, w.device)
        if kept is not None and kept[0] == key:
            return kept
        # a normal tensor even when first asked under inference_mode: training may use it after an evaluation
        with torch.inference_mode(False), torch.no_grad():
            rows = w.detach()  # [V, H]
            if self.d2t is not None:
                ids = self.to_target_ids(torch.arange(self.draft_vocab_size, device=self.d2t.device))  # [Vd]
                rows = rows[ids.to(w.device)]  # [Vd, H]
            if g is not None:  # rounded to the weight's dtype, as Transformer.fold_norm_weights rounds its W'
                rows = rows * g.to(w.dtype)[None, :]  # [Vd, H]
            return key, rows.contiguous()

    def _draft_vocab_changed(self) -> None:
        self._rows = self._folded_rows = None

    def vocab_logits(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., H] final-normed -> fp32 logits [..., Vd] over the draft vocabulary (the training path)."""
        if self.d2t is None:
            return self.target.logits(x.to(self.target.dtype))  # [..., V]
        return F.linear(x.to(self.target.dtype), self.lm_head_rows()).float()  # [..., Vd]

    def block_logits(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., H] (forward_block's) -> logits [..., Vd] through the final norm and the target LM head's rows of
        the draft vocabulary: in the LM head's dtype on the invariant path (grow_tree reads them as fp32: no launch for
        an fp32 copy), fp32 on the stock one."""
        if path_for(self.invariant) is KernelPath.INVARIANT:
            w, g = self.logit_rows()  # [Vd, H], the final norm's weight or FOLDED
            x2d = x.reshape(-1, x.shape[-1]).to(w.dtype).contiguous()  # [M, H]
            return proj.linear(x2d, w, norm_weight=g, eps=self.args.norm_eps).view(*x.shape[:-1], -1)  # [..., Vd]
        return self.vocab_logits(self.norm(x))  # [..., Vd]

    def dep_bias(self, parents: torch.Tensor) -> torch.Tensor:
        """parents [...] target ids -> the dependency term [..., Vd] fp32 of the rows that continue them."""
        z = draft_linear(self.dep_in, self.invariant, self.embed(parents))  # [..., r]
        return draft_linear(self.dep_out, self.invariant, z).float()  # [..., Vd]

    # ---- training -----------------------------------------------------------------------------------------
    def forward_dense(self, tokens: torch.Tensor, feature: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        """tokens [B, T], feature [B, T, F] (target_feature), anchors [B, A] positions (>= 1; the block of
        anchor a reads the context p < a, its root is tokens[a]) -> logits [B, A, K-1, Vd] fp32 of block rows
        1..K-1 (row j predicts tokens[a + j]), the dependency term taken with the true parent tokens[a + j - 1].
        Blocks running past T read the last token as their parents (their rows are out of the loss)."""
        self.check_unfolded("trained")
        B, T = tokens.shape
        A, K, H = anchors.shape[1], self.block_size, self.args.dim
        dev = tokens.device
        if self._inv_freq.device != dev:
            self._inv_freq = self._inv_freq.to(dev)
        j = torch.arange(K, device=dev)  # [K]
        pos_b = (anchors[:, :, None] + j).reshape(B, A * K)  # [B, A*K]
        pos_c = torch.arange(T, device=dev).expand(B, T)  # [B, T]
        roots = tokens.gather(1, anchors)  # [B, A]
        x = torch.cat([self.embed(roots)[:, :, None], self.mask_embedding.expand(B, A, K - 1, H)], dim=2)
        x = x.reshape(B, A * K, H)  # [B, A*K, H]
        c = rmsnorm_ref(self.fc(feature.to(self.dtype)), self.hidden_norm.weight, self.args.norm_eps)  # [B, T, H]
        # a block row sees the context before its anchor and its own block
        blk = torch.arange(A, device=dev).repeat_interleave(K)  # [A*K]
        see_ctx = pos_c[:, None, :] < anchors.repeat_interleave(K, dim=1)[:, :, None]  # [B, A*K, T]
        see_blk = (blk[:, None] == blk[None, :]).expand(B, A * K, A * K)  # [B, A*K, A*K]
        mask = torch.cat([see_ctx, see_blk], dim=2)[:, None]  # [B, 1, A*K, T + A*K]
        for layer in self.layers:
            x = self._layer_dense(layer, x, c, pos_b, pos_c, mask)  # [B, A*K, H]
        x = x.view(B, A, K, H)[:, :, 1:]  # [B, A, K-1, H]
        logits = self.vocab_logits(rmsnorm_ref(x, self.norm.weight, self.args.norm_eps))  # [B, A, K-1, Vd]
        parent_at = (anchors[:, :, None] + j[:-1]).clamp(max=T - 1)  # [B, A, K-1]
        parents = tokens.gather(1, parent_at.view(B, -1)).view(B, A, K - 1)  # [B, A, K-1] target ids
        return logits + self.dep_out(self.dep_in(self.embed(parents))).float()  # [B, A, K-1, Vd]

    def _layer_dense(self, layer: DraftLayer, x, c, pos_b, pos_c, mask) -> torch.Tensor:
        """One layer over the blocks' rows x [B, Q, H] and the context c [B, T, H] (normed), dense attention."""
        attn = layer.self_attn
        Hq, Hkv, D = attn.n_heads, attn.n_kv_heads, attn.head_dim
        a = rmsnorm_ref(x, layer.input_layernorm.weight, layer.input_layernorm.eps)  # [B, Q, H]
        q, kb, vb = attn.qkv_proj(a).split([Hq * D, Hkv * D, Hkv * D], dim=-1)
        w, b = attn.qkv_proj.weight[Hq * D:], None if attn.qkv_proj.bias is None else attn.qkv_proj.bias[Hq * D:]
        kc, vc = F.linear(c, w, b).split([Hkv * D, Hkv * D], dim=-1)  # [B, T, Hkv*D] each
        q = rope_dense(q, pos_b, self._inv_freq, Hq)  # [B, Hq, Q, D]
        k = torch.cat([rope_dense(kc, pos_c, self._inv_freq, Hkv), rope_dense(kb, pos_b, self._inv_freq, Hkv)], 2)
        v = torch.cat([vc, vb], dim=1).unflatten(-1, (Hkv, D)).transpose(1, 2)  # [B, Hkv, T + Q, D]
        G = Hq // Hkv
        with sdpa_kernel(SDPA_BACKENDS):  # no cuDNN: a plan per new length (models/ttt_attention.py)
            o = F.scaled_dot_product_attention(q, k.repeat_interleave(G, 1), v.repeat_interleave(G, 1), attn_mask=mask)
        h = attn.o_proj(o.transpose(1, 2).flatten(2))  # [B, Q, H]
        post = layer.post_attention_layernorm
        h, residual = rmsnorm_ref(h, post.weight, post.eps, residual=x)  # [B, Q, H] each
        return layer.mlp.down_proj(silu_and_mul_ref(layer.mlp.gate_up_proj(h))) + residual  # [B, Q, H]
