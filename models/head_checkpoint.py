"""Draft head checkpoints: config.json checks, new heads, load and save in the public EAGLE / EAGLE-3 layout.

The layouts are matched against SafeAILab/EAGLE `eagle/model/cnets1.py` (EAGLE-1) and `cnets.py` (EAGLE-3),
SGLang `python/sglang/srt/models/llama_eagle.py` / `llama_eagle3.py` and SpecForge
`specforge/modeling/draft/llama3_eagle.py`, so a head trained here can be served elsewhere and public heads
load here. Tensor names are the public ones with q/k/v and gate/up split (eaglet fuses them into `qkv_proj` /
`gate_up_proj` in memory, as the target does):

    EAGLE-1      fc.{weight,bias}, layers.{i}.self_attn.{q,k,v,o}_proj.weight,
                 layers.{i}.mlp.{gate,up,down}_proj.weight, layers.{i}.post_attention_layernorm.weight,
                 layers.{i>0}.input_layernorm.weight (+ embed_tokens.weight)
    EAGLE-3      fc.weight, midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight,
                 midlayer.self_attn.{q,k,v,o}_proj.weight, midlayer.mlp.{gate,up,down}_proj.weight, norm.weight,
                 lm_head.weight, d2t [draft_vocab] int64, t2d [vocab] bool (+ embed_tokens.weight)
    multi-layer  layers.{i}.fc.{weight,bias}, layers.{i}.self_attn..., layers.{i}.mlp...,
                 layers.{i}.post_attention_layernorm.weight
    block        fc.weight, hidden_norm.weight, layers.{i}..., norm.weight, mask_embedding, dep_in.weight,
                 dep_out.weight [draft_vocab, r], and d2t / t2d as EAGLE-3's when draft_vocab < vocab (eaglet's own)

Heads with a draft vocabulary (models/eagle.py's `DraftVocab`: EAGLE-3, block) write `draft_vocab_size` in config.json
and their map as d2t / t2d; a block config.json without the key (written before it) is a full-vocabulary drafter.

Loading reads config.json plus safetensors or `pytorch_model.bin` (public EAGLE files; only ever through
`torch.load(..., weights_only=True)`) and checks the config and every tensor against the target before a
weight is copied; saving writes config.json + model.safetensors.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from eaglet.models.block_head import BlockHead
from eaglet.models.checkpoint import (
    SUPPORTED_ARCHITECTURES,
    CheckpointError,
    CheckpointNotFoundError,
    _safetensors_files,
    attention_defaults,
    save_hf_checkpoint,
)
from eaglet.models.eagle import HEAD_CLASSES as EAGLE_HEADS
from eaglet.models.eagle import DraftHead, DraftVocab, Eagle3Head
from eaglet.models.llama import ModelArgs, Transformer

HEAD_CLASSES: dict[str, type[DraftHead]] = {**EAGLE_HEADS, BlockHead.KIND: BlockHead}
KINDS = tuple(HEAD_CLASSES)
_BY_ARCHITECTURE = {c.ARCHITECTURE: c for c in HEAD_CLASSES.values()}


# ----------------------------------------------------------------------------------------------------
# Config and tensor names


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
    # A head has its own RoPE: public EAGLE-3 configs often omit rope_theta (LlamaConfig's 10000 then),
    # whatever the target uses. Draft positions equal target positions, the frequencies need not.
    cfg = dict(raw, **attention_defaults(raw))
    cfg.pop("rope_parameters", None)  # folded into rope_theta/rope_scaling above
    cfg["max_position_embeddings"] = cfg.get("max_position_embeddings") or 2048
    cfg["attention_bias"] = bool(cfg.get("attention_bias", False))
    return cfg


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
        return Eagle3Head if config.get("draft_vocab_size") is not None else HEAD_CLASSES["eagle1"]
    raise CheckpointError(f"{source}: unknown draft head architecture {archs}; supported: "
                          f"{sorted(_BY_ARCHITECTURE)}, or a target architecture such as LlamaForCausalLM "
                          f"(EAGLE-1, or EAGLE-3 when the config has draft_vocab_size)")


def new_draft_head(kind: str, target: Transformer, num_layers: int | None = None,
                   draft_vocab_size: int | None = None, dtype: torch.dtype | None = None, device=None,
                   **config) -> DraftHead:
    """A randomly initialised head sized from the target's ModelArgs (hidden size, heads, head_dim,
    intermediate size, RoPE). num_layers: EAGLE-1 1 (public), EAGLE-3 1, multi-layer S (required).
    draft_vocab_size: EAGLE-3 and block heads (default: the full vocabulary; set the map with `set_draft_vocab`).
    `config` overrides config.json keys, e.g. intermediate_size=..., bias=False."""
    if kind not in HEAD_CLASSES:
        raise ValueError(f"unknown draft head kind {kind!r}; choose one of {KINDS}")
    if kind == "multi_layer" and num_layers is None:
        raise ValueError("a multi_layer head needs num_layers (one layer per draft step, e.g. the tree's steps)")
    cls, t = HEAD_CLASSES[kind], target.args
    if not issubclass(cls, DraftVocab) and draft_vocab_size not in (None, t.vocab_size):
        raise ValueError(f"draft_vocab_size={draft_vocab_size}: only EAGLE-3 and block heads have a reduced "
                         f"vocabulary ({kind} heads use the target's lm_head over all {t.vocab_size} tokens)")
    raw = dict(
        architectures=[cls.ARCHITECTURE], model_type="llama", hidden_size=t.dim, intermediate_size=t.intermediate_size,
        num_hidden_layers=num_layers or 1, num_attention_heads=t.n_heads, num_key_value_heads=t.n_kv_heads,
        head_dim=t.head_dim, rms_norm_eps=t.norm_eps, rope_theta=t.rope_theta, rope_scaling=t.rope_scaling,
        max_position_embeddings=t.max_seq_len, vocab_size=t.vocab_size, bias=cls.FC_BIAS,
    )
    if issubclass(cls, DraftVocab):
        raw["draft_vocab_size"] = draft_vocab_size or t.vocab_size
    raw.update(config)
    cfg = _normalise_head_config(raw, "new_draft_head")
    cfg["bias"] = bool(raw["bias"])
    with torch.device(device if device is not None else target.device):
        head = cls(cfg, target)
    return head.to(dtype or target.dtype)


# ----------------------------------------------------------------------------------------------------
# Save


def head_config(head: DraftHead, dtype: torch.dtype | None = None) -> dict:
    """The config.json a head is saved with (its loaded config, refreshed from the head)."""
    a = head.args
    cfg = dict(head.config)
    cfg.update(
        architectures=[head.ARCHITECTURE], model_type="llama", hidden_size=a.dim,
        intermediate_size=a.intermediate_size, num_hidden_layers=a.n_layers, num_attention_heads=a.n_heads,
        num_key_value_heads=a.n_kv_heads, head_dim=a.head_dim, hidden_act="silu", rms_norm_eps=a.norm_eps,
        rope_theta=a.rope_theta, rope_scaling=a.rope_scaling, max_position_embeddings=a.max_seq_len,
        vocab_size=a.vocab_size, attention_bias=a.attention_bias, bias=head.config["bias"],
        # tied heads would make save_hf_checkpoint drop lm_head.weight; no head ties its own
        tie_word_embeddings=False, torch_dtype=str(dtype or head.dtype).removeprefix("torch."),
    )
    if isinstance(head, DraftVocab):
        cfg["draft_vocab_size"] = head.draft_vocab_size
    if isinstance(head, Eagle3Head):
        if head.fc.in_features != 3 * a.dim:
            cfg["target_hidden_size"] = head.fc.in_features // 3
    return cfg


def public_state_dict(head: DraftHead, dtype: torch.dtype | None = None, include_embedding: bool = False) -> dict:
    """The head's weights under the public names (q/k/v, gate/up split), floats cast to `dtype`;
    `include_embedding` adds the (shared) `embed_tokens.weight`, as public EAGLE-1 files carry it."""
    sd = split_fused_names({k: v.detach() for k, v in head.state_dict().items()}, head.args)
    if include_embedding and "embed_tokens.weight" not in sd:
        sd["embed_tokens.weight"] = head.target.model.embed_tokens.weight.detach()
    return {k: v.to(dtype) if dtype is not None and v.is_floating_point() else v for k, v in sd.items()}


def save_draft_head(head: DraftHead, directory: str | Path, dtype: torch.dtype | None = None,
                    include_embedding: bool | None = None) -> Path:
    """Write config.json + model.safetensors in the public layout (dtype: the head's by default).
    include_embedding defaults to True for EAGLE-1 (EAGLE's loader wants `embed_tokens.weight`)."""
    if include_embedding is None:
        include_embedding = head.KIND == "eagle1"
    dtype = dtype or head.dtype  # the shared embedding too, whatever the target's dtype
    return save_hf_checkpoint(directory, head_config(head, dtype), public_state_dict(head, dtype, include_embedding))


# ----------------------------------------------------------------------------------------------------
# Load


def load_draft_head(path: str | Path, target: Transformer, dtype: torch.dtype | None = None, device=None,
                    kind: str | None = None) -> DraftHead:
    """Load a head directory (config.json + safetensors or pytorch_model.bin) for `target`, whatever kind its
    config says (EAGLE-1, EAGLE-3, multi-layer), or refuse one not of `kind` when given; dtype and device
    default to the target's."""
    raw, sd, source = _read_head_dir(path)
    cls = head_class(raw, source)
    if kind is not None and cls.KIND != kind:
        raise ValueError(f"{source} holds a draft head of kind {cls.KIND!r} ({cls.__name__}), not {kind!r}; "
                         f"load it without kind= to take whatever it holds")
    return _from_state_dict(cls, raw, sd, target, dtype or target.dtype,
                            device if device is not None else target.device, source)


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


def _config_from(cls: type[DraftHead], raw: dict, sd: dict, source) -> dict:
    cfg = _normalise_head_config(raw, source)
    if cls is Eagle3Head:
        # EAGLE's cnets.py never gives the EAGLE-3 fc a bias whatever `bias` says; the weights decide.
        cfg["bias"] = "fc.bias" in sd
    else:
        cfg["bias"] = bool(raw.get("bias", cls.FC_BIAS))
    return cfg


def _optional_tensors(head: DraftHead) -> set[str]:
    # A full-vocabulary EAGLE-3 head needs no map (EAGLE deletes d2t/t2d then); a full block head has none.
    full = isinstance(head, DraftVocab) and head.has_draft_map and head.draft_vocab_size == head.target.args.vocab_size
    return {"d2t", "t2d"} if full else set()


def _check_vocab_map(head: DraftVocab, sd: dict, source) -> None:
    """A checkpoint's d2t / t2d (EAGLE-3, block) against the target's vocabulary and the head's draft vocabulary."""
    V, Vd = head.target.args.vocab_size, head.draft_vocab_size
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


def _check_embedding(head: DraftHead, weight: torch.Tensor, source) -> None:
    """A checkpoint's copy of the shared embedding: its shape must be the target's; values are not used
    (the target's are), but a different table means the head was trained for another target."""
    tw = head.target.model.embed_tokens.weight
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
                      stacklevel=4)


def _from_state_dict(cls: type[DraftHead], raw, sd, target, dtype, device, source) -> DraftHead:
    config = _config_from(cls, raw, sd, source)
    with torch.device("meta"):
        head = cls(config, target)
    sd = {k: v for k, v in sd.items() if not k.endswith("rotary_emb.inv_freq")}  # derived from the config
    expected = {k: tuple(v.shape) for k, v in public_state_dict(head).items()}
    if "embed_tokens.weight" in sd and "embed_tokens.weight" not in expected:
        _check_embedding(head, sd.pop("embed_tokens.weight"), source)
    if isinstance(head, DraftVocab) and head.has_draft_map:
        _check_vocab_map(head, sd, source)
    optional = _optional_tensors(head)
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
    if isinstance(head, DraftVocab) and optional - sd.keys():  # a full-vocabulary EAGLE-3 head without its map
        head.d2t.zero_()
        head.t2d.fill_(True)
    return head.eval()


# ----------------------------------------------------------------------------------------------------
# Command line


def restrict_vocab(src: str | Path, target: Transformer, vocab_of: str | Path, out: str | Path,
                   dtype: torch.dtype = torch.bfloat16) -> Path:
    """The head at `src` over the draft vocabulary of the head at `vocab_of` (its d2t), written to `out`
    (`with_draft_vocab`). Over a subset of its own vocabulary this is exact for a block drafter: its logits are the
    target LM head's rows and dep_out has a row per id, so its logits over those ids are the trained ones; ids new to
    it would get a fresh head's rows. How heads/smollm2_135m_block was made from the trained drafter."""
    head = load_draft_head(src, target, torch.float32, "cpu")
    if not isinstance(head, DraftVocab):
        raise ValueError(f"{src} holds a {head.KIND} head, which has no draft vocabulary")
    _, sd, source = _read_head_dir(vocab_of)
    if "d2t" not in sd:
        raise ValueError(f"{source} has no draft vocabulary (no d2t): take it from an EAGLE-3 head or a block drafter "
                         f"with draft_vocab_size set")
    d2t = sd["d2t"].long()  # [Vd] target id = draft id + d2t
    return save_draft_head(head.with_draft_vocab(torch.arange(d2t.numel()) + d2t), out, dtype=dtype)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m eaglet.models.head_checkpoint")
    sub = parser.add_subparsers(dest="cmd", required=True)
    rv = sub.add_parser("restrict-vocab", help="a head over another head's draft vocabulary (bf16 safetensors)")
    rv.add_argument("src", help="the head directory to restrict")
    rv.add_argument("--target", required=True, help="the target's registry name, e.g. smollm2_135m (only its shape)")
    rv.add_argument("--vocab-of", required=True, help="a head directory whose d2t is the draft vocabulary to take")
    rv.add_argument("--out", required=True, help="the new head directory")
    args = parser.parse_args(argv)
    with torch.device("meta"):  # the target's shape only: no weights are made or read
        target = Transformer(ModelArgs.from_name(args.target))
    print(restrict_vocab(args.src, target, args.vocab_of, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
