"""block_tree.grow_tree (kernels/block_tree.py) against its torch reference `grow_tree_ref`: tokens and parents
exactly, scores to fp32 rounding; S = 1 (the root's children alone) and deeper, K = 1 (chains) up to MAX_K,
vocabularies inside U (Vd <= BASE_TOP) and larger (tabled ids that are and are not base top ids), ranks that are not a
multiple of the kernel's chunk, a draft vocabulary (d2t), B > 1, exact ties (the lower id first, as top_ids_ref); the
spec against the whole-vocabulary tree where U is the whole vocabulary; a CUDA graph on a GPU; the launcher's input
checks. tests/engine/test_block_drafter.py holds the tree to a plain-Python construction.

On CPU run with TRITON_INTERPRET=1 (CI does) so the Triton kernel itself is tested; without it the launcher runs the
reference.
"""

from __future__ import annotations

import pytest
import torch
from kernel_testing import CUDA, DEVICE, gpu_only, needs_kernel

from eaglet.kernels.block_tree import BASE_TOP, MAX_K, dependency_top, grow_tree, grow_tree_ref
from eaglet.kernels.build_tree import num_candidates
from eaglet.kernels.draft_expand import expand_step_ref
from eaglet.kernels.topk import topk_logprobs_ref


def inputs(B, S, Vd, V, r, d2t: bool, seed: int):
    """(base, dep_in, dep_rows, dep_top, roots, d2t offsets): a term as large as the base's spread, so that children
    come from both halves of U."""
    g = torch.Generator().manual_seed(seed)
    base = 3 * torch.randn(B, S, Vd, generator=g)  # [B, S, Vd]
    dep_in = torch.randn(V, r, generator=g)  # [V, r]
    dep_rows = 3 * torch.randn(Vd, r, generator=g) / r**0.5  # [Vd, r]
    roots = torch.randint(0, V, (B,), generator=g)  # [B]
    ids = torch.randperm(V, generator=g)[:Vd].sort().values if d2t else None  # [Vd] target id of each draft id
    d2t_offsets = None if ids is None else ids - torch.arange(Vd)  # [Vd]
    return base, dep_in, dep_rows, dependency_top(dep_in, dep_rows), roots, d2t_offsets


def check(base, dep_in, dep_rows, dep_top, roots, d2t, S, K):
    dev = [t.to(DEVICE) if t is not None else None for t in (base, dep_in, dep_rows, dep_top, roots, d2t)]
    got = [t.cpu() for t in grow_tree(*dev[:5], S, K, dev[5])]
    want = grow_tree_ref(base, dep_in, dep_rows, dep_top, roots, S, K, d2t)
    assert torch.equal(got[1], want[1]), (got[1], want[1])
    assert torch.equal(got[2], want[2]), (got[2], want[2])
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    return got


@needs_kernel
@pytest.mark.parametrize("S, K", [(1, 1), (1, 4), (5, 1), (3, 4), (2, MAX_K)])
@pytest.mark.parametrize("Vd, V, r", [(48, 60, 16), (700, 900, 20)])  # U all ids; U a part, a partial rank chunk
@pytest.mark.parametrize("d2t", [False, True])
def test_equals_reference(S, K, Vd, V, r, d2t):
    check(*inputs(3, S, Vd, V, r, d2t, seed=S * 10 + K), S, K)


@needs_kernel
def test_children_come_from_both_halves_of_u():
    """At 700 ids the kept children include base top ids and tabled ids outside the base top (the dedupe and the
    second half's terms are exercised), and the tree holds no repeated sibling."""
    x = inputs(3, 4, 700, 900, 20, False, seed=5)
    base = x[0]
    scores, tokens, parents = check(*x, 4, 4)
    top = base[:, 0].float().topk(BASE_TOP, dim=-1).indices  # [B, BASE_TOP] the root's base top
    first = tokens[:, :4]  # [B, K] depth 1: the root's children
    inside = (first[:, :, None] == top[:, None, :]).any(-1)  # [B, K]
    assert inside.any() and (~inside).any(), inside
    for b in range(3):
        sib = {}
        for c in range(tokens.shape[1]):
            sib.setdefault(int(parents[b, c]), []).append(int(tokens[b, c]))
        assert all(len(v) == len(set(v)) for v in sib.values())


