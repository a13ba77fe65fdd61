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
- `DraftVocab`: a reduced draft vocabulary (d2t / t2d, `set_draft_vocab`, `with_draft_vocab`), mixed into
  `Eagle3Head` and the block drafter (models/block_head.py).

The embedding (and for EAGLE-1 / multi-layer the lm_head) is the target's, shared and frozen: the head
keeps a plain reference to the target, so `head.parameters()`, `head.state_dict()` and `head.to()` only
touch the head's own weights.

Checkpoints (config.json checks, `new_draft_head`, `load_draft_head`, `save_draft_head`, the public EAGLE /
EAGLE-3 layout) are in models/head_checkpoint.py, the decoder layers (`DraftLayer`, `FcLayer`) in
models/draft_layers.py.

Training (`eaglet.training`) runs `forward_dense`: the same weights and math with attention computed densely by
models/ttt_attention.py and the kernels' torch references, because the inference path writes K/V into the
paged pool (no gradient reaches k/v) and its Triton kernels have no backward.
"""

from __future__ import annotations

import torch
from torch import nn

from eaglet.kernels import projection as proj
from eaglet.kernels.rmsnorm import rmsnorm_ref
from eaglet.kernels.tree_attention import SUPPORTED_HEAD_DIMS
from eaglet.models.draft_layers import DraftLayer, FcLayer, draft_linear
from eaglet.models.kernel_paths import KernelPath, path_for
from eaglet.models.kv_cache import ForwardBatch, KVCache
from eaglet.models.llama import ModelArgs, RMSNorm, Transformer, concat_captured, rope_inv_freq
from eaglet.models.ttt_attention import DenseKV, TTTPattern

ARCH_EAGLE1 = "LlamaForCausalLMEagle"  # SGLang's name; EAGLE's own configs say LlamaForCausalLM
ARCH_EAGLE3 = "LlamaForCausalLMEagle3"
ARCH_MULTI_LAYER = "EagletMultiLayerEagle"
KINDS = ("eagle1", "eagle3", "multi_layer")


def _draft_args(cfg: dict) -> ModelArgs:
    """ModelArgs of the draft decoder layer(s) (a Llama layer) from a normalised head config."""
    return ModelArgs(
        family="llama", vocab_size=cfg["vocab_size"], dim=cfg["hidden_size"], n_layers=cfg["num_hidden_layers"],
        n_heads=cfg["num_attention_heads"], n_kv_heads=cfg["num_key_value_heads"], head_dim=cfg["head_dim"],
        intermediate_size=cfg["intermediate_size"], norm_eps=cfg["rms_norm_eps"], rope_theta=cfg["rope_theta"],
        rope_scaling=cfg["rope_scaling"], max_seq_len=cfg["max_position_embeddings"],
        attention_bias=cfg["attention_bias"],
    )


class DraftHead(nn.Module):
    """Common API of the draft heads (see the module docstring for the three kinds)."""

    KIND: str
    ARCHITECTURE: str
    FC_BIAS: bool  # default of config["bias"] (EAGLE: fc has a bias unless the config says otherwise)
    # Whether a draft step's KV layer holds the tokens drafted at earlier steps (their ancestors):
    # true when one layer runs every step; the engine's draft mask follows it.
    DRAFT_ANCESTORS_CACHED = True

    def __init__(self, config: dict, target: Transformer):
        """`config`: a normalised HF-style config dict (models/head_checkpoint.py builds and loads them)."""
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
        self.invariant = False  # set_invariant

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

    def set_invariant(self, invariant: bool) -> "DraftHead":
        """Run the target's invariant kernels (kernels/projection.py, the invariant tree attention) in every layer
        and projection of the head; engine/run.py follows the target's `invariant`. Not for the draft's numerics,
        which decide no emitted token (the verify does), but so that one set of kernels serves target and head
        (models/kernel_paths.py). The training forward (`forward_dense`) is unaffected."""
        self.invariant = invariant = bool(invariant)
        for m in self.modules():
            if isinstance(m, DraftLayer):
                m.invariant = invariant
        return self

    # ---- forward ------------------------------------------------------------------------------
    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch,
                kv: KVCache, step: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens [B, T] (token at p+1), hidden [B, T, F] (feature at p), positions [B, T] (= p) ->
        (hidden_out [B, T, H], logits [B, T, draft_vocab] in the head's dtype: its one reader, `topk_logprobs`,
        takes them as fp32, so a bf16 run writes no fp32 copy, one launch a head step; `forward_dense`'s are fp32).

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

    def target_logits(self, x: torch.Tensor, float32: bool = True) -> torch.Tensor:
        """x [B, T, H] -> logits [B, T, V] through the target's frozen lm_head, fp32 (float32=False: the target's
        dtype, for `forward`)."""
        return self.target.logits(x.to(self.target.dtype), float32=float32)

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
        x = draft_linear(self.fc, self.invariant, torch.cat([self.embed(tokens), hidden], dim=-1))  # [B, T, H]
        for layer in self.layers:
            x = layer(x, positions, self._inv_freq, batch, kv)  # [B, T, H]
        return x, self.target_logits(x, float32=False)

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
                                lambda layer, pair: layer(pair, positions, self._inv_freq, batch, kv), float32=False)

    def _forward_dense(self, tokens, hidden, positions, attn_mask, cache):
        # unrolled step 0 is the extend (over the target's features), as the engine's draft-extend
        step = attn_mask.step if isinstance(attn_mask, TTTPattern) and attn_mask.step > 0 else None
        return self._run_layers(tokens, hidden, step, lambda layer, pair: layer.forward_dense(
            pair, positions, self._inv_freq, attn_mask, cache))

    def _run_layers(self, tokens, hidden, step, run_layer, float32: bool = True):
        """Run the layers of `step` (None = extend) as run_layer(layer, pair [B, T, 2H]) -> [B, T, H]
        -> (hidden_out [B, T, H], logits [B, T, V], fp32 unless not float32) of layer 0 (extend) or of the step's
        layer."""
        pair = torch.cat([self.embed(tokens), hidden], dim=-1)  # [B, T, 2H]
        # Extend: every layer caches the accepted sequence for its own later steps; the output is layer 0's,
        # the step-0 prediction (the one made from the target's own features).
        run = range(len(self.layers)) if step is None else (min(step, len(self.layers) - 1),)
        outs = [run_layer(self.layers[i], pair) for i in run]  # [B, T, H] each
        return outs[0], self.target_logits(outs[0], float32)


def _draft_vocab_loaded(module, incompatible_keys) -> None:
    """load_state_dict's post-hook of DraftVocab heads (a module-level function: heads stay picklable)."""
    module._draft_vocab_changed()


