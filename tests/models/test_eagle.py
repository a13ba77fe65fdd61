"""Draft heads (models/eagle.py, models/head_checkpoint.py): shapes, paged-KV path == a dense re-implementation
of EAGLE's formulas, checkpoint round trips, the public EAGLE-1 / EAGLE-3 layouts, d2t, and every mismatch error."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from eaglet.models.checkpoint import CheckpointError, CheckpointNotFoundError
from eaglet.models.draft_layers import DraftLayer
from eaglet.models.eagle import Eagle1Head, Eagle3Head, MultiLayerHead
from eaglet.models.head_checkpoint import (
    head_class,
    head_config,
    load_draft_head,
    new_draft_head,
    public_state_dict,
    save_draft_head,
)
from eaglet.models.kv_cache import ForwardBatch, KVCache, slots_for
from eaglet.models.llama import ModelArgs, Transformer

V, H = 512, 256  # tiny_llama: vocab 512, hidden 256, 4 heads x 64 (2 KV heads)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.fixture(scope="module")
def target() -> Transformer:
    # 8 layers: EAGLE-3's default low/mid/high choice needs >= 7
    torch.manual_seed(0)
    return Transformer(ModelArgs(**{**ModelArgs.from_name("tiny_llama").__dict__, "n_layers": 8})).eval()


def randomised(head):
    """Norm weights and biases away from their ones/zeros init, so that a skipped or swapped one shows."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    return head.eval()


def make_head(kind, target, **kw):
    torch.manual_seed(2)
    return randomised(new_draft_head(kind, target, **kw))


def batch_at(kv, reqs, start: int, T: int):
    """positions [B, T] = start.. and the ForwardBatch of T new tokens after a prefix of `start`."""
    B = len(reqs)
    pos = torch.arange(start, start + T)[None].repeat(B, 1)  # [B, T]
    pt = kv.req_to_page[reqs]  # [B, P]
    prefix = torch.full((B,), start, dtype=torch.int32)  # [B]
    return pos, ForwardBatch(pt, prefix, slots_for(pt, pos, kv.page_size), max_prefix_len=start)


def fresh_kv(head, B=2, context=32, page_size=4):
    kv = head.kv_cache(max_reqs=B, max_context=context, page_size=page_size)
    reqs = [kv.alloc_request() for _ in range(B)]
    for r in reqs:
        kv.reserve(r, context)
    return kv, reqs


# ----------------------------------------------------------------------------------------------------
# A dense re-implementation of EAGLE's formulas (cnets1.py / cnets.py), over public tensor names


def rms(x, w, eps):
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rope(x, pos, theta):
    """x [B, T, h, D], HF rotate-half."""
    D = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D)  # [D/2]
    f = pos[..., None].double() * inv  # [B, T, D/2]
    emb = torch.cat([f, f], -1)[:, :, None, :]  # [B, T, 1, D]
    x1, x2 = x.double().chunk(2, -1)
    return (x.double() * emb.cos() + torch.cat([-x2, x1], -1) * emb.sin()).to(x.dtype)


