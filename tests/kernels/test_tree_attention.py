"""Tree attention (kernels/tree_attention.py and its two kernels) against an fp64 reference.

On CPU run with TRITON_INTERPRET=1 (CI does) so the Triton kernel itself is tested; without it
the launcher falls back to the reference and the kernel tests are skipped. On a GPU the same
tests run bigger (more heads, longer prefixes) plus bf16/fp16.
"""

from __future__ import annotations

import math

import pytest
import torch
from kernel_testing import CUDA, DEVICE, gpu_only, needs_kernel, rel_err

import eaglet.kernels.tree_attention as ta
import eaglet.kernels.tree_attention_invariant as inv
import eaglet.kernels.tree_attention_splitkv as sk
from eaglet.kernels.tree_attention import tree_attention, tree_attention_ref
from eaglet.kernels.tree_attention_plan import meta


def random_parents(n: int, gen: torch.Generator) -> list[int]:
    """Parents before children (parent[i] < i), root 0; resampled until some node has >= 2 children."""
    while True:
        parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
        if n < 3 or len(set(parents[1:])) < n - 1:  # a repeated parent = a real branch
            return parents


def ancestor_mask(parents: list[int]) -> torch.Tensor:
    """[N, N] bool: mask[i, j] = j is i or an ancestor of i."""
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)  # [N, N]
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    return mask


def make_inputs(B, N, Hq, Hkv, D, prefix, page_size, dtype, tree, seed=0, device=DEVICE):
    """Random q and a paged pool whose pages are shuffled (non-contiguous, interleaved across requests)."""
    gen = torch.Generator().manual_seed(seed)
    prefix_lens = torch.tensor(prefix, dtype=torch.int32)  # [B]
    pages_per_req = math.ceil((max(prefix) + N) / page_size) + 1  # one spare column
    num_pages = B * pages_per_req + 5  # spare pages hold junk nobody may read
    page_table = torch.randperm(num_pages, generator=gen)[: B * pages_per_req].view(B, pages_per_req).int()  # [B, P]
    k_cache = torch.randn(num_pages, page_size, Hkv, D, generator=gen).to(dtype)  # [pages, page_size, Hkv, D]
    v_cache = torch.randn(num_pages, page_size, Hkv, D, generator=gen).to(dtype)  # [pages, page_size, Hkv, D]
    q = torch.randn(B, N, Hq, D, generator=gen).to(dtype)  # [B, N, Hq, D]
    tree_mask = torch.stack([ancestor_mask(random_parents(N, gen)) for _ in range(B)]) if tree else None  # [B, N, N]
    ts = [q, k_cache, v_cache, page_table, prefix_lens, tree_mask]
    return [t.to(device) if t is not None else None for t in ts]



def ref64(q, k_cache, v_cache, page_table, prefix_lens, tree_mask, sm_scale=None):
    return tree_attention_ref(q.double(), k_cache.double(), v_cache.double(), page_table, prefix_lens, tree_mask,
                              sm_scale)


# (B, N, Hq, Hkv, D, prefix_lens, page_size, tree). On CPU the interpreter runs these few-head
# shapes; on a GPU the heads are scaled up 8x (GQA group unchanged).
CASES = [
    pytest.param(1, 37, 4, 2, 64, [4093], 16, True, id="odd-prefix4093-N37-tree"),
    pytest.param(1, 37, 4, 2, 64, [4093], 16, False, id="odd-prefix4093-N37-causal"),
    pytest.param(3, 9, 4, 1, 64, [130, 0, 17], 16, True, id="ragged-with-empty-prefix"),
    pytest.param(2, 12, 2, 2, 128, [300, 61], 1, True, id="page1-D128-MHA"),
    pytest.param(2, 16, 8, 2, 64, [1000, 999], 64, True, id="page64-group4"),
    pytest.param(2, 10, 6, 2, 64, [300, 77], 16, True, id="group3-tree"),  # SmolLM2's GQA group: per-row mask loads
    pytest.param(2, 1, 4, 2, 128, [777, 5], 16, False, id="N1-decode"),
    pytest.param(1, 1, 2, 1, 64, [0], 16, True, id="N1-empty-prefix"),
    pytest.param(2, 150, 2, 1, 64, [0, 40], 16, False, id="chunked-prefill-causal"),
]


def _scale_heads(Hq, Hkv):
    return (Hq * 8, Hkv * 8) if CUDA else (Hq, Hkv)


