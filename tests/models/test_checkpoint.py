"""eaglet.models.checkpoint: HF safetensors directories, GGUF files, errors, tokenizer.

The embedded SmolLM2 GGUF is checked against transformers' own GGUF loader tensor by tensor and by
a greedy answer; tiny random checkpoints of each family are written with transformers (safetensors,
sharded too) and with gguf's writer the way llama.cpp's convert does (Q/K rows permuted for `llama`).
"""

from __future__ import annotations

import json
import math
import re
import sys
import time

import numpy as np
import pytest
import torch

from eaglet.models.checkpoint import (
    SUPPORTED_ARCHITECTURES,
    CheckpointError,
    CheckpointNotFoundError,
    convert,
    load_checkpoint,
    load_tokenizer,
    read_config,
    save_hf_checkpoint,
)

transformers = pytest.importorskip("transformers")
try:
    import gguf
except ImportError:  # the GPU machine has no gguf: the safetensors tests still run there
    gguf = None
needs_gguf = pytest.mark.skipif(gguf is None, reason="the gguf package is not installed")

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=128, max_position_embeddings=256, rms_norm_eps=1e-5)
FAMILY_CONFIGS = {"llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config"}


# ----------------------------------------------------------------------------------------------------
# SmolLM2 GGUF (the embedded default target)


@pytest.fixture(scope="module")
def smollm2_gguf():
    if gguf is None:
        pytest.skip("the gguf package is not installed")
    try:
        from eaglet.data.assets import asset_path
    except ImportError as e:
        pytest.skip(f"eaglet.data.assets unavailable: {e}")
    try:
        return asset_path("smollm2_gguf")
    except Exception as e:  # no network and no cached copy
        pytest.skip(f"SmolLM2 GGUF not available: {type(e).__name__}: {e}")


@pytest.fixture(scope="module")
def ours(smollm2_gguf):
    t0 = time.perf_counter()
    hf_config, state_dict = load_checkpoint(smollm2_gguf)
    print(f"\neaglet load_checkpoint(SmolLM2 Q4_1 GGUF): {time.perf_counter() - t0:.1f} s")
    return hf_config, state_dict


@pytest.fixture(scope="module")
def theirs(smollm2_gguf):
    """transformers' GGUF loader. `from_pretrained(gguf_file=)` needs accelerate, so call the lower level
    `load_gguf_checkpoint` with a meta-device model that only supplies the parameter names."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    t0 = time.perf_counter()
    parsed = load_gguf_checkpoint(str(smollm2_gguf), return_tensors=False)
    config = AutoConfig.for_model(**parsed["config"])
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    tensors = load_gguf_checkpoint(str(smollm2_gguf), return_tensors=True, model_to_load=model)["tensors"]
    print(f"\ntransformers load_gguf_checkpoint(SmolLM2 Q4_1 GGUF): {time.perf_counter() - t0:.1f} s")
    return parsed["config"], tensors


@pytest.mark.slow
def test_smollm2_gguf_equals_transformers(ours, theirs):
    _, sd = ours
    _, ref = theirs
    assert sorted(sd) == sorted(ref)
    for name, t in ref.items():
        assert sd[name].dtype == torch.float32, name
        # Same dequantiser and the same inverse Q/K permutation: bit-identical, not just close.
        assert torch.equal(sd[name], t), name


@pytest.mark.slow
def test_smollm2_config(ours, theirs):
    cfg, sd = ours
    facts = dict(num_hidden_layers=30, hidden_size=576, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                 intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True, rope_theta=100000.0,
                 rms_norm_eps=1e-5, max_position_embeddings=8192, bos_token_id=1, eos_token_id=2,
                 architectures=["LlamaForCausalLM"], model_type="llama", attention_bias=False, rope_scaling=None)
    assert {k: cfg[k] for k in facts} == facts
    assert "lm_head.weight" not in sd
    tf_cfg, _ = theirs
    for key in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "intermediate_size", "vocab_size", "tie_word_embeddings", "bos_token_id", "eos_token_id",
                "max_position_embeddings", "rope_theta"):
        assert cfg[key] == tf_cfg[key], key
    assert cfg["rms_norm_eps"] == pytest.approx(tf_cfg["rms_norm_eps"], rel=1e-7)  # we print float32 as 1e-05


@pytest.mark.slow
def test_smollm2_greedy_answer(ours, smollm2_gguf):
    """The weights mean what they should: transformers' Llama with our state dict answers correctly
    (a wrong Q/K un-permutation scrambles RoPE and the answer)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg, sd = ours
    model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in cfg.items() if k != "architectures"})).eval()
    result = model.load_state_dict(sd, strict=False)
    assert result.missing_keys == ["lm_head.weight"] and not result.unexpected_keys  # tied to embed_tokens
    tok = load_tokenizer(smollm2_gguf)
    enc = tok.apply_chat_template(QUESTION, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**enc, max_new_tokens=9, do_sample=False)  # [1, T + 9]
    answer = tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    assert answer.startswith("The capital of France is Paris.")


