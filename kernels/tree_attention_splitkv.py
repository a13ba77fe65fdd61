"""The split-KV tree-attention kernel (`tree_attention(..., invariant=False)`): flash-decoding with GQA packing.

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
"""

from __future__ import annotations

import functools
import math

import triton
import triton.language as tl

from eaglet.kernels._compile_cases import TARGET_SMS, CompileCase, model_shapes
from eaglet.kernels._utils import autotune_configs, is_hip, sm_count
from eaglet.kernels.tree_attention_plan import case_calls, case_inputs, cdiv, check_call, merge_case, out_ptr

# The split plan (`_plan`), tuned on an H200: each constant's measurements are in results/tree_attention_notes.md.
# Chunks are powers of two, at least this long (so split boundaries fall on tile boundaries
# and the chunk length, an autotune key, takes few values).
_CHUNK_ALIGN = 128
# Up to one program per SM, chunks may be this short (B=1, L=1k, N=8: 8 splits of 128 keys beat 4 of 256).
_MIN_CHUNK = 128
# Beyond one wave a split must be longer: each split writes, and the merge reads, rows * D
# fp32 values per KV head against chunk * D bf16 K and V values read; chunk >= 8 * rows keeps
# that under 25% of the K/V bytes.
_CHUNK_PER_ROW = 8
# Target split count cap: more splits add partial-output traffic and merge work for the same K/V bytes (B=1, L=64k,
# N=16: 33 splits of 2048 keys beat 57 of 1152).
_MAX_SPLITS = 32
# The merge combines up to this many splits in one pass (rounding the chunk to a power of
# two can raise the count above _MAX_SPLITS).
_MERGE_SPLITS = 64
# Largest row tile: 128 rows x D fp32 accumulator is 64 registers/thread at 8 warps.
_MAX_BLOCK_M = 128
# Resident programs per SM worth filling: several 4-warp 64-row programs (their K/V streams hide each other's HBM
# latency: B=8, L=16k, N=16 ran fastest with 8 splits); a single 8-warp 128-row program (register-bound: B=8, L=4k,
# N=64 ran faster unsplit than in 2 splits).
_PROGRAMS_PER_SM = 4
_PROGRAMS_PER_SM_LARGE = 1


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
    m_tiles = cdiv(rows, block_m)
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
    prefix_splits = max(1, cdiv(kv_max - nk, chunk))
    if apart:
        return prefix_splits + 1
    return prefix_splits if nk <= chunk else cdiv(kv_max, chunk)


@functools.lru_cache(maxsize=512)
def prepare(q, k, v, pt, pl, mask, sm_scale, max_prefix_len, interpret: bool, num_sms: int | None = None) -> tuple:
    """One call's launch recipe from its inputs' `meta`s (`check_call`): (forward kernel, grid, its positional
    arguments after the tensors, its keywords, workspace floats, merge or None), the merge (kernel, grid, arguments,
    keywords, whether it takes the mask). Cached: a repeated shape costs one dict lookup, and the eager path's host
    time is what a short call costs (results/tree_attention_notes.md). None when an input needs .contiguous() first.
    num_sms: the SM count of the GPU to plan for (`compile_cases` plans for GPUs this machine lacks); None: q's."""
    c = check_call(q, k, v, pt, pl, mask, sm_scale, max_prefix_len, interpret)
    if c is None:
        return None
    if num_sms is None:  # interpreter: few SMs, still splits (a CPU call without it takes the reference)
        num_sms = sm_count(c.device.index) if c.device.type == "cuda" and not interpret else 8
    block_m, m_tiles, num_splits, chunk, apart = _plan(c.B, c.N, c.Hq, c.Hkv, c.kv_max, c.nk, num_sms)
    split = num_splits > 1
    fwd_args = (c.qk_scale, chunk, num_splits, c.N, c.nk, c.Hkv, *c.strides, c.pt_width * c.page_size)  # kv_cap last
    fwd_kw = dict(GROUP=c.group, HEAD_DIM=c.D, PAGE_SIZE=c.page_size, HAS_MASK=c.has_mask, SPLIT=split,
                  DOT_DTYPE=c.dot_dtype, BLOCK_M=block_m, TREE_APART=apart)
    ws_numel = c.B * c.Hkv * num_splits * c.N * c.group * (c.D + 1) if split else 0  # partial outputs + LSEs
    merge = None
    if split:
        # All splits in one pass (a serial pass per block of splits costs µs of latency).
        merge = (_merge_kernel, (c.N * c.group, c.B * c.Hkv), (chunk, num_splits, c.N, c.nk, c.Hkv),
                 dict(GROUP=c.group, HEAD_DIM=c.D, HAS_MASK=c.has_mask, TREE_APART=apart,
                      BLOCK_S=triton.next_power_of_2(num_splits), num_warps=4 if num_splits <= 32 else 8), False)
    return _fwd_kernel, (m_tiles, num_splits, c.B * c.Hkv), fwd_args, fwd_kw, ws_numel, merge


def _call_cases(s, B: int, N: int, tree: bool, prefix: int, sms: int, hip: bool, used_by: str) -> list[CompileCase]:
    """The launches of one bf16 call (`case_inputs`, max_prefix_len = prefix) on a GPU of `sms` SMs (AMD's when
    `hip`): the forward once per autotune entry `_prune_fwd_configs` keeps, then the merge where the keys split."""
    metas, ptrs = case_inputs(s, B, N, tree, prefix)
    kernel, _, fwd_args, fwd_kw, _, merge = prepare(*metas, None, prefix, False, sms)
    args = dict(zip(kernel.fn.arg_names, ptrs + (out_ptr(merge is not None),) + fwd_args), **fwd_kw)
    configs = _prune_fwd_configs(_fwd_configs(hip), {}, BLOCK_M=fwd_kw["BLOCK_M"])
    cases = [CompileCase.from_config(kernel.fn, args, c, (used_by,)) for c in configs]
    return cases + ([merge_case(merge, ptrs, used_by)] if merge else [])


def compile_cases(hip: bool) -> list[CompileCase]:
    """kernels/_compile_cases.py: `_call_cases` on the target at both models' heads, for each of `case_calls`."""
    return [case for s in model_shapes() for label, B, N, tree, prefix in case_calls()
            for case in _call_cases(s, B, N, tree, prefix, TARGET_SMS[hip], hip, f"{s.name} {label}")]
