"""trie_graft (kernels/trie_graft.py) against its torch reference (`graft_ref`) and the plain-Python insertion
(`graft_sequential`), exactly: random EAGLE-2 trees (kernels/build_tree.py), B > 1 with a different tree a row, the
bare root (the n-gram drafter), budgets that cut a path, all -1 paths, shared prefixes, a grafted tree (padding
slots) grafted again, N up to 64 and P x S up to 4 x 8; the launcher's input checks.

On CPU run with TRITON_INTERPRET=1 (CI does) so the Triton kernel itself is tested; without it the launcher runs the
torch reference, which the tests then hold to the plain-Python one. On a GPU the same tests run there, plus a CUDA
graph.
"""

from __future__ import annotations

import pytest
import torch
from kernel_testing import CUDA, DEVICE, gpu_only

from eaglet.engine.drafters._trie import root_tree
from eaglet.kernels.build_tree import build_tree, random_candidates
from eaglet.kernels.trie_graft import MAX_NODES, graft, graft_ref, graft_sequential


def check(tree, paths, extra, fallback=None):
    """graft == graft_ref == graft_sequential, every output exactly; returns graft's (CPU)."""
    fb = None if fallback is None else tuple(t.to(DEVICE) for t in fallback)
    got = [t.cpu() for t in graft(tuple(t.to(DEVICE) for t in tree), paths.to(DEVICE), extra, fb)]
    ref = graft_ref(tree, paths, extra, fallback)
    want = graft_sequential(tree, paths, extra, fallback)
    B, N = tree[0].shape
    M = N + extra
    for name, g, r, w in zip(("tokens", "positions", "next_token", "next_sibling", "mask"), got, ref, want):
        assert g.shape == w.shape == ((B, M, M) if name == "mask" else (B, M)) and g.dtype == w.dtype, name
        assert torch.equal(r, w), (name, r, w)
        assert torch.equal(g, w), (name, g, w)
    return got


def eagle_trees(B: int, K: int, S: int, N: int, vocab: int, g: torch.Generator, widen: int | None = None):
    """B random EAGLE-2 trees of N nodes (one per row, from build_tree) over `vocab` tokens, as a DraftTree tuple;
    with `widen`, also the trees of N + widen nodes from the same candidates (a drafter's `propose_widened`)."""
    scores, tokens, parents = random_candidates(B, K, S, vocab=vocab, generator=g)
    roots = torch.randint(vocab, (B,), generator=g)  # [B]
    seq_lens = torch.randint(0, 100, (B,), generator=g).int()  # [B]
    trees = []
    for n in (N,) if widen is None else (N, N + widen):
        bt = build_tree(scores, tokens, parents, roots, seq_lens, n, K, S)
        trees.append((bt.draft_tokens, bt.positions, bt.retrieve_next_token, bt.retrieve_next_sibling, bt.tree_mask))
    return trees[0] if widen is None else trees


def random_paths(tree, P: int, S: int, vocab: int, g: torch.Generator) -> torch.Tensor:
    """[B, P, S] paths that follow a random node's path down the tree, then depart with random tokens, cut at a random
    length (-1 past it); a third of them repeat an earlier path's prefix (shared new nodes)."""
    B, N = tree[0].shape
    out = []
    for b in range(B):
        rows = []
        for p in range(P):
            if p and int(torch.randint(3, (1,), generator=g)) == 0:  # an earlier path's prefix, then its own tokens
                q = rows[int(torch.randint(p, (1,), generator=g))]
                keep = int(torch.randint(S + 1, (1,), generator=g))
                path = [t for t in q[:keep] if t >= 0] + torch.randint(vocab, (S,), generator=g).tolist()
            else:
                i = int(torch.randint(N, (1,), generator=g))
                anc = tree[4][b, i].nonzero()[:, 0].tolist()[1:]
                path = [tree[0][b, a].item() for a in anc] + torch.randint(vocab, (S,), generator=g).tolist()
            cut = int(torch.randint(S + 1, (1,), generator=g))
            rows.append(path[:min(cut, S)] + [-1] * (S - min(cut, S)))
        out.append(rows)
    return torch.tensor(out, dtype=torch.int64)  # [B, P, S]


# (B, tree topk K / steps / nodes N, paths P x S, extras): the n-gram drafter's and n-gram branches' shapes and larger
EAGLE_CASES = [
    (1, 3, 4, 10, 4, 4, (12, 3, 0)),
    (3, 4, 5, 8, 2, 5, (10, 4)),  # eagle+ngram2 on the default 5/4/8 tree
    (4, 2, 3, 6, 4, 8, (32, 7)),  # P x S = 4 x 8
    (2, 8, 6, 32, 2, 6, (12, 32)),  # eagle2_wide + 2 branches; 32 + 32 = 64 slots
    (2, 4, 7, 24, 2, 7, (14,)),  # the block drafter's 7/4/24 + 2 branches: 38 nodes, BLOCK_M = 64
    (2, 10, 6, 60, 2, 6, (4, 1)),  # the EAGLE-2 paper's 60-node tree
    (2, 8, 8, 64, 3, 8, (0,)),  # N = 64
]