@pytest.mark.slow
def test_smollm2_tokenizer(smollm2_gguf):
    tok = load_tokenizer(smollm2_gguf)
    assert load_tokenizer(str(smollm2_gguf)) is tok  # cached per path
    assert tok.chat_template
    text = tok.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.apply_chat_template(QUESTION, add_generation_prompt=True)
    ids = ids["input_ids"] if not isinstance(ids, list) else ids  # transformers 5 returns a BatchEncoding
    assert ids == tok(text, add_special_tokens=False)["input_ids"]
    # SmolLM2 has no separate BOS: the template opens with <|im_start|> (id 1 = bos_token_id), and plain
    # encoding adds nothing.
    assert ids[0] == 1 and tok.convert_ids_to_tokens(1) == "<|im_start|>"
    assert tok("Paris")["input_ids"] == tok("Paris", add_special_tokens=False)["input_ids"]
    # eos/pad as the GGUF says (transformers 5.17 alone would give eos <|im_start|> and no pad)
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token_id) == ("<|im_end|>", 2, 2)


@pytest.mark.slow
def test_convert_smollm2_to_hf_directory(ours, smollm2_gguf, tmp_path):
    """The path for machines without `gguf`: GGUF -> config.json + safetensors + tokenizer files."""
    out = convert(smollm2_gguf, tmp_path / "smollm2", dtype=torch.bfloat16)
    cfg, sd = load_checkpoint(out)
    ref_cfg, ref_sd = ours
    assert cfg == ref_cfg
    assert sorted(sd) == sorted(ref_sd)
    for name, t in ref_sd.items():
        assert sd[name].dtype == torch.bfloat16
        assert torch.equal(sd[name], t.to(torch.bfloat16)), name
    tok_dir, tok_gguf = load_tokenizer(out), load_tokenizer(smollm2_gguf)
    assert tok_dir.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False) == \
        tok_gguf.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False)


# ----------------------------------------------------------------------------------------------------
# Tiny random HF checkpoints (safetensors), one per family


def _tiny_model(family: str, seed: int = 0, **overrides):
    config_cls = getattr(transformers, FAMILY_CONFIGS[family])
    config = config_cls(**{**TINY, "bos_token_id": 1, "eos_token_id": 2, **overrides})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # norms init to ones: randomise so a swapped tensor is caught
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("family", list(FAMILY_CONFIGS))
@pytest.mark.parametrize("sharded", [False, True], ids=["single", "sharded"])
def test_hf_round_trip(family, sharded, tmp_path):
    model = _tiny_model(family)
    model.save_pretrained(tmp_path, safe_serialization=True, **({"max_shard_size": "20KB"} if sharded else {}))
    assert (tmp_path / "model.safetensors.index.json").exists() == sharded
    cfg, sd = load_checkpoint(tmp_path)
    ref = model.state_dict()
    assert sorted(sd) == sorted(ref)
    for name, t in ref.items():
        assert sd[name].dtype == torch.float32 and torch.equal(sd[name], t), name
    assert SUPPORTED_ARCHITECTURES[cfg["architectures"][0]] == family
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size", "rms_norm_eps", "max_position_embeddings"):
        assert cfg[key] == TINY[key], key
    assert cfg["rope_theta"] == 10000.0 and cfg["rope_scaling"] is None
    assert cfg["attention_bias"] == (family == "qwen2")
    assert cfg["tie_word_embeddings"] is False
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (1, 2)
    assert read_config(tmp_path) == cfg  # the config alone, as a run sizes its memory before loading