class DraftVocab:
    """A draft vocabulary for a DraftHead (mixed in before it): the head's logits cover Vd <= V target tokens, draft
    id i being target id i + d2t[i] (EAGLE-3's design, which the block drafter shares). Buffers `d2t` [Vd] int64 and
    `t2d` [V] bool (target id is in the draft vocabulary), checkpointed under the public EAGLE-3 names; a new head's
    map is the first Vd target ids until `set_draft_vocab`.

    `VOCAB_WEIGHTS`: the head's weights with one row per draft id (`with_draft_vocab` carries them over by token).
    `MAP_AT_FULL_VOCAB`: whether a head over the whole vocabulary still has d2t / t2d (EAGLE-3's layout always has
    them, EAGLE deletes them only on load) or none (the block drafter: no map, today's full-vocabulary head)."""

    VOCAB_WEIGHTS: tuple[str, ...]
    MAP_AT_FULL_VOCAB: bool

    def _init_draft_vocab(self, config: dict) -> int:
        """Validate config["draft_vocab_size"] (None: the target's vocabulary), register the map -> Vd."""
        V = self.target.args.vocab_size
        Vd = config.get("draft_vocab_size") or V
        if not 0 < Vd <= V:
            raise ValueError(f"{self.KIND} draft_vocab_size={Vd} must be in [1, {V}] (the target's vocabulary)")
        if Vd < V or self.MAP_AT_FULL_VOCAB:
            self.register_buffer("d2t", torch.zeros(Vd, dtype=torch.int64))  # target id = draft id + d2t[draft id]
            self.register_buffer("t2d", torch.arange(V) < Vd)  # [V] target id is in the draft vocabulary
        else:  # None buffers: not in the state dict, so a full-vocabulary head's checkpoint has no map
            self.register_buffer("d2t", None)
            self.register_buffer("t2d", None)
        # a map loaded into the buffers (load_state_dict copies in place) changes what is derived from it
        self.register_load_state_dict_post_hook(_draft_vocab_loaded)
        return Vd

    @property
    def has_draft_map(self) -> bool:
        return self.d2t is not None

    @property
    def draft_vocab_size(self) -> int:
        return self.d2t.numel() if self.d2t is not None else self.target.args.vocab_size

    @property
    def d2t_offsets(self) -> torch.Tensor | None:
        return self.d2t

    def _draft_vocab_changed(self) -> None:
        """Hook: the map changed (set_draft_vocab, a loaded state dict); heads that derive tensors from it drop them."""

    def set_draft_vocab(self, target_ids: torch.Tensor) -> None:
        """Make the draft vocabulary the given distinct target ids [draft_vocab] (sorted here, as EAGLE-3's
        and SpecForge's frequency-based maps are), e.g. the most frequent tokens of the training data."""
        if self.d2t is None:
            raise ValueError(f"this {self.KIND} head covers the target's whole vocabulary and has no map: build it "
                             f"with draft_vocab_size < {self.target.args.vocab_size}")
        ids = torch.unique(target_ids.long())  # [Vd] sorted
        if ids.numel() != self.draft_vocab_size or int(ids[0]) < 0 or int(ids[-1]) >= self.t2d.numel():
            raise ValueError(f"need {self.draft_vocab_size} distinct target ids in [0, {self.t2d.numel()}), got "
                             f"{ids.numel()} distinct in [{int(ids[0])}, {int(ids[-1])}]")
        self.d2t.copy_(ids - torch.arange(ids.numel(), device=ids.device))
        self.t2d.zero_()
        self.t2d[ids.to(self.t2d.device)] = True
        self._draft_vocab_changed()

    def with_draft_vocab(self, target_ids: torch.Tensor):
        """A copy of this head over another draft vocabulary (the given distinct target ids), e.g. a trained
        8,192-token head grown to 32,768 tokens: every weight is copied except `VOCAB_WEIGHTS`, whose rows carry
        over for the tokens in both vocabularies; the rows of tokens new to it keep a fresh head's init."""
        ids = torch.unique(target_ids.long())  # [Vd'] sorted
        with torch.device(self.device):
            twin = type(self)({**self.config, "draft_vocab_size": ids.numel()}, self.target)
        twin.to(self.get_parameter(self.VOCAB_WEIGHTS[0]).dtype)
        own = set(self.VOCAB_WEIGHTS) | ({"d2t", "t2d"} if twin.has_draft_map else set())
        res = twin.load_state_dict({k: v for k, v in self.state_dict().items() if k not in own}, strict=False)
        assert set(res.missing_keys) == own and not res.unexpected_keys, res  # every other weight copied
        if twin.has_draft_map:
            twin.set_draft_vocab(ids)
        n, dev = self.draft_vocab_size, self.device
        old_draft = torch.full((self.target.args.vocab_size,), -1, dtype=torch.long, device=dev)  # [V] -> old draft id
        old_draft[self.to_target_ids(torch.arange(n, device=dev))] = torch.arange(n, device=dev)
        src = old_draft[ids.to(dev)]  # [Vd'] this head's draft id of each new draft id, or -1
        keep = src >= 0
        with torch.no_grad():
            for name in self.VOCAB_WEIGHTS:
                twin.get_parameter(name)[keep] = self.get_parameter(name)[src[keep]]
        return twin.train(self.training)


