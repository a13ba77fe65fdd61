"""build_tree (kernels/build_tree.py): the Triton kernel equals the pure-Python reference exactly.

On CPU run with TRITON_INTERPRET=1 (CI does) so the kernel itself is tested; without it the
launcher falls back to the reference and the kernel-vs-reference tests are skipped.
"""

from __future__ import annotations

import pytest
import torch
from kernel_testing import DEVICE, needs_kernel

from eaglet.kernels.build_tree import (
    DraftTree,
    MaskFormat,
    build_tree,
    build_tree_pair,
    build_tree_ref,
    num_candidates,
    random_candidates,
)

# (steps S, topk K, num_draft_tokens N)
SHAPES = [
    (5, 4, 8),  # SGLang's Llama default
    (6, 10, 60),  # EAGLE-2 paper
    (4, 3, 13),
    (3, 5, 32),  # BITPACKED's largest N
    (2, 2, 7),  # N-1 == C: every candidate kept
    (4, 1, 5),  # K=1: a chain
    (3, 3, 1),  # N=1: the root only
    (1, 6, 4),  # a single draft step
]
FORMATS = list(MaskFormat)


def make_inputs(B, S, K, seed, seq_lens=None, tie_levels=None, vocab=1000, root_children=None):
    gen = torch.Generator().manual_seed(seed)
    scores, tokens, parents = random_candidates(B, K, S, vocab, gen, tie_levels, root_children)
    roots = torch.randint(0, vocab, (B,), generator=gen)  # [B]
    if seq_lens is None:
        seq_lens = torch.randint(0, 300, (B,), generator=gen)
    seq_lens = torch.as_tensor(seq_lens, dtype=torch.int32)  # [B]
    return [t.to(DEVICE) for t in (scores, tokens, parents, roots, seq_lens)]


def qlen_from(tree: DraftTree, fmt: MaskFormat, seq_lens: torch.Tensor, N: int) -> torch.Tensor:
    """Decode any mask format to [B, N, N] bool ancestor-or-self; checks FULL's prefix is all True."""
    mask = tree.tree_mask.cpu()
    if fmt == MaskFormat.QLEN_ONLY:
        return mask
    if fmt == MaskFormat.BITPACKED:
        bits = (mask.long()[:, :, None] >> torch.arange(N)) & 1  # [B, N, N]
        return bits.bool()
    out, off = [], 0
    for L in seq_lens.tolist():
        rows = mask[off: off + N * (L + N)].view(N, L + N)  # [N, L+N]
        assert rows[:, :L].all(), "FULL: the prefix columns must all be True"
        out.append(rows[:, L:])
        off += N * (L + N)
    assert off == mask.numel()
    return torch.stack(out)


def assert_same(a: DraftTree, b: DraftTree):
    for name, x, y in zip(DraftTree._fields, a, b):
        assert x.dtype == y.dtype, name
        assert torch.equal(x.cpu(), y.cpu()), name


@needs_kernel
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.value)
@pytest.mark.parametrize("S,K,N", SHAPES)
def test_kernel_matches_reference(S, K, N, fmt):
    if fmt == MaskFormat.BITPACKED and N > 32:
        pytest.skip("BITPACKED holds N <= 32")
    B = 3
    inputs = make_inputs(B, S, K, seed=S * 100 + K * 10 + N, seq_lens=[0, 7, 129])  # 129 > one prefix block
    sls = int(inputs[-1].sum())
    out = build_tree(*inputs, N, K, S, fmt, sls)
    ref = build_tree_ref(*[t.cpu() for t in inputs], N, K, S, fmt, sls)
    assert_same(out, ref)
    if K >= 2 and N >= 2 * K + 1:  # enough nodes for a real tree: make sure the test saw one
        par = ref.parents
        depth = ref.positions - inputs[-1].cpu()[:, None].long()  # [B, N]
        children = torch.stack([(par == i).sum(1) for i in range(N)], 1)  # [B, N]
        assert (children >= 2).any() and depth.max() >= 2


# (S, K, N, the wide tree's N): the drafters' trees beside their widened fallback (engine/drafter.py), a wide tree
# past a power of two (N_PAD 16 -> 32 -> 64), a narrower second tree and two of one size
PAIRS = [(5, 4, 16, 31), (5, 4, 8, 18), (6, 10, 60, 61), (4, 3, 13, 5), (3, 5, 7, 7), (2, 2, 1, 7)]