@needs_kernel
@pytest.mark.parametrize("B,N,Hq,Hkv,D,prefix,page_size,tree", CASES)
def test_fp32_matches_fp64_reference(B, N, Hq, Hkv, D, prefix, page_size, tree):
    Hq, Hkv = _scale_heads(Hq, Hkv)
    inputs = make_inputs(B, N, Hq, Hkv, D, prefix, page_size, torch.float32, tree)
    out = tree_attention(*inputs, max_prefix_len=max(prefix))  # [B, N, Hq, D]
    ref = ref64(*inputs)
    assert not out.isnan().any()
    assert rel_err(out, ref) < 1e-4


@needs_kernel
@pytest.mark.parametrize("invariant", [False, True], ids=["split", "invariant"])
@pytest.mark.parametrize("K,step", [(4, 3), (1, 5), (3, 1)])
def test_draft_step_queries_fewer_than_new_keys(K, step, invariant):
    """A draft step: K queries attend the prefix plus the K*step draft-tree keys written so far
    (mask [B, K, K*step]: ancestors in earlier blocks, itself in the last), in both modes (a head beside an invariant
    target runs the invariant kernels)."""
    B, Hq, Hkv, D = 2, *_scale_heads(4, 2), 64
    NK = K * step
    q, k_cache, v_cache, page_table, prefix_lens, _ = make_inputs(B, NK, Hq, Hkv, D, [200, 33], 16, torch.float32,
                                                                  False, seed=3)
    q = q[:, -K:].contiguous()  # [B, K, Hq, D] the last block queries
    gen = torch.Generator().manual_seed(4)
    mask = torch.rand(B, K, NK, generator=gen) < 0.5  # [B, K, NK] arbitrary earlier-block visibility
    mask[:, :, -K:] = torch.eye(K, dtype=torch.bool)  # each query sees itself in its own block
    mask = mask.to(q.device)
    out = tree_attention(q, k_cache, v_cache, page_table, prefix_lens, mask, max_prefix_len=200, invariant=invariant)
    assert rel_err(out, ref64(q, k_cache, v_cache, page_table, prefix_lens, mask)) < 1e-4