def dense_attention(a, sd, p, cfg, pos):
    """Full causal attention over the whole sequence, no cache."""
    B, T, _ = a.shape
    nh, nkv, D = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    q = rope((a @ sd[p + "q_proj.weight"].T).view(B, T, nh, D), pos, cfg["theta"])
    k = rope((a @ sd[p + "k_proj.weight"].T).view(B, T, nkv, D), pos, cfg["theta"]).repeat_interleave(nh // nkv, 2)
    v = (a @ sd[p + "v_proj.weight"].T).view(B, T, nkv, D).repeat_interleave(nh // nkv, 2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(D)
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    o = torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v).reshape(B, T, nh * D)
    return o @ sd[p + "o_proj.weight"].T


def dense_decoder(x, attn_in, sd, p, cfg, pos):
    h = x + dense_attention(attn_in, sd, p + "self_attn.", cfg, pos)
    m = rms(h, sd[p + "post_attention_layernorm.weight"], cfg["eps"])
    gate, up, down = (sd[f"{p}mlp.{n}_proj.weight"] for n in ("gate", "up", "down"))
    return h + (F.silu(m @ gate.T) * (m @ up.T)) @ down.T


def fc(x, sd, p=""):
    y = x @ sd[p + "fc.weight"].T
    return y + sd[p + "fc.bias"] if p + "fc.bias" in sd else y


def eagle1_dense(sd, cfg, emb, feature, pos, n_layers=1):
    x = fc(torch.cat([emb, feature], -1), sd)  # embedding FIRST
    for i in range(n_layers):
        p = f"layers.{i}."
        x = dense_decoder(x, x if i == 0 else rms(x, sd[p + "input_layernorm.weight"], cfg["eps"]), sd, p, cfg, pos)
    return x


def eagle3_dense(sd, cfg, emb, hidden, pos):
    """hidden: already H-wide (fc-projected target features, or the head's own outputs)."""
    a = torch.cat([rms(emb, sd["midlayer.input_layernorm.weight"], cfg["eps"]),
                   rms(hidden, sd["midlayer.hidden_norm.weight"], cfg["eps"])], -1)
    x = dense_decoder(hidden, a, sd, "midlayer.", cfg, pos)
    return x, rms(x, sd["norm.weight"], cfg["eps"]) @ sd["lm_head.weight"].T


def cfg_of(head):
    a = head.args
    return dict(heads=a.n_heads, kv_heads=a.n_kv_heads, head_dim=a.head_dim, theta=a.rope_theta, eps=a.norm_eps)


# ----------------------------------------------------------------------------------------------------
# Shapes and paged == dense


@pytest.mark.parametrize("kind", ["eagle1", "eagle3", "multi_layer"])
@pytest.mark.parametrize("step", [None, 0, 5])
def test_forward_shapes(target, kind, step):
    head = make_head(kind, target, num_layers=3 if kind == "multi_layer" else None,
                     draft_vocab_size=100 if kind == "eagle3" else None)
    kv, reqs = fresh_kv(head)
    B, T = 2, 3
    pos, batch = batch_at(kv, reqs, 0, T)
    width = head.feature_widths[0] if step is None else H  # draft steps feed the head's own H-wide output
    with torch.no_grad():
        out, logits = head(torch.randint(0, V, (B, T)), torch.randn(B, T, width), pos, batch, kv, step=step)
    assert out.shape == (B, T, H) and out.dtype == torch.float32
    assert logits.shape == (B, T, 100 if kind == "eagle3" else V) and logits.dtype == torch.float32
    assert head.num_kv_layers == kv.kv.shape[0] == (3 if kind == "multi_layer" else 1)
    assert head.hidden_size == H and head.feature_size == (3 * H if kind == "eagle3" else H)
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("n_layers", [1, 2])
@pytest.mark.parametrize("page_size", [4, 16])
def test_eagle1_extend_then_steps_equal_dense(target, n_layers, page_size):
    """Extend over 5 accepted pairs, then two chained draft steps (hidden = the head's previous output)
    == one dense causal forward of EAGLE's formulas over all 7 positions."""
    head = make_head("eagle1", target, num_layers=n_layers)
    kv, reqs = fresh_kv(head, page_size=page_size)
    g = torch.Generator().manual_seed(3)
    B, T = 2, 5
    tokens = torch.randint(0, V, (B, T + 2), generator=g)
    feats = torch.randn(B, T, H, generator=g)
    with torch.no_grad():
        pos, batch = batch_at(kv, reqs, 0, T)
        out, logits = head(tokens[:, :T], feats, pos, batch, kv)
        outs, all_logits, hidden = [out], [logits], out[:, -1:]
        for s in range(2):
            pos, batch = batch_at(kv, reqs, T + s, 1)
            hidden, lg = head(tokens[:, T + s:T + s + 1], hidden, pos, batch, kv, step=s + 1)
            outs.append(hidden)
            all_logits.append(lg)
        paged, paged_logits = torch.cat(outs, 1), torch.cat(all_logits, 1)
        sd = public_state_dict(head)
        seq_hidden = torch.cat([feats, outs[0][:, -1:], outs[1]], 1)  # features, then the head's own outputs
        emb = target.model.embed_tokens(tokens)
        dense = eagle1_dense(sd, cfg_of(head), emb, seq_hidden, torch.arange(T + 2)[None].repeat(B, 1), n_layers)
        dense_logits = target.lm_head(dense)  # the target's frozen head, no final norm
    assert rel_err(paged, dense) <= 1e-5
    assert rel_err(paged_logits, dense_logits) <= 1e-5


@pytest.mark.parametrize("page_size", [4, 16])
def test_eagle3_extend_then_steps_equal_dense(target, page_size):
    """fc applied once (to the 3H target features only); steps take the head's own H-wide output."""
    head = make_head("eagle3", target, draft_vocab_size=100)
    kv, reqs = fresh_kv(head, page_size=page_size)
    g = torch.Generator().manual_seed(4)
    B, T = 2, 5
    tokens = torch.randint(0, V, (B, T + 2), generator=g)
    feats = torch.randn(B, T, 3 * H, generator=g)
    with torch.no_grad():
        pos, batch = batch_at(kv, reqs, 0, T)
        out, logits = head(tokens[:, :T], feats, pos, batch, kv)
        outs, all_logits, hidden = [out], [logits], out[:, -1:]
        for s in range(2):
            pos, batch = batch_at(kv, reqs, T + s, 1)
            hidden, lg = head(tokens[:, T + s:T + s + 1], hidden, pos, batch, kv, step=s + 1)
            outs.append(hidden)
            all_logits.append(lg)
        sd = public_state_dict(head)
        seq_hidden = torch.cat([fc(feats, sd), outs[0][:, -1:], outs[1]], 1)  # [B, T+2, H]
        dense, dense_logits = eagle3_dense(sd, cfg_of(head), target.model.embed_tokens(tokens), seq_hidden,
                                           torch.arange(T + 2)[None].repeat(B, 1))
    assert rel_err(torch.cat(outs, 1), dense) <= 1e-5
    assert rel_err(torch.cat(all_logits, 1), dense_logits) <= 1e-5


@pytest.mark.parametrize("kind,n_layers", [("eagle1", 2), ("eagle3", 1)])
def test_fold_norm_weights_keeps_the_function(target, kind, n_layers):
    """Folded heads (serving's fold_norms=true) compute what the unfolded ones do on the stock path (the rmsnorm
    kernel with unit weights; test_invariant_head_keeps_the_function covers the invariant one); EAGLE-1's layer 0 has
    no input norm to fold and is left as it is."""
    plain = make_head(kind, target, num_layers=n_layers) if kind == "eagle1" else make_head(kind, target)
    folded = make_head(kind, target, num_layers=n_layers) if kind == "eagle1" else make_head(kind, target)
    folded.fold_norm_weights()
    layers = list(folded.layers) if kind == "eagle1" else [folded.midlayer]
    assert [layer.norms_folded for layer in layers] == ([False, True] if kind == "eagle1" else [True])
    g = torch.Generator().manual_seed(4)
    B, T = 2, 5
    tokens = torch.randint(0, V, (B, T + 1), generator=g)
    feats = torch.randn(B, T, folded.feature_size, generator=g)
    outs = []
    for head in (plain, folded):
        kv, reqs = fresh_kv(head)
        with torch.no_grad():
            pos, batch = batch_at(kv, reqs, 0, T)
            out, logits = head(tokens[:, :T], feats, pos, batch, kv)
            pos, batch = batch_at(kv, reqs, T, 1)
            outs.append((out, logits, *head(tokens[:, T:], out[:, -1:], pos, batch, kv, step=1)))
    for got, want in zip(*reversed(outs)):
        assert rel_err(got, want) <= 1e-5


@pytest.mark.parametrize("kind,folded", [("eagle1", False), ("eagle3", False), ("eagle3", True),
                                         ("multi_layer", False)])
def test_invariant_head_keeps_the_function(target, kind, folded):
    """A head on the target's invariant kernels (`set_invariant`, serving's invariant=true: kernels/projection.py's
    launches and the invariant tree attention in every layer, fc and LM head) computes what it computes on the
    others, extend and a draft step, and leaves the caller's hidden as it was. On CPU the kernels' references run
    (tests/kernels/ runs the kernels)."""
    heads = [make_head(kind, target, **({"num_layers": 3} if kind == "multi_layer" else {})) for _ in range(2)]
    if folded:
        for head in heads:
            head.fold_norm_weights()
    heads[1].set_invariant(True)
    assert all(m.invariant for m in heads[1].modules() if isinstance(m, DraftLayer))
    g = torch.Generator().manual_seed(5)
    B, T = 2, 5
    tokens = torch.randint(0, V, (B, T + 1), generator=g)
    feats = torch.randn(B, T, heads[0].feature_size, generator=g)
    outs = []
    for head in heads:
        kv, reqs = fresh_kv(head)
        before = feats.clone()
        with torch.no_grad():
            pos, batch = batch_at(kv, reqs, 0, T)
            out, logits = head(tokens[:, :T], feats, pos, batch, kv)
            pos, batch = batch_at(kv, reqs, T, 1)
            hidden = out[:, -1:].clone()
            step = head(tokens[:, T:], hidden, pos, batch, kv, step=1)
        assert torch.equal(feats, before) and torch.equal(hidden, out[:, -1:])
        outs.append((out, logits, *step))
    for got, want in zip(*reversed(outs)):
        assert rel_err(got, want) <= 1e-5


def test_multi_layer_extend_runs_every_layer_and_step_runs_one(target):
    head = make_head("multi_layer", target, num_layers=3)
    kv, reqs = fresh_kv(head)
    g = torch.Generator().manual_seed(5)
    B, T = 2, 5
    tokens = torch.randint(0, V, (B, T + 1), generator=g)
    feats = torch.randn(B, T, H, generator=g)
    sd, cfg = public_state_dict(head), cfg_of(head)
    emb = target.model.embed_tokens(tokens)
    pos_all = torch.arange(T + 1)[None].repeat(B, 1)

    def layer_dense(i, hidden):
        x = fc(torch.cat([emb[:, :hidden.shape[1]], hidden], -1), sd, f"layers.{i}.")
        return dense_decoder(x, x, sd, f"layers.{i}.", cfg, pos_all[:, :hidden.shape[1]])

    with torch.no_grad():
        pos, batch = batch_at(kv, reqs, 0, T)
        out, logits = head(tokens[:, :T], feats, pos, batch, kv)
        assert rel_err(out, layer_dense(0, feats)) <= 1e-5  # the extend's output is layer 0's
        assert rel_err(logits, target.lm_head(out)) <= 1e-6
        new_hidden = torch.randn(B, 1, H, generator=g)
        for step, layer in ((1, 1), (2, 2), (7, 2), (0, 0)):  # step i -> layer min(i, S-1)
            before = kv.kv.clone()
            pos, batch = batch_at(kv, reqs, T, 1)
            got, _ = head(tokens[:, T:], new_hidden, pos, batch, kv, step=step)
            # layer `layer` sees the extend's KV (written by the extend for every layer) + this token
            want = layer_dense(layer, torch.cat([feats, new_hidden], 1))[:, -1:]
            assert rel_err(got, want) <= 1e-5, (step, layer)
            changed = [i for i in range(3) if not torch.equal(kv.kv[i], before[i])]
            assert changed in ([layer], [])  # only that layer's KV is written ([] if it rewrote equal values)


# ----------------------------------------------------------------------------------------------------
# Checkpoints: round trips and the public layouts


@pytest.mark.parametrize("kind,dtype", [("eagle1", torch.float32), ("eagle3", torch.float32),
                                        ("multi_layer", torch.float32), ("eagle3", torch.bfloat16),
                                        ("block", torch.float32), ("block", torch.bfloat16)])
def test_save_load_roundtrip_bitwise(target, tmp_path, kind, dtype):
    """Every kind; EAGLE-3 and block heads (models/eagle.py's DraftVocab) with a draft vocabulary: d2t / t2d too."""
    vocab = kind in ("eagle3", "block")
    head = make_head(kind, target, num_layers=2 if kind == "multi_layer" else None,
                     draft_vocab_size=64 if vocab else None).to(dtype)
    if vocab:
        head.set_draft_vocab(torch.randperm(V, generator=torch.Generator().manual_seed(6))[:64])
        assert {"d2t", "t2d"} <= head.state_dict().keys()
    save_draft_head(head, tmp_path)
    loaded = load_draft_head(tmp_path, target, dtype=dtype)
    assert type(loaded) is type(head)
    assert loaded.state_dict().keys() == head.state_dict().keys()
    for k, v in head.state_dict().items():
        assert loaded.state_dict()[k].dtype == v.dtype and torch.equal(loaded.state_dict()[k], v), k
    assert head_config(loaded) == head_config(head)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [head.ARCHITECTURE]
    # a second save of the loaded head writes the same file
    save_draft_head(loaded, tmp_path / "again")
    assert (tmp_path / "again" / "model.safetensors").read_bytes() == (tmp_path / "model.safetensors").read_bytes()


def eagle3_public(g, Ht=H, Hd=H, I=192, Vd=64, heads=4, kv_heads=2, D=64):
    """Tensors under the exact public EAGLE-3 names (EAGLE cnets.py / SpecForge llama3_eagle.py)."""
    ids = torch.randperm(V, generator=g)[:Vd].sort().values  # draft vocabulary = these target ids
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    r = lambda *s: 0.05 * torch.randn(*s, generator=g)  # noqa: E731
    n = lambda s: 1 + 0.2 * torch.randn(s, generator=g)  # noqa: E731
    sd = {
        "fc.weight": r(Hd, 3 * Ht),
        "midlayer.input_layernorm.weight": n(Hd), "midlayer.hidden_norm.weight": n(Hd),
        "midlayer.self_attn.q_proj.weight": r(heads * D, 2 * Hd),
        "midlayer.self_attn.k_proj.weight": r(kv_heads * D, 2 * Hd),
        "midlayer.self_attn.v_proj.weight": r(kv_heads * D, 2 * Hd),
        "midlayer.self_attn.o_proj.weight": r(Hd, heads * D),
        "midlayer.mlp.gate_proj.weight": r(I, Hd), "midlayer.mlp.up_proj.weight": r(I, Hd),
        "midlayer.mlp.down_proj.weight": r(Hd, I),
        "midlayer.post_attention_layernorm.weight": n(Hd),
        "norm.weight": n(Hd), "lm_head.weight": r(Vd, Hd),
        "d2t": ids - torch.arange(Vd), "t2d": t2d,
    }
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": Hd,
           "intermediate_size": I, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
           "num_hidden_layers": 1, "vocab_size": V, "draft_vocab_size": Vd, "rms_norm_eps": 1e-5,
           "rope_theta": 50000.0, "max_position_embeddings": 2048, "hidden_act": "silu",
           "tie_word_embeddings": False, "torch_dtype": "float16", "pad_token_id": 0}
    return cfg, sd, ids


