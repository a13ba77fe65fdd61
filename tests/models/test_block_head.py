"""The block drafter (models/block_head.py): its inference forward over the paged pool equals its dense training
forward, on both kernel paths; it saves and loads as the other heads; its checks name the bad key."""

from __future__ import annotations

import pytest
import torch

from eaglet.models.head_checkpoint import load_draft_head, new_draft_head, save_draft_head
from eaglet.models.kv_cache import ForwardBatch, slots_for
from eaglet.models.llama import ModelArgs, Transformer

ARGS = ModelArgs(family="llama", vocab_size=96, dim=128, n_layers=6, n_heads=2, n_kv_heads=1, head_dim=64,
                 intermediate_size=128, rope_theta=10000.0, max_seq_len=256)


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    return Transformer(ARGS).eval()


def block_head(target, **kw):
    torch.manual_seed(1)
    head = new_draft_head("block", target, num_layers=2, block_size=5, dep_rank=8, dtype=torch.float32,
                          device="cpu", **kw)
    with torch.no_grad():
        head.dep_out.weight.normal_(0, 0.5)  # an untrained term is zero: make it count
    return head.eval()


def paged_logits(head, tokens, feature, anchor, page_size=4):
    """The engine's way: the context before `anchor` stored into the pool, then the block in one forward ->
    logits [K-1, V] of rows 1..K-1 with the true parents' dependency term."""
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
    return (head.block_logits(x[:, 1:]) + head.dep_bias(tokens[:, anchor:anchor + K - 1]))[0]  # [K-1, V]


@pytest.mark.parametrize("invariant", [False, True])
def test_paged_forward_equals_dense(target, invariant):
    head = block_head(target).set_invariant(invariant)
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, ARGS.vocab_size, (1, 24), generator=g)  # [1, T]
    feature = torch.randn(1, 24, head.feature_size, generator=g)  # [1, T, F]
    anchors = torch.tensor([[3, 11, 17]])  # [1, A]
    with torch.no_grad():
        dense = head.forward_dense(tokens, feature, anchors)  # [1, A, K-1, V]
    for i, a in enumerate(anchors[0].tolist()):
        with torch.inference_mode():
            paged = paged_logits(head, tokens, feature, a)
        torch.testing.assert_close(paged, dense[0, i], rtol=1e-4, atol=1e-4)


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


def test_save_load_round_trip(target, tmp_path):
    head = block_head(target, target_layer_ids=[1, 3, 4])
    save_draft_head(head, tmp_path / "h")
    back = load_draft_head(tmp_path / "h", target, dtype=torch.float32)
    assert type(back) is type(head) and back.block_size == 5 and back.capture_layers(6) == (1, 3, 4)
    assert all(torch.equal(a, b) for a, b in zip(head.state_dict().values(), back.state_dict().values()))


@pytest.mark.parametrize("kw, msg", [({"target_layer_ids": [4, 2]}, "increasing"),
                                     ({"target_layer_ids": [9]}, r"\[0, 6\)"),
                                     ({"block_size": 1}, "block_size=1")])
def test_bad_config_is_named(target, kw, msg):
    with pytest.raises(ValueError, match=msg):
        new_draft_head("block", target, num_layers=1, device="meta", **kw)
