"""verify_greedy / verify_sampling (kernels/verify.py).

Greedy: the kernel equals the pure-Python reference exactly, on trees from build_tree with
targets that follow the draft to every depth. Sampling: the kernel equals the reference
exactly for the same coins, and a chi-square test shows the emitted tokens are distributed as
the target (with a negative control that must fail). On CPU run with TRITON_INTERPRET=1 (CI
does): the kernel's chi-square then uses fewer trials (the interpreter runs ~10 ms a request);
the full-size test of the kernel runs on a GPU.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
import torch
from kernel_testing import CUDA, DEVICE, needs_kernel

from eaglet.kernels.build_tree import build_tree, random_candidates
from eaglet.kernels.verify import (
    VerifyResult,
    verify_greedy,
    verify_greedy_ref,
    verify_sampling,
    verify_sampling_ref,
)

gpu_only = pytest.mark.skipif(not CUDA, reason="full-size chi-square of the kernel needs a GPU")

# (steps S, topk K, num_draft_tokens N)
SHAPES = [(5, 4, 8), (6, 10, 60), (4, 3, 13), (5, 1, 6), (3, 3, 1), (2, 4, 9)]


def random_tree(B, S, K, N, seed, vocab):
    """A draft tree from build_tree (on CPU: the reference builds it) and the generator that made it."""
    gen = torch.Generator().manual_seed(seed)
    scores, tokens, parents = random_candidates(B, K, S, vocab, gen)
    roots = torch.randint(0, vocab, (B,), generator=gen)  # [B]
    seq_lens = torch.randint(0, 50, (B,), generator=gen).int()  # [B]
    tree = build_tree(scores, tokens, parents, roots, seq_lens, N, K, S, "qlen_only")
    return tree, gen


def follow_target(tree, gen, vocab):
    """target_predict [B, N]: random, except along the path to a goal node of random depth,
    where it predicts the drafted child, and at the goal, where it predicts `vocab` (never
    drafted). Returns it and the goal depths [B]: the accepted length must be goal depth + 1."""
    B, N = tree.draft_tokens.shape
    pred = torch.randint(0, vocab, (B, N), generator=gen)  # [B, N]
    par, tok = tree.parents.tolist(), tree.draft_tokens.tolist()
    goal_depth = []
    for b in range(B):
        depth = [0] * N
        for i in range(1, N):
            depth[i] = depth[par[b][i]] + 1
        d = int(torch.randint(0, max(depth) + 1, (1,), generator=gen))
        nodes = [i for i in range(N) if depth[i] == d]
        node = nodes[int(torch.randint(0, len(nodes), (1,), generator=gen))]
        pred[b, node] = vocab
        while node > 0:
            pred[b, par[b][node]] = tok[b][node]
            node = par[b][node]
        goal_depth.append(d)
    return pred, torch.tensor(goal_depth)


def assert_same(a: VerifyResult, b: VerifyResult):
    for name, x, y in zip(VerifyResult._fields, a, b):
        assert x.dtype == y.dtype, name
        assert torch.equal(x.cpu(), y.cpu()), name


def tree_args(tree):
    return [t.to(DEVICE) for t in (tree.draft_tokens, tree.retrieve_next_token, tree.retrieve_next_sibling)]


# ----------------------------------------------------------------------------- greedy


@needs_kernel
@pytest.mark.parametrize("S,K,N", SHAPES)
def test_greedy_matches_reference(S, K, N):
    B, vocab = 48, 12  # a small vocabulary: random predictions sometimes match by chance too
    tree, gen = random_tree(B, S, K, N, seed=S * 100 + K * 10 + N, vocab=vocab)
    pred, goal_depth = follow_target(tree, gen, vocab)
    draft, nxt, sib = tree_args(tree)
    out = verify_greedy(draft, pred.to(DEVICE), nxt, sib, S)
    ref = verify_greedy_ref(tree.draft_tokens, pred, tree.retrieve_next_token, tree.retrieve_next_sibling, S)
    assert_same(out, ref)
    assert torch.equal(ref.accept_len.long(), goal_depth + 1)
    assert set(ref.accept_len.tolist()) == set(range(1, int(goal_depth.max()) + 2))  # every length seen
    if K == 1:
        assert ref.accept_len.max() == S + 1


@needs_kernel
def test_greedy_stops_at_steps():
    # A chain deeper than `steps`: the walk stops after S levels even though the target agrees.
    N, S = 6, 3
    draft = torch.tensor([[7, 1, 2, 3, 4, 5]])
    nxt = torch.tensor([[1, 2, 3, 4, 5, -1]])
    sib = torch.full((1, N), -1)
    pred = torch.tensor([[1, 2, 3, 4, 5, 9]])
    out = verify_greedy(*[t.to(DEVICE) for t in (draft, pred, nxt, sib)], S)
    assert out.accept_index.tolist() == [[0, 1, 2, 3]] and out.accept_len.tolist() == [4]
    assert out.bonus.tolist() == [4]


# The golden tree of test_build_tree.py (nodes: token/parent):
#   0: 99 (root) | 1: 10/0 | 2: 11/0 | 3: 20/1 | 4: 21/1 | 5: 22/2 | 6: 30/3 | 7: 32/4
GOLDEN_DRAFT = [[99, 10, 11, 20, 21, 22, 30, 32], [98, 10, 11, 20, 21, 22, 30, 32]]
GOLDEN_NEXT = [[1, 3, 5, 6, 7, -1, -1, -1]] * 2
GOLDEN_SIB = [[-1, 2, -1, 4, -1, -1, -1, -1]] * 2
# Request 0 follows 10 -> 21 (second sibling) -> 32, bonus 77; request 1 takes 11, then misses 22.
GOLDEN_PREDICT = [[10, 21, 5, 5, 32, 5, 5, 77], [11, 0, 44, 0, 0, 0, 0, 0]]
GOLDEN_ACCEPT = dict(accept_index=[[0, 1, 4, 7], [0, 2, -1, -1]], accept_len=[4, 2], bonus=[77, 44])


def golden_tree():
    return [torch.tensor(x, device=DEVICE) for x in (GOLDEN_DRAFT, GOLDEN_NEXT, GOLDEN_SIB)]


def test_greedy_golden():
    draft, nxt, sib = golden_tree()
    out = verify_greedy(draft, torch.tensor(GOLDEN_PREDICT, device=DEVICE), nxt, sib, 3)
    for name, expected in GOLDEN_ACCEPT.items():
        assert getattr(out, name).tolist() == expected, name
    assert out.accept_len.dtype == torch.int32 and out.accept_index.dtype == torch.int64


# ----------------------------------------------------------------------------- sampling


def drafty_probs(tree, gen, V):
    """target_probs [B, N, V] where each node's drafted children are likely, so paths go deep."""
    boost = math.log(V)  # a drafted child weighs about as much as the rest of the vocabulary
    B, N = tree.draft_tokens.shape
    logits = torch.randn(B, N, V, generator=gen)  # [B, N, V]
    par = tree.parents
    for i in range(1, N):
        rows = torch.arange(B)
        logits[rows, par[:, i], tree.draft_tokens[:, i]] += boost
    return torch.softmax(logits, -1)  # [B, N, V]


