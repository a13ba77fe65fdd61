"""Checkpoint and tokenizer loading for the target family (Llama 2/3, Mistral, Qwen2, Qwen3, SmolLM2).

`load_checkpoint(path)` returns `(hf_config, state_dict)` in Hugging Face form whatever the source:

- a directory with `config.json` and safetensors (`model.safetensors`, or shards listed by
  `model.safetensors.index.json`, or any `*.safetensors`). Never pickle: `.bin`/`.pt` files are refused.
- a `.gguf` file (or a directory holding exactly one `.gguf` and no `config.json`): every tensor is
  dequantised with `gguf.quants.dequantize` (the same routine transformers uses, so the result equals
  transformers' own GGUF loader bit for bit), llama.cpp names are mapped to HF names, the Q/K row
  permutation llama.cpp applies to `llama` models is undone, and the config is built from the metadata.

The returned `hf_config` always holds the keys the model needs, filled with transformers' defaults
where the file leaves them out (see `_normalise_config`); transformers >= 5 writes `rope_parameters`
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
import math
import re
import sys
import warnings
from pathlib import Path

import numpy as np
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
# GGUF `general.architecture` -> HF architecture. Mistral and SmolLM2 GGUFs use `llama`: llama.cpp runs
# them as plain Llama (no sliding window), and so do we.
GGUF_ARCHITECTURES: dict[str, str] = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

# Defaults of transformers' config classes for keys a config.json may omit.
_MAX_POSITIONS_DEFAULT = {"llama": 2048, "mistral": 131072, "qwen2": 32768, "qwen3": 32768}

# llama.cpp tensor names -> HF names (`blk.N.` -> `model.layers.N.`); the suffix `.weight`/`.bias` is kept.
_GGUF_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_GGUF_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GGUF_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


class CheckpointError(ValueError):
    """A checkpoint or tokenizer cannot be loaded; the message names the path and the fix."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """The path does not exist (also a FileNotFoundError, for callers that catch that)."""


def _supported_list() -> str:
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
        f"supported: {_supported_list()} (model_type llama, mistral, qwen2, qwen3)"
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


def _normalise_config(cfg: dict, source: str | Path) -> dict:
    """A copy of `cfg` whose model keys are all present (transformers' defaults where omitted)."""
    family = model_family(cfg, source)
    required = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
    absent = [k for k in required if cfg.get(k) is None]
    if absent:
        raise CheckpointError(f"{source}: config lacks {absent}; is it a complete Hugging Face config.json?")
    out = dict(cfg)
    n_heads = cfg["num_attention_heads"]
    out["num_key_value_heads"] = cfg.get("num_key_value_heads") or n_heads
    out["head_dim"] = cfg.get("head_dim") or cfg["hidden_size"] // n_heads
    out["rms_norm_eps"] = cfg.get("rms_norm_eps") or 1e-6
    out["rope_theta"], out["rope_scaling"] = _rope_from_config(cfg)
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
            shapes.update({f"{p}mlp.{n}_proj.bias": (d,) for n, d in (("gate", inter), ("up", inter), ("down", hidden))})
        shapes[f"{p}input_layernorm.weight"] = (hidden,)
        shapes[f"{p}post_attention_layernorm.weight"] = (hidden,)
    return shapes


def _check_tensors(hf_config: dict, state_dict: dict, source: str | Path) -> dict[str, torch.Tensor]:
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
    hf_config = _normalise_config(raw, config_path)
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
    return hf_config, _check_tensors(hf_config, state_dict, directory)


# ----------------------------------------------------------------------------------------------------
# GGUF


def _unpermute_rotary(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp convert's `permute` of q/k rows (it interleaves each head's two rotary halves for
    GGML's rope); the inverse of `w.reshape(n, 2, r // n // 2, ...).swapaxes(1, 2)`, as in transformers."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)  # [rows, ...]


def _llama3_rope_scaling(factors: torch.Tensor, theta: float, head_dim: int) -> dict:
    """Recover HF's llama3 rope_scaling from llama.cpp's `rope_freqs` table (Llama 3.1/3.2 GGUFs store the
    per-frequency divisors, not the parameters). Only Meta's published parameters are tried; a table they do
    not reproduce is refused rather than approximated."""
    factor = float(factors.max())
    params = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192}
    # Same formula as llama.cpp's convert_hf_to_gguf (LlamaModel.generate_extra_tensors).
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # [head_dim/2]
    wavelen = 2 * math.pi / freqs  # [head_dim/2]
    low, high = params["low_freq_factor"], params["high_freq_factor"]
    old = params["original_max_position_embeddings"]
    smooth = (old / wavelen - low) / (high - low)  # [head_dim/2]
    mid = 1 / ((1 - smooth) / factor + smooth)  # [head_dim/2]
    expect = torch.where(wavelen < old / high, 1.0, torch.where(wavelen > old / low, factor, mid))  # [head_dim/2]
    if factors.shape != expect.shape or not torch.allclose(factors.double(), expect, rtol=1e-5, atol=0):
        raise CheckpointError("rope_freqs table does not match llama3 rope scaling with Meta's parameters")
    return params


def _gguf_field(reader, key: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        return default
    value = field.contents()
    # GGUF floats are float32: take the shortest decimal that rounds to it (1e-05, not 9.999999747378752e-06).
    return float(str(np.float32(value))) if isinstance(value, float) else value


def _open_gguf(path: Path):
    """(gguf module, GGUFReader) of a checked GGUF file; the reader is shared per file version (see below)."""
    st = Path(path).stat()
    return _open_gguf_cached(str(path), st.st_mtime_ns, st.st_size)


# Parsing the header costs 2.6 s for SmolLM2's GGUF (its 49k-token vocabulary; 2-core CPU), and a run reads it three
# times (memory estimate, tokenizer, weights): once per file version instead. The reader maps the file; it copies nothing.
@functools.lru_cache(maxsize=2)
def _open_gguf_cached(file: str, mtime_ns: int, size: int):
    path = Path(file)
    try:
        import gguf
    except ImportError as e:
        raise CheckpointError(
            f"{path}: reading GGUF needs the `gguf` package (pip install gguf); on a machine without it, convert "
            f"elsewhere first: python -m eaglet.models.checkpoint convert {path.name} <out_dir>"
        ) from e
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise CheckpointError(f"{path}: not a GGUF file (magic {magic!r}, expected b'GGUF'); re-download it")
    try:
        # The reader memory-maps the file; a truncated file fails here with a numpy reshape/view error.
        reader = gguf.GGUFReader(path)
        short = [t.name for t in reader.tensors if t.data.nbytes != t.n_bytes]
    except (ValueError, IndexError, KeyError, OSError) as e:
        raise CheckpointError(f"{path}: corrupt or truncated GGUF file ({type(e).__name__}: {e}); re-download it") from e
    if short:
        raise CheckpointError(f"{path}: truncated GGUF file (tensors {short[:4]} are short); re-download it")
    return gguf, reader


def _gguf_config(path: Path, reader) -> dict:
    """The HF config of a GGUF file from its header (a llama3 rope scaling stored as the rope_freqs tensor is
    filled in by `_load_gguf`)."""
    arch = _gguf_field(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise CheckpointError(
            f"{path}: unsupported GGUF architecture {arch!r}; supported: {', '.join(GGUF_ARCHITECTURES)} "
            f"(HF {_supported_list()}; Mistral and SmolLM2 GGUFs are `llama`)"
        )
    if _gguf_field(reader, f"{arch}.expert_count", 0):
        raise CheckpointError(f"{path}: a mixture-of-experts GGUF ({arch}.expert_count > 0); only dense models are supported")

    def meta(key: str, default=None):
        return _gguf_field(reader, f"{arch}.{key}", default)

    n_heads, n_kv = meta("attention.head_count"), meta("attention.head_count_kv")
    n_kv = n_kv or n_heads
    tensors = {t.name: t for t in reader.tensors}
    q = tensors.get("blk.0.attn_q.weight")
    if n_heads is None or q is None:
        raise CheckpointError(f"{path}: GGUF lacks {arch}.attention.head_count or blk.0.attn_q.weight; re-download it")
    head_dim = int(q.shape[1]) // n_heads  # GGUF shapes are [in, out]
    rope_dim = meta("rope.dimension_count")
    if rope_dim not in (None, head_dim):
        raise CheckpointError(f"{path}: partial rotary (rope.dimension_count {rope_dim} != head_dim {head_dim}) is unsupported")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    eos = [_gguf_field(reader, f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    eos = list(dict.fromkeys(e for e in eos if e is not None))  # unique, in order: eos first
    theta = float(meta("rope.freq_base", 10000.0))
    cfg = {
        "architectures": [GGUF_ARCHITECTURES[arch]],
        "model_type": arch,
        "hidden_size": meta("embedding_length"),
        "intermediate_size": meta("feed_forward_length"),
        "num_hidden_layers": meta("block_count"),
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "vocab_size": meta("vocab_size") or (len(tokens.data) if tokens is not None else None),
        "rms_norm_eps": meta("attention.layer_norm_rms_epsilon"),
        "rope_theta": theta,
        "rope_scaling": None,
        "max_position_embeddings": meta("context_length"),
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "bos_token_id": _gguf_field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": (eos[0] if len(eos) == 1 else eos) if eos else None,
    }
    scaling_type = meta("rope.scaling.type")
    if scaling_type in ("linear", "yarn"):
        cfg["rope_scaling"] = {"rope_type": scaling_type, "factor": float(meta("rope.scaling.factor"))}
        if scaling_type == "yarn":
            cfg["rope_scaling"]["original_max_position_embeddings"] = meta("rope.scaling.original_context_length")
    elif scaling_type not in (None, "none"):
        raise CheckpointError(f"{path}: rope scaling type {scaling_type!r} is unsupported (linear, yarn are)")
    elif meta("rope.scale_linear"):  # older llama.cpp key for linear scaling
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": float(meta("rope.scale_linear"))}
    return _normalise_config(cfg, path)


def _load_gguf(path: Path, dtype: torch.dtype | None) -> tuple[dict, dict[str, torch.Tensor]]:
    gguf, reader = _open_gguf(path)
    hf_config = _gguf_config(path, reader)
    arch = hf_config["model_type"]
    n_heads, n_kv, head_dim = (hf_config[k] for k in ("num_attention_heads", "num_key_value_heads", "head_dim"))
    theta = hf_config["rope_theta"]
    tensors = {t.name: t for t in reader.tensors}
    state_dict: dict[str, torch.Tensor] = {}
    unknown = []
    for name, t in tensors.items():
        w = gguf.quants.dequantize(t.data, t.tensor_type)  # float32, numpy layout [out, in]
        # F32 comes back as a read-only view of the memory map: copy so torch owns writable memory.
        w = torch.from_numpy(w.copy() if not w.flags.writeable else w)
        if name == "rope_freqs.weight":
            try:
                hf_config["rope_scaling"] = _llama3_rope_scaling(w, theta, head_dim)
            except CheckpointError as e:
                raise CheckpointError(f"{path}: {e}") from None
            continue
        if (m := _GGUF_LAYER_RE.fullmatch(name)) and m[2] in _GGUF_LAYER_NAMES:
            hf_name = f"model.layers.{m[1]}.{_GGUF_LAYER_NAMES[m[2]]}.{m[3]}"
        elif (base := name.rsplit(".", 1))[0] in _GGUF_GLOBAL_NAMES and base[1] in ("weight", "bias"):
            hf_name = f"{_GGUF_GLOBAL_NAMES[base[0]]}.{base[1]}"
        else:
            unknown.append(name)
            continue
        if arch == "llama" and m and m[2] in ("attn_q", "attn_k"):
            w = _unpermute_rotary(w, n_heads if m[2] == "attn_q" else n_kv)
        state_dict[hf_name] = w.to(dtype or torch.float32)
    if unknown:
        raise CheckpointError(f"{path}: GGUF tensors with no HF counterpart for {arch}: {unknown[:4]}; "
                              f"this variant of the architecture is unsupported")
    return hf_config, _check_tensors(hf_config, state_dict, path)


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
        raise CheckpointError(f"{path}: not a checkpoint; pass a .gguf file or a directory with config.json + safetensors")
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
        return _gguf_config(where, _open_gguf(where)[1])
    config_path = where / "config.json"
    try:
        return _normalise_config(json.loads(config_path.read_text()), config_path)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{config_path}: invalid JSON ({e}); re-download config.json") from e


def load_checkpoint(path: str | Path, dtype: torch.dtype | None = None) -> tuple[dict, dict[str, torch.Tensor]]:
    """Load `(hf_config, state_dict)` from an HF directory or a GGUF file (see the module docstring).

    `dtype` casts the floating tensors; by default safetensors keep their stored dtype and dequantised
    GGUF tensors are float32.
    """
    kind, where = _resolve(path)
    return _load_gguf(where, dtype) if kind == "gguf" else _load_hf_dir(where, dtype)


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


@functools.lru_cache(maxsize=8)
def _load_tokenizer_cached(path: str):
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
    _, reader = _open_gguf(directory / gguf_file)
    for attr, key in (("bos_token", "bos"), ("eos_token", "eos"), ("pad_token", "padding")):
        token_id = _gguf_field(reader, f"tokenizer.ggml.{key}_token_id")
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
