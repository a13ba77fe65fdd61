"""block_tree.grow_tree (kernels/block_tree.py) against its torch reference `grow_tree_ref`: tokens and parents
exactly, scores to fp32 rounding; every level variant (S = 1: compute then the root's merge; S > 1: middle levels),
K = 1 (chains) up to MAX_K, the root's K1 > K children (up to MAX_ROOT_CHILDREN), vocabularies of one chunk and of
many, ranks that are not a multiple of the kernel's unroll, a draft vocabulary (d2t), B > 1, exact ties (the lower id
first, as top_ids_ref); a CUDA graph on a GPU; the launcher's input checks. tests/engine/test_block_drafter.py holds
the tree to a plain-Python construction.

On CPU run with TRITON_INTERPRET=1 (CI does) so the Triton kernel itself is tested; without it the launcher runs the
reference.
"""

from __future__ import annotations

import pytest
import torch
from kernel_testing import CUDA, DEVICE, gpu_only, needs_kernel

from eaglet.kernels.block_tree import MAX_K, MAX_ROOT_CHILDREN, _launch_meta, grow_tree, grow_tree_ref


def inputs(B, S, Vd, V, r, d2t: bool, seed: int):
    g = torch.Generator().manual_seed(seed)
    base = 3 * torch.randn(B, S, Vd, generator=g)  # [B, S, Vd]
    dep_in = torch.randn(V, r, generator=g)  # [V, r]
    dep_out = torch.randn(r, Vd, generator=g) / r**0.5  # [r, Vd]
    roots = torch.randint(0, V, (B,), generator=g)  # [B]
    ids = torch.randperm(V, generator=g)[:Vd].sort().values if d2t else None  # [Vd] target id of each draft id
    return base, dep_in, dep_out, roots, None if ids is None else ids - torch.arange(Vd)


def check(base, dep_in, dep_out, roots, S, K, d2t, K1=None):
    dev = [t.to(DEVICE) if t is not None else None for t in (base, dep_in, dep_out, roots, d2t)]
    got = [t.cpu() for t in grow_tree(dev[0], dev[1], dev[2], dev[3], S, K, dev[4], root_children=K1)]
    want = grow_tree_ref(base, dep_in, dep_out, roots, S, K, d2t, K1)
    assert torch.equal(got[1], want[1]), (got[1], want[1])
    assert torch.equal(got[2], want[2]), (got[2], want[2])
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    return got


@needs_kernel
@pytest.mark.parametrize("S, K", [(1, 1), (1, 4), (5, 1), (3, 4), (2, MAX_K)])
@pytest.mark.parametrize("Vd, V, r", [(200, 200, 16), (700, 900, 20)])  # one chunk; three, a partial unroll
@pytest.mark.parametrize("d2t", [False, True])
def test_equals_reference(S, K, Vd, V, r, d2t):
    base, dep_in, dep_out, roots, d2t_offsets = inputs(3, S, Vd, V, r, d2t, seed=S * 10 + K)
    check(base, dep_in, dep_out, roots, S, K, d2t_offsets)


@needs_kernel
@pytest.mark.parametrize("S, K, K1", [(1, 4, 16), (3, 4, 16), (4, 1, 5), (2, 3, 8), (3, 2, MAX_ROOT_CHILDREN)])
@pytest.mark.parametrize("d2t", [False, True])
def test_root_children_equal_reference(S, K, K1, d2t):
    """More children of the root than of any later node: depth 1 holds K1 candidates, the first K kept, and the later
    depths' candidates sit after them (kernels/build_tree.py's layout)."""
    base, dep_in, dep_out, roots, d2t_offsets = inputs(3, S, 700, 900, 20, d2t, seed=S * 100 + K1)
    got = check(base, dep_in, dep_out, roots, S, K, d2t_offsets, K1)
    assert got[0].shape[1] == K1 + (S - 1) * K * K
    assert (got[2][:, :K1] == -1).all() and (got[2][:, K1:] < K1 + max(0, S - 2) * K * K).all()
    # the root's K best children are those of the same tree with K1 = K, and so is everything below them
    same = grow_tree_ref(base, dep_in, dep_out, roots, S, K, d2t_offsets)
    assert torch.equal(got[1][:, :K], same[1][:, :K]) and torch.equal(got[1][:, K1:], same[1][:, K:])