# (S, K, K1, N, N2 or 0): the root with more children than any later node (the block drafter's root_children):
# its candidates first, the later depths' after them; the block tree with 16 and with 5 (an odd count), a chain
# under a wide root, a single depth, and the pair at the widened fallback's size
ROOT_SHAPES = [(5, 4, 16, 16, 0), (5, 4, 5, 16, 0), (4, 1, 8, 6, 0), (1, 2, 16, 9, 0), (5, 4, 16, 16, 31)]


@needs_kernel
@pytest.mark.parametrize("fmt", [MaskFormat.QLEN_ONLY, MaskFormat.FULL], ids=lambda f: f.value)
@pytest.mark.parametrize("S,K,K1,N,N2", ROOT_SHAPES)
def test_root_children_match_reference(S, K, K1, N, N2, fmt):
    if N2 and fmt == MaskFormat.FULL:
        pytest.skip("the pair builds QLEN_ONLY or BITPACKED masks")
    inputs = make_inputs(3, S, K, seed=S * 100 + K1 + N2, seq_lens=[0, 7, 129], root_children=K1)
    assert inputs[0].shape[1] == num_candidates(K, S, K1) == K1 + (S - 1) * K * K
    sls = int(inputs[-1].sum())
    cpu = [t.cpu() for t in inputs]
    if N2:
        outs = build_tree_pair(*inputs, N, N2, K, S, fmt, root_children=K1)
        refs = [build_tree_ref(*cpu, n, K, S, fmt, root_children=K1) for n in (N, N2)]
    else:
        outs = [build_tree(*inputs, N, K, S, fmt, sls, root_children=K1)]
        refs = [build_tree_ref(*cpu, N, K, S, fmt, sls, root_children=K1)]
    for out, ref in zip(outs, refs):
        assert_same(out, ref)
    # the depths come from the layout: every depth-1 node is a root child (parent 0), every deeper one is not
    ref = refs[0]
    depth = ref.positions - inputs[-1].cpu()[:, None].long()  # [B, N]
    assert torch.equal(depth[:, 1:] == 1, ref.parents[:, 1:] == 0)
    assert S == 1 or depth.max() >= 2


def test_root_children_validation():
    inputs = make_inputs(1, 3, 4, seed=0, root_children=8)  # C = 8 + 2 * 16
    with pytest.raises(ValueError, match="root_children=2 must be >= topk=4"):
        build_tree(*inputs, 8, 4, 3, root_children=2)
    with pytest.raises(ValueError, match=r"cand_scores must be \[B, C\] = \[1, 36\]"):
        build_tree(*inputs, 8, 4, 3)  # the layout without the root's extra children


@needs_kernel
@pytest.mark.parametrize("fmt", [MaskFormat.QLEN_ONLY, MaskFormat.BITPACKED], ids=lambda f: f.value)
@pytest.mark.parametrize("S,K,N,N2", PAIRS)
def test_pair_matches_reference(S, K, N, N2, fmt):
    if fmt == MaskFormat.BITPACKED and max(N, N2) > 32:
        pytest.skip("BITPACKED holds N <= 32")
    inputs = make_inputs(3, S, K, seed=S * 100 + N2, seq_lens=[0, 7, 129])
    tree, wide = build_tree_pair(*inputs, N, N2, K, S, fmt)
    for out, n in ((tree, N), (wide, N2)):
        assert_same(out, build_tree_ref(*[t.cpu() for t in inputs], n, K, S, fmt))


def test_pair_validation():
    inputs = make_inputs(2, 3, 2, seed=0)  # C = 10
    with pytest.raises(ValueError, match=r"num_draft_tokens=12.*num_draft_tokens <= 11"):
        build_tree_pair(*inputs, 8, 12, 2, 3)
    with pytest.raises(ValueError, match="N <= 32|> 32"):
        build_tree_pair(*make_inputs(1, 6, 10, seed=0), 8, 40, 10, 6, "bitpacked")
    with pytest.raises(ValueError, match="FULL"):
        build_tree_pair(*inputs, 4, 8, 2, 3, "full", int(inputs[-1].sum()))


@needs_kernel
@pytest.mark.parametrize("tie_levels", [2, 4])
def test_ties_break_to_lower_index(tie_levels):
    # Quantized log-probs: many equal scores, including child == parent (log-prob 0).
    S, K, N, B = 4, 4, 20, 4
    inputs = make_inputs(B, S, K, seed=tie_levels, tie_levels=tie_levels)
    out = build_tree(*inputs, N, K, S, MaskFormat.QLEN_ONLY)
    assert_same(out, build_tree_ref(*[t.cpu() for t in inputs], N, K, S, MaskFormat.QLEN_ONLY))


