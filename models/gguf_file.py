"""GGUF files (llama.cpp's format) as Hugging Face checkpoints: the config from the header, every tensor
dequantised with `gguf.quants.dequantize` (the routine transformers uses, so the weights equal its own GGUF
loader's bit for bit), llama.cpp names mapped to HF names, and the Q/K row permutation llama.cpp applies to
`llama` models undone. models/checkpoint.py normalises and checks the result like any other checkpoint."""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path

import numpy as np
import torch

from eaglet.models.checkpoint import CheckpointError, check_tensors, normalise_config, supported_list

# GGUF `general.architecture` -> HF architecture. Mistral and SmolLM2 GGUFs use `llama`: llama.cpp runs
# them as plain Llama (no sliding window), and so do we.
GGUF_ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}

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


def gguf_field(reader, key: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        return default
    value = field.contents()
    # GGUF floats are float32: take the shortest decimal that rounds to it (1e-05, not 9.999999747378752e-06).
    return float(str(np.float32(value))) if isinstance(value, float) else value


def open_gguf(path: Path):
    """(gguf module, GGUFReader) of a checked GGUF file; the reader is shared per file version (see below)."""
    st = Path(path).stat()
    return _open_gguf_cached(str(path), st.st_mtime_ns, st.st_size)


# Parsing the header costs 2.6 s for SmolLM2's GGUF (its 49k-token vocabulary; 2-core CPU), and a run reads it three
# times (memory estimate, tokenizer, weights): once per file version instead. The reader maps the file; it copies
# nothing.
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
        raise CheckpointError(
            f"{path}: corrupt or truncated GGUF file ({type(e).__name__}: {e}); re-download it"
        ) from e
    if short:
        raise CheckpointError(f"{path}: truncated GGUF file (tensors {short[:4]} are short); re-download it")
    return gguf, reader


def gguf_config(path: Path, reader) -> dict:
    """The HF config of a GGUF file from its header (a llama3 rope scaling stored as the rope_freqs tensor is
    filled in by `load_gguf`)."""
    arch = gguf_field(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise CheckpointError(
            f"{path}: unsupported GGUF architecture {arch!r}; supported: {', '.join(GGUF_ARCHITECTURES)} "
            f"(HF {supported_list()}; Mistral and SmolLM2 GGUFs are `llama`)"
        )
    if gguf_field(reader, f"{arch}.expert_count", 0):
        raise CheckpointError(
            f"{path}: a mixture-of-experts GGUF ({arch}.expert_count > 0); only dense models are supported"
        )

    def meta(key: str, default=None):
        return gguf_field(reader, f"{arch}.{key}", default)

    n_heads, n_kv = meta("attention.head_count"), meta("attention.head_count_kv")
    n_kv = n_kv or n_heads
    tensors = {t.name: t for t in reader.tensors}
    q = tensors.get("blk.0.attn_q.weight")
    if n_heads is None or q is None:
        raise CheckpointError(f"{path}: GGUF lacks {arch}.attention.head_count or blk.0.attn_q.weight; re-download it")
    head_dim = int(q.shape[1]) // n_heads  # GGUF shapes are [in, out]
    rope_dim = meta("rope.dimension_count")
    if rope_dim not in (None, head_dim):
        raise CheckpointError(
            f"{path}: partial rotary (rope.dimension_count {rope_dim} != head_dim {head_dim}) is unsupported"
        )
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    eos = [gguf_field(reader, f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
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
        "bos_token_id": gguf_field(reader, "tokenizer.ggml.bos_token_id"),
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
    return normalise_config(cfg, path)


def load_gguf(path: Path, dtype: torch.dtype | None) -> tuple[dict, dict[str, torch.Tensor]]:
    gguf, reader = open_gguf(path)
    hf_config = gguf_config(path, reader)
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
    return hf_config, check_tensors(hf_config, state_dict, path)
