# One module past ~500 lines: split-KV and invariant mode are one op (one launcher, `_prepare`, reference, cases).
"""Tree attention over a paged KV pool.

For each request b the N query tokens (tree nodes, or a prefill chunk) attend
  * every cached prefix token at positions [0, prefix_lens[b]) of the request, and
  * the new keys j < NK at positions prefix_lens[b] + j for which tree_mask[b, i, j] is True
    (tree_mask [B, N, NK]; None means NK = N and causal: j <= i).
The new keys' K/V must already be written to the pool at positions prefix_lens[b] + j. Usually
NK = N (a verify or prefill writes its own keys); a draft step's K queries attend all the
draft-tree nodes written so far (NK = step * K).

Pool layout: k_cache / v_cache [num_pages, page_size, Hkv, D]; the slot of position p of
request b is page_table[b, p // page_size] * page_size + p % page_size.

The Triton path (flash-decoding with GQA packing):
  * one program owns BLOCK_M packed query rows (row = token * G + group head, G = Hq // Hkv)
    of one KV head, so every K/V tile it loads serves all G query heads of that KV head;
  * the key range [0, prefix + N) is cut into `num_splits` chunks (grid axis 1) so that one
    long request still fills every SM; each split runs an online softmax over its chunk
    (prefix tiles unmasked, tree tiles masked; the new keys go to the last split, or to a split of
    their own while the grid has room) and, when there is more than one split,
    writes its normalised partial output and log2-sum-exp; `_merge_kernel` combines them;
  * num_splits is sized on the host from `max_prefix_len` (never from device values), so a
    call is CUDA-graph capturable; the keys per split are computed on the device from each
    request's prefix (`_split_len`), so a prefix far below the bound still uses every split.
    Warm it up once before capture: the first call of each shape class (row tile, mask, split
    or not, chunk length) autotunes (EAGLET_AUTOTUNE=0 takes the default config instead).
A row whose allowed key set is empty (impossible for a tree: a node sees itself) gives 0 here
and NaN in the reference.

Invariant mode (`invariant=True`, `_inv_fwd_kernel` + `_inv_merge_kernel`): a query's output depends only on its
own keys, never on the batch, the tree around it or the grid's split count, so a tree node's output is bit-identical
to the output of the same token decoded alone at the same position. A node at depth d with prefix P sees the logical
sequence 0..P+d: the prefix, then its ancestors in depth order (the j-th allowed new key is its depth-j ancestor: new
tokens are numbered parents first, and key j of the new tokens is at position P + j). Every program holds a tile of
16 or 64 query rows (TOKS tokens of G heads; `_inv_rows` picks per call: an MMA row's bits do not depend on the
tile's rows, and the row sums are `fixed_sum1`'s, in an order written out) and attends one leaf: `_INVARIANT_CHUNK`
logical positions, in `_INVARIANT_BLOCK_N`-key tiles from the leaf's start, from the sentinel state. A leaf whose keys
are in every row's sequence (below the prefix; causal: below the tile's first token) is attended once for the tile; a
leaf that reaches the tree is attended by the tile's tree leaves, each with its ancestors gathered into depth order,
for its own rows and its ancestors' (their keys past their depth masked). Each leaf's unnormalised state (m, l, acc)
goes to the workspace; the merge combines a row's leaves by one fixed tree, blocks of 16 leaves each a binary tree of
adjacent pairs (`_inv_comb`, explicit FMAs), the blocks folded in order, so a verify, a decode step and a prefill
reduce alike. On an H200 (results/invariant_h200/leaf_tree_attn.md) a decode costs 0.92-1.04x the split-KV kernel, a
verify of 8 tokens at a 1k prefix 0.99-1.06x (B=1 and 8), of 64 tokens 0.92-1.32x, a B=8 verify of 16 tokens
1.37-1.53x and a 4k prefix 1.08-1.48x: the leaves stay 128 keys whatever the batch, so a B=8 verify still writes and
merges more partial states than the split-KV kernel's plan, and the leaf that holds a verify's tree is attended once
per tree leaf of the tile.
"""

from __future__ import annotations

import contextlib
import functools
import math

import torch
import triton
import triton.language as tl

from eaglet.kernels._compile_cases import TARGET_SMS, TREES, CompileCase, Ptr, model_shapes
from eaglet.kernels._fixed_order import fixed_sum1
from eaglet.kernels._utils import autotune_configs, is_hip, is_interpret, sm_count, use_triton

SUPPORTED_HEAD_DIMS = (64, 128)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_LOG2E = 1.4426950408889634
# Split plan (`_plan`), tuned on an H200 (results/tree_attention_h200.md, sweep):
# Chunks are powers of two, at least this long (so split boundaries fall on tile boundaries
# and the chunk length, an autotune key, takes few values).
_CHUNK_ALIGN = 128
# Up to one program per SM, chunks may be this short (B=1, L=1k, N=8: 8 splits of 128 keys ran in 17.0 µs
# against 19.5 µs for 4 of 256; L=4k, N=16: 11 splits of 384 keys 23 µs against 27
# for 7 of 640).
_MIN_CHUNK = 128
# Beyond one wave a split must be longer: each split writes, and the merge reads, rows * D
# fp32 values per KV head against chunk * D bf16 K and V values read; chunk >= 8 * rows keeps
# that under 25% of the K/V bytes.
_CHUNK_PER_ROW = 8
# Target split count cap: B=1, L=64k, N=16 ran 91 µs with 33 splits of 2048 keys and 110 µs
# with 57 of 1152 (more partial-output traffic and merge work for the same K/V bytes).
_MAX_SPLITS = 32
# The merge combines up to this many splits in one pass (rounding the chunk to a power of
# two can raise the count above _MAX_SPLITS).
_MERGE_SPLITS = 64
# Invariant mode: the leaf length (a constant, so leaf boundaries never move with the batch or the context bound),
# and its key tile (fixed: tile boundaries must not move with an autotuner's choice).
_INVARIANT_CHUNK = 128
_INVARIANT_BLOCK_N = 64
_INVARIANT_BLOCK_N_HIP = 32  # gfx942, 8 waves: 64-key tiles spilled the 8B's 64-row tile (256 VGPRs); 32 take 154
# The leaf tree: blocks of 16 leaves (`_inv_node`: 2k keys), each a binary tree of adjacent pairs, the blocks folded
# in order. The forward stores every leaf: forming the nodes of 2-8 shared leaves in one program was slower in all
# but one case (H200, 1k-4k prefixes, B=1 and 8, both models: the sweep's sum 320-568 µs in 4 warps against 306, more
# in 8; the 8B's B=8 verify of 8 tokens at a 4k prefix 81.1 against 87.0 µs), each program's leaves a serial chain of
# dependent loads.
# Packed rows a merge program combines, and its warps (H200, bench_invariant --parts attn_sweep, the sum over 14 cases
# of 1k-4k prefixes: 8 rows in 8 warps 281.4 µs, 4 in 4 283.1, 1 in 4 316.9; the 8B's B=8 verify of 16 tokens 47.1,
# 47.1, 56.6).
_INVARIANT_MERGE_ROWS = 8
_INVARIANT_MERGE_WARPS = 8
# Query rows of a tile, chosen per call (`_inv_rows`; at most _INVARIANT_CHUNK: a causal tile's tokens cross one leaf
# end): 64, or 16 where a request's rows of a KV head fit in 16 and the call has this many (request, KV head) pairs,
# where the smaller tile's registers buy occupancy (H200, bench_invariant --parts attn_sweep, µs in 16 / 64-row tiles:
# the 8B's B=8 decode 18.9 / 20.7; its B=8 verify of 16 tokens 82.1 / 65.8, of 8 44.4 / 39.3; SmolLM2's B=8 verify
# of 8 16.3 / 12.3, B=1 of 8 at a 4k prefix 10.5 / 9.6). A row's bits do not depend on the tile: an MMA row's do
# not (benchmarks/probes/mma_rows_probe.py: 16-128 rows, 4 and 8 warps), and the row sums are `fixed_sum1`'s.
_INVARIANT_ROWS = (16, 64)
_INVARIANT_SMALL_PAIRS = 64
# Largest row tile: 128 rows x D fp32 accumulator is 64 registers/thread at 8 warps.
_MAX_BLOCK_M = 128
# Resident programs per SM worth filling: several 4-warp 64-row programs (their K/V streams
# hide each other's HBM latency: B=8, L=16k, N=16 ran 178 µs with 8 splits, 193-233 with 3-5);
# a single 8-warp 128-row program (register-bound; B=8, L=4k, N=64 ran 122 µs unsplit and
# 168 µs with 2 splits).
_PROGRAMS_PER_SM = 4
_PROGRAMS_PER_SM_LARGE = 1