def eagle1_public(g, target, I=192, bias=True):
    """Tensors of a public EAGLE-1 pytorch_model.bin (EAGLE cnets1.py; yuhuili/EAGLE-LLaMA3-Instruct-8B)."""
    r = lambda *s: 0.05 * torch.randn(*s, generator=g)  # noqa: E731
    sd = {
        "fc.weight": r(H, 2 * H),
        "layers.0.self_attn.q_proj.weight": r(256, H), "layers.0.self_attn.k_proj.weight": r(128, H),
        "layers.0.self_attn.v_proj.weight": r(128, H), "layers.0.self_attn.o_proj.weight": r(H, 256),
        "layers.0.mlp.gate_proj.weight": r(I, H), "layers.0.mlp.up_proj.weight": r(I, H),
        "layers.0.mlp.down_proj.weight": r(H, I),
        "layers.0.post_attention_layernorm.weight": 1 + 0.2 * torch.randn(H, generator=g),
        "embed_tokens.weight": target.model.embed_tokens.weight.detach().clone(),
    }
    if bias:
        sd["fc.bias"] = r(H)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H, "intermediate_size": I,
           "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1, "vocab_size": V,
           "rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "hidden_act": "silu", "torch_dtype": "float16"}
    if not bias:
        cfg["bias"] = False
    return cfg, sd


