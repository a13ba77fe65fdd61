"""The block drafter (models/block_head.py): its inference forward over the paged pool equals its dense training
forward, on both kernel paths, over the target's vocabulary and a draft vocabulary (EAGLE-3's d2t map); it saves and
loads as the other heads, its map too; its checks name the bad key."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from eaglet.models.checkpoint import CheckpointError
from eaglet.models.head_checkpoint import load_draft_head, new_draft_head, save_draft_head
from eaglet.models.kv_cache import ForwardBatch, slots_for
from eaglet.models.llama import ModelArgs, Transformer

ARGS = ModelArgs(family="llama", vocab_size=96, dim=128, n_layers=6, n_heads=2, n_kv_heads=1, head_dim=64,
                 intermediate_size=128, rope_theta=10000.0, max_seq_len=256)
VD = 40  # a draft vocabulary of 40 of the 96 tokens


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    return Transformer(ARGS).eval()


def block_head(target, vocab=None, **kw):
    """A random block drafter; vocab: its draft vocabulary size (random target ids, unsorted order given)."""
    torch.manual_seed(1)
    head = new_draft_head("block", target, num_layers=2, block_size=5, dep_rank=8, dtype=torch.float32,
                          device="cpu", draft_vocab_size=vocab, **kw)
    with torch.no_grad():
        head.dep_out.weight.normal_(0, 0.5)  # an untrained term is zero: make it count
    if vocab is not None:
        head.set_draft_vocab(torch.randperm(ARGS.vocab_size, generator=torch.Generator().manual_seed(4))[:vocab])
    return head.eval()


def paged_logits(head, tokens, feature, anchor, page_size=4):
    """The engine's way: the context before `anchor` stored into the pool, then the block in one forward ->
    logits [K-1, Vd] of rows 1..K-1 with the true parents' dependency term, and the pool."""
    K = head.block_size
    kv = head.kv_cache(max_reqs=1, max_context=64, page_size=page_size)
    row = kv.alloc_request()
    kv.reserve(row, 64)
    pt = kv.req_to_page[[row]]  # [1, P]
    pos = torch.arange(anchor)[None]  # [1, a]
    head.store_context(feature[:, :anchor], pos, slots_for(pt, pos, page_size), kv)
    bpos = anchor + torch.arange(K)[None]  # [1, K]
    batch = ForwardBatch(pt, torch.tensor([anchor], dtype=torch.int32), slots_for(pt, bpos, page_size),
                         torch.ones(1, K, K, dtype=torch.bool), 64)
    x = head.forward_block(tokens[:, anchor], bpos, batch, kv)  # [1, K, H]
    return (head.block_logits(x[:, 1:]) + head.dep_bias(tokens[:, anchor:anchor + K - 1]))[0], kv  # [K-1, Vd]


