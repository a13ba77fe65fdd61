"""models/eagle.py's training forward (`forward_dense`) against the paged inference forward: same outputs on
the same attention pattern, and the unrolled training-time test (TTT) equals the engine's chain draft, for every
head kind (a multi-layer head's draft step k runs layer min(k, S-1) and does not see its ancestors)."""

from __future__ import annotations

import pytest
import torch

from eaglet.models.head_checkpoint import new_draft_head
from eaglet.models.kv_cache import ForwardBatch, slots_for
from eaglet.models.ttt_attention import DenseKV
from eaglet.training.losses import unroll

V = 256


def rel_err(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def make_head(kind, target, layers=None):
    torch.manual_seed(1)
    head = new_draft_head(kind, target, num_layers=layers, draft_vocab_size=64 if kind == "eagle3" else None)
    with torch.no_grad():  # norms and biases away from their ones/zeros init, so a skipped one shows
        for name, p in head.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape))
    if kind == "eagle3":
        head.set_draft_vocab(torch.randperm(V)[:64])
    return head


def pool(head, B, context=64, page_size=4):
    kv = head.kv_cache(max_reqs=B, max_context=context, page_size=page_size)
    rows = [kv.alloc_request() for _ in range(B)]
    for r in rows:
        kv.reserve(r, context)
    return kv, kv.req_to_page[rows]


def paged(head, kv, pt, tokens, hidden, start, mask=None, step=None, prefix=None):
    """The inference forward of T new tokens at positions start.. after a cached prefix of `prefix` (= start)
    tokens; with `mask` [B, T, NK] they attend the NK new keys at positions prefix.. instead of themselves."""
    B, T = tokens.shape
    prefix = start if prefix is None else prefix
    pos = torch.arange(start, start + T)[None].repeat(B, 1)  # [B, T]
    batch = ForwardBatch(pt, torch.full((B,), prefix, dtype=torch.int32), slots_for(pt, pos, kv.page_size), mask,
                         max_prefix_len=prefix)
    return head(tokens, hidden, pos, batch, kv, step=step)


CASES = [("eagle1", 1), ("eagle1", 2), ("eagle3", 1), ("multi_layer", 3)]


@pytest.mark.parametrize("kind,layers", CASES)
@pytest.mark.parametrize("T1,T2", [(7, 5), (1, 1), (16, 3)])
def test_dense_equals_paged(target, kind, layers, T1, T2):
    """A causal forward of T1 tokens, then T2 more attending the first T1 (from DenseKV / the paged pool); for a
    multi-layer head both are extends (every layer runs, the output is layer 0's)."""
    head = make_head(kind, target, layers).eval()
    g = torch.Generator().manual_seed(2)
    B = 2
    tokens = torch.randint(0, V, (B, T1 + T2), generator=g)
    feats = torch.randn(B, T1 + T2, head.feature_size, generator=g)
    kv, pt = pool(head, B)
    cache = DenseKV()
    pos = torch.arange(T1 + T2)[None].repeat(B, 1)
    causal = torch.ones(T1 + T2, T1 + T2, dtype=torch.bool).tril()  # [T, T]
    with torch.no_grad():
        h1, l1 = paged(head, kv, pt, tokens[:, :T1], feats[:, :T1], 0)
        h2, l2 = paged(head, kv, pt, tokens[:, T1:], feats[:, T1:], T1)
        d1, m1 = head.forward_dense(tokens[:, :T1], feats[:, :T1], pos[:, :T1], causal[:T1, :T1], cache)
        d2, m2 = head.forward_dense(tokens[:, T1:], feats[:, T1:], pos[:, T1:], causal[T1:], cache)
    for a, b in ((d1, h1), (m1, l1), (d2, h2), (m2, l2)):
        assert a.shape == b.shape
        assert rel_err(a, b) <= 1e-5