def write(directory, cfg, sd, fmt="safetensors"):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(cfg))
    if fmt == "safetensors":
        tensors = {k: v.contiguous() for k, v in sd.items()}
        save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    else:
        torch.save(dict(sd), directory / "pytorch_model.bin")  # a plain dict of tensors, as EAGLE publishes
    return directory


def extend(head, tokens, hidden):
    kv, reqs = fresh_kv(head, B=tokens.shape[0])
    pos, batch = batch_at(kv, reqs, 0, tokens.shape[1])
    with torch.no_grad():
        return head(tokens, hidden, pos, batch, kv)


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_load_public_eagle3(target, tmp_path, fmt):
    g = torch.Generator().manual_seed(7)
    cfg, sd, ids = eagle3_public(g)
    sd_with_embed = {**sd, "embed_tokens.weight": target.model.embed_tokens.weight.detach().clone()}  # SpecForge
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an embedding equal to the target's: nothing to warn about
        head = load_draft_head(write(tmp_path, cfg, sd_with_embed, fmt), target)
    assert isinstance(head, Eagle3Head) and head.draft_vocab_size == 64
    assert head.args.rope_theta == 50000.0 and head.args.intermediate_size == 192  # the head's own config
    got = public_state_dict(head)
    assert got.keys() == sd.keys()
    assert all(torch.equal(got[k], sd[k].to(got[k].dtype)) for k in sd)
    # the mapping means what EAGLE-3 means: forward == the dense formulas over the written tensors
    tokens, feats = torch.randint(0, V, (2, 6), generator=g), torch.randn(2, 6, 3 * H, generator=g)
    out, logits = extend(head, tokens, feats)
    want, want_logits = eagle3_dense(sd, dict(heads=4, kv_heads=2, head_dim=64, theta=50000.0, eps=1e-5),
                                     target.model.embed_tokens(tokens), fc(feats, sd),
                                     torch.arange(6)[None].repeat(2, 1))
    assert rel_err(out, want) <= 1e-5 and rel_err(logits, want_logits) <= 1e-5
    # top-k is taken in the draft vocabulary; tokens are target ids
    top = logits[:, -1].topk(5).indices  # [2, 5] draft ids
    assert torch.equal(head.to_target_ids(top), ids[top])
    assert head.t2d[head.to_target_ids(torch.arange(64))].all() and int(head.t2d.sum()) == 64