@needs_kernel
def test_poisoned_buffers_are_fully_written(monkeypatch):
    """Out, partial outputs and LSEs all start as NaN: every element the result depends on must be written."""

    def poisoned(shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(ta, "_empty", poisoned)
    # Ragged prefixes leave splits unused by the short request; causal rows skip late splits.
    for tree in (True, False):
        inputs = make_inputs(3, 21, 4, 2, 64, [2500, 3, 0], 16, torch.float32, tree, seed=1)
        out = tree_attention(*inputs, max_prefix_len=2500)
        assert not out.isnan().any()
        assert rel_err(out, ref64(*inputs)) < 1e-4


@needs_kernel
def test_split_count_independent():
    """max_prefix_len only sizes the grid: a loose bound, the page table's capacity (None) and a
    bound that is too small (the last split then runs to the end) all give the same result."""
    inputs = make_inputs(2, 7, 4, 2, 64, [1500, 200], 16, torch.float32, True, seed=2)
    ref = ref64(*inputs)
    for bound in (1500, 1700, None, 100):
        out = tree_attention(*inputs, max_prefix_len=bound)
        assert rel_err(out, ref) < 1e-4, bound


@needs_kernel
def test_sm_scale_and_noncontiguous_q():
    q, k_cache, v_cache, page_table, prefix_lens, tree_mask = make_inputs(
        2, 6, 4, 2, 64, [90, 33], 16, torch.float32, True
    )
    q_strided = q.transpose(1, 2).contiguous().transpose(1, 2)  # [B, N, Hq, D], heads-major memory
    out = tree_attention(q_strided, k_cache, v_cache, page_table, prefix_lens, tree_mask, sm_scale=0.3)
    ref = ref64(q, k_cache, v_cache, page_table, prefix_lens, tree_mask, sm_scale=0.3)
    assert rel_err(out, ref) < 1e-4


def test_grid_plan():
    """Host-side plan: splits cover the bound, chunks are powers of two (an autotune key) and long
    enough, a full grid needs no split, the new keys get a split of their own only within one wave."""
    cases = [(1, 16, 32, 8, 65552, 132), (1, 16, 32, 8, 1040, 132), (8, 64, 32, 8, 16448, 132), (1, 1, 1, 1, 10, 132),
             (1, 37, 4, 2, 4130, 8), (1, 64, 32, 8, 4160, 132), (1, 8, 32, 8, 1032, 132)]  # fmt: skip
    for B, N, Hq, Hkv, kv_max, sms in cases:
        block_m, m_tiles, splits, chunk, apart = sk._plan(B, N, Hq, Hkv, kv_max, N, sms)
        rows = N * Hq // Hkv
        prefix_splits = splits - apart
        programs = B * Hkv * m_tiles * splits
        assert 16 <= block_m <= 128 and (m_tiles - 1) * block_m < rows <= m_tiles * block_m
        assert chunk >= sk._CHUNK_ALIGN and chunk & (chunk - 1) == 0 and 1 <= splits <= sk._MERGE_SPLITS
        assert kv_max - N <= prefix_splits * chunk  # the prefix splits cover the bound
        assert prefix_splits == 1 or (prefix_splits - 1) * chunk < kv_max - N  # it starts inside the prefix
        assert splits == 1 or chunk >= sk._MIN_CHUNK // 2  # rounded to the nearest power of two
        assert not apart or (splits > 1 and programs <= sms)
        # past one wave: long chunks (up to the power-of-two rounding)
        assert splits == 1 or programs <= 2 * sms or 2 * chunk >= sk._CHUNK_PER_ROW * rows
    assert sk._plan(1, 16, 32, 8, 65552, 16, 132)[2:] == (32, 2048, False)  # one request, 8 KV heads: many splits
    assert sk._plan(1, 16, 32, 8, 4112, 16, 132)[2:] == (16, 256, False)  # 128 programs on 132 SMs, apart 136
    assert sk._plan(1, 8, 32, 8, 1032, 8, 132)[2:] == (9, 128, True)  # the 8B verify: 8 prefix splits, 1 tree
    assert sk._plan(64, 64, 32, 8, 65552, 64, 132)[2] == 1  # the grid is already full
    assert sk._plan(8, 64, 32, 8, 4160, 64, 132)[2] == 1  # 128 heavy 128-row programs: one per SM already


@needs_kernel
@pytest.mark.parametrize("tree", [True, False])
@pytest.mark.parametrize("apart", [False, True])
def test_new_keys_apart_or_in_the_last_split(monkeypatch, apart, tree):
    """Both places of the new keys give the reference, with ragged and empty prefixes, a bound above and one below
    the longest prefix (the device-side split length then outgrows the chunk), and every buffer starting as NaN
    (no unused split is read)."""
    plan = sk._plan.__wrapped__

    def forced(B, N, Hq, Hkv, kv_max, nk, num_sms):
        block_m, m_tiles = plan(B, N, Hq, Hkv, kv_max, nk, num_sms)[:2]
        return block_m, m_tiles, sk._num_splits(kv_max, nk, 64, apart), 64, apart

    monkeypatch.setattr(sk, "_plan", forced)
    monkeypatch.setattr(ta, "_empty", lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype,
                                                                              device=device))
    inputs = make_inputs(3, 21, 4, 2, 64, [700, 3, 0], 16, torch.float32, tree, seed=5)
    ref = ref64(*inputs)
    sk.prepare.cache_clear()  # its recipes hold the plan
    try:
        for bound in (700, 100):
            assert sk.prepare(*[meta(t) for t in inputs], None, bound, True)[1][1] > 1  # split
            out = tree_attention(*inputs, max_prefix_len=bound)
            assert not out.isnan().any()
            assert rel_err(out, ref) < 1e-4, bound
    finally:
        sk.prepare.cache_clear()


def _chain(mask_row: torch.Tensor) -> list[int]:
    """The ancestors-or-self of a tree node, root first (its allowed new keys in index order)."""
    return mask_row.nonzero().flatten().tolist()