@pytest.mark.parametrize("kind,layers", [("eagle1", None), ("eagle3", None), ("multi_layer", 2), ("multi_layer", 3)])
@pytest.mark.parametrize("steps", [1, 3])
def test_ttt_unroll_equals_engine_chain(target, kind, layers, steps):
    """Unrolled step k at row p == the engine drafting a chain from the prefix ending at p: extend over the pairs
    of rows 0..p, then draft steps 1..k, each at position p+k, fed the previous step's hidden state and the
    token p+k+1, attending the extend's KV plus the chain's own draft KV (tree mask = its ancestors; a multi-layer
    head's = itself only, and with 2 layers steps 1 and 2 share layer 1)."""
    head = make_head(kind, target, layers).eval()
    g = torch.Generator().manual_seed(3)
    B, T = 2, 12
    tokens = torch.randint(0, V, (B, T), generator=g)
    feats = torch.randn(B, T, head.feature_size, generator=g)
    with torch.no_grad():
        outs = unroll(head, tokens, feats, steps)
    for p in (0, 4, T - steps - 1):
        kv, pt = pool(head, B)
        with torch.no_grad():
            h, logits = paged(head, kv, pt, tokens[:, 1:p + 2], feats[:, :p + 1], 0)  # extend: pairs (f_q, x_{q+1})
            h, logits = h[:, -1:], logits[:, -1:]
            chain = [(h, logits)]
            for k in range(1, steps):
                # as SpeculativeEngine._draft_fn with topk 1: prefix = the p+1 extended rows, the step's KV written at
                # position p+k, new keys p+1..p+k = the chain's draft KV (its ancestors, if cached, and itself)
                mask = torch.ones(B, 1, k, dtype=torch.bool)  # [B, 1, k]
                mask[..., :-1] = head.DRAFT_ANCESTORS_CACHED
                h, logits = paged(head, kv, pt, tokens[:, p + k + 1:p + k + 2], h, p + k, mask=mask, step=k,
                                  prefix=p + 1)
                chain.append((h, logits))
        for k, ((hd, ld), (hp, lp)) in enumerate(zip(outs, chain)):
            assert rel_err(hd[:, p:p + 1], hp) <= 1e-5, (p, k)
            assert rel_err(ld[:, p:p + 1], lp) <= 1e-5, (p, k)


@pytest.mark.parametrize("kind,layers", [("eagle1", None), ("eagle3", None), ("multi_layer", 3)])
def test_gradients_reach_every_head_parameter_and_no_target_parameter(target, kind, layers):
    head = make_head(kind, target, layers).train()
    target.requires_grad_(False)
    tokens = torch.randint(0, V, (2, 10))
    feats = torch.randn(2, 10, head.feature_size)
    outs = unroll(head, tokens, feats, 3)
    sum(lg.logsumexp(-1).sum() + h.square().sum() for h, lg in outs).backward()
    for name, prm in head.named_parameters():
        assert prm.grad is not None and prm.grad.abs().sum() > 0, name
    assert all(prm.grad is None for prm in target.parameters())


def test_dense_rejects_bad_mask(target):
    head = make_head("eagle1", target)
    tokens, feats = torch.randint(0, V, (1, 4)), torch.randn(1, 4, head.feature_size)
    pos = torch.arange(4)[None]
    with pytest.raises(ValueError, match="attn_mask must be bool"):
        head.forward_dense(tokens, feats, pos, torch.ones(4, 4))


@pytest.mark.parametrize("T", [1, 9])
def test_ttt_pattern_equals_its_dense_mask_with_gradients(target, T):
    """Training runs TTTPattern (T^2 + k*T scores per step); SDPA over `ttt_attention_mask` ((k+1)*T^2) is its
    reference: same outputs and same gradients over 4 unrolled steps."""
    from eaglet.models.ttt_attention import TTTPattern
    from eaglet.training.losses import ttt_attention_mask

    head = make_head("eagle3", target)
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, V, (2, T + 4), generator=g)
    feats = torch.randn(2, T, head.feature_size, generator=g)
    pos = torch.arange(T)[None].repeat(2, 1)

    def run(pattern: bool):
        cache, hidden, loss = DenseKV(), feats, 0.0
        for k in range(4):
            mask = TTTPattern(k) if pattern else ttt_attention_mask(T, k)
            hidden, logits = head.forward_dense(tokens[:, k:k + T], hidden, pos + k, mask, cache)
            loss = loss + (logits * torch.linspace(-1, 1, logits.shape[-1])).sum() + hidden.square().sum()
        head.zero_grad(set_to_none=True)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in head.parameters() if p.grad is not None]

    (l_pat, g_pat), (l_mask, g_mask) = run(True), run(False)
    assert rel_err(l_pat, l_mask) < 1e-5 and len(g_pat) == len(g_mask) > 0
    assert max(rel_err(a, b) for a, b in zip(g_pat, g_mask)) < 1e-4


def test_ttt_pattern_needs_the_earlier_steps(target):
    from eaglet.models.ttt_attention import TTTPattern

    head = make_head("eagle3", target)
    tokens, feats = torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4, head.feature_size)
    with pytest.raises(ValueError, match="TTTPattern\\(step=2\\) needs the keys of steps 0..2"):
        head.forward_dense(tokens, feats, torch.arange(4)[None], TTTPattern(2), DenseKV())
    multi = make_head("multi_layer", target, 2)
    feats = torch.zeros(1, 4, multi.feature_size)
    with pytest.raises(ValueError, match="TTTPattern\\(step=2\\) needs the keys of step 0 and of this call"):
        multi.forward_dense(tokens, feats, torch.arange(4)[None], TTTPattern(2, ancestors=False), DenseKV())
    # the engine's multi-layer draft steps do not see their ancestors: the pattern must say so
    with pytest.raises(ValueError, match="do not see their ancestors"):
        multi.forward_dense(tokens, feats, torch.arange(4)[None], TTTPattern(1), DenseKV())
