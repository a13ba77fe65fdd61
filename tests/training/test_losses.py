"""training/losses.py: the TTT attention mask against a pure-Python reference, the draft vocabulary map,
the target distribution restricted to it, and the alignment of every per-step statistic."""

from __future__ import annotations

import pytest
import torch

from eaglet.models.head_checkpoint import new_draft_head
from eaglet.training.data import Sample, draft_vocab
from eaglet.training.losses import (
    STATS,
    draft_loss,
    repeated_ngrams,
    step_counts,
    step_terms,
    target_distribution,
    ttt_attention_mask,
)


def ttt_mask_reference(T: int, k: int) -> list[list[bool]]:
    """Query i of unrolled step k over keys (step s, row j), s = 0..k: step 0 causally, steps >= 1 only row i."""
    return [[(j <= i) if s == 0 else (j == i) for s in range(k + 1) for j in range(T)] for i in range(T)]


@pytest.mark.parametrize("T", [1, 2, 7, 33])
@pytest.mark.parametrize("k", [0, 1, 3, 6])
def test_ttt_mask_equals_reference(T, k):
    got = ttt_attention_mask(T, k)
    assert got.dtype == torch.bool and got.shape == (T, (k + 1) * T)
    assert got.tolist() == ttt_mask_reference(T, k)


def test_draft_vocab_is_the_most_frequent_assistant_tokens_and_round_trips(target):
    V, n = target.args.vocab_size, 16
    g = torch.Generator().manual_seed(0)
    samples = []
    for _ in range(20):
        ids = torch.randint(0, V, (50,), generator=g)
        ids[25:40] = torch.randint(200, 210, (15,), generator=g)  # frequent assistant tokens
        ids[:10] = 7  # frequent, but prompt only: must not count
        samples.append(Sample(ids, torch.arange(50) >= 25))
    vocab = draft_vocab(samples, V, n)
    counts = torch.zeros(V, dtype=torch.long)
    for s in samples:
        for t in s.ids[s.mask].tolist():
            counts[t] += 1
    ref = sorted(sorted(range(V), key=lambda t: (-counts[t], t))[:n])  # ties by ascending id
    assert vocab.tolist() == ref
    assert set(range(200, 210)) <= set(ref) and 7 not in ref
    head = new_draft_head("eagle3", target, draft_vocab_size=n)
    head.set_draft_vocab(vocab)
    assert head.to_target_ids(torch.arange(n)).tolist() == ref  # d2t: draft id -> target id
    assert head.t2d.nonzero()[:, 0].tolist() == ref  # t2d: target id -> in the draft vocabulary
    assert int(head.t2d.sum()) == n
    with pytest.raises(ValueError, match="draft_vocab_size"):
        draft_vocab(samples, V, V + 1)


def test_target_distribution_restricted():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 5, 32, generator=g) * 3
    vocab = torch.tensor([1, 4, 9, 30])
    d = target_distribution(logits, vocab)
    full = logits.softmax(-1)
    assert torch.allclose(d.probs, full[..., vocab], rtol=1e-5, atol=1e-7)
    assert torch.allclose(d.labels, full[..., vocab] / full[..., vocab].sum(-1, keepdim=True), rtol=1e-5)
    assert torch.equal(d.argmax, full.argmax(-1))
    assert torch.equal(d.in_vocab, torch.isin(d.argmax, vocab))
    e = target_distribution(logits, None)
    assert torch.allclose(e.labels, full) and e.in_vocab.all()


@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
@pytest.mark.parametrize("k", [0, 2])
def test_step_terms_alignment(target, kind, k):
    """Draft logits at row p equal to the target's at p+k+1 must score accuracy 1 and acceptance 1 on every
    counted row (rows p whose token p+k+2 is in the loss mask), and cross-entropy = the target's entropy."""
    head = new_draft_head(kind, target, draft_vocab_size=None)
    B, T, V = 2, 10, target.args.vocab_size
    g = torch.Generator().manual_seed(2)
    tlogits = torch.randn(B, T, V, generator=g) * 2
    mask = torch.rand(B, T, generator=g) < 0.6
    dist = target_distribution(tlogits, None)
    draft_logits = torch.cat([tlogits[:, k + 1:], torch.zeros(B, k + 1, V)], dim=1)  # row p = target's p+k+1
    t = step_terms(head, k, torch.zeros(B, T, target.args.dim), draft_logits, dist, mask, None)
    rows = int(mask[:, k + 2:].sum())
    assert int(t["rows"]) == rows == int(step_counts(mask, k + 1)[k])
    assert int(t["correct"]) == rows
    assert abs(float(t["accept"]) - rows) < 1e-4
    p = tlogits.softmax(-1)
    ent = -(p * p.log()).sum(-1)[:, k + 1:T - 1]  # [B, T-k-2] entropy at the target positions
    assert torch.allclose(t["ploss"], (ent * mask[:, k + 2:]).sum(), rtol=1e-5)