@pytest.mark.parametrize("vocab", [None, VD])
@pytest.mark.parametrize("invariant", [False, True])
def test_paged_forward_equals_dense(target, invariant, vocab):
    head = block_head(target, vocab).set_invariant(invariant)
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, ARGS.vocab_size, (1, 24), generator=g)  # [1, T]
    feature = torch.randn(1, 24, head.feature_size, generator=g)  # [1, T, F]
    anchors = torch.tensor([[3, 11, 17]])  # [1, A]
    with torch.no_grad():
        dense = head.forward_dense(tokens, feature, anchors)  # [1, A, K-1, Vd]
    assert dense.shape[-1] == head.draft_vocab_size == (vocab or ARGS.vocab_size)
    for i, a in enumerate(anchors[0].tolist()):
        with torch.inference_mode():
            paged, _ = paged_logits(head, tokens, feature, a)
        torch.testing.assert_close(paged, dense[0, i], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("vocab", [None, VD])
@pytest.mark.parametrize("invariant", [False, True])
def test_folded_norms_keep_the_function(target, invariant, vocab):
    """fold_norm_weights (serving's fold_norms=true): the K/V the pool holds (the context's and the block's) and the
    block's logits equal the unfolded head's on either path, though the projections' weights differ; the target's LM
    head is left as it is; a folded head is neither trained nor saved, and one with attention_bias is not folded."""
    plain, folded = block_head(target, vocab), block_head(target, vocab)
    for head in (plain, folded):
        norms = [head.hidden_norm, head.norm] + [n for la in head.layers
                                                 for n in (la.input_layernorm, la.post_attention_layernorm)]
        g = torch.Generator().manual_seed(6)
        with torch.no_grad():  # away from their ones init: folding them changes the weights
            for n in norms:
                n.weight.uniform_(0.5, 1.5, generator=g)
    lm = target.lm_head.weight.clone()
    folded.fold_norm_weights()
    for a, b in zip(plain.layers, folded.layers):
        q_rows = a.self_attn.n_heads * a.self_attn.head_dim
        w, w_folded = a.self_attn.qkv_proj.weight, b.self_attn.qkv_proj.weight  # [(Hq+2Hkv)*D, H] each
        assert b.norms_folded and not torch.allclose(w, w_folded)
        ctx = folded._context_kv(b)[0]  # [2*Hkv*D, H] this layer's rows of the head's context_kv
        assert not torch.allclose(ctx, w[q_rows:]) and not torch.allclose(ctx, w_folded[q_rows:])
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, ARGS.vocab_size, (1, 24), generator=g)  # [1, T]
    feature = torch.randn(1, 24, plain.feature_size, generator=g)  # [1, T, F]
    with torch.inference_mode():
        want, want_kv = paged_logits(plain.set_invariant(invariant), tokens, feature, 11)
        got, got_kv = paged_logits(folded.set_invariant(invariant), tokens, feature, 11)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert want_kv.kv.abs().sum() > 0
    torch.testing.assert_close(got_kv.kv, want_kv.kv, rtol=1e-5, atol=1e-5)
    assert torch.equal(target.lm_head.weight, lm)
    with pytest.raises(ValueError, match="not trained"):
        folded.forward_dense(tokens, feature, torch.tensor([[11]]))
    with pytest.raises(ValueError, match="not saved"):
        folded.state_dict()
    with pytest.raises(ValueError, match="attention_bias"):
        block_head(target, vocab, attention_bias=True).fold_norm_weights()


def test_draft_vocab_logits_are_the_full_heads_columns(target):
    """A draft vocabulary changes only which tokens are scored: the base logits are the full-vocabulary drafter's at
    the draft ids' target ids (the target LM head's rows), the map checked against t2d."""
    head = block_head(target, VD)
    full = block_head(target)  # the same seed: the same layers; its dep_out differs (V rows)
    full.load_state_dict({k: v for k, v in head.state_dict().items() if k not in ("dep_out.weight", "d2t", "t2d")},
                         strict=False)
    ids = head.to_target_ids(torch.arange(VD))  # [Vd]
    assert head.t2d[ids].all() and int(head.t2d.sum()) == VD and ids.tolist() == sorted(ids.tolist())
    x = torch.randn(3, ARGS.dim)  # [3, H]
    with torch.no_grad():
        torch.testing.assert_close(head.block_logits(x), full.block_logits(x)[:, ids], rtol=1e-6, atol=1e-6)
        assert torch.equal(head.lm_head_rows(), target.lm_head.weight[ids])
        new = torch.randperm(ARGS.vocab_size, generator=torch.Generator().manual_seed(5))[:VD]
        head.set_draft_vocab(new)  # the rows follow a new map
        assert torch.equal(head.lm_head_rows(), target.lm_head.weight[new.sort().values])