def test_hf_tied_dtype_and_rope_scaling(tmp_path):
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    model = _tiny_model("llama", tie_word_embeddings=True, rope_parameters=rope)
    model.save_pretrained(tmp_path, safe_serialization=True)
    cfg, sd = load_checkpoint(tmp_path, dtype=torch.bfloat16)
    assert cfg["tie_word_embeddings"] is True and "lm_head.weight" not in sd
    # transformers >= 5 writes rope_parameters; the normalised config also has rope_theta / rope_scaling.
    assert cfg["rope_theta"] == 500000.0
    assert cfg["rope_scaling"] == {k: v for k, v in rope.items() if k != "rope_theta"}
    for name, t in model.state_dict().items():
        if name != "lm_head.weight":
            assert sd[name].dtype == torch.bfloat16 and torch.equal(sd[name], t.to(torch.bfloat16)), name


def test_old_style_config_and_save_hf_checkpoint(tmp_path):
    """A transformers-4 style config (rope_theta + rope_scaling with `type`, no head_dim, no kv heads)
    written by save_hf_checkpoint loads with the defaults filled in."""
    model = _tiny_model("llama", num_key_value_heads=4)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
           "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 128, "rope_theta": 1e6,
           "rope_scaling": {"type": "linear", "factor": 2.0}}
    save_hf_checkpoint(tmp_path, cfg, model.state_dict())
    got, sd = load_checkpoint(tmp_path / "config.json")
    assert (got["num_key_value_heads"], got["head_dim"], got["rope_theta"]) == (4, 16, 1e6)
    assert got["rope_scaling"] == {"type": "linear", "factor": 2.0, "rope_type": "linear"}
    assert all(torch.equal(sd[k], v) for k, v in model.state_dict().items())


# ----------------------------------------------------------------------------------------------------
# Tiny GGUFs written the way llama.cpp's convert_hf_to_gguf.py writes them


def _llamacpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # convert_hf_to_gguf.py LlamaModel.permute (n_head already replaced by n_head_kv for k).
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_HF_TO_GGUF = [  # written out independently of the loader's own table
    (r"model\.embed_tokens\.", "token_embd."), (r"model\.norm\.", "output_norm."), (r"lm_head\.", "output."),
    (r"model\.layers\.(\d+)\.self_attn\.q_proj\.", r"blk.\1.attn_q."),
    (r"model\.layers\.(\d+)\.self_attn\.k_proj\.", r"blk.\1.attn_k."),
    (r"model\.layers\.(\d+)\.self_attn\.v_proj\.", r"blk.\1.attn_v."),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj\.", r"blk.\1.attn_output."),
    (r"model\.layers\.(\d+)\.self_attn\.q_norm\.", r"blk.\1.attn_q_norm."),
    (r"model\.layers\.(\d+)\.self_attn\.k_norm\.", r"blk.\1.attn_k_norm."),
    (r"model\.layers\.(\d+)\.mlp\.gate_proj\.", r"blk.\1.ffn_gate."),
    (r"model\.layers\.(\d+)\.mlp\.up_proj\.", r"blk.\1.ffn_up."),
    (r"model\.layers\.(\d+)\.mlp\.down_proj\.", r"blk.\1.ffn_down."),
    (r"model\.layers\.(\d+)\.input_layernorm\.", r"blk.\1.attn_norm."),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.", r"blk.\1.ffn_norm."),
]