def tree_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    prefix_lens: torch.Tensor,
    tree_mask: torch.Tensor | None = None,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """Torch reference. q [B, N, Hq, D] -> out [B, N, Hq, D] (dtype of q); fp32 math (fp64 for fp64 q)."""
    B, N, Hq, D = q.shape
    page_size, Hkv = k_cache.shape[1], k_cache.shape[2]
    group = Hq // Hkv
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(D)
    acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    k_flat = k_cache.reshape(-1, Hkv, D)  # [slots, Hkv, D]
    v_flat = v_cache.reshape(-1, Hkv, D)  # [slots, Hkv, D]
    out = torch.empty_like(q)  # [B, N, Hq, D]
    NK = N if tree_mask is None else tree_mask.shape[2]
    new = torch.arange(N, device=q.device)  # [N]
    causal = new[None, :] <= new[:, None]  # [N, N]
    for b in range(B):
        P = int(prefix_lens[b])
        pos = torch.arange(P + NK, device=q.device)  # [P+NK]
        slots = page_table[b, pos // page_size].long() * page_size + pos % page_size  # [P+NK]
        k = k_flat[slots].to(acc_dtype).repeat_interleave(group, dim=1)  # [P+NK, Hq, D]
        v = v_flat[slots].to(acc_dtype).repeat_interleave(group, dim=1)  # [P+NK, Hq, D]
        s = torch.einsum("nhd,khd->hnk", q[b].to(acc_dtype), k) * scale  # [Hq, N, P+NK]
        tree = causal if tree_mask is None else tree_mask[b].bool()  # [N, NK]
        allowed = torch.cat([torch.ones(N, P, dtype=torch.bool, device=q.device), tree], dim=1)  # [N, P+NK]
        s = s.masked_fill(~allowed, float("-inf"))  # [Hq, N, P+NK]
        p = torch.softmax(s, dim=-1)  # [Hq, N, P+NK]
        out[b] = torch.einsum("hnk,khd->nhd", p, v).to(q.dtype)  # [N, Hq, D]
    return out


def _fwd_configs(hip: bool | None = None) -> list:
    """Autotune grid for `_fwd_kernel` (first entry = default) on AMD (`hip`; None: the running torch) or NVIDIA.
    BLOCK_M is chosen on the host (it sets the grid and the split count), so only the key tile and the schedule are
    tuned."""
    if is_hip() if hip is None else hip:
        # MI300 (tutorial 06's AMD entries): one software stage, occupancy hint waves_per_eu; 32-key tiles, 8 waves
        # for 128-row tiles (`_prune_fwd_configs`). Compiled for gfx942 (PORTABILITY.md), 64-key tiles spilled at
        # head_dim 128 (1-193 VGPRs) and waves_per_eu=3 (168 VGPRs) at both models' heads; these take 90-202, none.
        return [
            triton.Config({"BLOCK_N": 32, "waves_per_eu": 2}, num_warps=w, num_stages=1) for w in (4, 8)
        ]
    return [
        triton.Config({"BLOCK_N": bn}, num_warps=w, num_stages=s)
        for bn, w, s in ((64, 4, 3), (64, 4, 2), (64, 4, 4), (32, 4, 4), (64, 8, 3), (128, 8, 2), (128, 8, 3))
    ]


def _prune_fwd_configs(configs: list, named_args: dict, **kwargs) -> list:
    """A 128-row accumulator needs 8 warps and key tiles under 128 (else it spills: sm_90, 128-key tiles at 255
    registers and 20-1664 B of spill stores a thread, PORTABILITY.md); tiny row tiles waste 8 warps."""
    block_m = kwargs["BLOCK_M"]
    kept = [
        c for c in configs
        if not (block_m >= 128 and (c.num_warps < 8 or c.kwargs["BLOCK_N"] >= 128))
        and not (block_m <= 32 and c.num_warps > 4)
    ]
    return kept or configs[:1]


def _bench_config(kernel_call, quantiles):
    """Autotune timing from CUDA-graph replays: small shapes run for a few µs, less than the
    Python launch cost that plain do_bench would measure instead."""
    return triton.testing.do_bench_cudagraph(kernel_call, rep=20, quantiles=quantiles)


@triton.jit
def _softmax_update(acc, l_i, m_i, qk, v, DOT_DTYPE: tl.constexpr):
    """One key tile of the online softmax: scores qk [BLOCK_M, BLOCK_N] (log2 units, -inf where masked) and
    values v [BLOCK_N, D] into (acc [BLOCK_M, D], l_i, m_i [BLOCK_M]). m_i starts finite (-1e30), so a fully
    masked tile gives p = 0, never inf - inf."""
    m_new = tl.maximum(m_i, tl.max(qk, 1))  # [BLOCK_M]
    p = tl.math.exp2(qk - m_new[:, None])  # [BLOCK_M, BLOCK_N]
    alpha = tl.math.exp2(m_i - m_new)  # [BLOCK_M]
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE), acc * alpha[:, None], input_precision="ieee")  # [BLOCK_M, D]
    return acc, l_i, m_new