@pytest.mark.parametrize("bias", [True, False])
def test_load_public_eagle1_bin(target, tmp_path, bias):
    g = torch.Generator().manual_seed(8)
    cfg, sd = eagle1_public(g, target, bias=bias)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        head = load_draft_head(write(tmp_path, cfg, sd, "bin"), target)
    assert isinstance(head, Eagle1Head) and (head.fc.bias is not None) == bias
    own = {k: v for k, v in sd.items() if k != "embed_tokens.weight"}  # the embedding stays the target's
    assert public_state_dict(head).keys() == own.keys()
    tokens, feats = torch.randint(0, V, (2, 6), generator=g), torch.randn(2, 6, H, generator=g)
    out, logits = extend(head, tokens, feats)
    want = eagle1_dense(own, dict(heads=4, kv_heads=2, head_dim=64, theta=10000.0, eps=1e-6),
                        target.model.embed_tokens(tokens), feats, torch.arange(6)[None].repeat(2, 1))
    assert rel_err(out, want) <= 1e-5 and rel_err(logits, target.lm_head(want)) <= 1e-5
    assert torch.equal(head.to_target_ids(torch.arange(7)), torch.arange(7))
    # saved back in the public layout with the embedding (EAGLE's own loader is strict about it)
    save_draft_head(head, tmp_path / "out")
    again = load_draft_head(tmp_path / "out", target)
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), head.state_dict().values()))


