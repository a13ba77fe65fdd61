"""Log-softmax top-k over a vocabulary: one draft expansion's candidates in one or two launches.

    topk_logprobs(logits [..., V], k) -> (logprobs [..., k] fp32, ids [..., k] int64)

The k largest logits of each row, largest first (ties: the lower id first), and their log-probabilities
log_softmax(logits)[ids] in fp32. Every draft step of the EAGLE-2 tree, the draft-extend and the prefill take
these from the draft head's logits. In torch that is `log_softmax` then `topk`: a softmax kernel and a radix
select of 13 kernels (4 digit passes of 3 kernels, a gather); results/kernel_choices_h200.md has what they cost in
a draft graph.

Kernels. Each program packs a logit and its id into one int64 key: the fp32 value's order-preserving int32
(`build_tree._score_key`; -0.0 and 0.0 tie) in the high half, 2**31 - 1 - id in the low half. A larger key is a
larger logit, or the same logit at a lower id, and k rounds of "take the max, remove it" give the top k in order.
  * `_chunk_kernel` (grid rows x chunks of BLOCK_V ids, `_block_v`): the chunk's max and sum of exp(x - max), and its k
    largest keys. A row of one chunk (V <= _SINGLE_CHUNK) finishes here;
  * `_rows_kernel` (one program per row): the chunks' sums into the row's log-sum-exp, the k largest of the
    chunks' keys.
The sums run in another order than torch's, so a log-probability may differ from the reference in the last
bits. The ids equal the reference's exactly; the tests check both.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from eaglet.kernels._compile_cases import TREES, CompileCase, Ptr, model_shapes
from eaglet.kernels._utils import FLOAT_DTYPES, use_triton
from eaglet.kernels.build_tree import _score_key

# Rows up to this many ids run as one chunk: one launch instead of two. Above it, more programs win over the
# second launch (4 rows of 8,192 ids: 4.64 µs in chunks of 1,024, 7.26 as one; results/draft_kernels_h200.md).
_SINGLE_CHUNK = 1024


def _block_v(V: int) -> int:
    """Chunk length of a row of V > _SINGLE_CHUNK ids: 1,024 up to 32k ids, 2,048 beyond (the H200 sweep in
    results/draft_kernels_h200.md, "Chunking sweep": V=128,256, 32 rows, 17.70 µs against 20.15 with 1,024)."""
    return 1024 if V <= 32768 else 2048


# Above this k the reference runs: the kernels' k rounds of a max per chunk grow with k (timed only up to k = 4).
MAX_K = 64
_EMPTY: tl.constexpr = tl.constexpr(-(2**63))  # the key of an id past the row's end: below every real key


def top_ids_ref(x: torch.Tensor, k: int) -> torch.Tensor:
    """The ids of the k largest values of x [..., V] along its last axis, largest first, ties to the lower id
    -> [..., k] int64 (torch.topk leaves the order of ties open)."""
    V = x.shape[-1]
    kth = x.topk(k, dim=-1).values[..., -1:]  # [..., 1] the k-th largest value
    tie = x == kth  # [..., V]
    room = k - (x > kth).sum(-1, keepdim=True)  # [..., 1] places left for the ids tied at the k-th value
    chosen = (x > kth) | (tie & (tie.cumsum(-1) <= room))  # [..., V] exactly k per row: ties by lower id
    rank = torch.arange(V, 0, -1, device=x.device)  # [V] larger for lower ids
    ids = torch.where(chosen, rank, 0).topk(k, dim=-1).indices  # [..., k] the chosen ids, ascending
    order = x.gather(-1, ids).sort(dim=-1, descending=True, stable=True).indices  # [..., k] ties keep the id order
    return ids.gather(-1, order)


def topk_logprobs_ref(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference (the spec): the k largest logits' ids (ties: lower id first) and log_softmax(logits) there.
    logits [..., V] -> (logprobs [..., k] fp32, ids [..., k] int64), largest first."""
    x = logits.float()  # [..., V]
    ids = top_ids_ref(x, k)  # [..., k]
    return torch.log_softmax(x, dim=-1).gather(-1, ids), ids


@triton.jit
def _keys(x, ids, ok):
    """fp32 values x and their ids [BLOCK] -> int64 keys ordered by (value, then lower id); _EMPTY where not ok."""
    key = (_score_key(x).to(tl.int64) << 32) + (0x7FFFFFFF - ids).to(tl.int64)  # [BLOCK] (ids < 2**31)
    return tl.where(ok, key, _EMPTY)