@needs_kernel
@pytest.mark.parametrize("N,tokens", [(6, [5, 0, 1, 3, 4, 5]), (12, [5, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11])])
def test_signed_zero_and_inf_scores(N, tokens):
    # N=6 cuts inside eight zero scores: -0.0 must tie with 0.0 (float order, not bit order).
    # N=12 keeps all but one: the -inf candidate (c10) ranks below -3.0 (c11).
    S, K = 2, 3
    scores = torch.tensor([[0.0, -0.0, -1.0, -0.0, 0.0, -0.0, 0.0, -0.0, -0.0, -2.0, float("-inf"), -3.0]])
    parents = torch.tensor([[-1, -1, -1, 0, 0, 0, 1, 1, 1, 2, 2, 2]])
    cand_tokens = torch.arange(12)[None]
    ts = (scores, cand_tokens, parents, torch.tensor([5]), torch.tensor([3], dtype=torch.int32))
    inputs = [t.to(DEVICE) for t in ts]
    out = build_tree(*inputs, N, K, S, MaskFormat.QLEN_ONLY)
    ref = build_tree_ref(*ts, N, K, S, MaskFormat.QLEN_ONLY)
    assert_same(out, ref)
    assert ref.draft_tokens.tolist() == [tokens]


@pytest.mark.parametrize("S,K,N", [(5, 4, 8), (4, 3, 13), (3, 5, 32), (4, 1, 5), (3, 3, 1)])
def test_mask_formats_agree(S, K, N):
    inputs = make_inputs(2, S, K, seed=7, seq_lens=[4, 0])
    sls = int(inputs[-1].sum())
    trees = {f: build_tree(*inputs, N, K, S, f, sls) for f in FORMATS}
    masks = {f: qlen_from(t, f, inputs[-1].cpu(), N) for f, t in trees.items()}
    for f in FORMATS[1:]:
        assert torch.equal(masks[f], masks[FORMATS[0]]), f
        for x, y in zip(trees[f][:3] + trees[f][4:], trees[FORMATS[0]][:3] + trees[FORMATS[0]][4:]):
            assert torch.equal(x, y)
    # ancestor-or-self: the diagonal and the root column are always set
    m = masks[MaskFormat.QLEN_ONLY]
    assert m[:, torch.arange(N), torch.arange(N)].all() and m[:, :, 0].all()


def test_chain():
    S, N = 4, 5
    inputs = make_inputs(2, S, 1, seed=3, seq_lens=[10, 20])
    tree = build_tree(*inputs, N, 1, S, "qlen_only")
    assert tree.parents.tolist() == [[-1, 0, 1, 2, 3]] * 2
    assert tree.retrieve_next_token.tolist() == [[1, 2, 3, 4, -1]] * 2
    assert tree.retrieve_next_sibling.tolist() == [[-1] * 5] * 2
    assert tree.positions.tolist() == [[10, 11, 12, 13, 14], [20, 21, 22, 23, 24]]
    assert torch.equal(tree.tree_mask.cpu(), torch.ones(N, N, dtype=torch.bool).tril().expand(2, N, N))
    assert tree.draft_tokens[:, 1:].tolist() == inputs[1].cpu().tolist()


def test_root_only():
    inputs = make_inputs(2, 3, 2, seed=1, seq_lens=[6, 0])
    tree = build_tree(*inputs, 1, 2, 3, "bitpacked")
    assert tree.draft_tokens.tolist() == inputs[3].cpu()[:, None].tolist()
    assert tree.parents.tolist() == [[-1], [-1]] and tree.positions.tolist() == [[6], [0]]
    assert tree.retrieve_next_token.tolist() == [[-1], [-1]] and tree.tree_mask.tolist() == [[1], [1]]