INVARIANT_CASES = [
    # (B, N, Hq, Hkv, D, prefix_lens, page_size, tree); prefixes straddle the 64-key tiles and the 128-key splits;
    # groups of 2 (32 tokens a 64-row tile), 3 (21 tokens and a padding row), 1 (64 tokens), 32 (two tokens a tile);
    # two causal tiles whose tokens cross a split boundary
    pytest.param(2, 9, 4, 2, 64, [37, 509], 16, True, id="tree-split-boundary"),
    pytest.param(2, 70, 1, 1, 64, [115, 3], 16, False, id="causal-two-tiles-split-boundary"),
    pytest.param(1, 24, 6, 2, 128, [1030], 8, True, id="tree-group3-D128"),
    pytest.param(2, 7, 4, 4, 64, [0, 60], 1, False, id="causal-page1"),
    pytest.param(1, 5, 32, 1, 64, [200], 16, True, id="tree-group32"),
    pytest.param(1, 6, 2, 1, 64, [2090], 16, True, id="tree-merge-two-blocks"),  # 17 splits: two merge passes
]


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16] if CUDA else [torch.float32])
@pytest.mark.parametrize("B,N,Hq,Hkv,D,prefix,page_size,tree", INVARIANT_CASES)
def test_invariant_node_equals_its_decode(dtype, B, N, Hq, Hkv, D, prefix, page_size, tree):
    """invariant=True: each tree (or prefill) row is bit-identical to the same query decoded alone (N = 1)
    after its ancestors were committed to consecutive positions, as plain decoding would have them, and
    under another grid bound; and it is attention (close to the fp64 reference)."""
    Hq, Hkv = _scale_heads(Hq, Hkv)
    q, k_cache, v_cache, page_table, prefix_lens, mask = make_inputs(B, N, Hq, Hkv, D, prefix, page_size, dtype, tree,
                                                                     seed=7)
    out = tree_attention(q, k_cache, v_cache, page_table, prefix_lens, mask, max_prefix_len=max(prefix),
                         invariant=True)  # [B, N, Hq, D]
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    assert rel_err(out, ref64(q, k_cache, v_cache, page_table, prefix_lens, mask)) < tol
    if tree:
        assert any(len(set(_chain(m))) < i + 1 for m_b in mask for i, m in enumerate(m_b)), "the trees must branch"
    slot = lambda b, p: page_table[b, p // page_size].long() * page_size + p % page_size  # noqa: E731
    k_flat, v_flat = k_cache.view(-1, Hkv, D), v_cache.view(-1, Hkv, D)  # [slots, Hkv, D]
    for b in range(B):
        P = prefix[b]
        for i in range(N):
            chain = _chain(mask[b, i]) if tree else list(range(i + 1))
            k2, v2 = k_cache.clone(), v_cache.clone()
            k2f, v2f = k2.view(-1, Hkv, D), v2.view(-1, Hkv, D)
            for e, j in enumerate(chain):  # ancestor e of node i -> position P + e, where decoding puts it
                k2f[slot(b, P + e)] = k_flat[slot(b, P + j)]
                v2f[slot(b, P + e)] = v_flat[slot(b, P + j)]
            lens = prefix_lens.clone()
            lens[b] = P + len(chain) - 1
            one = tree_attention(q[:, i:i + 1].contiguous(), k2, v2, page_table, lens, None,
                                 max_prefix_len=max(prefix) + 3000, invariant=True)  # [B, 1, Hq, D]
            assert torch.equal(one[b, 0], out[b, i]), (b, i)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16] if CUDA else [torch.float32])
@pytest.mark.parametrize("B,N,Hq,Hkv,D,prefix,tree", [
    (2, 9, 4, 2, 64, [37, 509], True), (1, 24, 6, 2, 128, [1030], True), (2, 20, 2, 2, 64, [115, 3], False),
    (3, 1, 4, 1, 128, [700, 3, 260], False), (1, 6, 2, 1, 64, [2090], True),
])
def test_invariant_rows_do_not_depend_on_the_row_tile(monkeypatch, dtype, B, N, Hq, Hkv, D, prefix, tree):
    """invariant=True: a call gives the same bits in 16-row and in 64-row tiles (`_inv_rows` picks per call) and with
    any count of rows a merge program (a module constant: the merge's steps are elementwise over its rows)."""
    Hq, Hkv = _scale_heads(Hq, Hkv)
    inputs = make_inputs(B, N, Hq, Hkv, D, prefix, 16, dtype, tree, seed=3)
    outs = {}
    for rows in inv._INVARIANT_ROWS:
        for merge_rows in (1, inv._INVARIANT_MERGE_ROWS, 16):
            monkeypatch.setattr(inv, "_inv_rows", lambda b_hkv, n, group, rows=rows: rows)
            monkeypatch.setattr(inv, "_INVARIANT_MERGE_ROWS", merge_rows)
            inv.prepare.cache_clear()
            outs[rows, merge_rows] = tree_attention(*inputs, max_prefix_len=max(prefix), invariant=True)
    inv.prepare.cache_clear()
    first = outs[inv._INVARIANT_ROWS[0], 1]
    for key, out in outs.items():
        assert torch.equal(out, first), key