@needs_kernel
@pytest.mark.parametrize("V", [50, 5000])  # 5000: three vocabulary blocks, rejected tokens in any of them
@pytest.mark.parametrize("S,K,N", SHAPES)
def test_sampling_matches_reference(S, K, N, V):
    B = 16
    tree, gen = random_tree(B, S, K, N, seed=S * 100 + K * 10 + N + V, vocab=V)
    probs = drafty_probs(tree, gen, V)
    u = torch.rand(B, N, generator=gen)  # [B, N]
    uf = torch.rand(B, generator=gen)  # [B]
    out = verify_sampling(*tree_args(tree), probs.to(DEVICE), u.to(DEVICE), uf.to(DEVICE), S)
    ref = verify_sampling_ref(tree.draft_tokens, tree.retrieve_next_token, tree.retrieve_next_sibling,
                              probs, u, uf, S)
    assert_same(out, ref)
    if N > 1:
        assert ref.accept_len.max() >= 2 and ref.accept_len.min() <= 2  # accepts and rejects were both seen


def test_sampling_one_hot_is_greedy():
    # A one-hot target accepts exactly the greedy path and emits the argmax as bonus.
    draft, nxt, sib = golden_tree()
    pred = torch.tensor(GOLDEN_PREDICT, device=DEVICE)
    probs = torch.nn.functional.one_hot(pred, 100).float()  # [B, N, 100]
    gen = torch.Generator().manual_seed(0)
    u, uf = torch.rand(2, 8, generator=gen).to(DEVICE), torch.rand(2, generator=gen).to(DEVICE)
    out = verify_sampling(draft, nxt, sib, probs, u, uf, 3)
    for name, expected in GOLDEN_ACCEPT.items():
        assert getattr(out, name).tolist() == expected, name