def _write_gguf(path, arch: str, model, qtype: str = "F32", rope_freqs: np.ndarray | None = None):
    """Write `model` as llama.cpp would; returns the state dict a correct loader must give back."""
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    if arch == "llama":
        writer.add_rope_dimension_count(cfg.head_dim)
    expected = {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        w = t.numpy()
        gname = name
        for pat, rep in _HF_TO_GGUF:
            gname = re.sub(pat, rep, gname)
        if arch == "llama" and (".attn_q." in gname or ".attn_k." in gname):
            w = _llamacpp_permute(w, cfg.num_attention_heads if ".attn_q." in gname else cfg.num_key_value_heads)
        if qtype == "F32" or w.ndim == 1:  # llama.cpp keeps 1-D tensors (norms, biases) in F32
            writer.add_tensor(gname, w)
            expected[name] = t
        elif qtype == "F16":
            writer.add_tensor(gname, w.astype(np.float16))
            expected[name] = t.half().float()
        else:
            q = gguf.GGMLQuantizationType[qtype]
            writer.add_tensor(gname, gguf.quants.quantize(w, q), raw_dtype=q)
            # Quant blocks run along a row and the permutation moves whole rows, so the un-permuted
            # dequantised tensor equals quantising the HF tensor directly.
            expected[name] = torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(t.numpy(), q), q))
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", rope_freqs)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


@needs_gguf
@pytest.mark.parametrize("family,arch,qtype", [
    ("llama", "llama", "F32"), ("llama", "llama", "F16"), ("llama", "llama", "Q8_0"), ("llama", "llama", "Q4_0"),
    ("mistral", "llama", "F32"), ("qwen2", "qwen2", "F32"), ("qwen2", "qwen2", "Q8_0"), ("qwen3", "qwen3", "F32"),
])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_gguf_round_trip(family, arch, qtype, tied, tmp_path):
    model = _tiny_model(family, tie_word_embeddings=tied)
    path = tmp_path / "tiny.gguf"
    expected = _write_gguf(path, arch, model, qtype)
    cfg, sd = load_checkpoint(tmp_path)  # a directory holding one .gguf
    assert sorted(sd) == sorted(expected)
    for name, t in expected.items():
        assert sd[name].dtype == torch.float32 and torch.equal(sd[name], t), name
    assert cfg["architectures"] == [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                                     "qwen3": "Qwen3ForCausalLM"}[arch]]
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size", "rms_norm_eps", "max_position_embeddings"):
        assert cfg[key] == TINY[key], key
    assert (cfg["tie_word_embeddings"], cfg["attention_bias"]) == (tied, arch == "qwen2")
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["rope_theta"]) == (1, 2, 10000.0)
    assert read_config(path) == cfg  # from the header alone
    _, sd16 = load_checkpoint(path, dtype=torch.float16)
    assert all(sd16[k].dtype == torch.float16 and torch.equal(sd16[k], sd[k].half()) for k in sd)


@needs_gguf
def test_gguf_llama3_rope_freqs(tmp_path):
    """Llama 3.1 GGUFs carry rope scaling as a `rope_freqs` table (llama.cpp's convert computes it)."""
    model = _tiny_model("llama", rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    factor, low, high, old = 8.0, 1.0, 4.0, 8192
    factors = []
    for freq in 1.0 / (500000.0 ** (np.arange(0, 16, 2, dtype=np.float32) / 16)):
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            factors.append(1)
        elif wavelen > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    _write_gguf(tmp_path / "a.gguf", "llama", model, rope_freqs=np.array(factors, dtype=np.float32))
    cfg, sd = load_checkpoint(tmp_path / "a.gguf")
    assert cfg["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    assert not any("rope_freqs" in k for k in sd)
    _write_gguf(tmp_path / "b.gguf", "llama", model, rope_freqs=np.array(factors, dtype=np.float32) * 1.5)
    with pytest.raises(CheckpointError, match="rope_freqs"):
        load_checkpoint(tmp_path / "b.gguf")


# ----------------------------------------------------------------------------------------------------
# Errors: each names the path and the fix


def test_error_missing_path(tmp_path):
    missing = tmp_path / "nope"
    for fn in (load_checkpoint, load_tokenizer):
        with pytest.raises(CheckpointNotFoundError, match="no such file") as e:
            fn(missing)
        assert str(missing) in str(e.value) and isinstance(e.value, FileNotFoundError)


def test_error_empty_dir(tmp_path):
    with pytest.raises(CheckpointError, match="no config.json") as e:
        load_checkpoint(tmp_path)
    assert str(tmp_path) in str(e.value)


def test_error_no_safetensors_pickle_refused(tmp_path):
    _tiny_model("llama").config.save_pretrained(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors.*pytorch_model\.bin.*not loaded"):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize("damage", ["truncate", "garble_header"])
def test_error_corrupt_safetensors(damage, tmp_path):
    _tiny_model("qwen3").save_pretrained(tmp_path, safe_serialization=True)
    f = tmp_path / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2] if damage == "truncate" else data[:8] + b"\x00garbage" + data[16:])
    with pytest.raises(CheckpointError, match="corrupt or truncated safetensors") as e:
        load_checkpoint(tmp_path)
    assert str(f) in str(e.value)


@needs_gguf
@pytest.mark.parametrize("cut", [3, 200, 0.5, -1])
def test_error_truncated_gguf(cut, tmp_path):
    path = tmp_path / "t.gguf"
    _write_gguf(path, "llama", _tiny_model("llama"))
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * cut) if isinstance(cut, float) else cut])
    with pytest.raises(CheckpointError, match="GGUF") as e:
        load_checkpoint(path)
    assert str(path) in str(e.value) and "re-download" in str(e.value)


