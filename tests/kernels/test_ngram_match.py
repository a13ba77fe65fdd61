"""ngram_match and ngram_continuations (kernels/ngram_match.py) against their references, exactly: random histories
with planted repeats, a hand-built case written out, edge lengths, and the launchers' input checks.

On CPU run with TRITON_INTERPRET=1 (CI does) so the Triton kernel itself is tested; on a GPU the same tests run there,
plus a CUDA graph.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from kernel_testing import CUDA, DEVICE, gpu_only, needs_kernel

import eaglet.kernels.ngram_match as ngm
from eaglet.kernels.ngram_match import (
    append_accepted,
    append_accepted_ref,
    ngram_continuations,
    ngram_continuations_ref,
    ngram_match,
    ngram_match_ref,
)


def check(history, rows, lengths, n_max, n_min, M, steps=3):
    """Both launchers against their references; steps: the continuations' length (3: a padded power of 2)."""
    starts, ngram = ngram_match(history, rows, lengths, n_max=n_max, n_min=n_min, num_matches=M)
    want_starts, want_ngram = ngram_match_ref(history, rows, lengths, n_max=n_max, n_min=n_min, num_matches=M)
    assert starts.shape == (rows.shape[0], M) and ngram.shape == (rows.shape[0],)
    assert starts.dtype == ngram.dtype == torch.int32
    assert torch.equal(ngram.cpu(), want_ngram.cpu()), (ngram, want_ngram)
    assert torch.equal(starts.cpu(), want_starts.cpu()), (starts, want_starts)
    kw = dict(n_max=n_max, n_min=n_min, num_matches=M, steps=steps)
    cont, want_cont = ngram_continuations(history, rows, lengths, **kw), ngram_continuations_ref(history, rows,
                                                                                                  lengths, **kw)
    assert cont.shape == (rows.shape[0], M, steps) and cont.dtype == torch.int64
    assert torch.equal(cont.cpu(), want_cont.cpu()), (cont, want_cont)
    return starts.cpu(), ngram.cpu()


def continuations_by_hand(history, rows, lengths, starts, steps):
    """What follows each start, in plain Python (the continuations' spec without tensors): the history from the start
    on, then, past its end, what the continuation itself wrote there (a loop goes on)."""
    h, out = history.tolist(), []
    for row, length, ss in zip(rows.tolist(), lengths.tolist(), starts.tolist()):
        length = max(0, min(length, len(h[row])))
        per = []
        for s in ss:
            text = list(h[row][:length])
            for j in range(steps):
                text.append(text[s + j] if s >= 0 else -1)  # the next token, as the match predicts it
            per.append(text[length:] if s >= 0 else [-1] * steps)
        out.append(per)
    return out


def planted_row(g: random.Random, L: int, vocab: int) -> tuple[list[int], int]:
    """A row of L random tokens and a length, with repeats planted: the suffix (1 to 5 tokens) copied at a few earlier
    places, often at position 0, sometimes overlapping; or a run of one token ("a a a a") at the end."""
    row = [g.randrange(vocab) for _ in range(L)]
    length = g.choice([0, 1, 2, g.randint(0, L), L, L])
    if length >= 2 and g.random() < 0.25:
        run = g.randint(2, min(length, 8))
        row[length - run:length] = [g.randrange(vocab)] * run
    elif length >= 2:
        p = g.randint(1, min(5, length - 1))
        pattern = row[length - p:length]
        places = [0] * (g.random() < 0.5) + [g.randint(0, length - p) for _ in range(g.randint(0, 4))]
        for at in places:
            row[at:at + p] = pattern
        row[length - p:length] = pattern
    return row, length