@pytest.mark.parametrize("few", [True, False], ids=["vocab_topk+1", "vocab50"])
@pytest.mark.parametrize("B, K, S_tree, N, P, S, extras", EAGLE_CASES,
                         ids=[f"B{c[0]}-K{c[1]}-S{c[2]}-N{c[3]}-P{c[4]}xS{c[5]}" for c in EAGLE_CASES])
def test_random_eagle_trees(B, K, S_tree, N, P, S, extras, few):
    """Random trees, a different one a row; paths along them and departing. A vocabulary of topk + 1 tokens: paths
    walk far down the tree and share prefixes; of 50: they depart sooner."""
    vocab = K + 1 if few else 50
    g = torch.Generator().manual_seed(B * 1000 + N * 10 + P + vocab)
    tree = eagle_trees(B, K, S_tree, N, vocab, g)
    paths = random_paths(tree, P, S, vocab, g)
    for extra in extras:
        got = check(tree, paths, extra)
        assert torch.equal(got[0][:, :N], tree[0]) and torch.equal(got[4][:, :N, :N], tree[4])  # the tree stays


@pytest.mark.parametrize("B, K, S_tree, N, P, S", [(4, 4, 5, 16, 1, 15), (3, 4, 5, 8, 2, 5), (2, 4, 7, 24, 2, 7)],
                         ids=["block-5/4/16+1x15", "eagle2+2x5", "7/4/24+2x7"])
def test_fallback_where_no_node_is_created(B, K, S_tree, N, P, S):
    """With the drafter's widened tree as `fallback`: a request whose paths create no node (all -1, or walking the
    tree only) gets the fallback tree exactly; one that creates some gets the graft as without it."""
    g = torch.Generator().manual_seed(N * 10 + P)
    extra = P * S
    tree, wide = eagle_trees(B, K, S_tree, N, 50, g, widen=extra)
    paths = random_paths(tree, P, S, 50, g)  # [B, P, S]
    paths[0] = -1  # request 0: no match at all
    anc = tree[4][1, N - 1].nonzero()[:, 0].tolist()[1:]  # request 1: along the tree only
    paths[1] = -1
    paths[1, 0, :len(anc)] = tree[0][1, anc]
    paths[2:, 0, 0] = 49 + 1000  # the others: a token no node has, so each creates a node
    got = check(tree, paths, extra, wide)
    plain = check(tree, paths, extra)
    for k in range(5):
        assert torch.equal(got[k][:2], wide[k][:2]), k
        assert torch.equal(got[k][2:], plain[k][2:]), k
    assert not torch.equal(got[0][:2], plain[0][:2])  # padding replaced


@pytest.mark.parametrize("P, S, extra", [(1, 5, 5), (4, 5, 7), (8, 6, 31), (4, 8, 15), (8, 8, 63), (4, 6, 2)])
def test_bare_root(P, S, extra):
    """The n-gram drafter's trie: paths grafted onto the root alone (N = 1), B = 3 rows of different roots."""
    g = torch.Generator().manual_seed(P * 100 + S * 10 + extra)
    tree = tuple(root_tree(torch.tensor([4, 0, 2]), torch.tensor([7, 0, 30], dtype=torch.int32)))
    paths = random_paths(tree, P, S, 4, g)
    check(tree, paths, extra)


def test_golden_and_edges():
    """Written out: shared prefixes walk, a budget cuts a path midway, all -1 paths leave the tree and padding."""
    tree = tuple(root_tree(torch.tensor([5, 5]), torch.tensor([10, 20])))
    paths = torch.tensor([[[1, 2, 3], [1, 2, 4], [1, 5, -1], [-1, -1, -1]],
                          [[-1, -1, -1], [-1, -1, -1], [-1, -1, -1], [-1, -1, -1]]])  # [2, 4, 3]
    tokens, positions, next_token, next_sibling, mask = check(tree, paths, 5)
    # row 0: 1 2 3, then 4 under 2, then 5 under 1; row 1: the root and padding
    assert tokens.tolist() == [[5, 1, 2, 3, 4, 5], [5, 0, 0, 0, 0, 0]]
    assert positions.tolist() == [[10, 11, 12, 13, 13, 12], [20, 21, 21, 21, 21, 21]]
    assert next_token.tolist() == [[1, 2, 3, -1, -1, -1], [-1] * 6]
    assert next_sibling.tolist() == [[-1, -1, 5, 4, -1, -1], [-1] * 6]
    assert mask[0, 4].nonzero()[:, 0].tolist() == [0, 1, 2, 4] and mask[1, 3].nonzero()[:, 0].tolist() == [0, 3]
    # a budget of 4: 1 2 3 and 4 under 2; the third path walks 1 and stops where it would create 5
    tokens, _, next_token, next_sibling, _ = check(tree, paths, 4)
    assert tokens[0].tolist() == [5, 1, 2, 3, 4] and next_sibling[0].tolist() == [-1, -1, -1, 4, -1]
    # a budget of 2 cuts the first path after 1 2; no budget: the tree itself
    assert check(tree, paths, 2)[0][0].tolist() == [5, 1, 2]
    assert check(tree, paths, 0)[0].tolist() == [[5], [5]]