def test_eagle3_own_embedding_when_widths_differ(target, tmp_path):
    """target_hidden_size != hidden_size: the target's embedding has the wrong width, the head brings its own."""
    g = torch.Generator().manual_seed(9)
    cfg, sd, _ = eagle3_public(g, Hd=128, heads=2, kv_heads=1)
    cfg["target_hidden_size"] = H
    sd["embed_tokens.weight"] = torch.randn(V, 128, generator=g)
    head = load_draft_head(write(tmp_path, cfg, sd), target)
    tokens = torch.randint(0, V, (1, 4), generator=g)
    out, logits = extend(head, tokens, torch.randn(1, 4, 3 * H, generator=g))
    assert out.shape == (1, 4, 128) and logits.shape == (1, 4, 64)
    assert torch.equal(head.embed(tokens), sd["embed_tokens.weight"][tokens])
    save_draft_head(head, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["target_hidden_size"] == H
    del sd["embed_tokens.weight"]
    with pytest.raises(CheckpointError, match="embed_tokens.weight"):
        load_draft_head(write(tmp_path / "noemb", cfg, sd), target)


def test_capture_layers_and_target_feature(target):
    head = make_head("eagle3", target)
    assert head.capture_layers(8) == (1, 3, 4)
    assert head.capture_layers(32) == (1, 15, 28)  # EAGLE-3's inputs of layers [2, 16, 29]
    assert make_head("eagle1", target).capture_layers(8) == ()
    kv = KVCache.for_model(target.args, max_reqs=1, max_context=8, page_size=4)
    pos, batch = batch_at(kv, [kv.alloc_request()], 0, 3)
    with torch.no_grad():
        final, captured = target(torch.randint(0, V, (1, 3)), pos, batch, kv, capture_layers=head.capture_layers(8))
    feat = head.target_feature(final, captured)
    assert feat.shape == (1, 3, 3 * H) and torch.equal(feat[..., :H], captured[0])
    assert torch.equal(make_head("eagle1", target).target_feature(final, captured), final)
    with pytest.raises(ValueError, match="needs the 3 captured"):
        head.target_feature(final, captured[:2])


@pytest.mark.parametrize("kind", ["eagle1", "eagle3", "multi_layer"])
def test_the_inference_forward_keeps_the_heads_dtype(target, kind):
    """In a bf16 run a head's `forward` returns its logits in bf16 (`topk_logprobs`, their one reader, takes them as
    fp32: no fp32 copy a step); the values are those of the fp32 copy, so the same top-k."""
    from eaglet.kernels.topk import topk_logprobs

    t16 = Transformer.from_state_dict(target.args, target.state_dict(), torch.bfloat16, "cpu")
    head = new_draft_head(kind, t16, dtype=torch.bfloat16, device="cpu",
                          **({"num_layers": 2} if kind == "multi_layer" else {}))
    kv, reqs = fresh_kv(head, B=1)
    pos, batch = batch_at(kv, reqs, 0, 3)
    feats = torch.randn(1, 3, head.feature_size, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    with torch.no_grad():
        _, logits = head(torch.randint(0, V, (1, 3)), feats, pos, batch, kv)
    assert logits.dtype == torch.bfloat16
    got, want = topk_logprobs(logits, 3), topk_logprobs(logits.float(), 3)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])


def test_aux_layer_ids_from_config(target, tmp_path):
    g = torch.Generator().manual_seed(10)
    cfg, sd, _ = eagle3_public(g)
    cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [0, 2, 6]}  # SpecForge: layer outputs
    head = load_draft_head(write(tmp_path, cfg, sd), target)
    assert head.capture_layers(8) == (0, 2, 6)
    save_draft_head(head, tmp_path / "out")
    assert load_draft_head(tmp_path / "out", target).capture_layers(8) == (0, 2, 6)


def test_set_draft_vocab_and_to_target_ids(target):
    head = make_head("eagle3", target, draft_vocab_size=4)
    assert torch.equal(head.to_target_ids(torch.arange(4)), torch.arange(4))  # a new head: the first ids
    head.set_draft_vocab(torch.tensor([500, 7, 42, 3]))
    assert head.d2t.tolist() == [3, 6, 40, 497]
    assert head.to_target_ids(torch.tensor([[3, 0], [1, 2]])).tolist() == [[500, 3], [7, 42]]
    assert head.t2d.nonzero().flatten().tolist() == [3, 7, 42, 500]
    with pytest.raises(ValueError, match="distinct target ids"):
        head.set_draft_vocab(torch.tensor([1, 1, 2, 3]))