class Eagle3Head(DraftVocab, DraftHead):
    """EAGLE-3: fc over three target features, a midlayer over [embed, hidden], own norm + reduced-vocab lm_head."""

    KIND, ARCHITECTURE, FC_BIAS = "eagle3", ARCH_EAGLE3, False
    VOCAB_WEIGHTS, MAP_AT_FULL_VOCAB = ("lm_head.weight",), True

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
        Vd = self._init_draft_vocab(config)
        aux = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        self.aux_layer_ids = tuple(aux) if aux else None
        self.capture_layers(t.n_layers)  # validates the choice against this target now, not at the first forward
        self.fc = nn.Linear(3 * Ht, H, bias=config["bias"])
        self.midlayer = DraftLayer(a, 0, input_norm=True, hidden_norm=True)
        self.norm = RMSNorm(H, a.norm_eps)
        self.lm_head = nn.Linear(H, Vd, bias=False)
        if H != Ht:  # the target's embedding has the wrong width: the head brings its own (as SGLang does)
            self.embed_tokens = nn.Embedding(t.vocab_size, H)

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
        return concat_captured(captured)  # [B, T, 3*Ht] low, mid, high

    def _forward(self, tokens, hidden, positions, batch, kv, step):
        if hidden.shape[-1] == self.fc.in_features:  # target features: project; own output: already H-wide
            hidden = draft_linear(self.fc, self.invariant, hidden)  # [B, T, H]
        x = self.midlayer(hidden, positions, self._inv_freq, batch, kv, embeds=self.embed(tokens))  # [B, T, H]
        # x (pre-norm) is what the next draft step takes as hidden, as in EAGLE's topK_genrate and SGLang
        if path_for(self.invariant) is KernelPath.INVARIANT:  # the norm inside the LM head's projection
            B, T, H = x.shape
            logits = proj.linear(x.reshape(B * T, H), self.lm_head.weight, norm_weight=self.norm.weight,
                                 eps=self.norm.eps).view(B, T, -1)  # [B, T, draft_vocab]
            return x, logits
        return x, self.lm_head(self.norm(x))

    def _forward_dense(self, tokens, hidden, positions, attn_mask, cache):
        if hidden.shape[-1] == self.fc.in_features:
            hidden = self.fc(hidden)  # [B, T, H]
        x = self.midlayer.forward_dense(hidden, positions, self._inv_freq, attn_mask, cache,
                                        embeds=self.embed(tokens))  # [B, T, H]
        return x, self.lm_head(rmsnorm_ref(x, self.norm.weight, self.norm.eps)).float()

HEAD_CLASSES: dict[str, type[DraftHead]] = {c.KIND: c for c in (Eagle1Head, Eagle3Head, MultiLayerHead)}