def test_sampling_golden():
    # Request 0, root p: 10 -> 0.2, 11 -> 0.5, 3 -> 0.3. Node 1 (token 10): coin 0.5, 0.5 * 1 >= 0.2:
    # rejected, mass 0.8. Node 2 (token 11): 0.5 * 0.8 = 0.4 < 0.5: accepted. Node 2's p: 22 -> 0.1,
    # 3 -> 0.3, 7 -> 0.6; node 5 (token 22): coin 0.9 * 1 >= 0.1: rejected, mass 0.9. Residual
    # {3: 0.3, 7: 0.6}, final coin 0.5 -> target 0.45: cdf(3) = 0.3, cdf(7) = 0.9 -> bonus 7.
    draft, nxt, sib = golden_tree()
    V = 40
    probs = torch.zeros(2, 8, V)
    probs[:, :, 0] = 1.0  # nodes not reached
    probs[0, 0] = 0.0
    probs[0, 0, [10, 11, 3]] = torch.tensor([0.2, 0.5, 0.3])
    probs[0, 2] = 0.0
    probs[0, 2, [22, 3, 7]] = torch.tensor([0.1, 0.3, 0.6])
    # Request 1, root p: 10 -> 1.0: node 1 accepted whatever its coin; node 1's children 20, 21
    # have p = 0: both rejected, bonus from node 1's p: 5 -> 0.25, 39 -> 0.75, final coin 0.2 -> 5.
    probs[1, 0] = 0.0
    probs[1, 0, 10] = 1.0
    probs[1, 1] = 0.0
    probs[1, 1, [5, 39]] = torch.tensor([0.25, 0.75])
    u = torch.tensor([[0.0, 0.5, 0.5, 0.0, 0.0, 0.9, 0.0, 0.0], [0.0, 0.99, 0.5, 0.1, 0.1, 0.5, 0.5, 0.5]])
    uf = torch.tensor([0.5, 0.2])
    out = verify_sampling(draft, nxt, sib, probs.to(DEVICE), u.to(DEVICE), uf.to(DEVICE), 3)
    assert out.accept_index.tolist() == [[0, 2, -1, -1], [0, 1, -1, -1]]
    assert out.accept_len.tolist() == [2, 2]
    assert out.bonus.tolist() == [7, 5]


# Chi-square: a small tree over a vocabulary of 8 and a Markov "target": the first token is
# drawn from P0, the second from P1[first] (node probabilities follow from the drafted path).
#   node 0 (root): children 1, 2, 3     node 1: children 4, 5     node 2: child 6
CHI_V = 8
CHI_NEXT = [1, 4, 6, -1, -1, -1, -1]
CHI_SIB = [-1, 2, 3, -1, 5, -1, -1]
CHI_PARENT = [-1, 0, 0, 0, 1, 1, 2]