@pytest.mark.parametrize("config,cls", [
    ({"architectures": ["LlamaForCausalLMEagle"]}, Eagle1Head),  # SGLang's EAGLE-1 name
    ({"architectures": ["LlamaForCausalLM"]}, Eagle1Head),  # EAGLE's own EAGLE-1 configs
    ({"architectures": ["Qwen2ForCausalLM"]}, Eagle1Head),  # copied from a Qwen2 target's config
    ({}, Eagle1Head),
    ({"architectures": ["LlamaForCausalLMEagle3"]}, Eagle3Head),
    ({"architectures": ["LlamaForCausalLM"], "draft_vocab_size": 32000}, Eagle3Head),
    ({"architectures": ["EagletMultiLayerEagle"]}, MultiLayerHead),
])
def test_head_class_dispatch(config, cls):
    assert head_class(config) is cls


# ----------------------------------------------------------------------------------------------------
# Mismatches and bad files


def test_target_mismatch_errors(target, tmp_path):
    g = torch.Generator().manual_seed(11)
    cfg1, sd1 = eagle1_public(g, target)
    cfg3, sd3, _ = eagle3_public(g)
    cases = [
        ("e1-hidden", cfg1 | {"hidden_size": 128, "num_attention_heads": 2}, sd1, ValueError, "hidden"),
        ("e1-vocab", cfg1 | {"vocab_size": 1000}, sd1, ValueError, "vocab_size=1000.*512"),
        ("e1-embed", cfg1, sd1 | {"embed_tokens.weight": torch.zeros(600, H)}, ValueError,
         r"embed_tokens.weight is \[600"),
        ("e3-target-hidden", cfg3 | {"target_hidden_size": 128}, sd3, ValueError, "3 x 128.*256"),
        ("e3-t2d-length", cfg3, sd3 | {"t2d": torch.ones(1000, dtype=torch.bool)}, ValueError, "t2d has \\[1000\\]"),
        ("e3-d2t-range", cfg3, sd3 | {"d2t": sd3["d2t"] + 600}, ValueError, "outside the target's vocabulary"),
        ("e3-d2t-t2d", cfg3, sd3 | {"t2d": torch.arange(V) < 64}, ValueError, "d2t and t2d disagree"),
        ("e3-no-map", cfg3, {k: v for k, v in sd3.items() if k != "d2t"}, CheckpointError, "needs both d2t and t2d"),
        ("e3-capture", cfg3 | {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 9]}}, sd3, ValueError,
         r"\[1, 3, 9\].*8 layers"),
        ("e3-layers", cfg3 | {"num_hidden_layers": 2}, sd3, ValueError, "num_hidden_layers=2"),
        ("head-dim", cfg1 | {"num_attention_heads": 8, "num_key_value_heads": 4}, sd1, ValueError, "head_dim=32"),
        ("rope", cfg1 | {"rope_scaling": {"type": "dynamic", "factor": 2.0}}, sd1, ValueError, "RoPE.*dynamic"),
        ("missing", cfg1, {k: v for k, v in sd1.items() if k != "layers.0.self_attn.k_proj.weight"},
         CheckpointError, "missing.*k_proj"),
        ("shape", cfg1 | {"intermediate_size": 100}, sd1, CheckpointError,
         r"gate_proj.weight \[192, 256\] != \[100, 256\]"),
        ("arch", cfg1 | {"architectures": ["MedusaModel"]}, sd1, CheckpointError, "unknown draft head architecture"),
        ("act", cfg1 | {"hidden_act": "gelu"}, sd1, CheckpointError, "hidden_act"),
    ]
    for name, cfg, sd, exc, match in cases:
        with pytest.raises(exc, match=match):
            load_draft_head(write(tmp_path / name, cfg, sd), target)


def test_target_too_shallow_for_eagle3_default():
    shallow = Transformer(ModelArgs.from_name("tiny_llama"))  # 2 layers
    with pytest.raises(ValueError, match=r"\[1, 0, -2\].*2 layers"):
        new_draft_head("eagle3", shallow)


def test_embedding_from_another_target_warns(target, tmp_path):
    g = torch.Generator().manual_seed(12)
    cfg, sd = eagle1_public(g, target)
    sd["embed_tokens.weight"] = torch.randn(V, H, generator=g)
    with pytest.warns(UserWarning, match="differs from the target's embedding"):
        load_draft_head(write(tmp_path, cfg, sd), target)


