"""N-gram match (prompt lookup) on the device: where the last n tokens of each request occurred before.

    ngram_match(history [R, L], rows [B], lengths [B], *, n_max, n_min, num_matches)
        -> (starts [B, M] int32, ngram [B] int32)
    ngram_continuations(history, rows, lengths, *, n_max, n_min, num_matches, steps) -> [B, M, steps] int64
    append_accepted(history, tokens, accept_index, accept_len, bonus, seq_lens, rows)   (in place)

Request b's history is h = history[rows[b], :lengths[b]] (prompt, then generated tokens; h[-1] is the token the next
draft continues from). For the largest n in [n_min, n_max] for which the suffix s = h[len-n:] occurs earlier, at a
start i with i + n < len (its continuation h[i+n] exists; the suffix's own occurrence i = len-n is excluded) and
h[i:i+n] == s, starts[b] holds the continuation starts i + n of up to M such occurrences, most recent (largest i)
first, -1 past the matches found; ngram[b] is that n (0 and all -1: no n matches). `ngram_match_ref` is the spec.
`ngram_continuations` is what follows those starts, h[start + t mod (len - start)] for t < steps (-1 for a start of
-1), written by the same launch: an n-gram drafter's proposals need no gather after the match (a launch in a draft
graph costs 2-4 µs however small; BENCHMARKS.md). Read cyclically: a match says the text repeats with period
len - start, so once a continuation reaches the history's end, what the request will have written there is the
continuation itself (a loop of 3 tokens is proposed as deep as `steps`, not 3 tokens deep).

Kernel (`_ngram_match_kernel`, grid (B,), one program per request). An occurrence of the n-suffix is named by its
continuation c = i + n, and it matches iff h[c-1-j] == h[len-1-j] for j < n: the candidates of every n live at the
same continuations, c in [n, len-1]. So one backward scan over c serves all n at once: a block of BLOCK continuations
loads the tile h[c-1-j] for j < N_MAX (N_MAX shifted loads of one stretch), compares it with the suffix tokens
h[len-1-j] and takes each c's matched length ml(c) (the first j that differs); c is a candidate for every n <= ml(c).
The answer's n is the longest ml seen (nbest, once >= N_MIN), and only its list is kept: no candidate of a larger n
lies in a more recent block than the one where that length first shows, so its list starts there. A list fills most
recent first by rounds of "take the largest candidate c, mask it", up to M; the scan stops when nbest = N_MAX holds
M starts or at the history's start. The next block's tile is loaded before this block's compare, so that its memory
latency overlaps the block's reductions.

Bytes read: each request's history from its end back to where the scan stops, once (the shifted loads re-read the
same lines from L1), itemsize * len at most (nothing past len or another row); the worst case is a suffix whose n_max
never recurs, which reads the whole history (SmolLM2's 8,192-token context in int64: 64 KiB a request, 4 MiB at
B = 64, about 1 µs at 4 TB/s). A program is a serial chain of len / BLOCK blocks, each a load and a few
block reductions (ml's max; while the list fills, one more and one per start taken), so a long history is expected to
be bound by that chain's latency rather than by HBM bandwidth (benchmarks/bench_ngram_match.py measures both); B
programs run side by side, one per SM up to the SM count.
No host sync and fixed shapes: CUDA-graph capturable.

`append_accepted` keeps a history after a verify: the accepted path (tree nodes accept_index, the root first) and the
bonus written at seq_len .. seq_len + accept_len, in one launch of the draft-extend graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from eaglet.kernels._compile_cases import TREES, CompileCase, Ptr
from eaglet.kernels._utils import use_triton

# The kernel keeps N_MAX shifted loads of a block and M starts in registers: these bound both.
MAX_N = 16
MAX_M = 16
# Elements of one tile (N_MAX rounded up to a power of 2, times BLOCK): 16 a thread at 8 warps, with the prefetched
# tile as many again, no spills on sm_90 or gfx942 (tests/portability). Not yet timed against other tiles on a GPU:
# benchmarks/bench_ngram_match.py --tile does.
_TILE = 4096
_NUM_WARPS = 8


def _check(history, rows, lengths, n_max, n_min, num_matches) -> None:
    if history.dim() != 2 or history.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"history must be [R, L] int32 or int64, got shape {tuple(history.shape)} {history.dtype}")
    if rows.dim() != 1 or rows.dtype != torch.int64:
        raise ValueError(f"rows must be [B] int64 (history rows), got shape {tuple(rows.shape)} {rows.dtype}")
    if tuple(lengths.shape) != tuple(rows.shape) or lengths.dtype != torch.int32:
        raise ValueError(f"lengths must be [B] = [{rows.shape[0]}] int32, got shape {tuple(lengths.shape)} "
                         f"{lengths.dtype}")
    for name, t in (("rows", rows), ("lengths", lengths)):
        if t.device != history.device:
            raise ValueError(f"{name} is on {t.device}, history on {history.device}: move it to {history.device}")
    for name, v in (("n_max", n_max), ("n_min", n_min), ("num_matches", num_matches)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError(f"{name}={v!r} must be an int")
    if not 1 <= n_min <= n_max:
        raise ValueError(f"n-gram sizes must satisfy 1 <= n_min <= n_max, got n_min={n_min}, n_max={n_max}")
    if n_max > MAX_N:
        raise ValueError(f"n_max={n_max}: at most {MAX_N} supported (the kernel holds n_max shifted loads)")
    if not 1 <= num_matches <= MAX_M:
        raise ValueError(f"num_matches={num_matches} must be in [1, {MAX_M}]")


def ngram_match_ref(history: torch.Tensor, rows: torch.Tensor, lengths: torch.Tensor, *, n_max: int, n_min: int,
                    num_matches: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain-Python reference (the spec) of `ngram_match`. A length outside [0, L] is clamped there, as the kernel
    does."""
    _check(history, rows, lengths, n_max, n_min, num_matches)
    hist, L = history.tolist(), history.shape[1]
    starts, ngram = [], []
    for row, length in zip(rows.tolist(), lengths.tolist()):
        h = hist[row][:max(0, min(length, L))]
        found, size = [], 0
        for n in range(n_max, n_min - 1, -1):
            if len(h) < n + 1:
                continue
            found = [i + n for i in range(len(h) - n - 1, -1, -1) if h[i:i + n] == h[-n:]][:num_matches]
            if found:
                size = n
                break
        starts.append(found + [-1] * (num_matches - len(found)))
        ngram.append(size)
    dev = history.device
    return (torch.tensor(starts, dtype=torch.int32, device=dev).reshape(len(ngram), num_matches),  # [B, M]
            torch.tensor(ngram, dtype=torch.int32, device=dev))  # [B]