def test_root_children_reference_matches_a_wider_tree_at_depth_one():
    """The reference's depth 1 at K1 = the top K1 of a K = K1 tree's depth 1 (the same row, the same log-softmax)."""
    base, dep_in, dep_out, roots, _ = inputs(2, 1, 300, 300, 16, False, seed=5)
    got = grow_tree_ref(base, dep_in, dep_out, roots, 1, 2, None, 8)
    want = grow_tree_ref(base, dep_in, dep_out, roots, 1, 8, None)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_logits_are_read_as_float32(dtype):
    """base in the LM head's dtype (the invariant path's, no fp32 copy): the tree of its fp32 values."""
    base, dep_in, dep_out, roots, d2t = inputs(3, 4, 700, 900, 20, True, seed=9)
    half = base.to(dtype)
    dev = [t.to(DEVICE) for t in (half, dep_in, dep_out, roots, d2t)]
    got = [t.cpu() for t in grow_tree(*dev[:4], 4, 4, dev[4])]
    want = grow_tree_ref(half.float(), dep_in, dep_out, roots, 4, 4, d2t)
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    assert all(torch.equal(a, b) for a, b in zip(grow_tree_ref(half, dep_in, dep_out, roots, 4, 4, d2t), want))


@needs_kernel
def test_ties_take_the_lower_id():
    """Integer logits and a zero term: every candidate ties with others; the order is the reference's (lower id,
    then lower index), so the tree is fixed."""
    B, S, K, V = 2, 3, 4, 300
    g = torch.Generator().manual_seed(3)
    base = torch.randint(0, 3, (B, S, V), generator=g).float()  # [B, S, V] many ties
    got = check(base, torch.zeros(V, 16), torch.zeros(16, V), torch.tensor([5, 7]), S, K, None)
    assert got[1][0, :K].tolist() == (base[0, 0] == 2).nonzero()[:K, 0].tolist()


@needs_kernel
def test_chunking_matches_the_launch_table():
    """A vocabulary of many chunks (the merge reads every chunk's partials): SmolLM2's draft vocabulary."""
    assert _launch_meta(8192, 4, 64)["BLOCK_V"] < 8192
    base, dep_in, dep_out, roots, d2t = inputs(1, 2, 8192, 9000, 64, True, seed=7)
    check(base, dep_in, dep_out, roots, 2, 4, d2t)


def test_above_max_k_the_reference_runs():
    base, dep_in, dep_out, roots, _ = inputs(1, 2, 64, 64, 16, False, seed=1)
    got = grow_tree(base, dep_in, dep_out, roots, 2, MAX_K + 2)
    want = grow_tree_ref(base, dep_in, dep_out, roots, 2, MAX_K + 2)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("change, msg", [
    (dict(base=torch.zeros(2, 1, 50)), r"base must be \[B=2, >= S=2, Vd=50\]"),
    (dict(dep_in=torch.zeros(50, 8)), "must share r"),
    (dict(base=torch.zeros(2, 2, 50, dtype=torch.float64)), "must be float32"),
    (dict(K=0), "K=0"),
    (dict(K=2, root_children=1), "root_children=1"),
    (dict(roots=torch.zeros(2, dtype=torch.int32)), "roots and d2t must be int64"),
])
def test_checks(change, msg):
    args = dict(base=torch.zeros(2, 2, 50), dep_in=torch.zeros(50, 16), dep_out=torch.zeros(16, 50),
                roots=torch.zeros(2, dtype=torch.long), S=2, K=2)
    args.update(change)
    with pytest.raises(ValueError, match=msg):
        grow_tree(**args)


@gpu_only
@pytest.mark.parametrize("K1", [None, 16])
def test_cuda_graph(K1):
    base, dep_in, dep_out, roots, d2t = (t.to(DEVICE) for t in inputs(8, 5, 8192, 9000, 64, True, seed=11))
    grow_tree(base, dep_in, dep_out, roots, 5, 4, d2t, K1)  # compile before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = grow_tree(base, dep_in, dep_out, roots, 5, 4, d2t, K1)
    base.copy_(torch.randn_like(base))
    roots.random_(0, 9000)
    graph.replay()
    want = grow_tree_ref(base, dep_in, dep_out, roots, 5, 4, d2t, K1)
    assert CUDA and torch.equal(out[1], want[1]) and torch.equal(out[2], want[2])
