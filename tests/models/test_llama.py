"""eaglet's model code against transformers' reference classes, and its KV-cache paths."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

from eaglet.models.kv_cache import ForwardBatch, KVCache, slots_for
from eaglet.models.llama import ModelArgs, Transformer


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def tiny_hf(family: str, **over):
    common = dict(vocab_size=256, hidden_size=256, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64, max_position_embeddings=512, tie_word_embeddings=False,
                  rms_norm_eps=1e-6)
    common.update(over)
    cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    }[family]
    torch.manual_seed(0)
    hf = model_cls(cls(**common)).eval()
    with torch.no_grad():  # random (not ones/zeros) norms and biases, so a mis-mapped tensor shows
        for name, p in hf.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "norm" in name else 0.0))
    return hf


def to_eaglet(hf) -> Transformer:
    cfg = hf.config.to_dict()
    cfg["architectures"] = [type(hf).__name__]
    return Transformer.from_state_dict(ModelArgs.from_hf_config(cfg), hf.state_dict())


def full_forward(model: Transformer, ids: torch.Tensor, page_size: int = 4) -> torch.Tensor:
    """ids [1, T] -> logits [T, V], one prefill into a fresh cache."""
    kv = KVCache.for_model(model.args, max_reqs=1, max_context=ids.shape[1] + 8, page_size=page_size,
                           dtype=model.dtype)
    r = kv.alloc_request()
    kv.reserve(r, ids.shape[1])
    pos = torch.arange(ids.shape[1])[None]  # [1, T]
    pt = kv.req_to_page[[r]]  # [1, P]
    with torch.no_grad():
        h, _ = model(ids, pos, ForwardBatch(pt, torch.zeros(1, dtype=torch.int32), slots_for(pt, pos, page_size)), kv)
    return model.logits(h[0])


FAMILIES = {
    "llama": {},
    "llama-rope3.1": {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
    "mistral": {},
    "qwen2": {},
    "qwen3": {},
    "llama-tied": {"tie_word_embeddings": True},
}


@pytest.mark.parametrize("variant", list(FAMILIES))
def test_logits_match_transformers_tiny(variant):
    family = variant.split("-")[0]
    hf = tiny_hf(family, **FAMILIES[variant])
    ours = to_eaglet(hf)
    assert ours.args.family == family
    ids = torch.randint(0, 256, (1, 150), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits[0]  # [T, V]
    assert rel_err(full_forward(ours, ids), ref) <= 1e-4


@pytest.mark.slow
def test_logits_match_transformers_smollm2(smollm2_path, smollm2):
    from eaglet.models.checkpoint import load_checkpoint

    cfg, sd = load_checkpoint(smollm2_path)
    hf_cfg = transformers.LlamaConfig(**{k: v for k, v in cfg.items() if k != "architectures"})
    hf = transformers.LlamaForCausalLM(hf_cfg)
    hf.load_state_dict(sd, strict=False)
    hf.tie_weights()
    hf.eval()
    ids = torch.randint(0, 49152, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids).logits[0]
    assert smollm2.args.n_layers == 30 and smollm2.args.dim == 576 and smollm2.args.vocab_size == 49152
    assert rel_err(full_forward(smollm2, ids, page_size=16), ref) <= 1e-4


def test_decode_with_cache_equals_full_forward():
    hf = tiny_hf("qwen3")
    model = to_eaglet(hf)
    ids = torch.randint(0, 256, (1, 37), generator=torch.Generator().manual_seed(3))
    ref = full_forward(model, ids)  # [37, V]
    ps = 8
    kv = KVCache.for_model(model.args, max_reqs=2, max_context=64, page_size=ps)
    kv.alloc_request()  # occupy row 0 so the request under test lives at a non-trivial row and pages
    r = kv.alloc_request()
    got = []
    with torch.no_grad():
        # prefill 20 tokens, then decode one at a time
        for start, end in [(0, 20)] + [(t, t + 1) for t in range(20, 37)]:
            kv.reserve(r, end)
            pt = kv.req_to_page[[r]]
            pos = torch.arange(start, end)[None]
            h, _ = model(ids[:, start:end], pos,
                         ForwardBatch(pt, torch.tensor([start], dtype=torch.int32), slots_for(pt, pos, ps)), kv)
            got.append(model.logits(h[0]))
    assert rel_err(torch.cat(got), ref) <= 1e-5


def test_ragged_batch_equals_each_alone():
    from eaglet.engine.autoregressive import AREngine
    from eaglet.engine.requests import Request

    model = to_eaglet(tiny_hf("llama"))
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 23, 11)]

    def run(batch):
        kv = KVCache.for_model(model.args, max_reqs=3, max_context=64, page_size=4)
        eng = AREngine(model, kv, max_batch=3)
        reqs = [Request(p, [9, 14, 20][i], rid=i) for i, p in batch]
        eng.generate(reqs)
        return {r.rid: r.output_ids for r in reqs}

    together = run(list(enumerate(prompts)))
    for i, p in enumerate(prompts):
        assert together[i] == run([(i, p)])[i]
    assert [len(together[i]) for i in range(3)] == [9, 14, 20]  # each stops at its own budget


def test_capture_layers_returns_residual_stream():
    model = to_eaglet(tiny_hf("llama"))
    ids = torch.randint(0, 256, (1, 9))
    kv = KVCache.for_model(model.args, max_reqs=1, max_context=16, page_size=4)
    r = kv.alloc_request()
    kv.reserve(r, 9)
    pt, pos = kv.req_to_page[[r]], torch.arange(9)[None]
    with torch.no_grad():
        h, cap = model(ids, pos, ForwardBatch(pt, torch.zeros(1, dtype=torch.int32), slots_for(pt, pos, 4)), kv,
                       capture_layers=(0, 1))
    assert len(cap) == 2 and cap[0].shape == (1, 9, 256)
    assert torch.allclose(model.model.norm(cap[1]), h)


@pytest.mark.parametrize("invariant", [False, True], ids=["stock", "invariant"])
@pytest.mark.parametrize("layers", [(0,), (0, 1), (1,)], ids=["first", "both", "last"])
def test_capturing_changes_nothing_and_its_features_need_no_copy(invariant, layers):
    """The invariant forward writes a captured layer's stream where it is kept and the next layer reads it there
    (no clone): the final hidden is bitwise the uncaptured forward's, each capture is the stream after its layer
    (the last one normed is the hidden), and `concat_captured` puts them side by side without a copy."""
    from eaglet.models.llama import concat_captured

    model = to_eaglet(tiny_hf("llama")).set_invariant(invariant)
    ids = torch.randint(0, 256, (2, 5), generator=torch.Generator().manual_seed(3))

    def run(capture):
        kv = KVCache.for_model(model.args, max_reqs=2, max_context=16, page_size=4)
        rows = [kv.alloc_request() for _ in range(2)]
        for r in rows:
            kv.reserve(r, 5)
        pt, pos = kv.req_to_page[rows], torch.arange(5).expand(2, 5)
        with torch.no_grad():
            return model(ids, pos, ForwardBatch(pt, torch.zeros(2, dtype=torch.int32), slots_for(pt, pos, 4)), kv,
                         capture_layers=capture)

    h0, _ = run(())
    h, cap = run(layers)
    assert torch.equal(h, h0) and len(cap) == len(layers)
    if layers[-1] == model.args.n_layers - 1:
        assert torch.allclose(model.model.norm(cap[-1].contiguous()), h, atol=1e-6)
    feats = concat_captured(cap)  # [2, 5, n*256]
    assert torch.equal(feats, torch.cat(cap, dim=-1))
    if invariant:
        assert feats.data_ptr() == cap[0].data_ptr()  # a view of the buffer the forward wrote


@pytest.mark.parametrize("invariant", [False, True], ids=["stock", "invariant"])
def test_greedy_logits_keep_the_model_dtype(invariant):
    """logits(float32=False), what a greedy argmax reads: the model's dtype, the same values as the fp32 logits (and
    so the same argmax, ties included), without the fp32 copy."""
    model = to_eaglet(tiny_hf("llama")).to(torch.bfloat16).set_invariant(invariant)
    h = torch.randn(3, 4, model.args.dim, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    raw, f32 = model.logits(h, float32=False), model.logits(h)
    assert raw.dtype == torch.bfloat16 and f32.dtype == torch.float32
    assert torch.equal(raw.float(), f32) and torch.equal(raw.argmax(-1), f32.argmax(-1))


def test_unknown_architecture_is_named():
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*supported"):
        ModelArgs.from_hf_config({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})


def test_missing_tensors_are_named():
    hf = tiny_hf("llama")
    sd = hf.state_dict()
    del sd["model.layers.1.mlp.up_proj.weight"]
    cfg = hf.config.to_dict()
    with pytest.raises(ValueError, match="model.layers.1.mlp.up_proj.weight"):
        Transformer.from_state_dict(ModelArgs.from_hf_config(cfg), sd)


def test_registry_configs_build():
    for name in ("tiny_llama", "smollm2_135m", "llama3_8b", "qwen2_5_7b", "qwen3_8b", "mistral_7b", "llama2_7b"):
        args = ModelArgs.from_name(name)
        assert args.n_heads % args.n_kv_heads == 0
    with pytest.raises(ValueError, match="unknown model config"):
        ModelArgs.from_name("gpt5")


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_invariant_path_equals_the_stock_one(family):
    """The two paths (models/kernel_paths.py) compute the same model, a prefill and a decode step: on CPU both run
    the kernels' references, which differ in rounding only (the invariant projection scales by 1/rms after the
    matmul, the stock one normalises first)."""
    ids = torch.randint(0, 256, (1, 29), generator=torch.Generator().manual_seed(5))
    model = to_eaglet(tiny_hf(family))
    stock = full_forward(model.set_invariant(False), ids)
    invariant = full_forward(model.set_invariant(True), ids)
    assert rel_err(invariant, stock) < 1e-5
    assert rel_err(full_forward(model, ids[:, :1]), stock[:1]) < 1e-5  # one row: decode's shape


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_weight_read_bytes_counts_the_lm_head_not_an_untied_embedding(tied):
    """The weight-read floor's numerator: every matrix once; an untied embedding table is only gathered from."""
    args = dataclasses.replace(ModelArgs.from_name("tiny_llama"), tie_embeddings=tied)
    model = Transformer(args).to(torch.bfloat16)
    total = sum(p.numel() for p in model.parameters()) * 2  # bf16; a tied matrix is one parameter
    emb = args.vocab_size * args.dim * 2
    assert model.weight_read_bytes() == (total if tied else total - emb)