def chi_problem(seed=0):
    rng = np.random.default_rng(seed)
    p0 = rng.dirichlet(np.full(CHI_V, 0.8)).astype(np.float32)  # [V]
    p1 = rng.dirichlet(np.full(CHI_V, 0.8), size=CHI_V).astype(np.float32)  # [V, V] p(second | first)
    order0 = np.argsort(-p0)
    draft = [0, int(order0[1]), int(order0[0]), int(order0[3])]  # not in probability order; one unlikely
    a, b = draft[1], draft[2]
    draft += [int(np.argsort(-p1[a])[0]), int(np.argsort(-p1[a])[2]), int(np.argsort(-p1[b])[0])]
    node_probs = np.stack([p0] + [p1[draft[i]] for i in (1, 2, 3)] + [p1[draft[i]] for i in (4, 5, 6)])
    return p0, p1, draft, node_probs  # node_probs [7, V]: depth-2 nodes reuse P1 as p(third | second)


def emitted_pairs(sample, trials, seed, coin_power=1.0):
    """Run `sample` (a verify_sampling implementation) on `trials` copies of the chi problem;
    returns the first two emitted tokens [trials, 2] and the accepted lengths [trials]."""
    p0, p1, draft, node_probs = chi_problem()
    gen = torch.Generator().manual_seed(seed)
    N = len(draft)
    args = [torch.tensor([x]).expand(trials, N).contiguous().to(DEVICE) for x in (draft, CHI_NEXT, CHI_SIB)]
    probs = torch.from_numpy(node_probs / node_probs.sum(-1, keepdims=True))  # [N, V]
    probs = probs.float().expand(trials, N, CHI_V).contiguous().to(DEVICE)  # [trials, N, V]
    u = (torch.rand(trials, N, generator=gen) ** coin_power).to(DEVICE)  # [trials, N]
    uf = torch.rand(trials, generator=gen).to(DEVICE)  # [trials]
    res = sample(*args, probs, u, uf, 2)
    idx, n, bonus = res.accept_index.cpu().numpy(), res.accept_len.cpu().numpy(), res.bonus.cpu().numpy()
    tokens = np.array(draft)
    seq = np.where(idx >= 0, tokens[np.maximum(idx, 0)], -1)  # [trials, 3], node tokens, root first
    first = np.where(n >= 2, seq[:, 1], bonus)
    second = np.where(n >= 3, seq[:, 2], bonus)
    # One token emitted: the second comes from the next step, i.e. from the target P1[first].
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(p1[first] / p1[first].sum(-1, keepdims=True), -1)  # [trials, V]
    nxt = np.minimum((cdf < rng.random((trials, 1))).sum(-1), CHI_V - 1)
    second = np.where(n >= 2, second, nxt)
    return np.stack([first, second], 1), n, p0, p1


def chi_square_pvalues(pairs, p0, p1):
    """p-values of the first token's marginal and of the first two tokens jointly."""
    n = len(pairs)
    p0, p1 = p0.astype(np.float64), p1.astype(np.float64)
    p0 = p0 / p0.sum()
    joint = (p0[:, None] * (p1 / p1.sum(-1, keepdims=True))).ravel()  # [V*V]
    out = []
    for probs, obs_idx in ((p0, pairs[:, 0]), (joint, pairs[:, 0] * CHI_V + pairs[:, 1])):
        obs = np.bincount(obs_idx, minlength=len(probs)).astype(np.float64)
        exp = probs / probs.sum() * n
        big = exp >= 5  # chi-square needs expected counts >= 5: pool the rest into one cell
        obs_c = np.append(obs[big], obs[~big].sum())
        exp_c = np.append(exp[big], exp[~big].sum())
        if exp_c[-1] < 5:  # too small to stand alone: fold into the smallest kept cell
            i = np.argmin(exp_c[:-1])
            obs_c[i] += obs_c[-1]
            exp_c[i] += exp_c[-1]
            obs_c, exp_c = obs_c[:-1], exp_c[:-1]
        out.append(scipy.stats.chisquare(obs_c, exp_c).pvalue)
    return out