@triton.jit
def _load_tile(hist, c, j, N_MAX: tl.constexpr):
    """h[c-1-j] for continuations c [BLOCK] and offsets j [NJ] (j < N_MAX, c-1-j >= 0; else 0) -> [NJ, BLOCK]."""
    pos = c[None, :] - 1 - j[:, None]  # [NJ, BLOCK]
    return tl.load(hist + pos, mask=(pos >= 0) & (j[:, None] < N_MAX), other=0)


@triton.jit
def _ngram_match_kernel(H, stride_h, L, ROWS, LENS, STARTS, NGRAM, CONT, N_MIN: tl.constexpr, N_MAX: tl.constexpr,
                        M: tl.constexpr, MP: tl.constexpr, NJ: tl.constexpr, BLOCK: tl.constexpr,
                        STEPS: tl.constexpr, SP: tl.constexpr):
    """Grid (B,). STEPS > 0: also CONT [B, M, STEPS] int64, the tokens after each start (module doc)."""
    b = tl.program_id(0).to(tl.int64)
    hist = H + tl.load(ROWS + b) * stride_h
    length = tl.minimum(tl.maximum(tl.load(LENS + b), 0), L)  # clamped: no load outside the row
    j = tl.arange(0, NJ)  # [NJ] offsets back from the suffix's last token
    k = tl.arange(0, BLOCK)  # [BLOCK]
    slot = tl.arange(0, MP)  # [MP]
    suffix = tl.load(hist + length - 1 - j, mask=(j < N_MAX) & (j < length), other=0)  # [NJ] h[len-1-j]
    found = tl.full([MP], -1, tl.int32)  # [MP] the starts of n = nbest, most recent first
    count = tl.zeros([], tl.int32)
    nbest = tl.zeros([], tl.int32)  # the longest match seen; below N_MIN: no list
    c_end = length  # this block's continuations: [c_end - BLOCK, c_end)
    tile = _load_tile(hist, c_end - BLOCK + k, j, N_MAX)  # [NJ, BLOCK]
    # A candidate of n needs c >= n >= N_MIN: blocks wholly below N_MIN hold none.
    while (c_end > N_MIN) & ((nbest < N_MAX) | (count < M)):
        c = c_end - BLOCK + k  # [BLOCK]
        nxt = _load_tile(hist, c - BLOCK, j, N_MAX)  # [NJ, BLOCK]
        same = (tile == suffix[:, None]) & (c[None, :] - 1 - j[:, None] >= 0)  # [NJ, BLOCK]
        # The first j that differs (rows j >= N_MAX differ): the matched length, at most N_MAX.
        ml = tl.min(tl.where(same & (j[:, None] < N_MAX), NJ, j[:, None]), 0)  # [BLOCK]
        longest = tl.max(ml, 0)
        # A longer match than any more recent one: its n is the answer so far, and no more recent block holds a
        # start of it (that block's ml would have shown the length), so its list starts here.
        if longest > nbest:
            nbest = longest
            found = tl.full([MP], -1, tl.int32)
            count = tl.zeros([], tl.int32)
        if (nbest >= N_MIN) & (count < M):
            left = ml >= nbest  # [BLOCK]
            top = tl.max(tl.where(left, c, -1), 0)
            while (top >= 0) & (count < M):
                found = tl.where(slot == count, top, found)  # [MP]
                count += 1
                left = left & (c < top)  # [BLOCK]
                top = tl.max(tl.where(left, c, -1), 0)
        tile = nxt
        c_end -= BLOCK
    tl.store(STARTS + b * M + slot, found, mask=slot < M)
    tl.store(NGRAM + b, tl.where(nbest >= N_MIN, nbest, 0))
    if STEPS > 0:
        s = tl.arange(0, SP)  # [SP]
        period = tl.maximum(length - found, 1)  # [MP] a start is < length
        at = found[:, None] + s[None, :] % period[:, None]  # [MP, SP] history positions, cyclic (module doc)
        ok = (found[:, None] >= 0) & (s[None, :] < STEPS)  # [MP, SP]
        tok = tl.load(hist + at, mask=ok, other=-1).to(tl.int64)  # [MP, SP]
        tl.store(CONT + (b * M + slot[:, None]) * STEPS + s[None, :], tok, mask=(slot[:, None] < M) &
                 (s[None, :] < STEPS))