def test_grafted_tree_grafted_again():
    """A tree with padding slots (a graft's output): padding is no real node, so a path whose token is 0 does not walk
    into it but creates its own node."""
    g = torch.Generator().manual_seed(3)
    tree = eagle_trees(2, 4, 5, 8, 5, g)
    once = graft_ref(tree, random_paths(tree, 2, 5, 5, g), 10)  # [B, 18] with some padding
    paths = torch.cat([random_paths(once, 2, 5, 5, g), torch.zeros(2, 1, 5, dtype=torch.int64)], 1)  # [2, 3, 5]
    check(once, paths, 9)


def test_more_nodes_than_the_kernel_run_the_reference():
    """N + extra > MAX_NODES: the launcher runs graft_ref, the same answer."""
    g = torch.Generator().manual_seed(4)
    tree = eagle_trees(2, 10, 6, 60, 11, g)
    assert 60 + 8 > MAX_NODES
    check(tree, random_paths(tree, 2, 6, 11, g), 8)


def test_empty_batch():
    tree = tuple(root_tree(torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int32)))
    out = graft(tuple(t.to(DEVICE) for t in tree), torch.zeros(0, 2, 3, dtype=torch.int64, device=DEVICE), 4)
    assert out[0].shape == (0, 5) and out[4].shape == (0, 5, 5)


TREE = tuple(root_tree(torch.tensor([1, 2]), torch.tensor([3, 4])))
PATHS = torch.zeros(2, 2, 3, dtype=torch.int64)


@pytest.mark.parametrize(
    "tree, paths, extra, match",
    [
        (TREE[:4], PATHS, 2, r"tree must be \(tokens, positions, next_token, next_sibling, mask\), got 4"),
        ((TREE[0][:, :0],) + TREE[1:], PATHS, 2, r"tokens must be \[B, N\] with N >= 1"),
        ((TREE[0].int(),) + TREE[1:], PATHS, 2, r"tokens must be \[B, N\] = \[2, 1\] int64"),
        (TREE[:2] + (TREE[2][:1],) + TREE[3:], PATHS, 2, r"next_token must be \[B, N\] = \[2, 1\] int64"),
        (TREE[:4] + (TREE[4].int(),), PATHS, 2, r"mask must be \[B, N, N\] = \[2, 1, 1\] bool"),
        (TREE, PATHS[:1], 2, r"paths must be \[B, P, S\] int64 with B = 2"),
        (TREE, PATHS.int(), 2, r"paths must be \[B, P, S\] int64"),
        (TREE, PATHS.to("meta"), 2, "paths is on meta, tokens on cpu"),
        (TREE, PATHS, -1, "extra=-1 must be an int >= 0"),
        (TREE, PATHS, 2.0, "extra=2.0 must be an int >= 0"),
    ],
)
def test_bad_input(tree, paths, extra, match):
    for fn in (graft, graft_ref, graft_sequential):
        with pytest.raises(ValueError, match=match):
            fn(tree, paths, extra)


def test_bad_fallback():
    """A fallback of the wrong width (N nodes, not N + extra) or not five tensors is refused by all three."""
    for fb, match in ((TREE, r"fallback tokens must be \[2, 3\] torch.int64"),
                      (TREE[:4], r"fallback must be \(tokens, positions, next_token, next_sibling, mask\), got 4")):
        for fn in (graft, graft_ref, graft_sequential):
            with pytest.raises(ValueError, match=match):
                fn(TREE, PATHS, 2, fb)


def test_minus_ones_must_be_a_suffix():
    """graft and graft_ref assume it (checking would read the device); the plain-Python reference checks it."""
    with pytest.raises(ValueError, match=r"path \[3, -1, 4\] has a token after a -1"):
        graft_sequential(TREE, torch.tensor([[[3, -1, 4]], [[1, 2, 3]]]), 2)


@gpu_only
def test_cuda_graph():
    g = torch.Generator().manual_seed(5)
    tree = tuple(t.to(DEVICE) for t in eagle_trees(8, 4, 5, 8, 5, g))
    paths = random_paths(tuple(t.cpu() for t in tree), 2, 5, 5, g).to(DEVICE)
    graft(tree, paths, 10)  # compile before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = graft(tree, paths, 10)
    new = eagle_trees(8, 4, 5, 8, 5, g)
    for t, n in zip(tree, new):
        t.copy_(n)
    paths.copy_(random_paths(new, 2, 5, 5, g))
    graph.replay()
    want = graft_sequential(new, paths.cpu(), 10)
    assert CUDA and all(torch.equal(a.cpu(), b) for a, b in zip(out, want))