def test_sampling_distribution_reference():
    pairs, n, p0, p1 = emitted_pairs(verify_sampling_ref, 40_000, seed=1)
    p_first, p_joint = chi_square_pvalues(pairs, p0, p1)
    assert p_first > 1e-3 and p_joint > 1e-3, (p_first, p_joint)
    assert set(n.tolist()) == {1, 2, 3}  # all rejected, one accepted, two accepted: all exercised


def test_sampling_distribution_negative_control():
    # Coins u**2 accept x with probability sqrt(p(x)/mass) instead of p(x)/mass: the same
    # harness must reject, or it has no power.
    pairs, _, p0, p1 = emitted_pairs(verify_sampling_ref, 40_000, seed=1, coin_power=2.0)
    p_first, p_joint = chi_square_pvalues(pairs, p0, p1)
    assert p_first < 1e-3 and p_joint < 1e-3, (p_first, p_joint)


@needs_kernel
def test_sampling_distribution_kernel():
    trials = 40_000 if CUDA else 1_200  # the interpreter runs ~10 ms a request
    pairs, _, p0, p1 = emitted_pairs(verify_sampling, trials, seed=2)
    p_first, p_joint = chi_square_pvalues(pairs, p0, p1)
    assert p_first > 1e-3 and p_joint > 1e-3, (p_first, p_joint)


@gpu_only
def test_sampling_negative_control_kernel():
    pairs, _, p0, p1 = emitted_pairs(verify_sampling, 40_000, seed=2, coin_power=2.0)
    assert max(chi_square_pvalues(pairs, p0, p1)) < 1e-3


# ----------------------------------------------------------------------------- validation


def test_validation():
    draft, nxt, sib = golden_tree()
    pred = torch.tensor(GOLDEN_PREDICT, device=DEVICE)
    with pytest.raises(ValueError, match="target_predict"):
        verify_greedy(draft, pred[:, :-1], nxt, sib, 3)
    with pytest.raises(ValueError, match="retrieve_next_sibling"):
        verify_greedy(draft, pred, nxt, sib.int(), 3)
    with pytest.raises(ValueError, match="steps"):
        verify_greedy(draft, pred, nxt, sib, 0)
    probs = torch.full((2, 8, 5), 0.2, device=DEVICE)
    u, uf = torch.rand(2, 8, device=DEVICE), torch.rand(2, device=DEVICE)
    with pytest.raises(ValueError, match="target_probs"):
        verify_sampling(draft, nxt, sib, probs.double(), u, uf, 3)
    with pytest.raises(ValueError, match="target_probs"):
        verify_sampling(draft, nxt, sib, probs[:, :3], u, uf, 3)
    with pytest.raises(ValueError, match="uniforms_final"):
        verify_sampling(draft, nxt, sib, probs, u, uf[:1], 3)
    with pytest.raises(ValueError, match="uniforms"):
        verify_sampling(draft, nxt, sib, probs, u.half(), uf, 3)