def test_blocks_do_not_see_each_other_or_later_context(target):
    """A block's logits depend on the context before its anchor and its root only."""
    head = block_head(target)
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, ARGS.vocab_size, (1, 20), generator=g)
    feature = torch.randn(1, 20, head.feature_size, generator=g)
    with torch.no_grad():
        one = head.forward_dense(tokens, feature, torch.tensor([[6]]))[0, 0]  # [K-1, V]
        two = head.forward_dense(tokens, feature, torch.tensor([[6, 12]]))[0, 0]
        later = feature.clone()
        later[:, 6:] = 0  # the anchor's own feature and later ones are not context
        moved = head.forward_dense(tokens, later, torch.tensor([[6]]))[0, 0]
    torch.testing.assert_close(one, two, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(one, moved, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("vocab", [None, VD])
def test_save_load_round_trip(target, tmp_path, vocab):
    head = block_head(target, vocab, target_layer_ids=[1, 3, 4])
    save_draft_head(head, tmp_path / "h")
    back = load_draft_head(tmp_path / "h", target, dtype=torch.float32)
    assert type(back) is type(head) and back.block_size == 5 and back.capture_layers(6) == (1, 3, 4)
    assert back.state_dict().keys() == head.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(head.state_dict().values(), back.state_dict().values()))
    assert ("d2t" in back.state_dict()) == (vocab is not None)  # a full-vocabulary drafter has no map
    assert back.draft_vocab_size == head.draft_vocab_size
    assert json.loads((tmp_path / "h" / "config.json").read_text())["draft_vocab_size"] == head.draft_vocab_size
    assert torch.equal(back.lm_head_rows(), head.lm_head_rows())


def test_old_checkpoint_without_draft_vocab_size_is_full_vocabulary(target, tmp_path):
    """Block drafters saved before draft_vocab_size: config.json without the key, no map -> the whole vocabulary."""
    save_draft_head(block_head(target), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["draft_vocab_size"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    back = load_draft_head(tmp_path, target)
    assert back.draft_vocab_size == ARGS.vocab_size and back.d2t_offsets is None


def test_map_errors_are_named(target, tmp_path):
    """A reduced block drafter's file needs its map, and the map must fit the target (EAGLE-3's checks)."""
    save_draft_head(block_head(target, VD), tmp_path)
    sd = load_file(tmp_path / "model.safetensors")
    save_file({k: v for k, v in sd.items() if k != "t2d"}, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="needs both d2t and t2d"):
        load_draft_head(tmp_path, target)
    save_file(sd | {"d2t": sd["d2t"] + 90}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="outside the target's vocabulary"):
        load_draft_head(tmp_path, target)
    with pytest.raises(ValueError, match="no map"):
        block_head(target).set_draft_vocab(torch.arange(VD))


def test_with_draft_vocab_carries_dep_out_rows(target):
    """A block drafter over another draft vocabulary: every weight but dep_out the same, dep_out's row of each token in
    both vocabularies its old row, new tokens' rows zero (an untrained term)."""
    head = block_head(target, VD)
    old = head.to_target_ids(torch.arange(VD)).tolist()
    new_ids = torch.tensor(old[:30] + [t for t in range(ARGS.vocab_size) if t not in old][:20])
    twin = head.with_draft_vocab(new_ids)
    assert twin.draft_vocab_size == 50 and twin.dep_out.weight.shape == (50, 8)
    for k in head.state_dict().keys() - {"dep_out.weight", "d2t", "t2d"}:
        assert torch.equal(head.state_dict()[k], twin.state_dict()[k]), k
    for i, t in enumerate(twin.to_target_ids(torch.arange(50)).tolist()):
        want = head.dep_out.weight[old.index(t)] if t in old else torch.zeros(8)
        assert torch.equal(twin.dep_out.weight[i], want), t


def test_restrict_vocab_keeps_the_trained_logits(target, tmp_path):
    """`python -m eaglet.models.head_checkpoint restrict-vocab` (how heads/smollm2_135m_block was made): a
    whole-vocabulary drafter over another head's draft vocabulary: its logits and dependency term over the kept ids
    are the whole drafter's, its map the other head's."""
    from eaglet.models.head_checkpoint import restrict_vocab

    full = block_head(target)
    save_draft_head(full, tmp_path / "full", dtype=torch.float32)
    other = block_head(target, VD)  # a head with a map (an EAGLE-3 head's needs a deeper target than this one)
    save_draft_head(other, tmp_path / "other")
    restrict_vocab(tmp_path / "full", target, tmp_path / "other", tmp_path / "out", dtype=torch.float32)
    small = load_draft_head(tmp_path / "out", target, torch.float32, "cpu", kind="block")
    ids = other.to_target_ids(torch.arange(VD))  # [VD] target ids, ascending
    assert small.draft_vocab_size == VD and torch.equal(small.to_target_ids(torch.arange(VD)), ids)
    x = torch.randn(3, ARGS.dim)  # [3, H]
    parents = torch.tensor([5, 17, 60])
    with torch.no_grad():
        assert torch.equal(small.vocab_logits(x), full.vocab_logits(x)[:, ids])
        assert torch.equal(small.dep_bias(parents), full.dep_bias(parents)[:, ids])
    with pytest.raises(ValueError, match="no draft vocabulary"):
        restrict_vocab(tmp_path / "full", target, tmp_path / "full", tmp_path / "again")


@pytest.mark.parametrize("kw, msg", [({"target_layer_ids": [4, 2]}, "increasing"),
                                     ({"target_layer_ids": [9]}, r"\[0, 6\)"),
                                     ({"block_size": 1}, "block_size=1"),
                                     ({"draft_vocab_size": 97}, r"draft_vocab_size=97 must be in \[1, 96\]")])
def test_bad_config_is_named(target, kw, msg):
    with pytest.raises(ValueError, match=msg):
        new_draft_head("block", target, num_layers=1, device="meta", **kw)