@triton.jit
def _top_keys(key, K: tl.constexpr, KP: tl.constexpr):
    """The K largest of key [BLOCK] (distinct but for _EMPTY), largest first -> [KP] (_EMPTY past K)."""
    out = tl.arange(0, KP)  # [KP]
    best = tl.full([KP], _EMPTY, tl.int64)  # [KP]
    for i in range(K):
        top = tl.max(key, 0)
        best = tl.where(out == i, top, best)  # [KP]
        key = tl.where(key == top, _EMPTY, key)  # [BLOCK]
    return best


@triton.jit
def _decode_keys(best):
    """Keys [KP] (`_keys`) -> (values [KP] fp32, ids [KP] int64)."""
    ordered = (best >> 32).to(tl.int32)  # [KP]
    x = (ordered ^ ((ordered >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)  # [KP] _score_key is its own inverse
    return x, 0x7FFFFFFF - (best & 0x7FFFFFFF)


@triton.jit
def _store_top(best, lse, LP, IDS, row, K: tl.constexpr, KP: tl.constexpr):
    """Decode keys best [KP] into (logit - lse, id) and store the first K at row."""
    j = tl.arange(0, KP)  # [KP]
    x, ids = _decode_keys(best)  # [KP] each
    tl.store(LP + row * K + j, x - lse, mask=j < K)
    tl.store(IDS + row * K + j, ids, mask=j < K)


@triton.jit
def _chunk_kernel(X, stride_x, V, MAXS, SUMS, KEYS, LP, IDS, K: tl.constexpr, KP: tl.constexpr,
                  BLOCK_V: tl.constexpr, SINGLE: tl.constexpr):
    """Grid (rows, chunks). SINGLE: the row is one chunk, outputs written here; else the chunk's max, sum of
    exp(x - max) and K largest keys go to MAXS / SUMS [rows, chunks] and KEYS [rows, chunks, K]."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    ids = c * BLOCK_V + tl.arange(0, BLOCK_V)  # [BLOCK_V]
    ok = ids < V  # [BLOCK_V]
    x = tl.load(X + row * stride_x + ids, mask=ok, other=float("-inf")).to(tl.float32)  # [BLOCK_V]
    m = tl.max(x, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # an all -inf chunk sums to 0, not NaN
    s = tl.sum(tl.exp(x - m_safe), 0)
    best = _top_keys(_keys(x, ids, ok), K, KP)  # [KP]
    if SINGLE:
        _store_top(best, m + tl.log(s), LP, IDS, row, K, KP)
    else:
        cell = row * tl.num_programs(1) + c
        tl.store(MAXS + cell, m)
        tl.store(SUMS + cell, s)
        j = tl.arange(0, KP)  # [KP]
        tl.store(KEYS + cell * K + j, best, mask=j < K)


@triton.jit
def _rows_kernel(MAXS, SUMS, KEYS, LP, IDS, C, K: tl.constexpr, KP: tl.constexpr, BLOCK_C: tl.constexpr,
                 BLOCK_KC: tl.constexpr):
    """One program per row: its C chunks' (max, sum) into the log-sum-exp, and the K largest of their C * K keys."""
    row = tl.program_id(0).to(tl.int64)
    cs = tl.arange(0, BLOCK_C)  # [BLOCK_C]
    m_c = tl.load(MAXS + row * C + cs, mask=cs < C, other=float("-inf"))  # [BLOCK_C]
    s_c = tl.load(SUMS + row * C + cs, mask=cs < C, other=0.0)  # [BLOCK_C]
    m = tl.max(m_c, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    lse = m + tl.log(tl.sum(s_c * tl.exp(m_c - m_safe), 0))
    j = tl.arange(0, BLOCK_KC)  # [BLOCK_KC]
    key = tl.load(KEYS + row * C * K + j, mask=j < C * K, other=_EMPTY)  # [BLOCK_KC]
    _store_top(_top_keys(key, K, KP), lse, LP, IDS, row, K, KP)


def topk_logprobs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [..., V] (fp32/bf16/fp16) -> (logprobs [..., k] fp32, ids [..., k] int64): the k largest logits per
    row, largest first (ties: lower id first), with log_softmax(logits) at them. Triton on GPU (and on CPU under
    TRITON_INTERPRET=1) for k <= MAX_K, else the reference. No host sync: CUDA-graph capturable."""
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError(f"logits must be [..., V] with V >= 1, got shape {tuple(logits.shape)}")
    if logits.dtype not in FLOAT_DTYPES:
        raise ValueError(f"logits must be float32/bfloat16/float16, got {logits.dtype}")
    V = logits.shape[-1]
    if not isinstance(k, int) or not 1 <= k <= V:
        raise ValueError(f"k={k!r} must be an int in [1, {V}] (the vocabulary of logits' last axis)")
    if V >= 2**31:
        raise ValueError(f"vocabulary of {V} ids: at most 2**31 - 1 supported")
    if k > MAX_K or not use_triton(logits):
        return topk_logprobs_ref(logits, k)
    lead = logits.shape[:-1]
    x = logits.reshape(-1, V)  # [R, V], a view when possible
    if x.stride(1) != 1:
        x = x.contiguous()
    R = x.shape[0]
    lp = torch.empty(*lead, k, dtype=torch.float32, device=logits.device)  # [..., k]
    ids = torch.empty(*lead, k, dtype=torch.int64, device=logits.device)  # [..., k]
    if R == 0:
        return lp, ids
    chunk_meta, rows_meta = _launch_meta(V, k)
    C = triton.cdiv(V, chunk_meta["BLOCK_V"])
    if rows_meta is None:
        _chunk_kernel[(R, 1)](x, x.stride(0), V, lp, lp, ids, lp, ids, **chunk_meta)
        return lp, ids
    stats = torch.empty(2, R, C, dtype=torch.float32, device=logits.device)  # [max, sum] x [R, C]
    keys = torch.empty(R, C, k, dtype=torch.int64, device=logits.device)  # [R, C, k]
    _chunk_kernel[(R, C)](x, x.stride(0), V, stats[0], stats[1], keys, lp, ids, **chunk_meta)
    _rows_kernel[(R,)](stats[0], stats[1], keys, lp, ids, C, **rows_meta)
    return lp, ids


def argmax(x: torch.Tensor) -> torch.Tensor:
    """x [..., V] (fp32/bf16/fp16) -> [...] int64: the id of each row's largest value, ties to the lower id (torch's
    argmax, its first maximum): the greedy pick of the verify and of plain decoding. `topk_logprobs` at k = 1, two
    launches over chunks of the row; torch's argmax reduces a row in one block (12.9 µs for a SmolLM2 verify's 31 rows
    of 49,152 ids on an H100, results/widened_h100/profile_block_5_4_16.txt). Without Triton, torch's argmax."""
    if not use_triton(x):
        return x.argmax(dim=-1)
    return topk_logprobs(x, 1)[1][..., 0]  # [...]


def _launch_meta(V: int, k: int) -> tuple[dict, dict | None]:
    """The chunk kernel's meta-parameters for rows of V ids and the top k, and the rows kernel's (None: a row is one
    chunk, the chunk kernel finishes it)."""
    KP = triton.next_power_of_2(k)
    single = V <= _SINGLE_CHUNK
    block_v = triton.next_power_of_2(V) if single else _block_v(V)
    chunk = dict(K=k, KP=KP, BLOCK_V=block_v, SINGLE=single, num_warps=4)
    if single:
        return chunk, None
    C = triton.cdiv(V, block_v)
    return chunk, dict(K=k, KP=KP, BLOCK_C=triton.next_power_of_2(C), BLOCK_KC=triton.next_power_of_2(C * k),
                       num_warps=4)


def compile_cases(hip: bool) -> list[CompileCase]:
    """kernels/_compile_cases.py: fp32 logits over the target's vocabulary (EAGLE-1 and multi-layer heads, the
    prefill) and the EAGLE-3 draft vocabulary, top-k of every tree; the same on both vendors."""
    f32, i64 = Ptr(torch.float32), Ptr(torch.int64)
    cases = []
    for s in model_shapes():
        for V in (s.vocab, s.draft_vocab):
            for k in sorted({t.topk for t in TREES}):
                used = (f"{s.name} V={V} k={k}",)
                chunk_meta, rows_meta = _launch_meta(V, k)
                cases.append(CompileCase.of(_chunk_kernel, used, X=f32, stride_x=V, V=V, MAXS=f32, SUMS=f32,
                                            KEYS=i64, LP=f32, IDS=i64, **chunk_meta))
                if rows_meta is not None:
                    cases.append(CompileCase.of(_rows_kernel, used, MAXS=f32, SUMS=f32, KEYS=i64, LP=f32, IDS=i64,
                                                C=triton.cdiv(V, chunk_meta["BLOCK_V"]), **rows_meta))
        # argmax: the target's logits in the model's dtype (greedy verify, plain decoding)
        for dt in (torch.bfloat16, torch.float16):
            chunk_meta, rows_meta = _launch_meta(s.vocab, 1)
            used = (f"{s.name} argmax {dt}",)
            cases.append(CompileCase.of(_chunk_kernel, used, X=Ptr(dt), stride_x=s.vocab, V=s.vocab, MAXS=f32,
                                        SUMS=f32, KEYS=i64, LP=f32, IDS=i64, **chunk_meta))
    return cases