@needs_gguf
def test_error_bad_gguf_magic(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"GGML" + bytes(100))
    with pytest.raises(CheckpointError, match="not a GGUF file"):
        load_checkpoint(path)


def test_error_missing_shard(tmp_path):
    _tiny_model("llama").save_pretrained(tmp_path, safe_serialization=True, max_shard_size="20KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[1]
    (tmp_path / shard).unlink()
    with pytest.raises(CheckpointError, match="missing") as e:
        load_checkpoint(tmp_path)
    msg = str(e.value)
    assert shard in msg and str(tmp_path) in msg
    assert next(k for k, f in index["weight_map"].items() if f == shard) in msg


def test_error_missing_tensor(tmp_path):
    model = _tiny_model("qwen2")
    sd = {k: v for k, v in model.state_dict().items() if k != "model.layers.1.self_attn.k_proj.bias"}
    save_hf_checkpoint(tmp_path, json.loads(model.config.to_json_string()), sd)
    with pytest.raises(CheckpointError,
                       match=r"1 of \d+ tensors .* missing.*" r"model\.layers\.1\.self_attn\.k_proj\.bias"):
        load_checkpoint(tmp_path)


def test_error_shape_mismatch(tmp_path):
    model = _tiny_model("llama")
    cfg = json.loads(model.config.to_json_string())
    cfg["intermediate_size"] = 100
    save_hf_checkpoint(tmp_path, cfg, model.state_dict())
    with pytest.raises(CheckpointError, match="shapes disagree.*gate_proj"):
        load_checkpoint(tmp_path)


def test_error_unknown_architecture(tmp_path):
    config = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=32)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path, safe_serialization=True)
    with pytest.raises(CheckpointError, match="unsupported architecture") as e:
        load_checkpoint(tmp_path)
    msg = str(e.value)
    assert "GPT2LMHeadModel" in msg and str(tmp_path) in msg
    assert all(a in msg for a in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"))


@needs_gguf
def test_error_unknown_gguf_architecture(tmp_path):
    path = tmp_path / "g.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(CheckpointError, match="unsupported GGUF architecture 'gpt2'.*llama, qwen2, qwen3") as e:
        load_checkpoint(path)
    assert str(path) in str(e.value)


def test_error_gguf_package_missing(tmp_path, monkeypatch):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf -> ImportError, as on the GPU machine
    with pytest.raises(CheckpointError, match=r"needs the `gguf` package.*eaglet\.models\.checkpoint convert m\.gguf"):
        load_checkpoint(path)


def test_error_tokenizer_missing(tmp_path):
    _tiny_model("llama").save_pretrained(tmp_path, safe_serialization=True)
    with pytest.raises(CheckpointError, match="cannot load a tokenizer") as e:
        load_tokenizer(tmp_path)
    assert str(tmp_path) in str(e.value)