@needs_kernel
@pytest.mark.parametrize("S", [1, 5, 7])
def test_emitted_record_equals_a_plain_construction(S):
    """The step's record for the host: accept_len, the accepted path's tokens after the root, the bonus, -1 after;
    a padding row (accept_len 0) is all -1 past its 0. Exact, against Python lists and the torch reference."""
    from eaglet.kernels.verify import VerifyResult, emitted_record, emitted_record_ref

    g = torch.Generator().manual_seed(S)
    B, N = 6, 3 * S + 2
    tokens = torch.randint(0, 1000, (B, N), generator=g)  # [B, N]
    lens = torch.tensor([0, 1, S + 1] + torch.randint(1, S + 2, (B - 3,), generator=g).tolist(), dtype=torch.int32)
    index = torch.full((B, S + 1), -1, dtype=torch.int64)  # [B, S+1]
    for b, n in enumerate(lens.tolist()):
        if n:
            path = torch.randperm(N - 1, generator=g)[:n - 1] + 1  # [n-1] distinct non-root nodes
            index[b, :n] = torch.cat([torch.zeros(1, dtype=torch.int64), path])
    bonus = torch.randint(0, 1000, (B,), generator=g)  # [B]
    res = VerifyResult(index, lens, bonus)
    want = []
    for b, n in enumerate(lens.tolist()):
        toks = [int(tokens[b, i]) for i in index[b, 1:n].tolist()] + ([int(bonus[b])] if n else [])
        want.append([n] + toks + [-1] * (S + 1 - len(toks)))
    assert emitted_record_ref(tokens, res).tolist() == want
    dev = VerifyResult(*(t.to(DEVICE) for t in res))
    assert emitted_record(tokens.to(DEVICE), dev).cpu().tolist() == want


# ----------------------------------------------------------------------------- simulated acceptance


@needs_kernel
@pytest.mark.parametrize("S,K,N", SHAPES + [(7, 4, 30), (6, 8, 100)])  # 30: the block drafter's tree, 100: 4 warps
def test_simulated_accept_equals_a_plain_construction(S, K, N):
    """tree=simulate's accept: the drawn length (inverse CDF of the uniform, boundaries included) along the first
    deepest node's path, cut where the path ends; an empty row (bucket padding) accepts nothing and takes node 0's
    prediction. Exact, kernel and torch reference, against Python lists."""
    from eaglet.kernels.verify import verify_simulated, verify_simulated_ref

    tree, gen = random_tree(8, S, K, N, seed=S * 100 + N, vocab=1000)
    B, N = tree.draft_tokens.shape  # build_tree may make fewer nodes than asked
    parents = tree.parents.tolist()
    mask = torch.zeros(B, N, N, dtype=torch.bool)  # [B, N, N] ancestors-or-self
    for b in range(B):
        for j in range(N):
            a = j
            while True:
                mask[b, j, a] = True
                if a == 0:
                    break
                a = parents[b][a]
    mask[1] = False  # a row without a tree
    pred = torch.randint(0, 1000, (B, N), generator=gen)  # [B, N]
    p = torch.rand(S + 1, generator=gen, dtype=torch.float64) + 0.1  # [S+1]
    cdf = (p.cumsum(0) / p.sum()).float()  # [S+1]
    u = torch.rand(B, generator=gen)  # [B]
    u[2], u[3], u[4] = cdf[0], cdf[S - 1], 0.0  # exactly on a boundary: the next length
    want_index, want_len, want_bonus = [], [], []
    for b in range(B):
        depth = mask[b].sum(-1).tolist()
        deep = depth.index(max(depth))
        path = [k for k in range(N) if mask[b, deep, k]]
        n = min(1 + sum(float(c) <= float(u[b]) for c in cdf[:S]), len(path))
        want_index.append(path[:n] + [-1] * (S + 1 - n))
        want_len.append(n)
        want_bonus.append(int(pred[b, path[n - 1] if n else 0]))
    for fn, dev in ((verify_simulated_ref, "cpu"), (verify_simulated, DEVICE)):
        res = fn(pred.to(dev), mask.to(dev), cdf.to(dev), u.to(dev), S)
        assert res.accept_index.dtype == torch.int64 and res.accept_len.dtype == torch.int32
        assert res.accept_index.cpu().tolist() == want_index, fn.__name__
        assert res.accept_len.cpu().tolist() == want_len, fn.__name__
        assert res.bonus.cpu().tolist() == want_bonus, fn.__name__