@triton.jit
def _attend(
    acc,
    l_i,
    m_i,
    q,
    K,
    V,
    pt_row,
    page,
    MASK,
    b,
    kvh,
    tok,
    row_ok,
    prefix,
    lo,
    hi,
    qk_scale,
    stride_kp,
    stride_ks,
    stride_kh,
    stride_vp,
    stride_vs,
    stride_vh,
    stride_mb,
    stride_mi,
    N,
    TREE: tl.constexpr,
    HAS_MASK: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GROUP: tl.constexpr,
):
    """Online softmax of the packed rows over key positions [lo, hi). TREE tiles apply the
    tree (or causal) mask; prefix tiles only the length bound. page: the page ids of the tile at lo
    (pt_row: the request's page-table row)."""
    offs_d = tl.arange(0, HEAD_DIM)  # [D]
    pos = lo + tl.arange(0, BLOCK_N)  # [BLOCK_N] key positions of the current tile
    # The tree tiles (at most NK keys, the tail of one split) are not software-pipelined: a second prologue, live
    # beside the accumulator, costs registers in every program (sm_90, BLOCK_N 64, 4 warps: 255 -> 239).
    for _ in tl.range(lo, hi, BLOCK_N, num_stages=1 if TREE else None):
        kv_ok = pos < hi  # [BLOCK_N]
        # The next tile's page ids are loaded one iteration ahead, so the K/V loads never wait
        # on a page-table load issued in the same iteration (a dependent-latency chain).
        nxt = pos + BLOCK_N  # [BLOCK_N]
        page_next = tl.load(pt_row + nxt // PAGE_SIZE, mask=nxt < hi, other=0)  # [BLOCK_N]
        slot_k = page.to(tl.int64) * stride_kp + (pos % PAGE_SIZE) * stride_ks  # [BLOCK_N]
        slot_v = page.to(tl.int64) * stride_vp + (pos % PAGE_SIZE) * stride_vs  # [BLOCK_N]
        k = tl.load(K + kvh * stride_kh + slot_k[:, None] + offs_d[None, :], mask=kv_ok[:, None], other=0.0)
        v = tl.load(V + kvh * stride_vh + slot_v[:, None] + offs_d[None, :], mask=kv_ok[:, None], other=0.0)
        qk = tl.dot(q, tl.trans(k.to(DOT_DTYPE)), input_precision="ieee") * qk_scale  # [BLOCK_M, BLOCK_N] log2 units
        valid = kv_ok[None, :]  # [1, BLOCK_N]
        if TREE:
            j = pos - prefix  # [BLOCK_N] index among the new tokens
            if HAS_MASK and (GROUP & (GROUP - 1)) == 0:
                # One mask row per token, broadcast to its GROUP packed rows: a per-row byte gather (64-bit
                # address per element) spilled every BLOCK_N >= 64 config (sm_90: 255 registers -> 168 at
                # BLOCK_N 32, no spills). Needs GROUP | BLOCK_M, i.e. GROUP a power of two.
                TOKS: tl.constexpr = tok.shape[0] // GROUP  # tok is [BLOCK_M]
                tok_t = tl.program_id(0) * TOKS + tl.arange(0, TOKS)  # [TOKS] the tokens of row tile program_id(0)
                m_ptrs = MASK + b * stride_mb + tok_t[:, None] * stride_mi + j[None, :]  # [TOKS, BLOCK_N]
                a_t = tl.load(m_ptrs, mask=(tok_t < N)[:, None] & kv_ok[None, :], other=0)  # [TOKS, BLOCK_N]
                a_t = tl.broadcast_to(a_t[:, None, :], (TOKS, GROUP, BLOCK_N))  # [TOKS, GROUP, BLOCK_N]
                allowed = tl.reshape(a_t, (TOKS * GROUP, BLOCK_N)) != 0  # [BLOCK_M, BLOCK_N]
            elif HAS_MASK:
                m_ptrs = MASK + b * stride_mb + tok[:, None] * stride_mi + j[None, :]
                allowed = tl.load(m_ptrs, mask=row_ok[:, None] & kv_ok[None, :], other=0) != 0  # [BLOCK_M, BLOCK_N]
            else:
                allowed = j[None, :] <= tok[:, None]  # [BLOCK_M, BLOCK_N]
            valid = valid & allowed
        qk = tl.where(valid, qk, float("-inf"))  # [BLOCK_M, BLOCK_N]
        acc, l_i, m_i = _softmax_update(acc, l_i, m_i, qk, v, DOT_DTYPE)
        pos = nxt
        page = page_next
    return acc, l_i, m_i


@triton.jit
def _split_len(prefix, NK, chunk, num_splits, TREE_APART: tl.constexpr):
    """Keys per split, on the device. The host sized the grid (and chunk) for a bound on the prefix, and a captured
    graph's bound is the context limit: a shorter prefix is spread over all the splits instead of filling the first
    few. The keys spread are the prefix (the new keys in their own split, or at the end of the last one when they
    fit in a chunk: `_num_splits`' rule) or all of them. A multiple of 32 keys (the smallest key tile); at most
    chunk while the prefix is within the bound; longer beyond it (slower, never wrong)."""
    if TREE_APART:
        per_split = tl.cdiv(prefix, num_splits - 1)
    else:
        per_split = tl.cdiv(prefix + tl.where(NK > chunk, NK, 0), num_splits)
    return tl.maximum(tl.cdiv(per_split, 32) * 32, 32)


@triton.autotune(
    configs=autotune_configs(_fwd_configs()),
    # chunk (a power of two) is in the key: the best key tile depends on how many tiles a
    # program walks (the first run keyed without it tuned BLOCK_N=32 on B=1, L=1k, 384-key
    # chunks and reused it for 2048-key chunks).
    key=["HEAD_DIM", "BLOCK_M", "HAS_MASK", "SPLIT", "chunk"],
    prune_configs_by={"early_config_prune": _prune_fwd_configs},
    do_bench=_bench_config,
)
@triton.jit
def _fwd_kernel(
    Q,
    K,
    V,
    PT,
    PL,
    MASK,
    O,
    qk_scale,
    chunk,
    num_splits,
    N,
    NK,
    Hkv,
    stride_qb,
    stride_qn,
    stride_qh,
    stride_kp,
    stride_ks,
    stride_kh,
    stride_vp,
    stride_vs,
    stride_vh,
    stride_ptb,
    stride_mb,
    stride_mi,
    kv_cap,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    HAS_MASK: tl.constexpr,
    SPLIT: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TREE_APART: tl.constexpr,
):
    """Grid (row tiles, splits, B * Hkv). kv_cap: the keys the page table addresses (its width * PAGE_SIZE).
    TREE_APART: the last split holds the new keys alone and the others the prefix; else the last split takes the
    new keys after its prefix keys. O is out [B, N, Hq, D] when not SPLIT, else the launcher's fp32 workspace:
    partial outputs [B, Hkv, S, N, G, D] followed by their LSEs [B, Hkv, S, N, G] (one allocation: each
    torch.empty is host time on the eager path)."""
    pid_m = tl.program_id(0)  # row tiles fastest: tiles sharing a K/V chunk run together (L2 reuse)
    split = tl.program_id(1)
    pid_bh = tl.program_id(2)
    b = pid_bh // Hkv
    kvh = pid_bh % Hkv
    prefix = tl.load(PL + b)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] packed rows
    tok = offs_m // GROUP  # [BLOCK_M] new-token index
    grp = offs_m % GROUP  # [BLOCK_M] query head within the KV head's group
    row_ok = offs_m < N * GROUP  # [BLOCK_M]
    offs_d = tl.arange(0, HEAD_DIM)  # [D]
    # Q and the first tile's page ids (at the host's split start, right whenever the prefix fills its bound) do
    # not depend on the prefix length: issued here, beside its load, their latency overlaps it (masked by the page
    # table's width, not by the bound that waits for it).
    q_ptrs = Q + b * stride_qb + tok[:, None] * stride_qn + (kvh * GROUP + grp)[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0).to(DOT_DTYPE)  # [BLOCK_M, D]
    pt_row = PT + b * stride_ptb
    pos0 = split * chunk + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    page0 = tl.load(pt_row + pos0 // PAGE_SIZE, mask=pos0 < kv_cap, other=0)  # [BLOCK_N]
    split_len = _split_len(prefix, NK, chunk, num_splits, TREE_APART)
    lo = split * split_len
    # A shorter split: the first tile's page ids again (masked off, no load, when the guess was right).
    pos0 = lo + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    reload = tl.load(pt_row + pos0 // PAGE_SIZE, mask=pos0 < tl.where(split_len == chunk, 0, kv_cap), other=0)
    page0 = tl.where(split_len == chunk, page0, reload)  # [BLOCK_N]

    # Key range of this tile: causal rows see new tokens up to their own, so late splits of
    # early row tiles (chunked prefill) have nothing to do.
    if HAS_MASK:
        row_end = prefix + NK + tok * 0  # [BLOCK_M]
        tile_end = prefix + NK
    else:
        row_end = prefix + tok + 1  # [BLOCK_M]
        last_tok = (tl.minimum(pid_m * BLOCK_M + BLOCK_M, N * GROUP) - 1) // GROUP
        tile_end = prefix + last_tok + 1
    # Prefix keys [lo, hi_p), then new keys [lo_t, hi).
    hi = tile_end
    if TREE_APART:
        tree_split = split == num_splits - 1
        hi_p = tl.where(tree_split, lo, tl.minimum(lo + split_len, prefix))
        lo_t = tl.where(tree_split, prefix, tile_end)
        # The new keys' split, or a prefix split starting inside the prefix (every row sees the whole prefix).
        # Written with where: the interpreter rejects `scalar bool | vector` in a store mask.
        used = lo < tl.where(tree_split, lo + 1, prefix) + tok * 0  # [BLOCK_M]
    else:
        hi = tl.where(split == num_splits - 1, tile_end, tl.minimum(lo + split_len, tile_end))
        hi_p = tl.minimum(hi, prefix)
        lo_t = tl.maximum(lo, prefix)
        used = lo < row_end  # [BLOCK_M]

    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)  # running max (log2 units)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum of exp2
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    # The tree tiles' first page ids, loaded before the prefix tiles: their latency hides behind them.
    pos_t = lo_t + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    page_t = tl.load(pt_row + pos_t // PAGE_SIZE, mask=pos_t < hi, other=0)  # [BLOCK_N]
    acc, l_i, m_i = _attend(
        acc, l_i, m_i, q, K, V, pt_row, page0, MASK, b, kvh, tok, row_ok, prefix, lo, hi_p,
        qk_scale, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, stride_mb, stride_mi,
        N, False, HAS_MASK, HEAD_DIM, PAGE_SIZE, DOT_DTYPE, BLOCK_N, GROUP,
    )  # fmt: skip
    acc, l_i, m_i = _attend(
        acc, l_i, m_i, q, K, V, pt_row, page_t, MASK, b, kvh, tok, row_ok, prefix, lo_t, hi,
        qk_scale, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, stride_mb, stride_mi,
        N, True, HAS_MASK, HEAD_DIM, PAGE_SIZE, DOT_DTYPE, BLOCK_N, GROUP,
    )  # fmt: skip

    l_safe = tl.where(l_i > 0, l_i, 1.0)  # [BLOCK_M]; l == 0 only for rows with no key in this split
    o = acc / l_safe[:, None]  # [BLOCK_M, D]
    if SPLIT:
        # Rows with no key in this split write nothing; the merge skips them by the same rule.
        store_ok = row_ok & used  # [BLOCK_M]
        part_row = ((pid_bh * num_splits + split) * N + tok) * GROUP + grp  # [BLOCK_M] row of [B, Hkv, S, N, G]
        tl.store(O + part_row[:, None] * HEAD_DIM + offs_d[None, :], o, mask=store_ok[:, None])
        LSE = O + tl.num_programs(2) * num_splits * N * GROUP * HEAD_DIM  # after all partial outputs
        lse = tl.where(l_i > 0, m_i + tl.math.log2(l_safe), float("-inf"))  # [BLOCK_M] log2-sum-exp2
        tl.store(LSE + part_row, lse, mask=store_ok)
    else:
        out_row = (b * N + tok) * (Hkv * GROUP) + kvh * GROUP + grp  # [BLOCK_M] row of [B, N, Hq]
        tl.store(O + out_row[:, None] * HEAD_DIM + offs_d[None, :], o.to(O.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _inv_tiles(acc, l_i, m_i, q, K, V, pt_row, kvh, lo, hi, row_hi, prefix, anc, qk_scale, stride_kp, stride_ks,
               stride_kh, stride_vp, stride_vs, stride_vh, GATHER: tl.constexpr, HEAD_DIM: tl.constexpr,
               PAGE_SIZE: tl.constexpr, DOT_DTYPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_NK: tl.constexpr):
    """Online softmax of the tile's rows over logical key positions [lo, hi) in BLOCK_N tiles from lo, row r's keys
    those below row_hi[r] (<= hi). GATHER: logical position prefix + e is the depth-e ancestor of the sub-program's
    token, new key anc[e] (a tree token's sequence, anc [BLOCK_NK] its keys in depth order); else a logical position is
    where it sits in the pool (the prefix, a causal row's keys). A key past a row's end gives p = 0 whatever K/V
    hold there (finite: written ancestors, or zero past hi), so the row's sums are those of its own sequence."""
    offs_d = tl.arange(0, HEAD_DIM)  # [D]
    ROWS: tl.constexpr = q.shape[0]
    for start in range(lo, hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)  # [BLOCK_N] logical key positions
        kv_ok = pos < hi  # [BLOCK_N]
        phys = pos  # [BLOCK_N] pool positions
        if GATHER and start + BLOCK_N > prefix:  # the tile reaches the ancestors
            e = tl.minimum(tl.maximum(pos - prefix, 0), BLOCK_NK - 1)  # [BLOCK_N] depth (clamped for the gather)
            phys = tl.where(pos >= prefix, prefix + tl.gather(anc, e, 0), pos)  # [BLOCK_N]
        page = tl.load(pt_row + phys // PAGE_SIZE, mask=kv_ok, other=0)  # [BLOCK_N]
        slot_k = page.to(tl.int64) * stride_kp + (phys % PAGE_SIZE) * stride_ks  # [BLOCK_N]
        slot_v = page.to(tl.int64) * stride_vp + (phys % PAGE_SIZE) * stride_vs  # [BLOCK_N]
        k = tl.load(K + kvh * stride_kh + slot_k[:, None] + offs_d[None, :], mask=kv_ok[:, None], other=0.0)
        v = tl.load(V + kvh * stride_vh + slot_v[:, None] + offs_d[None, :], mask=kv_ok[:, None], other=0.0)
        qk = tl.dot(q, tl.trans(k.to(DOT_DTYPE)), input_precision="ieee")  # [ROWS, BLOCK_N]
        qk = tl.where(pos[None, :] < row_hi[:, None], qk * qk_scale, float("-inf"))  # [ROWS, BLOCK_N]
        m_new = tl.maximum(m_i, tl.max(qk, 1))  # [ROWS] (`_softmax_update`, its row sum in a fixed order)
        p = tl.math.exp2(qk - m_new[:, None])  # [ROWS, BLOCK_N]
        alpha = tl.math.exp2(m_i - m_new)  # [ROWS]
        l_i = l_i * alpha + fixed_sum1(p, ROWS, BLOCK_N)
        acc = tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE), acc * alpha[:, None], input_precision="ieee")  # [ROWS, D]
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _inv_comb(m_a, l_a, acc_a, m_b, l_b, acc_b):
    """The combine of two unnormalised softmax states of adjacent key ranges, a before b, elementwise over any leading
    shape S: m [S] (running max, log2 units), l [S] (sum of exp2), acc [S, D]. The sentinel state of an empty range
    (m = -1e30, l = 0, acc = 0) is an exact identity on either side: exp2(0) is 1 and exp2(-1e30 - m) is 0."""
    m = tl.maximum(m_a, m_b)  # [S]
    a = tl.math.exp2(m_a - m)  # [S]
    b = tl.math.exp2(m_b - m)  # [S]
    l = tl.fma(l_a, a, l_b * b)  # [S]; explicit FMAs: no contraction left to the compiler
    acc = tl.fma(acc_a, tl.expand_dims(a, -1), acc_b * tl.expand_dims(b, -1))  # [S, D]
    return m, l, acc


@triton.jit
def _inv_leaf(q, K, V, pt_row, kvh, lo, hi, row_hi, prefix, anc, qk_scale, stride_kp, stride_ks, stride_kh,
              stride_vp, stride_vs, stride_vh, GATHER: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
              DOT_DTYPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_NK: tl.constexpr):
    """The unnormalised state (m, l, acc) of the leaf of logical keys [lo, hi) (`_inv_tiles`), from the sentinel."""
    ROWS: tl.constexpr = q.shape[0]
    m = tl.full([ROWS], -1.0e30, dtype=tl.float32)  # [ROWS]
    l = tl.zeros([ROWS], dtype=tl.float32)  # [ROWS]
    acc = tl.zeros([ROWS, HEAD_DIM], dtype=tl.float32)  # [ROWS, D]
    acc, l, m = _inv_tiles(acc, l, m, q, K, V, pt_row, kvh, lo, hi, row_hi, prefix, anc, qk_scale, stride_kp,
                           stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, GATHER, HEAD_DIM, PAGE_SIZE,
                           DOT_DTYPE, BLOCK_N, BLOCK_NK)
    return m, l, acc


@triton.jit
def _inv_shared(q, K, V, pt_row, kvh, lo, qk_scale, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
                HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, DOT_DTYPE: tl.constexpr, BLOCK_N: tl.constexpr,
                CHUNK: tl.constexpr):
    """A leaf every row of the tile sees whole: keys [lo, lo + CHUNK) at their pool positions."""
    ROWS: tl.constexpr = q.shape[0]
    rows_hi = lo + CHUNK + tl.zeros([ROWS], dtype=tl.int32)  # [ROWS]
    anc = tl.arange(0, 16)  # [16] unused without GATHER
    return _inv_leaf(q, K, V, pt_row, kvh, lo, lo + CHUNK, rows_hi, lo, anc, qk_scale, stride_kp, stride_ks,
                     stride_kh, stride_vp, stride_vs, stride_vh, False, HEAD_DIM, PAGE_SIZE, DOT_DTYPE, BLOCK_N, 16)


@triton.jit
def _inv_store(m, l, acc, O, pid_bh, slot, n_slots, N, b, kvh, Hkv, tok, grp, rows, GROUP: tl.constexpr,
               HEAD_DIM: tl.constexpr, SPLIT: tl.constexpr):
    """The state of leaf-tree slot `slot` for `rows` [ROWS] of the tile. SPLIT: into the workspace, acc [B*Hkv, S, N,
    G, D] then (m, l) [B*Hkv, S, N, G, 2]; else (one leaf: the row's whole sequence) its output acc / l."""
    offs_d = tl.arange(0, HEAD_DIM)  # [D]
    if SPLIT:
        part_row = ((pid_bh * n_slots + slot) * N + tok) * GROUP + grp  # [ROWS] row of [B*Hkv, S, N, G]
        tl.store(O + part_row[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=rows[:, None])
        ML = O + tl.num_programs(2) * n_slots * N * GROUP * HEAD_DIM  # after every slot's acc
        tl.store(ML + 2 * part_row, m, mask=rows)
        tl.store(ML + 2 * part_row + 1, l, mask=rows)
    else:
        o = acc / tl.where(l > 0, l, 1.0)[:, None]  # [ROWS, D]
        out_row = (b * N + tok) * (Hkv * GROUP) + kvh * GROUP + grp  # [ROWS] row of [B, N, Hq]
        tl.store(O + out_row[:, None] * HEAD_DIM + offs_d[None, :], o.to(O.dtype.element_ty), mask=rows[:, None])


@triton.jit
def _inv_fwd_kernel(
    Q, K, V, PT, PL, MASK, O, qk_scale, n_slots, tail, N, NK, Hkv,
    stride_qb, stride_qn, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
    stride_ptb, stride_mb, stride_mi,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, HAS_MASK: tl.constexpr,
    SPLIT: tl.constexpr, DOT_DTYPE: tl.constexpr, ROWS: tl.constexpr, TOKS: tl.constexpr, TOKS_P2: tl.constexpr,
    HEAD_TILES: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_NK: tl.constexpr, CHUNK: tl.constexpr,
):
    """Invariant mode (module doc). Grid (row tiles, n_slots + tail * TOKS, B * Hkv). A row tile is ROWS query rows:
    TOKS tokens of GROUP heads (GROUP <= ROWS), or ROWS heads of one token (HEAD_TILES tiles a token). Leaf s is the
    logical key positions [s * CHUNK, (s + 1) * CHUNK) of each row's sequence. Program j < n_slots of axis 1 attends
    leaf j for the whole tile where every token of the tile sees it whole (below the prefix; causal: below the tile's
    first token). The others are sub-program t of one of the first `tail` leaves from there on (the only leaves the
    tile's tokens do not share): token t's own keys (its ancestors gathered into depth order) with the whole tile's
    q, stored for the rows of t and of its ancestors in the tile that no later token of the tile descends from (an
    ancestor's sequence is the start of t's: it is attended with its rows' keys past their own depth masked), so only
    the tile's leaves work (causal: its last token). O: the workspace of `_inv_store`."""
    tile = tl.program_id(0)
    j = tl.program_id(1)
    pid_bh = tl.program_id(2)
    tok_tile = tile // HEAD_TILES
    b = pid_bh // Hkv
    kvh = pid_bh % Hkv
    prefix = tl.load(PL + b)
    GT: tl.constexpr = GROUP // HEAD_TILES  # heads of one token in a tile
    rr = tl.arange(0, ROWS)  # [ROWS] the tile's rows
    c = rr // GT  # [ROWS] each row's token, counted in the tile
    first = tok_tile * TOKS  # the tile's first token
    tok = first + c  # [ROWS] new-token index of each row
    grp = (tile % HEAD_TILES) * GT + rr % GT  # [ROWS] query head within the KV head's group
    row_ok = (c < TOKS) & (tok < N)  # [ROWS]
    offs_d = tl.arange(0, HEAD_DIM)  # [D]
    q_ptrs = Q + b * stride_qb + tok[:, None] * stride_qn + (kvh * GROUP + grp)[:, None] * stride_qh  # [ROWS, 1]
    pt_row = PT + b * stride_ptb
    if HAS_MASK:  # keys [0, shared_end) are in every row's sequence
        shared_end = prefix
    else:
        shared_end = prefix + first + 1
    n_shared = shared_end // CHUNK  # leaves every row of the tile sees whole
    if j < n_slots:
        if j < n_shared:
            q = tl.load(q_ptrs + offs_d[None, :], mask=row_ok[:, None], other=0.0).to(DOT_DTYPE)  # [ROWS, D]
            m, l, acc = _inv_shared(q, K, V, pt_row, kvh, j * CHUNK, qk_scale, stride_kp, stride_ks, stride_kh,
                                    stride_vp, stride_vs, stride_vh, HEAD_DIM, PAGE_SIZE, DOT_DTYPE, BLOCK_N, CHUNK)
            _inv_store(m, l, acc, O, pid_bh, j, n_slots, N, b, kvh, Hkv, tok, grp, row_ok, GROUP, HEAD_DIM, SPLIT)
    else:
        sub = (j - n_slots) // tail
        leaf = n_shared + (j - n_slots) % tail
        lo = leaf * CHUNK
        t = first + sub  # the token this sub-program attends for
        jj = tl.arange(0, BLOCK_NK)  # [BLOCK_NK] new-key index
        if HAS_MASK:
            # The tile's mask rows: each token's depth and each key's owner (the last tile token whose sequence holds
            # it). Key j is token j when the call writes its own keys (NK == N); else no token serves another.
            a = tl.arange(0, TOKS_P2)  # [TOKS_P2] tokens, counted in the tile
            a_ok = (a < TOKS) & (first + a < N)  # [TOKS_P2]
            blk = tl.load(MASK + b * stride_mb + (first + a)[:, None] * stride_mi + jj[None, :],
                          mask=a_ok[:, None] & (jj < NK)[None, :], other=0) != 0  # [TOKS_P2, BLOCK_NK]
            depth_r = tl.gather(tl.sum(blk.to(tl.int32), 1) - 1, tl.minimum(c, TOKS_P2 - 1), 0)  # [ROWS]
            owner_j = tl.max(tl.where(blk, a[:, None], -1), 0)  # [BLOCK_NK]
            owner_r = tl.gather(owner_j, tl.minimum(tok, BLOCK_NK - 1), 0)  # [ROWS]
            owner_r = tl.where(NK == N, owner_r, c)  # [ROWS]
            t_keys = tl.load(MASK + b * stride_mb + t * stride_mi + jj, mask=jj < tl.where(t < N, NK, 0), other=0) != 0
            anc = tl.sort(tl.where(t_keys, jj, BLOCK_NK + jj))  # [BLOCK_NK] t's ancestors-or-self, root first
            row_hi = tl.minimum(lo + CHUNK, prefix + depth_r + 1)  # [ROWS] row sequence [0, P + depth]
            row_st = row_ok & (owner_r == sub) & (row_hi > lo)  # [ROWS]
        else:  # causal: the tile's last token holds every row's sequence
            anc = jj
            row_hi = tl.minimum(lo + CHUNK, prefix + tok + 1)  # [ROWS]
            last = tl.minimum(N - first, TOKS) - 1  # the tile's last token, counted in the tile
            row_st = row_ok & (rr * 0 + sub == last) & (row_hi > lo)  # [ROWS]
        hi = tl.max(tl.where(row_st, row_hi, lo), 0)
        if (leaf < n_slots) & (hi > lo):
            q = tl.load(q_ptrs + offs_d[None, :], mask=row_ok[:, None], other=0.0).to(DOT_DTYPE)  # [ROWS, D]
            m, l, acc = _inv_leaf(q, K, V, pt_row, kvh, lo, hi, row_hi, prefix, anc, qk_scale, stride_kp, stride_ks,
                                  stride_kh, stride_vp, stride_vs, stride_vh, HAS_MASK, HEAD_DIM, PAGE_SIZE, DOT_DTYPE,
                                  BLOCK_N, BLOCK_NK)
            _inv_store(m, l, acc, O, pid_bh, leaf, n_slots, N, b, kvh, Hkv, tok, grp, row_st, GROUP, HEAD_DIM, SPLIT)


@triton.jit
def _inv_slot(WS, ML, rows, s, n_used, stride_s, HEAD_DIM: tl.constexpr):
    """Leaf s's state (m, l [R], acc [R, D]) of the rows [R] (slot 0 of each in the workspace; stride_s between
    slots), the sentinel past a row's leaves."""
    ok = s < n_used  # [R]
    p = rows + s * stride_s  # [R]
    m = tl.load(ML + 2 * p, mask=ok, other=-1.0e30)  # [R]
    l = tl.load(ML + 2 * p + 1, mask=ok, other=0.0)  # [R]
    acc = tl.load(WS + p[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :], mask=ok[:, None], other=0.0)
    return m, l, acc


@triton.jit
def _inv_node(WS, ML, rows, s, n_used, stride_s, HEAD_DIM: tl.constexpr, SIZE: tl.constexpr):
    """The tree node of leaves s .. s + SIZE - 1 (SIZE a power of two): the nodes of its two halves combined, down to
    single leaves; SIZE 16 is one block of the leaf tree. Unrolled at compile time."""
    if SIZE == 1:
        m, l, acc = _inv_slot(WS, ML, rows, s, n_used, stride_s, HEAD_DIM)
    else:
        m0, l0, a0 = _inv_node(WS, ML, rows, s, n_used, stride_s, HEAD_DIM, SIZE // 2)
        m1, l1, a1 = _inv_node(WS, ML, rows, s + SIZE // 2, n_used, stride_s, HEAD_DIM, SIZE // 2)
        m, l, acc = _inv_comb(m0, l0, a0, m1, l1, a1)
    return m, l, acc


@triton.jit
def _inv_merge_kernel(WS, PL, MASK, OUT, n_slots, N, NK, Hkv, stride_mb, stride_mi,
                      GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HAS_MASK: tl.constexpr, BLOCK_NK: tl.constexpr,
                      CHUNK: tl.constexpr, ROWS: tl.constexpr):
    """Invariant mode: ROWS packed rows of one (request, KV head), each row's leaves [0, cdiv(its sequence length,
    CHUNK)) combined by the fixed tree (module doc): blocks of 16 leaves, each a binary tree of adjacent pairs
    (`_inv_node`, elementwise over the rows: no layout conversion), folded in order from the sentinel. A block past
    a row's leaves is all sentinels (the identity), so a row's bits do not depend on ROWS or on its neighbours."""
    pid = tl.program_id(0)
    pid_bh = tl.program_id(1)
    ML = WS + tl.num_programs(1) * n_slots * N * GROUP * HEAD_DIM
    b = pid_bh // Hkv
    kvh = pid_bh % Hkv
    r = pid * ROWS + tl.arange(0, ROWS)  # [ROWS] packed rows of this (request, KV head)
    r_ok = r < N * GROUP  # [ROWS]
    tok = r // GROUP  # [ROWS]
    grp = r % GROUP  # [ROWS]
    prefix = tl.load(PL + b)
    if HAS_MASK:
        jj = tl.arange(0, BLOCK_NK)  # [BLOCK_NK]
        allowed = tl.load(MASK + b * stride_mb + tok[:, None] * stride_mi + jj[None, :],
                          mask=r_ok[:, None] & (jj < NK)[None, :], other=0) != 0  # [ROWS, BLOCK_NK]
        length = prefix + tl.sum(allowed.to(tl.int32), 1)  # [ROWS]
    else:
        length = prefix + tok + 1  # [ROWS]
    n_used = tl.where(r_ok, tl.cdiv(length, CHUNK), 0)  # [ROWS]
    offs_d = tl.arange(0, HEAD_DIM)  # [D]
    row0 = pid_bh * n_slots * N * GROUP + r  # [ROWS] slot 0 of each row in [B*Hkv, S, N, G]
    m = tl.full([ROWS], -1.0e30, dtype=tl.float32)  # [ROWS]
    l = tl.zeros([ROWS], dtype=tl.float32)  # [ROWS]
    acc = tl.zeros([ROWS, HEAD_DIM], dtype=tl.float32)  # [ROWS, D]
    for s0 in range(0, tl.max(n_used, 0), 16):
        mb, lb, ab = _inv_node(WS, ML, row0, s0, n_used, N * GROUP, HEAD_DIM, 16)  # [ROWS], [ROWS], [ROWS, D]
        m, l, acc = _inv_comb(m, l, acc, mb, lb, ab)
    out = acc / tl.where(l > 0, l, 1.0)[:, None]  # [ROWS, D]
    out_row = (b * N + tok) * (Hkv * GROUP) + kvh * GROUP + grp  # [ROWS] row of [B, N, Hq]
    tl.store(OUT + out_row[:, None] * HEAD_DIM + offs_d[None, :], out.to(OUT.dtype.element_ty), mask=r_ok[:, None])


@triton.jit
def _merge_kernel(
    WS,
    PL,
    OUT,
    chunk,
    num_splits,
    N,
    NK,
    Hkv,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HAS_MASK: tl.constexpr,
    BLOCK_S: tl.constexpr,
    TREE_APART: tl.constexpr,
):
    """One packed row: out = sum_s 2^(lse_s - m) o_s / sum_s 2^(lse_s - m) over the splits it used.
    WS: the forward's workspace (partial outputs, then LSEs); TREE_APART as in the forward; splits of
    `_split_len` keys."""
    row = tl.program_id(0)
    pid_bh = tl.program_id(1)
    LSE = WS + tl.num_programs(1) * num_splits * N * GROUP * HEAD_DIM
    b = pid_bh // Hkv
    kvh = pid_bh % Hkv
    tok = row // GROUP
    grp = row % GROUP
    prefix = tl.load(PL + b)
    if HAS_MASK:
        row_end = prefix + NK
    else:
        row_end = prefix + tok + 1
    chunk = _split_len(prefix, NK, chunk, num_splits, TREE_APART)
    # The splits the row used (the forward's store rule): the first n_used, and the new keys' own split.
    if TREE_APART:
        n_used = tl.minimum(tl.cdiv(prefix, chunk), num_splits - 1)
        n_loop = num_splits
    else:
        n_used = tl.minimum(tl.cdiv(row_end, chunk), num_splits)
        n_loop = n_used
    offs_d = tl.arange(0, HEAD_DIM)  # [D]
    split_stride = N * GROUP  # rows between consecutive splits in [B, Hkv, S, N, G]
    row0 = pid_bh * num_splits * split_stride + row  # split 0 of this row

    m = -1.0e30
    l = 0.0
    acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for s0 in range(0, n_loop, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)  # [BLOCK_S]
        ok = offs_s < n_used  # [BLOCK_S]
        if TREE_APART:
            ok = ok | (offs_s == num_splits - 1)
        part_rows = row0 + offs_s * split_stride  # [BLOCK_S]
        lse = tl.load(LSE + part_rows, mask=ok, other=float("-inf"))  # [BLOCK_S]
        o = tl.load(WS + part_rows[:, None] * HEAD_DIM + offs_d[None, :], mask=ok[:, None], other=0.0)  # [BLOCK_S, D]
        m_new = tl.maximum(m, tl.max(lse, 0))
        w = tl.math.exp2(lse - m_new)  # [BLOCK_S]
        alpha = tl.math.exp2(m - m_new)
        l = l * alpha + tl.sum(w, 0)
        acc = acc * alpha + tl.sum(w[:, None] * o, 0)  # [D]
        m = m_new
    out = acc / tl.where(l > 0, l, 1.0)  # [D]
    out_row = (b * N + tok) * (Hkv * GROUP) + kvh * GROUP + grp
    tl.store(OUT + out_row * HEAD_DIM + offs_d, out.to(OUT.dtype.element_ty))


@functools.lru_cache(maxsize=1024)
def _plan(B: int, N: int, Hq: int, Hkv: int, kv_max: int, nk: int, num_sms: int) -> tuple[int, int, int, int, bool]:
    """Host-side grid plan -> (BLOCK_M, row tiles, num_splits, chunk, tree_apart). kv_max is a host upper
    bound on prefix + nk (nk: the new keys), so the plan never reads device values (graph-capturable).

    Packed rows per KV head: N * G. Splits: first fill one wave of SMs with chunks of at least
    _MIN_CHUNK keys; more splits (up to the resident programs per SM, at most _MAX_SPLITS)
    only with chunks of at least _CHUNK_PER_ROW * rows keys. The chunk is then rounded to the
    nearest power of two (>= _CHUNK_ALIGN); unsplit calls get the power of two >= kv_max. The new keys get a
    split of their own (tree_apart) when the grid then still has at most one program per SM."""
    rows = N * (Hq // Hkv)
    block_m = min(_MAX_BLOCK_M, max(16, triton.next_power_of_2(rows)))
    m_tiles = _cdiv(rows, block_m)
    base = B * Hkv * m_tiles  # programs per split
    resident = _PROGRAMS_PER_SM if block_m <= 64 else _PROGRAMS_PER_SM_LARGE
    one_wave = min(num_sms // base, kv_max // _MIN_CHUNK)
    more = min(resident * num_sms // base, kv_max // max(1, _CHUNK_PER_ROW * rows))
    splits = max(1, min(max(one_wave, more), _MAX_SPLITS))
    if splits == 1:
        return block_m, m_tiles, 1, max(_CHUNK_ALIGN, triton.next_power_of_2(kv_max)), False
    target = kv_max / splits
    chunk = max(_CHUNK_ALIGN, triton.next_power_of_2(math.ceil(target / 1.5)))  # nearest power of two (log scale)
    while _num_splits(kv_max, nk, chunk, True) > _MERGE_SPLITS:
        chunk *= 2
    # Apart, the new keys' tiles (page ids, K/V and mask loads, ~2 µs of dependent latency) run beside the prefix
    # splits instead of after the last one's tiles. Past one wave that split is one more short program behind a
    # full wave (B=1, L=4k, N=16: 17 splits, 136 programs on 132 SMs).
    apart = _num_splits(kv_max, nk, chunk, True) * base <= num_sms
    return block_m, m_tiles, _num_splits(kv_max, nk, chunk, apart), chunk, apart


def _num_splits(kv_max: int, nk: int, chunk: int, apart: bool) -> int:
    """Splits of the keys [0, kv_max) into chunk-long pieces. apart: the prefix splits and one of the nk new keys.
    Else the last split also takes the new keys when they fit in one chunk."""
    prefix_splits = max(1, _cdiv(kv_max - nk, chunk))
    if apart:
        return prefix_splits + 1
    return prefix_splits if nk <= chunk else _cdiv(kv_max, chunk)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _empty(shape: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Every buffer the launcher allocates goes through here (tests poison it with NaN)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _meta(t: torch.Tensor | None) -> tuple | None:
    """What `_prepare` needs of a tensor: shape, strides, dtype, device (hashable)."""
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


def _inv_rows(b_hkv: int, n: int, group: int) -> int:
    """The row tile of an invariant call of b_hkv (request, KV head) pairs, n tokens of `group` heads."""
    small, wide = _INVARIANT_ROWS
    return small if n * group <= small and b_hkv >= _INVARIANT_SMALL_PAIRS else wide


def _inv_meta(group: int, n: int, nk: int, hip: bool, rows: int) -> tuple[dict, dict]:
    """The invariant kernels' meta-parameters for `group` query heads a KV head, n query tokens and nk new keys:
    (`_inv_fwd_kernel`'s, `_inv_merge_kernel`'s). `rows`-row tiles of TOKS tokens, at most n (HEAD_TILES tiles of one
    token's heads for larger groups; a row's bits do not depend on where in the tile it sits, nor on whether its leaf
    is attended for the tile or for a token of the tile), the fixed leaf and key tile. MI300 (`hip`): one software
    stage and 32-key tiles, as `_fwd_configs`' AMD entries, and 8 waves (in 4, SmolLM2's verify of 60 tokens spilled 7
    SGPRs on gfx942); the same for every call (a row's sums follow the layout)."""
    block_nk = max(16, triton.next_power_of_2(nk))
    toks = max(1, min(rows // group, n))
    fwd = dict(ROWS=rows, TOKS=toks, TOKS_P2=triton.next_power_of_2(toks), HEAD_TILES=max(1, group // rows),
               BLOCK_N=_INVARIANT_BLOCK_N_HIP if hip else _INVARIANT_BLOCK_N, BLOCK_NK=block_nk, CHUNK=_INVARIANT_CHUNK,
               num_warps=8 if hip else 4, num_stages=1 if hip else 2)
    merge = dict(BLOCK_NK=block_nk, CHUNK=_INVARIANT_CHUNK, ROWS=_INVARIANT_MERGE_ROWS,
                 num_warps=_INVARIANT_MERGE_WARPS)
    return fwd, merge


@functools.lru_cache(maxsize=512)
def _prepare(q, k, v, pt, pl, mask, sm_scale, max_prefix_len, interpret: bool, invariant: bool = False,
             num_sms: int | None = None, hip: bool | None = None) -> tuple:
    """Validate one call's metadata (`_meta` tuples) and build its launch recipe. Cached, so a
    repeated shape costs one dict lookup: the eager path's host time is what a short call
    costs (an H200 run measured 175 µs eager against 21.5 µs from a CUDA graph at B=1, L=1k).
    Raises ValueError naming the argument. Returns None when an input needs .contiguous() first.
    num_sms / hip: the SM (CU) count and vendor of the GPU to plan for (`compile_cases` asks for GPUs this machine
    does not have); None: q's device and the running torch."""

    def need(cond: bool, msg) -> None:
        if not cond:
            raise ValueError(msg())

    (q_shape, q_stride, q_dtype, q_dev), (k_shape, k_stride, k_dtype, _), (v_shape, v_stride, v_dtype, _) = q, k, v
    need(len(q_shape) == 4, lambda: f"q must be [B, N, Hq, D], got shape {tuple(q_shape)}")
    need(len(k_shape) == 4, lambda: f"k_cache must be [num_pages, page_size, Hkv, D], got shape {tuple(k_shape)}")
    need(v_shape == k_shape, lambda: f"v_cache shape {tuple(v_shape)} must equal k_cache shape {tuple(k_shape)}")
    B, N, Hq, D = q_shape
    page_size, Hkv, Dk = k_shape[1], k_shape[2], k_shape[3]
    need(q_dtype in SUPPORTED_DTYPES, lambda: f"q dtype {q_dtype} unsupported: use one of {SUPPORTED_DTYPES}")
    need(k_dtype == q_dtype, lambda: f"k_cache dtype {k_dtype} must equal q dtype {q_dtype}")
    need(v_dtype == q_dtype, lambda: f"v_cache dtype {v_dtype} must equal q dtype {q_dtype}")
    need(D in SUPPORTED_HEAD_DIMS, lambda: f"head_dim D={D} (q.shape[3]) unsupported: use one of {SUPPORTED_HEAD_DIMS}")
    need(Dk == D, lambda: f"k_cache head_dim {Dk} must equal q head_dim {D}")
    need(Hkv > 0 and Hq % Hkv == 0, lambda: f"q heads Hq={Hq} must be a multiple of k_cache heads Hkv={Hkv}")
    need(N > 0 and B > 0, lambda: f"q must have B > 0 and N > 0 tokens, got shape {tuple(q_shape)}")
    need(len(pt[0]) == 2 and pt[0][0] == B, lambda: f"page_table must be [B={B}, P], got shape {tuple(pt[0])}")
    need(pt[2] == torch.int32, lambda: f"page_table dtype must be torch.int32, got {pt[2]}")
    need(pl[0] == (B,), lambda: f"prefix_lens must be [B={B}], got shape {tuple(pl[0])}")
    need(pl[2] == torch.int32, lambda: f"prefix_lens dtype must be torch.int32, got {pl[2]}")
    if mask is not None:
        need(len(mask[0]) == 3 and mask[0][:2] == (B, N) and mask[0][2] > 0,
             lambda: f"tree_mask must be [B={B}, N={N}, NK>0], got shape {tuple(mask[0])}")
        need(mask[2] == torch.bool, lambda: f"tree_mask dtype must be torch.bool, got {mask[2]}")
    for name, m in (("k_cache", k), ("v_cache", v), ("page_table", pt), ("prefix_lens", pl), ("tree_mask", mask)):
        need(m is None or m[3] == q_dev, lambda: f"{name} is on {m[3]} but q is on {q_dev}: put all inputs on one device")
    need(k_stride[-1] == 1 and v_stride[-1] == 1, lambda: "k_cache and v_cache need a contiguous last (head_dim) axis")
    need(sm_scale is None or sm_scale > 0, lambda: f"sm_scale must be positive or None, got {sm_scale}")
    need(
        max_prefix_len is None or (isinstance(max_prefix_len, int) and max_prefix_len >= 0),
        lambda: f"max_prefix_len must be a host int >= 0 or None, got {max_prefix_len!r}",
    )
    # The kernels need a unit stride on q's, page_table's and the mask's last axis and a dense prefix_lens.
    if q_stride[-1] != 1 or pt[1][-1] != 1 or (B > 1 and pl[1][0] != 1) or (mask is not None and mask[1][-1] != 1):
        return None

    group = Hq // Hkv
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(D)
    NK = N if mask is None else mask[0][2]  # new keys (after the prefix)
    kv_max = (pt[0][1] * page_size) if max_prefix_len is None else (max_prefix_len + NK)
    # fp32 inputs use exact fp32 dots (tf32 would miss 1e-4); the interpreter's bf16 is wrong, so upcast there.
    dot_dtype = tl.float32 if (q_dtype == torch.float32 or interpret) else (
        tl.bfloat16 if q_dtype == torch.bfloat16 else tl.float16
    )
    mask_strides = mask[1][:2] if mask is not None else (0, 0)
    strides = (*q_stride[:3], *k_stride[:3], *v_stride[:3], pt[1][0], *mask_strides)
    if invariant:  # fixed leaves and key tiles, no autotuning (module doc)
        need(group <= 16 or group % 16 == 0,
             lambda: f"invariant tree attention needs Hq/Hkv <= 16 or a multiple of 16, got {group}")
        hip = is_hip() if hip is None else hip
        fwd_meta, merge_meta = _inv_meta(group, N, NK, hip, _inv_rows(B * Hkv, N, group))
        toks, tiles = fwd_meta["TOKS"], _cdiv(N, fwd_meta["TOKS"]) * fwd_meta["HEAD_TILES"]
        n_slots = _cdiv(kv_max, _INVARIANT_CHUNK)  # leaves
        split = n_slots > 1
        # the leaves a tile's tokens do not share: their keys past shared_end, at most NK (a tree; causal: the
        # tile's other tokens, fewer than its rows), over at most one leaf boundary more than their length
        tail = min(n_slots, (_cdiv(NK, _INVARIANT_CHUNK) if mask is not None else 1) + 1)
        fwd_args = (scale * _LOG2E, n_slots, tail, N, NK, Hkv, *strides)
        fwd_kw = dict(GROUP=group, HEAD_DIM=D, PAGE_SIZE=page_size, HAS_MASK=mask is not None, SPLIT=split,
                      DOT_DTYPE=dot_dtype, **fwd_meta)
        grid = (tiles, n_slots + tail * toks, B * Hkv)
        merge = None
        if split:
            merge = (_inv_merge_kernel, (_cdiv(N * group, merge_meta["ROWS"]), B * Hkv),
                     (n_slots, N, NK, Hkv, *mask_strides),
                     dict(GROUP=group, HEAD_DIM=D, HAS_MASK=mask is not None, **merge_meta), True)
        ws_numel = B * Hkv * n_slots * N * group * (D + 2) if split else 0  # acc, then (m, l), a leaf slot a row
        return _inv_fwd_kernel, grid, fwd_args, fwd_kw, ws_numel, merge
    if num_sms is None:  # interpreter: few SMs, still splits (a CPU call without it takes the reference)
        num_sms = sm_count(q_dev.index) if q_dev.type == "cuda" and not interpret else 8
    block_m, m_tiles, num_splits, chunk, apart = _plan(B, N, Hq, Hkv, kv_max, NK, num_sms)
    split = num_splits > 1
    fwd_args = (scale * _LOG2E, chunk, num_splits, N, NK, Hkv, *strides, pt[0][1] * page_size)  # kv_cap last
    fwd_kw = dict(GROUP=group, HEAD_DIM=D, PAGE_SIZE=page_size, HAS_MASK=mask is not None, SPLIT=split,
                  DOT_DTYPE=dot_dtype, BLOCK_M=block_m, TREE_APART=apart)
    ws_numel = B * Hkv * num_splits * N * group * (D + 1) if split else 0  # partial outputs + LSEs
    merge = None
    if split:
        # All splits in one pass (a serial pass per block of splits costs µs of latency).
        merge = (_merge_kernel, (N * group, B * Hkv), (chunk, num_splits, N, NK, Hkv),
                 dict(GROUP=group, HEAD_DIM=D, HAS_MASK=mask is not None, TREE_APART=apart,
                      BLOCK_S=triton.next_power_of_2(num_splits), num_warps=4 if num_splits <= 32 else 8), False)
    return _fwd_kernel, (m_tiles, num_splits, B * Hkv), fwd_args, fwd_kw, ws_numel, merge


def tree_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    prefix_lens: torch.Tensor,
    tree_mask: torch.Tensor | None = None,
    sm_scale: float | None = None,
    max_prefix_len: int | None = None,
    invariant: bool = False,
) -> torch.Tensor:
    """Public launcher: Triton on GPU (and on CPU under TRITON_INTERPRET=1), else the reference.

    q [B, N, Hq, D] fp16/bf16/fp32, D in (64, 128); k_cache/v_cache [num_pages, page_size, Hkv, D];
    page_table [B, P] int32; prefix_lens [B] int32; tree_mask [B, N, NK] bool or None (causal, NK = N);
    max_prefix_len: host upper bound on prefix_lens that sizes the split grid (None: the page
    table's capacity; a tight bound avoids empty splits). invariant: each row's output independent of
    the batch, the tree and the split plan (module doc; needs a tree whose new tokens are numbered
    parents first, as `build_tree` numbers them). Returns out [B, N, Hq, D] (q's dtype).
    """
    interpret = is_interpret()
    recipe = _prepare(
        _meta(q), _meta(k_cache), _meta(v_cache), _meta(page_table), _meta(prefix_lens), _meta(tree_mask),
        sm_scale, max_prefix_len, interpret, invariant,
    )  # fmt: skip
    if not use_triton(q, k_cache, v_cache, page_table, prefix_lens):
        return tree_attention_ref(q, k_cache, v_cache, page_table, prefix_lens, tree_mask, sm_scale)
    if recipe is None:  # rare: a strided input, copied once here
        return tree_attention(
            q.contiguous(), k_cache, v_cache, page_table.contiguous(), prefix_lens.contiguous(),
            None if tree_mask is None else tree_mask.contiguous(), sm_scale, max_prefix_len, invariant,
        )  # fmt: skip
    kernel, grid, fwd_args, fwd_kw, ws_numel, merge = recipe
    # bool -> uint8 view (same bytes). page_table is a dummy when causal.
    mask = tree_mask.view(torch.uint8) if tree_mask is not None else page_table
    out = _empty(q.shape, q.dtype, q.device)  # [B, N, Hq, D]
    ws = _empty((ws_numel,), torch.float32, q.device) if merge else out  # partial outputs (leaf states) when split

    # Triton launches on the current device: switch only when q lives elsewhere (cheap common path).
    on_other_gpu = q.is_cuda and q.device.index != torch.cuda.current_device()
    with torch.cuda.device(q.device) if on_other_gpu else contextlib.nullcontext():
        kernel[grid](q, k_cache, v_cache, page_table, prefix_lens, mask, ws, *fwd_args, **fwd_kw)
        if merge:
            merge_kernel, merge_grid, merge_args, merge_kw, takes_mask = merge
            if takes_mask:  # the invariant merge reads each row's sequence length from its mask row
                merge_kernel[merge_grid](ws, prefix_lens, mask, out, *merge_args, **merge_kw)
            else:
                merge_kernel[merge_grid](ws, prefix_lens, out, *merge_args, **merge_kw)
    return out


# ----------------------------------------------------------------------------------------------------
# Compile cases (kernels/_compile_cases.py)

_CASE_PAGE = 16  # the KV pool's page size (KVCache's default)
_CASE_PREFIX = 1024  # the decode and verify cases' prefix (and max_prefix_len)


def _dense(shape: tuple, dtype: torch.dtype) -> tuple:
    """The `_meta` of a fresh contiguous tensor on a GPU."""
    return tuple(shape), tuple(math.prod(shape[i + 1:]) for i in range(len(shape))), dtype, torch.device("cuda", 0)


def _call_cases(s, B: int, N: int, tree: bool, prefix: int, invariant: bool, sms: int, hip: bool,
                used_by: str) -> list[CompileCase]:
    """The launches of one bf16 call at shape `s`'s heads (q [B, N], pages of 16, a tree mask or causal, max_prefix_len
    = prefix) on a GPU of `sms` SMs (AMD's when `hip`): `_prepare`'s recipe, the split-KV forward once per autotune
    entry `_prune_fwd_configs` keeps, then the merge where the keys split. Pointers as `tree_attention` passes them
    (the mask a uint8 view, or the page table where causal; the forward's output the fp32 workspace when split)."""
    bf16, f32, i32 = Ptr(torch.bfloat16), Ptr(torch.float32), Ptr(torch.int32)
    pages = _cdiv(prefix + N, _CASE_PAGE)  # [B, pages] page table, a pool of B * pages pages
    cache = _dense((B * pages, _CASE_PAGE, s.n_kv_heads, s.head_dim), torch.bfloat16)
    metas = (_dense((B, N, s.n_heads, s.head_dim), torch.bfloat16), cache, cache, _dense((B, pages), torch.int32),
             _dense((B,), torch.int32), _dense((B, N, N), torch.bool) if tree else None)
    kernel, _, fwd_args, fwd_kw, _, merge = _prepare(*metas, None, prefix, False, invariant, sms, hip)
    ptrs = (bf16, bf16, bf16, i32, i32, Ptr(torch.uint8) if tree else i32, f32 if merge else bf16)
    fn = kernel.fn if isinstance(kernel, triton.runtime.Autotuner) else kernel
    args = dict(zip(fn.arg_names, ptrs + fwd_args), **fwd_kw)
    if fn is kernel:
        cases = [CompileCase.of(fn, (used_by,), **args)]
    else:
        configs = _prune_fwd_configs(_fwd_configs(hip), {}, BLOCK_M=fwd_kw["BLOCK_M"])
        cases = [CompileCase.from_config(fn, args, c, (used_by,)) for c in configs]
    if merge:
        merge_kernel, _, merge_args, merge_kw, takes_mask = merge
        merge_ptrs = (f32, i32) + (ptrs[5:6] if takes_mask else ()) + (bf16,)
        cases.append(CompileCase.of(merge_kernel, (used_by,), **dict(zip(merge_kernel.arg_names,
                                                                         merge_ptrs + merge_args)), **merge_kw))
    return cases


def compile_cases(hip: bool) -> list[CompileCase]:
    """kernels/_compile_cases.py: `_call_cases` (split-KV and invariant) on the target at both models' heads: decode
    (B = 1 and 8, one token, a 1k prefix), the verify of a tree (B = 1 and 8, 8 tokens and the largest tree of TREES,
    a tree mask, a 1k prefix) and a causal prefill of 2048 tokens."""
    largest = max(t.num_draft_tokens for t in TREES)
    calls = [(f"decode B={B}", B, 1, False, _CASE_PREFIX) for B in (1, 8)]
    calls += [(f"verify B={B} N={N}", B, N, True, _CASE_PREFIX) for N in (8, largest) for B in (1, 8)]
    calls += [("prefill N=2048", 1, 2048, False, 0)]
    cases = []
    for s in model_shapes():
        for label, B, N, tree, prefix in calls:
            for invariant in (False, True):
                cases += _call_cases(s, B, N, tree, prefix, invariant, TARGET_SMS[hip], hip,
                                     f"{s.name} {label}{' invariant' if invariant else ''}")
    return cases