# Golden tree, K=2, S=3 (C = 2 + 2*4 = 10), N=8. Candidates (flat index: token, score, parent):
#   step 0: c0 10 -0.1 root | c1 11 -0.5 root
#   step 1: c2 20 -0.3 c0 | c3 21 -0.45 c0 | c4 22 -0.6 c1 | c5 23 -2.0 c1   (kept: c2, c3)
#   step 2: c6 30 -0.4 c2 | c7 31 -1.5 c2 | c8 32 -0.7 c3 | c9 33 -0.7 c3     (c8/c9 tie: c8 wins)
# Best 7: c0 c2 c6 c3 c1 c4 c8 -> nodes 1..7 in flat order c0 c1 c2 c3 c4 c6 c8.
GOLDEN_SCORES = [-0.1, -0.5, -0.3, -0.45, -0.6, -2.0, -0.4, -1.5, -0.7, -0.7]
GOLDEN_TOKENS = [10, 11, 20, 21, 22, 23, 30, 31, 32, 33]
GOLDEN_PARENTS = [-1, -1, 0, 0, 1, 1, 2, 2, 3, 3]
GOLDEN = dict(
    draft_tokens=[[99, 10, 11, 20, 21, 22, 30, 32], [98, 10, 11, 20, 21, 22, 30, 32]],
    parents=[[-1, 0, 0, 1, 1, 2, 3, 4]] * 2,
    positions=[[10, 11, 11, 12, 12, 12, 13, 13], [3, 4, 4, 5, 5, 5, 6, 6]],
    retrieve_next_token=[[1, 3, 5, 6, 7, -1, -1, -1]] * 2,
    retrieve_next_sibling=[[-1, 2, -1, 4, -1, -1, -1, -1]] * 2,
)
GOLDEN_ANCESTORS = [[0], [0, 1], [0, 2], [0, 1, 3], [0, 1, 4], [0, 2, 5], [0, 1, 3, 6], [0, 1, 4, 7]]
GOLDEN_BITS = [1, 3, 5, 11, 19, 37, 75, 147]


def golden_inputs():
    ts = (torch.tensor([GOLDEN_SCORES] * 2), torch.tensor([GOLDEN_TOKENS] * 2), torch.tensor([GOLDEN_PARENTS] * 2),
          torch.tensor([99, 98]), torch.tensor([10, 3], dtype=torch.int32))
    return [t.to(DEVICE) for t in ts]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.value)
def test_golden(fmt):
    tree = build_tree(*golden_inputs(), 8, 2, 3, fmt, 13)
    for name, expected in GOLDEN.items():
        assert getattr(tree, name).tolist() == expected, name
    qlen = torch.zeros(8, 8, dtype=torch.bool)
    for i, anc in enumerate(GOLDEN_ANCESTORS):
        qlen[i, anc] = True
    if fmt == MaskFormat.QLEN_ONLY:
        assert torch.equal(tree.tree_mask.cpu(), qlen.expand(2, 8, 8))
    elif fmt == MaskFormat.BITPACKED:
        assert tree.tree_mask.tolist() == [GOLDEN_BITS] * 2
        assert tree.tree_mask.dtype == torch.int32
    else:
        expected = torch.cat([torch.cat([torch.ones(8, L, dtype=torch.bool), qlen], 1).flatten() for L in (10, 3)])
        assert torch.equal(tree.tree_mask.cpu(), expected)


@needs_kernel
def test_bitpacked_sign_bit():
    # N = 32: the deepest rows of a chain set bit 31, which is the int32 sign bit.
    inputs = make_inputs(1, 31, 1, seed=0)
    out = build_tree(*inputs, 32, 1, 31, "bitpacked")
    assert_same(out, build_tree_ref(*[t.cpu() for t in inputs], 32, 1, 31, "bitpacked"))
    assert out.tree_mask[0, 31].item() == -1  # all 32 bits set


def test_validation():
    inputs = make_inputs(2, 3, 2, seed=0)  # C = 2 + 2*4 = 10
    with pytest.raises(ValueError, match=r"num_draft_tokens=12.*num_draft_tokens <= 11"):
        build_tree(*inputs, 12, 2, 3)
    with pytest.raises(ValueError, match="cand_scores"):
        build_tree(inputs[0].double(), *inputs[1:], 8, 2, 3)
    with pytest.raises(ValueError, match="cand_tokens"):
        build_tree(inputs[0], inputs[1].int(), *inputs[2:], 8, 2, 3)
    with pytest.raises(ValueError, match="cand_parents"):
        build_tree(*inputs[:2], inputs[2][:, :-1], *inputs[3:], 8, 2, 3)
    with pytest.raises(ValueError, match="root_tokens"):
        build_tree(*inputs[:3], inputs[3][:1], inputs[4], 8, 2, 3)
    with pytest.raises(ValueError, match="seq_lens"):
        build_tree(*inputs[:4], inputs[4].long(), 8, 2, 3)
    with pytest.raises(ValueError, match="N <= 32|> 32"):
        build_tree(*make_inputs(1, 6, 10, seed=0), 40, 10, 6, "bitpacked")
    with pytest.raises(ValueError, match="seq_lens_sum"):
        build_tree(*inputs, 8, 2, 3, "full")
    with pytest.raises(ValueError, match="mask_format"):
        build_tree(*inputs, 8, 2, 3, "dense")
    assert num_candidates(10, 6) == 510