def planted(seed: int, B: int, L: int, dtype: torch.dtype):
    """history [B + 3, L] (int64: tokens that differ only above bit 32 too), rows [B] permuted, lengths [B]."""
    g = random.Random(seed)
    vocab = g.choice([2, 3, 8, 50])
    R = B + 3
    hist, lens = zip(*(planted_row(g, L, vocab) for _ in range(R)))
    history = torch.tensor(hist, dtype=torch.int64).reshape(R, L)  # [R, L]
    if dtype == torch.int64:
        history = history % 2 + (history // 2) * 2**32  # [R, L]
    rows = torch.randperm(R, generator=torch.Generator().manual_seed(seed))[:B]  # [B]
    lengths = torch.tensor(lens, dtype=torch.int32)[rows]  # [B]
    return history.to(DEVICE, dtype), rows.to(DEVICE), lengths.to(DEVICE)


SIZES = [(1, 1), (1, 3), (2, 4)]
RANDOM_CASES = [
    pytest.param(i, dtype, n_min, n_max, M, tile, id=f"{str(dtype)[6:]}-n{n_min}..{n_max}-M{M}-tile{tile}")
    for i, (dtype, (n_min, n_max), M, tile) in enumerate(itertools.product(
        (torch.int32, torch.int64), SIZES, (1, 2, 3, 4), (ngm._TILE, 16)))
]


@needs_kernel
@pytest.mark.parametrize("i, dtype, n_min, n_max, M, tile", RANDOM_CASES)
def test_planted_repeats(monkeypatch, i, dtype, n_min, n_max, M, tile):
    """B = 1..9 requests of up to 200 tokens; tile 16 scans them in blocks of 16 continuations (block edges, the
    prefetch, the stop when the n_max list is full)."""
    monkeypatch.setattr(ngm, "_TILE", tile)
    B, L = 1 + i % 9, (7, 60, 200)[i // 9 % 3]
    history, rows, lengths = planted(1000 + i, B, L, dtype)
    check(history, rows, lengths, n_max, n_min, M)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_long_history(dtype):
    """3,000 tokens, several blocks at the default tile: the only n_max match at the very start, matches of one n in
    blocks far apart, a run that ends the scan in its first block."""
    g = random.Random(7)
    L = 3000
    rows = [[g.randrange(1000) for _ in range(L)] for _ in range(4)]
    rows[0][:4] = rows[0][-4:]  # n = 4 only at i = 0: the whole history is scanned
    rows[1][2000:2003] = rows[1][-3:]  # n = 3 midway, n = 1..2 wherever the tokens recur
    rows[2][-12:] = [5] * 12  # a run: n = 4 at the 8 most recent starts, the scan stops in the first block
    for at in (100, 1500, 2600):  # n = 4 in three blocks; 3 (and shorter) matches more recent than 2600
        rows[3][at:at + 4] = rows[3][-4:]
    rows[3][2900:2903] = rows[3][2800:2803] = rows[3][-3:]
    history = torch.tensor(rows, dtype=dtype, device=DEVICE)  # [4, L]
    lengths = torch.full((4,), L, dtype=torch.int32, device=DEVICE)  # [4]
    starts, ngram = check(history, torch.tensor([2, 0, 1, 3], device=DEVICE), lengths, 4, 1, 4)
    assert ngram.tolist() == [4, 4, 3, 4]
    assert starts[0].tolist() == [L - 1, L - 2, L - 3, L - 4] and starts[1].tolist() == [4, -1, -1, -1]
    assert starts[3].tolist() == [2604, 1504, 104, -1]


@needs_kernel
def test_golden():
    """Expected answers written out (n = 1..3, M = 3); rows out of order, R > B."""
    H = [
        [5, 6, 7, 5, 6, 8, 5, 6, 7, 9, 5, 6, 7, 0, 0],  # len 13: 5 6 7 at i = 6 and 0 (not 3: 5 6 8)
        [1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # len 5: a run, overlapping 1 1 1 at i = 1 and 0
        [1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # len 4: no token recurs
        [9, 4, 9, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4],  # len 3: 9 at i = 0 only (n = 1)
        [7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7],  # len 1: nothing before the suffix; len 0: nothing
        [3, 1, 2, 3, 1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # len 6: 3 1 2 at i = 0 only (the suffix's own i = 3 out)
        [8, 7, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # len 3: 7 at i = 1 (n = 1); 7 7 is the suffix only
    ]
    history = torch.tensor(H, dtype=torch.int64, device=DEVICE)  # [7, 15]
    rows = torch.tensor([1, 0, 2, 3, 4, 4, 5, 6], device=DEVICE)  # [8]
    lengths = torch.tensor([5, 13, 4, 3, 1, 0, 6, 3], dtype=torch.int32, device=DEVICE)  # [8]
    starts, ngram = check(history, rows, lengths, 3, 1, 3, steps=5)
    assert ngram.tolist() == [3, 3, 0, 1, 0, 0, 3, 1]
    assert starts.tolist() == [[4, 3, -1], [9, 3, -1], [-1, -1, -1], [1, -1, -1], [-1, -1, -1], [-1, -1, -1],
                               [3, -1, -1], [2, -1, -1]]
    cont = ngram_continuations(history, rows, lengths, n_max=3, n_min=1, num_matches=3, steps=5)
    assert cont.tolist() == continuations_by_hand(history, rows, lengths, starts, 5)
    # len 13: past the history's end the continuation goes on as the loop it matched (9 5 6 7, period 4)
    assert cont[1].tolist() == [[9, 5, 6, 7, 9], [5, 6, 8, 5, 6], [-1] * 5]
    assert cont[0].tolist()[0] == [1, 1, 1, 1, 1]  # len 5, a run of 1s: start 4, period 1
    # n = 2..3: len 3 cannot match at n = 3, and its 9 4 9 has no earlier 4 9; the run still matches at n = 3.
    starts, ngram = check(history, rows[:4], lengths[:4], 3, 2, 2)
    assert ngram.tolist() == [3, 3, 0, 0] and starts.tolist() == [[4, 3], [9, 3], [-1, -1], [-1, -1]]


@needs_kernel
def test_short_lengths_and_clamping():
    """len < n + 1 cannot match at n; lengths past L are clamped to L (a row of L = 6 tokens)."""
    history = torch.tensor([[4, 4, 4, 4, 4, 4]], dtype=torch.int32, device=DEVICE)  # [1, 6]
    rows = torch.zeros(4, dtype=torch.int64, device=DEVICE)  # [4]
    lengths = torch.tensor([2, 3, 9, 6], dtype=torch.int32, device=DEVICE)  # [4]
    starts, ngram = check(history, rows, lengths, 2, 2, 2)
    assert ngram.tolist() == [0, 2, 2, 2] and starts.tolist() == [[-1, -1], [2, -1], [5, 4], [5, 4]]


@needs_kernel
def test_strided_history_and_empty_batch():
    wide, rows, lengths = planted(5, 6, 90, torch.int64)
    check(wide[:, 10:70], rows, lengths.clamp(max=60), 3, 1, 4)  # a column slice: row stride 90
    starts, ngram = ngram_match(wide, rows[:0], lengths[:0], n_max=3, n_min=1, num_matches=2)
    assert starts.shape == (0, 2) and ngram.shape == (0,)


@needs_kernel
@pytest.mark.parametrize("S", [1, 4, 7])
def test_append_accepted(S):
    """The kernel, the torch reference and a plain-Python construction write the same histories: accepted paths of
    every length (0: a padding row, which writes nothing), a path reaching the history's end, rows out of order."""
    g = torch.Generator().manual_seed(S)
    B, N, R, L = 6, 12, 8, 40
    history = torch.randint(0, 100, (R, L), generator=g)  # [R, L]
    tokens = torch.randint(100, 200, (B, N), generator=g)  # [B, N]
    accept_len = torch.tensor([0, 1, S + 1, 2, S + 1, 1][:B], dtype=torch.int32).clamp(max=S + 1)  # [B]
    accept_index = torch.full((B, S + 1), -1, dtype=torch.int64)  # [B, S+1]
    for b, n in enumerate(accept_len.tolist()):
        if n:  # the root (node 0), then distinct nodes
            accept_index[b, :n] = torch.cat([torch.zeros(1, dtype=torch.int64), torch.randperm(N - 1, generator=g)[
                :n - 1] + 1])
    bonus = torch.randint(200, 300, (B,), generator=g)  # [B]
    seq_lens = torch.tensor([5, 0, 17, L - 2, 30, 9][:B], dtype=torch.int32)  # [B]
    rows = torch.tensor([3, 0, 7, 5, 1, 2][:B])  # [B]
    want = history.tolist()
    for b in range(B):
        n = int(accept_len[b])
        if n == 0:
            continue
        vals = [int(tokens[b, accept_index[b, j]]) for j in range(n)] + [int(bonus[b])]
        for j, v in enumerate(vals):
            if seq_lens[b] + j < L:
                want[rows[b]][seq_lens[b] + j] = v
    args = [t.to(DEVICE) for t in (tokens, accept_index, accept_len, bonus, seq_lens, rows)]
    for fn in (append_accepted, append_accepted_ref):
        h = history.to(DEVICE).clone()
        fn(h, *args)
        assert h.cpu().tolist() == want, fn.__name__


I64 = torch.zeros(2, dtype=torch.int64)
I32 = torch.zeros(2, dtype=torch.int32)
H = torch.zeros(3, 10, dtype=torch.int64)


@pytest.mark.parametrize(
    "history, rows, lengths, kw, match",
    [
        (H, I64, I32, dict(n_max=2, n_min=3), r"1 <= n_min <= n_max, got n_min=3, n_max=2"),
        (H, I64, I32, dict(n_max=2, n_min=0), r"1 <= n_min <= n_max, got n_min=0"),
        (H, I64, I32, dict(n_max=2.0, n_min=1), "n_max=2.0 must be an int"),
        (H, I64, I32, dict(n_max=17, n_min=1), "n_max=17: at most 16"),
        (H, I64, I32, dict(n_max=2, n_min=1, num_matches=0), r"num_matches=0 must be in \[1, 16\]"),
        (H, I64, I32, dict(n_max=2, n_min=1, num_matches=17), r"num_matches=17 must be in \[1, 16\]"),
        (H.float(), I64, I32, dict(n_max=2, n_min=1), "history must be .R, L. int32 or int64"),
        (H[0], I64, I32, dict(n_max=2, n_min=1), "history must be .R, L."),
        (H, I32, I32, dict(n_max=2, n_min=1), "rows must be .B. int64"),
        (H, I64[None], I32, dict(n_max=2, n_min=1), "rows must be .B. int64"),
        (H, I64, I64, dict(n_max=2, n_min=1), r"lengths must be \[B\] = \[2\] int32"),
        (H, I64, I32[:1], dict(n_max=2, n_min=1), r"lengths must be \[B\] = \[2\] int32"),
        (H, I64.to("meta"), I32, dict(n_max=2, n_min=1), "rows is on meta, history on cpu"),
        (H, I64, I32.to("meta"), dict(n_max=2, n_min=1), "lengths is on meta, history on cpu"),
    ],
)
def test_bad_input(history, rows, lengths, kw, match):
    kw = dict(num_matches=2) | kw
    for fn in (ngram_match, ngram_match_ref):
        with pytest.raises(ValueError, match=match):
            fn(history, rows, lengths, **kw)
    with pytest.raises(ValueError, match=match):
        ngram_continuations(history, rows, lengths, steps=2, **kw)


@pytest.mark.parametrize("steps", [0, -1, 2.0, True])
def test_bad_steps(steps):
    with pytest.raises(ValueError, match=f"steps={steps!r} must be an int >= 1"):
        ngram_continuations(H, I64, I32, n_max=2, n_min=1, num_matches=2, steps=steps)


@gpu_only
def test_cuda_graph():
    history, rows, lengths = planted(11, 8, 4096, torch.int64)
    ngram_match(history, rows, lengths, n_max=3, n_min=1, num_matches=4)  # compile before capture
    ngram_continuations(history, rows, lengths, n_max=3, n_min=1, num_matches=4, steps=7)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        starts, ngram = ngram_match(history, rows, lengths, n_max=3, n_min=1, num_matches=4)
        cont = ngram_continuations(history, rows, lengths, n_max=3, n_min=1, num_matches=4, steps=7)
    new, _, new_lengths = planted(12, 8, 4096, torch.int64)
    history.copy_(new)
    lengths.copy_(new_lengths)
    graph.replay()
    want_starts, want_ngram = ngram_match_ref(history, rows, lengths, n_max=3, n_min=1, num_matches=4)
    want_cont = ngram_continuations_ref(history, rows, lengths, n_max=3, n_min=1, num_matches=4, steps=7)
    assert CUDA and torch.equal(starts, want_starts) and torch.equal(ngram, want_ngram)
    assert torch.equal(cont, want_cont)