@pytest.mark.parametrize("invariant", [False, True], ids=["stock", "invariant"])
def test_folded_norm_weights_compute_the_same_model(invariant):
    """fold_norm_weights: the same logits (fp32: rounding only) on either path; the norm weights are then ones and
    the blocks say so (the invariant projections take projection.FOLDED, the stock path unit weights)."""
    hf = tiny_hf("llama")
    plain = to_eaglet(hf).set_invariant(invariant)
    folded = to_eaglet(hf).fold_norm_weights().set_invariant(invariant)
    assert all(layer.norms_folded and bool((layer.input_layernorm.weight == 1).all())
               for layer in folded.model.layers)
    ids = torch.randint(0, 256, (1, 19), generator=torch.Generator().manual_seed(3))
    a, b = full_forward(plain, ids), full_forward(folded, ids)
    assert rel_err(b, a) < 1e-5
    with pytest.raises(ValueError, match="fold_norm_weights: qwen2"):
        to_eaglet(tiny_hf("qwen2")).fold_norm_weights()
    with pytest.raises(ValueError, match="fold_norm_weights: qwen3"):
        to_eaglet(tiny_hf("qwen3")).fold_norm_weights()


@pytest.mark.parametrize("invariant", [False, True], ids=["stock", "invariant"])
def test_folded_norm_weights_capture_the_same_features(invariant):
    """EAGLE-3's features (the residual stream after chosen layers) from a folded model's verify-shaped forward."""
    hf = tiny_hf("llama")
    ids = torch.randint(0, 256, (1, 11), generator=torch.Generator().manual_seed(4))
    feats = []
    for model in (to_eaglet(hf), to_eaglet(hf).fold_norm_weights()):
        model.set_invariant(invariant)
        kv = KVCache.for_model(model.args, max_reqs=1, max_context=16, page_size=4, dtype=model.dtype)
        r = kv.alloc_request()
        kv.reserve(r, 11)
        pos, pt = torch.arange(11)[None], kv.req_to_page[[r]]
        with torch.no_grad():
            h, cap = model(ids, pos, ForwardBatch(pt, torch.zeros(1, dtype=torch.int32), slots_for(pt, pos, 4)),
                           kv, capture_layers=(0, 1))
        feats.append([h, *cap])
    assert all(rel_err(f, g) < 1e-5 for f, g in zip(*feats))


@pytest.mark.parametrize("T", [1, 7], ids=["decode", "multi-token"])
@pytest.mark.parametrize("invariant", [False, True], ids=["stock", "invariant"])
@pytest.mark.parametrize("folded", [False, True], ids=["norms", "folded"])
def test_blocks_leave_the_callers_embeds_alone(folded, invariant, T):
    """Invariant blocks update the residual stream in place; embeds passed in by the caller are copied first on that
    path, and the stock path leaves them alone."""
    model = to_eaglet(tiny_hf("llama"))
    if folded:
        model.fold_norm_weights()
    model.set_invariant(invariant)
    ids = torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(5))
    kv = KVCache.for_model(model.args, max_reqs=1, max_context=8, page_size=4, dtype=model.dtype)
    r = kv.alloc_request()
    kv.reserve(r, T)
    pos, pt = torch.arange(T)[None], kv.req_to_page[[r]]
    embeds = model.model.embed_tokens(ids).detach()  # [1, T, H]
    before = embeds.clone()
    with torch.no_grad():
        model(ids, pos, ForwardBatch(pt, torch.zeros(1, dtype=torch.int32), slots_for(pt, pos, 4)), kv,
              embeds=embeds)
    assert torch.equal(embeds, before)