@gpu_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "B,N,Hq,Hkv,D,prefix,page_size,tree",
    [
        (1, 37, 32, 8, 128, [4093], 16, True),
        (4, 64, 32, 8, 128, [16384, 5000, 0, 77], 16, True),
        (2, 16, 9, 3, 64, [2000, 1], 64, True),
        (2, 1, 32, 8, 128, [8191, 100], 1, False),
        (1, 1000, 32, 8, 128, [3000], 16, False),
    ],
)
def test_half_precision_gpu(dtype, B, N, Hq, Hkv, D, prefix, page_size, tree):
    inputs = make_inputs(B, N, Hq, Hkv, D, prefix, page_size, dtype, tree)
    out = tree_attention(*inputs, max_prefix_len=max(prefix))
    assert out.dtype == dtype
    assert not out.isnan().any()
    assert rel_err(out, ref64(*inputs)) < 1e-2


@gpu_only
def test_fp32_large_gpu():
    inputs = make_inputs(2, 64, 32, 8, 128, [20000, 3], 16, torch.float32, True)
    out = tree_attention(*inputs, max_prefix_len=20000)
    assert rel_err(out, ref64(*inputs)) < 1e-4


@gpu_only
def test_cuda_graph_capture_and_replay():
    """The call is capturable (no host sync, grid from max_prefix_len only); a replay picks up new
    q, prefix_lens and tree_mask written in place into the captured buffers."""
    q, k_cache, v_cache, page_table, prefix_lens, tree_mask = make_inputs(
        2, 16, 32, 8, 128, [3500, 10], 16, torch.bfloat16, True
    )
    tree_attention(q, k_cache, v_cache, page_table, prefix_lens, tree_mask, max_prefix_len=4000)  # warm up (autotune)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tree_attention(q, k_cache, v_cache, page_table, prefix_lens, tree_mask, max_prefix_len=4000)
    new = make_inputs(2, 16, 32, 8, 128, [3500, 10], 16, torch.bfloat16, True, seed=5)
    q.copy_(new[0])
    tree_mask.copy_(new[5])
    prefix_lens.copy_(torch.tensor([3510, 0], dtype=torch.int32))  # within the 3536 slots
    graph.replay()
    ref = ref64(q, k_cache, v_cache, page_table, prefix_lens, tree_mask)
    assert rel_err(out, ref) < 1e-2


def test_cpu_fallback_is_reference():
    """Without the interpreter, CPU tensors take the reference path (the engine runs anywhere)."""
    inputs = make_inputs(2, 5, 4, 2, 64, [20, 3], 16, torch.float32, True, device="cpu")
    out = tree_attention(*inputs)
    assert rel_err(out, ref64(*inputs)) < 1e-5


def test_validation_errors():
    q, k, v, pt, pl, tm = make_inputs(2, 4, 4, 2, 64, [10, 3], 16, torch.float32, True, device="cpu")
    cases = [
        (dict(q=q[0]), "q must be"),
        (dict(k_cache=k[0]), "k_cache must be"),
        (dict(v_cache=v[:, :, :1]), "v_cache shape"),
        (dict(q=q.double(), k_cache=k.double(), v_cache=v.double()), "q dtype"),
        (dict(k_cache=k.half()), "k_cache dtype"),
        (dict(q=q[..., :32], k_cache=k[..., :32], v_cache=v[..., :32]), "head_dim"),
        (dict(q=torch.randn(2, 4, 3, 64)), "multiple of"),
        (dict(page_table=pt[:1]), "page_table must be"),
        (dict(page_table=pt.long()), "page_table dtype"),
        (dict(prefix_lens=pl[:1]), "prefix_lens must be"),
        (dict(prefix_lens=pl.long()), "prefix_lens dtype"),
        (dict(tree_mask=tm[:, :3]), "tree_mask must be"),
        (dict(tree_mask=tm.int()), "tree_mask dtype"),
        (dict(max_prefix_len=-1), "max_prefix_len"),
        (dict(max_prefix_len=torch.tensor(5)), "max_prefix_len"),
        (dict(sm_scale=-1.0), "sm_scale"),
    ]
    base = dict(q=q, k_cache=k, v_cache=v, page_table=pt, prefix_lens=pl, tree_mask=tm)
    for change, msg in cases:
        with pytest.raises(ValueError, match=msg):
            tree_attention(**{**base, **change})
    if CUDA:
        with pytest.raises(ValueError, match="page_table is on"):
            tree_attention(q.cuda(), k.cuda(), v.cuda(), pt, pl.cuda(), tm.cuda())