def test_draft_loss_normalisation(target):
    """loss = sum_k w^k ploss_k / norm_k (EAGLE-3); stats sum per step; eagle1's vloss only with v_weight; with
    a_weight the loss adds a_weight * sum_k w^k aloss_k / norm_k."""
    head = new_draft_head("eagle3", target, draft_vocab_size=32)
    head.set_draft_vocab(torch.arange(0, 256, 8))
    g = torch.Generator().manual_seed(3)
    B, T = 2, 12
    tokens = torch.randint(0, 256, (B, T), generator=g)
    mask = torch.rand(B, T, generator=g) < 0.7
    feats, hidden = torch.randn(B, T, 3 * 128, generator=g), torch.randn(B, T, 128, generator=g)
    norm = step_counts(mask, 3)
    loss, stats = draft_loss(head, tokens, mask, feats, hidden, norm, steps=3, step_weight=0.8)
    assert stats.shape == (3, len(STATS))
    assert stats[:, STATS.index("rows")].tolist() == norm.tolist()
    want = sum(0.8**k * stats[k, STATS.index("ploss")] / norm[k] for k in range(3))
    assert torch.allclose(loss.detach(), want, rtol=1e-6)
    assert (stats[:, STATS.index("vloss")] == 0).all()
    weighted, same = draft_loss(head, tokens, mask, feats, hidden, norm, steps=3, step_weight=0.8, a_weight=0.5)
    assert torch.equal(stats, same)
    extra = sum(0.8**k * stats[k, STATS.index("aloss")] / norm[k] for k in range(3))
    assert float(extra) > 0
    assert torch.allclose(weighted.detach(), loss.detach() + 0.5 * extra, rtol=1e-6)


def test_accept_loss_is_minus_log_acceptance_and_raises_it(target):
    """aloss = sum over counted rows of -log sum_x min(p(x), q(x)); with accept_grad a gradient step on the draft
    logits raises the acceptance; without it the term carries no gradient."""
    head = new_draft_head("eagle3", target, draft_vocab_size=None)
    B, T, V, k = 2, 9, target.args.vocab_size, 1
    g = torch.Generator().manual_seed(5)
    dist = target_distribution(torch.randn(B, T, V, generator=g) * 3, None)
    mask = torch.rand(B, T, generator=g) < 0.7
    logits = (torch.randn(B, T, V, generator=g) * 3).requires_grad_()
    t = step_terms(head, k, torch.zeros(B, T, target.args.dim), logits, dist, mask, None, accept_grad=True)
    n = T - k - 2
    q = logits[:, :n].detach().softmax(-1)
    a = torch.minimum(dist.probs[:, k + 1:k + 1 + n], q).sum(-1)  # [B, n]
    valid = mask[:, k + 2:].float()
    assert torch.allclose(t["aloss"], (-a.log() * valid).sum(), rtol=1e-5)
    assert torch.allclose(t["accept"], (a * valid).sum(), rtol=1e-5)
    t["aloss"].backward()
    stepped = (logits - 0.5 * logits.grad).detach()
    after = step_terms(head, k, torch.zeros(B, T, target.args.dim), stepped, dist, mask, None)
    assert float(after["accept"]) > float(t["accept"])
    assert not step_terms(head, k, torch.zeros(B, T, target.args.dim), logits, dist, mask, None)["aloss"].requires_grad


def repeated_reference(ids: list[int], n: int) -> list[bool]:
    """Whether the n-gram ending at each position occurred earlier in ids (a set of tuples)."""
    seen, out = set(), [False] * len(ids)
    for i in range(n - 1, len(ids)):
        g = tuple(ids[i - n + 1:i + 1])
        out[i] = g in seen
        seen.add(g)
    return out


@pytest.mark.parametrize("n", [1, 3, 8])
def test_repeated_ngrams_equals_reference(n):
    g = torch.Generator().manual_seed(n)
    rows = [torch.randint(0, 5, (40,), generator=g),  # a small alphabet: many chance repeats
            torch.cat([torch.randint(0, 49152, (10,), generator=g), torch.tensor([7, 8, 9, 10, 11] * 6)]),  # a loop
            torch.randint(0, 49152, (60,), generator=g)[:40]]
    tokens = torch.stack(rows)  # [3, 40]
    got = repeated_ngrams(tokens, n)
    assert got.tolist() == [repeated_reference(r.tolist(), n) for r in rows]
    assert got[1, 30:].all() and not got[2].any() and not repeated_ngrams(tokens[:, :n - 1], n).any()


def test_fresh_accuracy_counts_only_rows_outside_repeats(target):
    """train/acc_0_fresh's statistics: without a repeat they equal the all-row ones; with a loop, fewer rows."""
    head = new_draft_head("eagle3", target, draft_vocab_size=None)
    g = torch.Generator().manual_seed(0)
    plain = torch.randint(0, target.args.vocab_size, (1, 24), generator=g)  # [1, 24] no repeated 8-gram
    loop = torch.cat([plain[:, :8], plain[:, :8], plain[:, :8]], 1)  # [1, 24] the same 8 tokens three times
    for tokens, looping in ((plain, False), (loop, True)):
        mask = torch.ones_like(tokens, dtype=torch.bool)
        hidden = torch.randn(1, 24, target.args.dim, generator=g)
        feature = torch.randn(1, 24, 3 * target.args.dim, generator=g)
        _, stats = draft_loss(head, tokens, mask, feature, hidden, torch.ones(2), steps=2, step_weight=0.8)
        rows, fresh = stats[:, STATS.index("rows")], stats[:, STATS.index("rows_fresh")]
        correct, correct_fresh = stats[:, STATS.index("correct")], stats[:, STATS.index("correct_fresh")]
        if looping:
            assert (fresh < rows).all() and (correct_fresh <= correct).all()
        else:
            assert torch.equal(fresh, rows) and torch.equal(correct_fresh, correct)