def test_bad_files(target, tmp_path):
    g = torch.Generator().manual_seed(13)
    cfg, sd = eagle1_public(g, target)
    with pytest.raises(CheckpointNotFoundError):
        load_draft_head(tmp_path / "nope", target)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no config.json"):
        load_draft_head(tmp_path / "empty", target)
    bad = write(tmp_path / "json", cfg, sd)
    (bad / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="invalid JSON"):
        load_draft_head(bad, target)
    noweights = tmp_path / "noweights"
    noweights.mkdir()
    (noweights / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_draft_head(noweights, target)
    trunc = write(tmp_path / "trunc_st", cfg, sd)
    data = (trunc / "model.safetensors").read_bytes()
    (trunc / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_draft_head(trunc, target)
    trunc_bin = write(tmp_path / "trunc_bin", cfg, sd, "bin")
    data = (trunc_bin / "pytorch_model.bin").read_bytes()
    (trunc_bin / "pytorch_model.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="weights-only"):
        load_draft_head(trunc_bin, target)
    pickled = write(tmp_path / "pickled", cfg, sd, "bin")
    torch.save({"fc.weight": sd["fc.weight"], "opt": Eagle1Head}, pickled / "pytorch_model.bin")  # not just tensors
    with pytest.raises(CheckpointError, match="weights-only"):
        load_draft_head(pickled, target)


def test_api_misuse_errors(target, tmp_path):
    head = make_head("eagle3", target)
    save_draft_head(head, tmp_path)
    with pytest.raises(ValueError, match="holds a draft head of kind 'eagle3'"):
        load_draft_head(tmp_path, target, kind="eagle1")
    assert isinstance(load_draft_head(tmp_path, target, kind="eagle3"), Eagle3Head)
    kv, reqs = fresh_kv(head)
    pos, batch = batch_at(kv, reqs, 0, 2)
    with pytest.raises(ValueError, match=r"F in \(768, 256\)"):
        head(torch.zeros(2, 2, dtype=torch.long), torch.zeros(2, 2, 512), pos, batch, kv)
    with pytest.raises(ValueError, match="step=-1"):
        head(torch.zeros(2, 2, dtype=torch.long), torch.zeros(2, 2, H), pos, batch, kv, step=-1)
    with pytest.raises(ValueError, match="unknown draft head kind"):
        new_draft_head("medusa", target)
    with pytest.raises(ValueError, match="needs num_layers"):
        new_draft_head("multi_layer", target)
    with pytest.raises(ValueError, match="only EAGLE-3"):
        new_draft_head("eagle1", target, draft_vocab_size=100)
    assert isinstance(new_draft_head("multi_layer", target, num_layers=2), MultiLayerHead)


def test_with_draft_vocab_carries_the_shared_rows(target):
    """Growing (or changing) a trained head's vocabulary: every weight but the LM head is the same, the LM-head row of
    each token in both vocabularies is its old row, and the map is the new one."""
    head = make_head("eagle3", target, draft_vocab_size=64)
    gen = torch.Generator().manual_seed(9)
    old_ids = torch.randperm(V, generator=gen)[:64]
    head.set_draft_vocab(old_ids)
    new_ids = torch.cat([old_ids[:40], torch.tensor([t for t in range(V) if t not in set(old_ids.tolist())][:88])])
    twin = head.with_draft_vocab(new_ids[torch.randperm(128, generator=gen)])  # any order: sorted like set_draft_vocab
    assert twin.draft_vocab_size == 128 and not twin.training
    assert torch.equal(twin.to_target_ids(torch.arange(128)), new_ids.sort().values)
    sd, tw = head.state_dict(), twin.state_dict()
    assert sd.keys() == tw.keys()
    for k in sd.keys() - {"lm_head.weight", "d2t", "t2d"}:
        assert torch.equal(sd[k], tw[k]), k
    old_row = {int(t): head.lm_head.weight[i] for i, t in enumerate(head.to_target_ids(torch.arange(64)))}
    shared = 0
    for i, t in enumerate(twin.to_target_ids(torch.arange(128)).tolist()):
        if t in old_row:
            assert torch.equal(twin.lm_head.weight[i], old_row[t])
            shared += 1
        else:
            assert not any(torch.equal(twin.lm_head.weight[i], r) for r in old_row.values())
    assert shared == 40
    # the twin scores the shared tokens as the head does (one draft step on the same input)
    kv, reqs = fresh_kv(head, page_size=4)
    kv2, _ = fresh_kv(twin, page_size=4)
    tokens, feats = torch.randint(0, V, (2, 3), generator=gen), torch.randn(2, 3, 3 * H, generator=gen)
    with torch.no_grad():
        pos, batch = batch_at(kv, reqs, 0, 3)
        _, logits = head(tokens, feats, pos, batch, kv)  # [2, 3, 64]
        _, logits2 = twin(tokens, feats, pos, batch, kv2)  # [2, 3, 128]
    both = [(i, j) for i, t in enumerate(head.to_target_ids(torch.arange(64)).tolist())
            for j, u in enumerate(twin.to_target_ids(torch.arange(128)).tolist()) if t == u]
    i, j = map(list, zip(*both))
    assert torch.equal(logits[..., i], logits2[..., j])