def _launch_meta(L: int, n_max: int, n_min: int, num_matches: int, tile: int | None = None, steps: int = 0) -> dict:
    """Constexprs and warps for histories of L tokens: a block of BLOCK continuations holds `tile` (default _TILE)
    elements at most; steps > 0: the continuations of that many tokens are written too."""
    NJ = triton.next_power_of_2(n_max)
    tile = tile or _TILE
    block = min(max(tile // NJ, 16), max(triton.next_power_of_2(L), 16))
    return dict(N_MIN=n_min, N_MAX=n_max, M=num_matches, MP=triton.next_power_of_2(num_matches), NJ=NJ,
                BLOCK=block, STEPS=steps, SP=triton.next_power_of_2(max(steps, 1)), num_warps=_NUM_WARPS)


def ngram_match(history: torch.Tensor, rows: torch.Tensor, lengths: torch.Tensor, *, n_max: int, n_min: int,
                num_matches: int) -> tuple[torch.Tensor, torch.Tensor]:
    """history [R, L] int32/int64, rows [B] int64 (each request's history row, in [0, R)), lengths [B] int32 (its
    valid tokens, in [0, L]; clamped there) -> (starts [B, num_matches] int32, ngram [B] int32): the continuation
    starts of the most recent earlier occurrences of the largest n-suffix (n_max down to n_min) that recurs, -1
    padded, and that n (0: none). Module docstring for the exact semantics. Triton on GPU (and on CPU under
    TRITON_INTERPRET=1), else the reference. No host sync: CUDA-graph capturable."""
    _check(history, rows, lengths, n_max, n_min, num_matches)
    if not use_triton(history, rows, lengths):
        return ngram_match_ref(history, rows, lengths, n_max=n_max, n_min=n_min, num_matches=num_matches)
    return _launch(history, rows, lengths, n_max, n_min, num_matches, 0)[:2]


def ngram_continuations_ref(history: torch.Tensor, rows: torch.Tensor, lengths: torch.Tensor, *, n_max: int,
                            n_min: int, num_matches: int, steps: int) -> torch.Tensor:
    """Reference of `ngram_continuations`: `ngram_match_ref`'s starts, then the history gathered after them."""
    starts, _ = ngram_match_ref(history, rows, lengths, n_max=n_max, n_min=n_min, num_matches=num_matches)
    length = lengths.long().clamp(0, history.shape[1])[:, None, None]  # [B, 1, 1]
    start = starts.long()[:, :, None]  # [B, M, 1]
    period = (length - start).clamp(min=1)  # [B, M, 1]
    at = start + torch.arange(steps, device=history.device) % period  # [B, M, steps] history positions, cyclic
    ok = (start >= 0).expand_as(at)  # [B, M, steps]
    tok = history[rows[:, None, None], at.clamp(0, history.shape[1] - 1)].long()  # [B, M, steps]
    return torch.where(ok, tok, -1)


def ngram_continuations(history: torch.Tensor, rows: torch.Tensor, lengths: torch.Tensor, *, n_max: int, n_min: int,
                        num_matches: int, steps: int) -> torch.Tensor:
    """`ngram_match`'s arguments and steps >= 1 -> [B, num_matches, steps] int64: the tokens that followed each match
    start, read cyclically past the history's end (module doc), -1 for matches not found. One launch (the match's), no
    host sync."""
    _check(history, rows, lengths, n_max, n_min, num_matches)
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"steps={steps!r} must be an int >= 1")
    if not use_triton(history, rows, lengths):
        return ngram_continuations_ref(history, rows, lengths, n_max=n_max, n_min=n_min, num_matches=num_matches,
                                       steps=steps)
    return _launch(history, rows, lengths, n_max, n_min, num_matches, steps)[2]


def _launch(history, rows, lengths, n_max, n_min, num_matches, steps):
    """(starts [B, M] int32, ngram [B] int32, continuations [B, M, steps] int64 or None) from one launch."""
    if history.stride(1) != 1:
        history = history.contiguous()
    B, L = rows.shape[0], history.shape[1]
    dev = history.device
    starts = torch.empty(B, num_matches, dtype=torch.int32, device=dev)  # [B, M]
    ngram = torch.empty(B, dtype=torch.int32, device=dev)  # [B]
    cont = torch.empty(B, num_matches, steps, dtype=torch.int64, device=dev) if steps else None  # [B, M, steps]
    if B > 0:
        _ngram_match_kernel[(B,)](history, history.stride(0), L, rows, lengths, starts, ngram,
                                  starts if cont is None else cont, **_launch_meta(L, n_max, n_min, num_matches,
                                                                                  steps=steps))
    return starts, ngram, cont


def compile_cases(hip: bool) -> list[CompileCase]:
    """kernels/_compile_cases.py: int32 and int64 histories over SmolLM2's context (8,192) and half of it, 1 and 4
    matches, n-gram sizes 1..3 and 1..4, without continuations and with those of the trees' depths (the drafter's
    int64 history: engine/drafters/ngram.py); the same on both vendors."""
    i32, i64 = Ptr(torch.int32), Ptr(torch.int64)
    cases = []
    for dtype in (torch.int32, torch.int64):
        for L in (8192, 4096):
            for n_min, n_max in ((1, 3), (1, 4)):
                for M in (1, 4):
                    used = (f"smollm2_135m {str(dtype).removeprefix('torch.')} L={L} n={n_min}..{n_max} M={M}",)
                    cases.append(CompileCase.of(_ngram_match_kernel, used, H=Ptr(dtype), stride_h=L, L=L, ROWS=i64,
                                                LENS=i32, STARTS=i32, NGRAM=i32, CONT=i32,
                                                **_launch_meta(L, n_max, n_min, M)))
    for steps in sorted({t.steps for t in TREES}):
        for M in (2, 4):
            used = (f"smollm2_135m int64 L=8192 n=1..4 M={M} continuations of {steps}",)
            cases.append(CompileCase.of(_ngram_match_kernel, used, H=i64, stride_h=8192, L=8192, ROWS=i64, LENS=i32,
                                        STARTS=i32, NGRAM=i32, CONT=i64, **_launch_meta(8192, 4, 1, M, steps=steps)))
        cases.append(CompileCase.of(_append_kernel, (f"append_accepted S={steps}",), H=i64, stride_h=8192, L=8192,
                                    TOK=i64, stride_tok=16, IDX=i64, stride_idx=steps + 1, ALEN=i32, BONUS=i64, SEQ=i32,
                                    ROWS=i64, S1=steps + 1, SP=triton.next_power_of_2(steps + 2), num_warps=1))
    return cases


def append_accepted_ref(history, tokens, accept_index, accept_len, bonus, seq_lens, rows) -> None:
    """Reference of `append_accepted` (in place): for each request with accept_len n > 0, history[row, seq_len + j] =
    tokens[accept_index[j]] for j < n, then the bonus at seq_len + n; padding rows (n = 0) write nothing."""
    B, S1 = accept_index.shape
    j = torch.arange(S1 + 1, device=tokens.device)  # [S+2]
    path = torch.cat([tokens.gather(1, accept_index.clamp(min=0)), bonus[:, None]], dim=1)  # [B, S+2]
    n = accept_len.long()[:, None]  # [B, 1]
    value = torch.where(j == n, bonus[:, None], path)  # [B, S+2]
    pos = (seq_lens.long()[:, None] + j).clamp(max=history.shape[1] - 1)  # [B, S+2]
    keep = (j <= n) & (n > 0) & (seq_lens.long()[:, None] + j < history.shape[1])  # [B, S+2]
    r = rows[:, None].expand(B, S1 + 1)  # [B, S+2]
    history[r[keep], pos[keep]] = value[keep].to(history.dtype)


@triton.jit
def _append_kernel(H, stride_h, L, TOK, stride_tok, IDX, stride_idx, ALEN, BONUS, SEQ, ROWS, S1, SP: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, SP)  # [SP] the path's nodes, then the bonus
    n = tl.load(ALEN + b)
    node = tl.load(IDX + b * stride_idx + j, mask=j < tl.minimum(n, S1), other=0)  # [SP]
    tok = tl.load(TOK + b * stride_tok + node, mask=j < n, other=0)  # [SP]
    tok = tl.where(j == n, tl.load(BONUS + b), tok)  # [SP]
    pos = tl.load(SEQ + b).to(tl.int64) + j  # [SP]
    row = tl.load(ROWS + b)
    ok = (j < n + (n > 0)) & (pos < L)  # [SP] j <= n: the path and the bonus; nothing for a padding row (n = 0)
    tl.store(H + row * stride_h + pos, tok.to(H.dtype.element_ty), mask=ok)


def append_accepted(history, tokens, accept_index, accept_len, bonus, seq_lens, rows) -> None:
    """history [R, L] int64 (in place), tokens [B, N] int64 (the verified tree), accept_index [B, S+1] int64 (-1
    padded), accept_len [B] int32, bonus [B] int64, seq_lens [B] int32, rows [B] int64 -> the accepted path and the
    bonus written at seq_len .. seq_len + accept_len (module doc). One launch; no host sync."""
    if history.dim() != 2 or history.stride(1) != 1:
        raise ValueError(f"history must be [R, L] with contiguous rows (written in place), got shape "
                         f"{tuple(history.shape)} strides {history.stride()}")
    if not use_triton(history, tokens, accept_index):
        return append_accepted_ref(history, tokens, accept_index, accept_len, bonus, seq_lens, rows)
    B, S1 = accept_index.shape
    if B > 0:
        _append_kernel[(B,)](history, history.stride(0), history.shape[1], tokens, tokens.stride(0), accept_index,
                             accept_index.stride(0), accept_len, bonus, seq_lens, rows, S1,
                             SP=triton.next_power_of_2(S1 + 1), num_warps=1)
