"""Checkpoint and tokenizer loading for the target family (Llama 2/3, Mistral, Qwen2, Qwen3, SmolLM2).

`load_checkpoint(path)` returns `(hf_config, state_dict)` in Hugging Face form whatever the source:

- a directory with `config.json` and safetensors (`model.safetensors`, or shards listed by
  `model.safetensors.index.json`, or any `*.safetensors`). Never pickle: `.bin`/`.pt` files are refused.
- a `.gguf` file (or a directory holding exactly one `.gguf` and no `config.json`), read by
  models/gguf_file.py (dequantised as transformers does, llama.cpp names mapped to HF names), which imports
  this module's checks; hence the imports of it inside the functions here.

The returned `hf_config` always holds the keys the model needs, filled with transformers' defaults
where the file leaves them out (see `normalise_config`); transformers >= 5 writes `rope_parameters`
instead of `rope_theta`/`rope_scaling`, both forms are read and `rope_theta`/`rope_scaling` are set.
The state dict holds exactly the family's tensors (`lm_head.weight` only when embeddings are not tied),
each checked for shape against the config.

The GPU machine has no `gguf` package: convert a GGUF once on a machine that has it,
`python -m eaglet.models.checkpoint convert model.gguf out_dir` (config, safetensors and tokenizer),
and load `out_dir` there.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import warnings
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

# HF `architectures[0]` and `model_type` -> family tag (the tag `eaglet.models.llama.ModelArgs` uses).
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
}

# Defaults of transformers' config classes for keys a config.json may omit.
_MAX_POSITIONS_DEFAULT = {"llama": 2048, "mistral": 131072, "qwen2": 32768, "qwen3": 32768}



class CheckpointError(ValueError):
    """A checkpoint or tokenizer cannot be loaded; the message names the path and the fix."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """The path does not exist (also a FileNotFoundError, for callers that catch that)."""


def supported_list() -> str:
    return ", ".join(k for k in SUPPORTED_ARCHITECTURES if k[0].isupper())


def model_family(hf_config: dict, source: str | Path = "config") -> str:
    """Family tag ('llama', 'mistral', 'qwen2', 'qwen3') of an HF config dict; CheckpointError if unsupported."""
    archs = hf_config.get("architectures") or []
    model_type = hf_config.get("model_type")
    for name in [*archs, model_type]:
        if name in SUPPORTED_ARCHITECTURES:
            return SUPPORTED_ARCHITECTURES[name]
    raise CheckpointError(
        f"{source}: unsupported architecture {archs or None} (model_type {model_type!r}); "
        f"supported: {supported_list()} (model_type llama, mistral, qwen2, qwen3)"
    )


def _rope_from_config(cfg: dict) -> tuple[float, dict | None]:
    # transformers < 5 writes rope_theta + rope_scaling; >= 5 writes rope_parameters {rope_theta, rope_type, ...}.
    params = cfg.get("rope_parameters") or {}
    theta = float(cfg.get("rope_theta") or params.get("rope_theta") or 10000.0)
    scaling = cfg.get("rope_scaling") or {k: v for k, v in params.items() if k != "rope_theta"}
    rope_type = scaling.get("rope_type", scaling.get("type")) if scaling else None
    if rope_type in (None, "default"):
        return theta, None
    return theta, {**scaling, "rope_type": rope_type}


def attention_defaults(cfg: dict) -> dict:
    """The attention and norm keys of a decoder config with transformers' defaults where omitted: KV heads, head_dim,
    rms_norm_eps, rope_theta and rope_scaling (a target's config.json and a draft head's share them)."""
    n_heads = cfg["num_attention_heads"]
    theta, scaling = _rope_from_config(cfg)
    return dict(num_key_value_heads=cfg.get("num_key_value_heads") or n_heads,
                head_dim=cfg.get("head_dim") or cfg["hidden_size"] // n_heads,
                rms_norm_eps=cfg.get("rms_norm_eps") or 1e-6, rope_theta=theta, rope_scaling=scaling)


def normalise_config(cfg: dict, source: str | Path) -> dict:
    """A copy of `cfg` whose model keys are all present (transformers' defaults where omitted)."""
    family = model_family(cfg, source)
    required = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
    absent = [k for k in required if cfg.get(k) is None]
    if absent:
        raise CheckpointError(f"{source}: config lacks {absent}; is it a complete Hugging Face config.json?")
    out = dict(cfg, **attention_defaults(cfg))
    out["max_position_embeddings"] = cfg.get("max_position_embeddings") or _MAX_POSITIONS_DEFAULT[family]
    out["tie_word_embeddings"] = bool(cfg.get("tie_word_embeddings", False))
    # Qwen2 always has q/k/v biases and its config has no switch for them.
    out["attention_bias"] = True if family == "qwen2" else bool(cfg.get("attention_bias", False))
    out["mlp_bias"] = bool(cfg.get("mlp_bias", False)) if family == "llama" else False
    out["bos_token_id"] = cfg.get("bos_token_id")
    out["eos_token_id"] = cfg.get("eos_token_id")
    if not out.get("architectures"):
        out["architectures"] = [next(k for k, v in SUPPORTED_ARCHITECTURES.items() if v == family)]
    out.setdefault("model_type", family)
    return out


def expected_shapes(hf_config: dict) -> dict[str, tuple[int, ...]]:
    """HF parameter name -> shape for a normalised config (as returned by `load_checkpoint`)."""
    family = model_family(hf_config)
    hidden, inter, vocab = hf_config["hidden_size"], hf_config["intermediate_size"], hf_config["vocab_size"]
    hd, nq, nkv = hf_config["head_dim"], hf_config["num_attention_heads"], hf_config["num_key_value_heads"]
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    if not hf_config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (vocab, hidden)
    qkv_out = {"q_proj": nq * hd, "k_proj": nkv * hd, "v_proj": nkv * hd}
    for i in range(hf_config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for proj, out in qkv_out.items():
            shapes[f"{p}self_attn.{proj}.weight"] = (out, hidden)
        shapes[f"{p}self_attn.o_proj.weight"] = (hidden, nq * hd)
        if hf_config["attention_bias"]:
            shapes.update({f"{p}self_attn.{proj}.bias": (out,) for proj, out in qkv_out.items()})
            if family != "qwen2":  # Llama/Qwen3's attention_bias also puts a bias on o_proj; Qwen2's never does
                shapes[f"{p}self_attn.o_proj.bias"] = (hidden,)
        if family == "qwen3":
            shapes[f"{p}self_attn.q_norm.weight"] = (hd,)
            shapes[f"{p}self_attn.k_norm.weight"] = (hd,)
        shapes[f"{p}mlp.gate_proj.weight"] = (inter, hidden)
        shapes[f"{p}mlp.up_proj.weight"] = (inter, hidden)
        shapes[f"{p}mlp.down_proj.weight"] = (hidden, inter)
        if hf_config["mlp_bias"]:
            mlp_out = (("gate", inter), ("up", inter), ("down", hidden))
            shapes.update({f"{p}mlp.{n}_proj.bias": (d,) for n, d in mlp_out})
        shapes[f"{p}input_layernorm.weight"] = (hidden,)
        shapes[f"{p}post_attention_layernorm.weight"] = (hidden,)
    return shapes


def check_tensors(hf_config: dict, state_dict: dict, source: str | Path) -> dict[str, torch.Tensor]:
    """Keep exactly the expected tensors; raise on missing ones or wrong shapes, warn on dropped extras."""
    shapes = expected_shapes(hf_config)
    missing = [k for k in shapes if k not in state_dict]
    if missing:
        raise CheckpointError(
            f"{source}: {len(missing)} of {len(shapes)} tensors the config needs are missing, e.g. {missing[:4]}; "
            f"a shard may be missing or incomplete, or config.json does not belong to these weights"
        )
    wrong = [f"{k} {tuple(state_dict[k].shape)} != {s}" for k, s in shapes.items() if tuple(state_dict[k].shape) != s]
    if wrong:
        raise CheckpointError(f"{source}: tensor shapes disagree with the config: {wrong[:4]}")
    # rotary inv_freq buffers (old checkpoints) are derived from the config; anything else is worth a warning.
    extra = [k for k in state_dict if k not in shapes and not k.endswith("rotary_emb.inv_freq")]
    if extra:
        warnings.warn(f"{source}: ignoring {len(extra)} tensors the {model_family(hf_config)} family does not use, "
                      f"e.g. {extra[:4]}", stacklevel=3)
    return {k: state_dict[k] for k in shapes}


def _cast(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    return t.to(dtype) if dtype is not None and t.is_floating_point() else t


# ----------------------------------------------------------------------------------------------------
# Hugging Face directory (config.json + safetensors)


def _safetensors_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index}: not a valid safetensors index ({e}); re-download it") from e
        files = sorted(set(weight_map.values()))
        absent = [f for f in files if not (directory / f).is_file()]
        if absent:
            keys = [k for k, f in weight_map.items() if f == absent[0]]
            raise CheckpointError(
                f"{directory}: shard(s) {absent} listed in {index.name} are missing (they hold e.g. {keys[:4]}); "
                f"download the missing shards"
            )
        return [directory / f for f in files]
    if (directory / "model.safetensors").is_file():
        return [directory / "model.safetensors"]
    return sorted(directory.glob("*.safetensors"))


def _load_hf_dir(directory: Path, dtype: torch.dtype | None) -> tuple[dict, dict[str, torch.Tensor]]:
    config_path = directory / "config.json"
    try:
        raw = json.loads(config_path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{config_path}: invalid JSON ({e}); re-download config.json") from e
    hf_config = normalise_config(raw, config_path)
    files = _safetensors_files(directory)
    if not files:
        pickled = sorted(p.name for p in directory.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
        hint = (f" Found {pickled}: pickled weights are not loaded (unsafe); convert them to safetensors "
                f"(e.g. transformers' save_pretrained(safe_serialization=True))." if pickled else "")
        raise CheckpointError(f"{directory}: config.json but no *.safetensors weights.{hint}")
    shapes = expected_shapes(hf_config)
    state_dict: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            with safe_open(f, framework="pt") as st:
                for key in st.keys():
                    if key in state_dict:
                        raise CheckpointError(f"{directory}: tensor {key} appears in more than one safetensors file "
                                              f"(second: {f.name}); remove stray files or add an index")
                    # Only load what the family uses: a stray large tensor costs no memory.
                    state_dict[key] = _cast(st.get_tensor(key), dtype) if key in shapes else torch.empty(0)
        except SafetensorError as e:
            raise CheckpointError(f"{f}: corrupt or truncated safetensors file ({e}); re-download it") from e
    return hf_config, check_tensors(hf_config, state_dict, directory)


# ----------------------------------------------------------------------------------------------------
# Public entry points


def _resolve(path: str | Path) -> tuple[str, Path]:
    """('gguf', file) or ('hf', directory) for a checkpoint path."""
    path = Path(path).expanduser()
    if not path.exists():
        raise CheckpointNotFoundError(f"{path}: no such file or directory; pass a model directory or a .gguf file")
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return "gguf", path
        if path.name == "config.json" or path.suffix == ".safetensors":
            return "hf", path.parent
        raise CheckpointError(
            f"{path}: not a checkpoint; pass a .gguf file or a directory with config.json + safetensors"
        )
    if (path / "config.json").is_file():
        return "hf", path
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return "gguf", ggufs[0]
    if ggufs:
        raise CheckpointError(f"{path}: holds several GGUF files {[g.name for g in ggufs]}; pass one of them")
    raise CheckpointError(f"{path}: no config.json (+ *.safetensors) and no .gguf file; "
                          f"pass a Hugging Face model directory or a GGUF file")


def read_config(path: str | Path) -> dict:
    """The normalised HF config of a checkpoint without its tensors (config.json, or a GGUF file's header): what
    a run needs to size the model and its KV pool before loading anything."""
    kind, where = _resolve(path)
    if kind == "gguf":
        from eaglet.models.gguf_file import gguf_config, open_gguf

        return gguf_config(where, open_gguf(where)[1])
    config_path = where / "config.json"
    try:
        return normalise_config(json.loads(config_path.read_text()), config_path)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{config_path}: invalid JSON ({e}); re-download config.json") from e


def load_checkpoint(path: str | Path, dtype: torch.dtype | None = None) -> tuple[dict, dict[str, torch.Tensor]]:
    """Load `(hf_config, state_dict)` from an HF directory or a GGUF file (see the module docstring).

    `dtype` casts the floating tensors; by default safetensors keep their stored dtype and dequantised
    GGUF tensors are float32.
    """
    kind, where = _resolve(path)
    if kind == "gguf":
        from eaglet.models.gguf_file import load_gguf

        return load_gguf(where, dtype)
    return _load_hf_dir(where, dtype)


def save_hf_checkpoint(directory: str | Path, hf_config: dict, state_dict: dict[str, torch.Tensor]) -> Path:
    """Write `config.json` + `model.safetensors` (the layout `load_checkpoint` and transformers read)."""
    directory = Path(directory).expanduser()
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in state_dict.items()}
    if hf_config.get("tie_word_embeddings"):
        tensors.pop("lm_head.weight", None)  # tied: safetensors refuses shared storage, and readers re-tie
    (directory / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})  # transformers requires "format"
    return directory


def _tokenizer_source(path: Path) -> tuple[Path, str | None]:
    """(directory, gguf_file or None) to pass to AutoTokenizer.from_pretrained."""
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return path.parent, path.name
        return path.parent, None
    if any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return path, None
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return path, ggufs[0].name
    return path, None  # let transformers say what is missing


def hub_kernels_first() -> None:
    """Import Hugging Face's `kernels` package, if installed, before transformers looks for it. transformers 5.25
    requires it and imports it when it reads a GGUF tokenizer or a model class; run from this repository's root
    (`python run_spec.py`, `python -m pytest`: the root is on sys.path) the bare name finds this repository's own
    kernels/ folder instead, and the import fails. Imported once with the root off sys.path, the package is the one
    sys.modules hands transformers; eaglet's kernels are `eaglet.kernels` either way."""
    if "kernels" in sys.modules:
        return
    root = Path(__file__).resolve().parents[1]  # kernels/ sits beside models/
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != root]
    try:
        import kernels  # noqa: F401
    except ImportError:
        pass  # not installed: transformers does not ask for it
    finally:
        sys.path[:] = saved


@functools.lru_cache(maxsize=8)
def _load_tokenizer_cached(path: str):
    hub_kernels_first()
    from transformers import AutoTokenizer

    directory, gguf_file = _tokenizer_source(Path(path))
    try:
        if gguf_file is None:
            return AutoTokenizer.from_pretrained(directory)
        tok = AutoTokenizer.from_pretrained(directory, gguf_file=gguf_file)
    except Exception as e:  # transformers raises OSError, ValueError, ImportError, KeyError... depending on the cause
        hint = (" (tokenizers from GGUF need the `gguf` package; or convert the GGUF to a directory with "
                "`python -m eaglet.models.checkpoint convert`)" if gguf_file else
                " (the directory needs tokenizer.json / tokenizer_config.json from the model repository)")
        raise CheckpointError(f"{path}: cannot load a tokenizer: {type(e).__name__}: {e}{hint}") from e
    # transformers 5.17 reads SmolLM2's GGUF with eos_token <|im_start|> (id 1) and no pad token, 5.24 with
    # <|im_end|> (id 2) as the file says: take bos/eos/pad from the GGUF's own ids so all versions agree.
    from eaglet.models.gguf_file import gguf_field, open_gguf

    _, reader = open_gguf(directory / gguf_file)
    for attr, key in (("bos_token", "bos"), ("eos_token", "eos"), ("pad_token", "padding")):
        token_id = gguf_field(reader, f"tokenizer.ggml.{key}_token_id")
        if token_id is not None and getattr(tok, f"{attr}_id") != token_id:
            setattr(tok, attr, tok.convert_ids_to_tokens(token_id))
    return tok


def load_tokenizer(path: str | Path):
    """`transformers.AutoTokenizer` for a model directory or a GGUF file (chat template included).

    Cached per resolved path: the returned object is shared, so do not mutate it (copy.deepcopy first).
    """
    resolved = Path(path).expanduser().resolve()
    if not resolved.exists():
        raise CheckpointNotFoundError(f"{path}: no such file or directory; pass a model directory or a .gguf file")
    return _load_tokenizer_cached(str(resolved))


def convert(src: str | Path, out_dir: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write `src` (GGUF or HF directory) as an HF directory: config.json, model.safetensors and the tokenizer.
    Lets machines without the `gguf` package (the GPU box) run a GGUF target."""
    hf_config, state_dict = load_checkpoint(src, dtype)
    out = save_hf_checkpoint(out_dir, hf_config, state_dict)
    load_tokenizer(src).save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eaglet.models.checkpoint")
    sub = parser.add_subparsers(dest="cmd", required=True)
    conv = sub.add_parser("convert", help="GGUF (or HF directory) -> HF directory with safetensors + tokenizer")
    conv.add_argument("src", help="a .gguf file or a model directory")
    conv.add_argument("out_dir")
    conv.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                      help="cast floating tensors (default: float32 for GGUF, the stored dtype otherwise)")
    args = parser.parse_args(argv)
    try:
        out = convert(args.src, args.out_dir, getattr(torch, args.dtype) if args.dtype else None)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