def test_where_u_is_the_whole_vocabulary_the_tree_is_exact():
    """Vd <= BASE_TOP: the spec equals the whole-vocabulary tree (log_softmax(base + term) per parent, K best,
    EAGLE-2's selection), written here in plain torch."""
    B, S, K, Vd, V, r = 2, 4, 4, BASE_TOP, 80, 8
    base, dep_in, dep_rows, dep_top, roots, d2t = inputs(B, S, Vd, V, r, True, seed=4)
    C = num_candidates(K, S)
    want = [torch.empty(B, C), torch.empty(B, C, dtype=torch.long), torch.empty(B, C, dtype=torch.long)]
    lp, tok = topk_logprobs_ref(base[:, 0] + dep_in[roots] @ dep_rows.t(), K)  # [B, K]
    tok = tok + d2t[tok]
    want[0][:, :K], want[1][:, :K], want[2][:, :K] = lp, tok, -1
    flat = torch.arange(K).expand(B, K)
    for d in range(1, S):
        lp_d, ids = topk_logprobs_ref(base[:, d, None] + dep_in[tok] @ dep_rows.t(), K)  # [B, K, K]
        lp, tok, flat, _, _ = expand_step_ref(lp, lp_d, ids, flat, torch.zeros(B, K, 0, dtype=torch.bool),
                                              torch.zeros(B, K, 0), *want, K + (d - 1) * K * K, d2t,
                                              keep_ancestors=False)
    got = grow_tree_ref(base, dep_in, dep_rows, dep_top, roots, S, K, d2t)
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_logits_are_read_as_float32(dtype):
    """base in the LM head's dtype (the invariant path's, no fp32 copy): the tree of its fp32 values."""
    base, dep_in, dep_rows, dep_top, roots, d2t = inputs(3, 4, 700, 900, 20, True, seed=9)
    half = base.to(dtype)
    dev = [t.to(DEVICE) for t in (half, dep_in, dep_rows, dep_top, roots, d2t)]
    got = [t.cpu() for t in grow_tree(*dev[:5], 4, 4, dev[5])]
    want = grow_tree_ref(half.float(), dep_in, dep_rows, dep_top, roots, 4, 4, d2t)
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    assert all(torch.equal(a, b) for a, b in zip(grow_tree_ref(half, dep_in, dep_rows, dep_top, roots, 4, 4, d2t),
                                                 want))


@needs_kernel
def test_ties_take_the_lower_id():
    """Integer logits and a zero term: every candidate ties with others; the order is the reference's (lower id,
    then lower index), so the tree is fixed."""
    B, S, K, V = 2, 3, 4, 300
    g = torch.Generator().manual_seed(3)
    base = torch.randint(0, 3, (B, S, V), generator=g).float()  # [B, S, V] many ties
    zeros = torch.zeros(V, 16), torch.zeros(V, 16)
    got = check(base, *zeros, dependency_top(*zeros), torch.tensor([5, 7]), None, S, K)
    assert got[1][0, :K].tolist() == (base[0, 0] == 2).nonzero()[:K, 0].tolist()


@needs_kernel
def test_the_shipped_shape():
    """SmolLM2's 8,192-id draft vocabulary at rank 64 (the base top-k in two launches, kernels/topk.py)."""
    check(*inputs(1, 2, 8192, 9000, 64, True, seed=7), 2, 4)


def test_above_max_k_the_reference_runs():
    base, dep_in, dep_rows, dep_top, roots, _ = inputs(1, 2, 64, 64, 16, False, seed=1)
    got = grow_tree(base, dep_in, dep_rows, dep_top, roots, 2, MAX_K + 2)
    want = grow_tree_ref(base, dep_in, dep_rows, dep_top, roots, 2, MAX_K + 2)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("change, msg", [
    (dict(base=torch.zeros(2, 1, 50)), r"base must be \[B=2, >= S=2, Vd=50\]"),
    (dict(dep_in=torch.zeros(50, 8), dep_top=torch.zeros(50, 4, dtype=torch.int32)), "must share r"),
    (dict(base=torch.zeros(2, 2, 50, dtype=torch.float64)), "must be float32"),
    (dict(dep_top=torch.zeros(50, 4, dtype=torch.int64)), "dep_top must be int32"),
    (dict(K=0), "K=0"),
    (dict(roots=torch.zeros(2, dtype=torch.int32)), "roots and d2t must be int64"),
])
def test_checks(change, msg):
    args = dict(base=torch.zeros(2, 2, 50), dep_in=torch.zeros(50, 16), dep_rows=torch.zeros(50, 16),
                dep_top=torch.zeros(50, 4, dtype=torch.int32), roots=torch.zeros(2, dtype=torch.long), S=2, K=2)
    args.update(change)
    with pytest.raises(ValueError, match=msg):
        grow_tree(**args)


@gpu_only
def test_cuda_graph():
    base, dep_in, dep_rows, dep_top, roots, d2t = (t.to(DEVICE) for t in inputs(8, 5, 8192, 9000, 64, True, seed=11))
    grow_tree(base, dep_in, dep_rows, dep_top, roots, 5, 4, d2t)  # compile before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = grow_tree(base, dep_in, dep_rows, dep_top, roots, 5, 4, d2t)
    base.copy_(torch.randn_like(base))
    roots.random_(0, 9000)
    graph.replay()
    want = grow_tree_ref(base, dep_in, dep_rows, dep_top, roots, 5, 4, d2t)
    assert CUDA and torch.equal(out[1], want[1]) and torch.equal(out[2], want[2])
