"""kernels/kv_ops.py: commit_kv, pool_slots and step_slots, the Triton kernels equal the torch references bit for bit.

On CPU run with TRITON_INTERPRET=1 (CI does) so the kernel itself is tested; without it the
launcher falls back to the reference and the kernel-vs-reference tests are skipped.
"""

from __future__ import annotations

import pytest
import torch
from kernel_testing import DEVICE, gpu_only, needs_kernel

from eaglet.kernels.kv_ops import commit_kv, commit_kv_ref, pool_slots, pool_slots_ref, step_slots, step_slots_ref


def random_paths(B, S, N, gen):
    """accept_index [B, S+1] (strictly increasing node indices from the root 0, -1 padded) and
    accept_len [B] int32 spanning 1..S+1."""
    idx = torch.full((B, S + 1), -1, dtype=torch.int64)  # [B, S+1]
    lens = torch.empty(B, dtype=torch.int32)  # [B]
    for b in range(B):
        n = b % (S + 1) + 1
        nodes = torch.randperm(N - 1, generator=gen)[: n - 1].add(1).sort().values
        idx[b, :n] = torch.cat([torch.zeros(1, dtype=torch.int64), nodes])
        lens[b] = n
    return idx, lens


def make_pool(B, L, Hkv, D, page_size, N, dtype, gen, max_prefix=40):
    seq_lens = torch.randint(0, max_prefix, (B,), generator=gen).int()  # [B]
    P = -(-(max_prefix + N) // page_size)  # pages per request
    num_pages = B * P + 3  # spare pages: slots no request owns, must stay untouched
    page_table = torch.randperm(num_pages, generator=gen)[: B * P].view(B, P).int()  # [B, P] shuffled
    kv = torch.randn(L, 2, num_pages, page_size, Hkv, D, generator=gen).to(dtype)  # [L, 2, pages, ps, Hkv, D]
    return kv, page_table, seq_lens


def bits(t: torch.Tensor) -> torch.Tensor:
    if t.element_size() == 1:
        return t.view(torch.uint8)
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn], ids=str)
@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("L,Hkv,D,S,N", [(2, 2, 16, 5, 8), (3, 3, 64, 6, 60), (1, 1, 8, 1, 3)])
def test_matches_reference(L, Hkv, D, S, N, page_size, dtype):
    gen = torch.Generator().manual_seed(page_size * 7 + N)
    B = 2 * (S + 1)  # every accepted length, twice
    kv, page_table, seq_lens = make_pool(B, L, Hkv, D, page_size, N, dtype, gen)
    accept_index, accept_len = random_paths(B, S, N, gen)
    ref_kv, ref_lens = kv.clone(), seq_lens.clone()
    commit_kv_ref(ref_kv, page_table, page_size, ref_lens, accept_index, accept_len)
    # in place: keep the inputs
    out = [t.clone().to(DEVICE) for t in (kv, page_table, seq_lens, accept_index, accept_len)]
    commit_kv(out[0], out[1], page_size, out[2], out[3], out[4])
    assert torch.equal(bits(out[0]).cpu(), bits(ref_kv))
    assert torch.equal(out[2].cpu(), seq_lens + accept_len)
    # Independent of the reference: exactly the destination slots changed, to their sources.
    old = bits(kv).reshape(L, 2, -1, Hkv * D)  # [L, 2, slots, Hkv*D]
    new = bits(out[0]).cpu().reshape(L, 2, -1, Hkv * D)
    expected_changed = torch.zeros(old.shape[2], dtype=torch.bool)
    for b in range(B):
        for i in range(1, int(accept_len[b])):
            def slot(p):
                return int(page_table[b, p // page_size]) * page_size + p % page_size
            dst, src = slot(int(seq_lens[b]) + i), slot(int(seq_lens[b]) + int(accept_index[b, i]))
            assert torch.equal(new[:, :, dst], old[:, :, src])
            expected_changed[dst] = src != dst
    changed = (new != old).flatten(3).any(3).any(1).any(0)  # [slots]
    assert not (changed & ~expected_changed).any(), "a slot that is no destination changed"


def test_overlapping_moves_in_order():
    # Path 0 -> 2 -> 3 -> 5 at seq_len 4: position 6 (node 2) is both the source of move 1
    # (to 5) and the destination of move 2 (from 7); ascending order reads it before it is overwritten.
    L, Hkv, D, page_size = 2, 1, 4, 2
    kv = torch.arange(L * 2 * 8 * page_size * Hkv * D, dtype=torch.float32).reshape(L, 2, 8, page_size, Hkv, D)
    page_table = torch.tensor([[3, 0, 6, 1, 5, 2, 7, 4]], dtype=torch.int32)  # shuffled pages
    seq_lens = torch.tensor([4], dtype=torch.int32)
    accept_index = torch.tensor([[0, 2, 3, 5, -1]])
    accept_len = torch.tensor([4], dtype=torch.int32)

    def at(t, p):
        return t[:, :, int(page_table[0, p // page_size]), p % page_size].clone()  # [L, 2, Hkv, D]

    before = {p: at(kv, p) for p in range(4, 12)}
    # in place: keep the inputs
    out = [t.clone().to(DEVICE) for t in (kv, page_table, seq_lens, accept_index, accept_len)]
    commit_kv(out[0], out[1], page_size, out[2], out[3], out[4])
    after = out[0].cpu()
    assert torch.equal(at(after, 4), before[4])  # the root stays
    assert torch.equal(at(after, 5), before[6])
    assert torch.equal(at(after, 6), before[7])
    assert torch.equal(at(after, 7), before[9])
    for p in (8, 9, 10, 11):  # beyond the new length: left as they were
        assert torch.equal(at(after, p), before[p])
    assert out[2].tolist() == [8]


def test_nothing_accepted():
    gen = torch.Generator().manual_seed(0)
    kv, page_table, seq_lens = make_pool(3, 2, 2, 8, 4, 8, torch.float32, gen)
    accept_index = torch.tensor([[0, -1, -1]] * 3)
    accept_len = torch.ones(3, dtype=torch.int32)
    # in place: keep the inputs
    out = [t.clone().to(DEVICE) for t in (kv, page_table, seq_lens, accept_index, accept_len)]
    commit_kv(out[0], out[1], 4, out[2], out[3], out[4])
    assert torch.equal(out[0].cpu(), kv) and torch.equal(out[2].cpu(), seq_lens + 1)


def test_validation():
    gen = torch.Generator().manual_seed(0)
    kv, page_table, seq_lens = make_pool(2, 2, 2, 8, 4, 8, torch.float32, gen)
    accept_index, accept_len = random_paths(2, 3, 8, gen)
    args = [kv, page_table, 4, seq_lens, accept_index, accept_len]
    for i, bad, match in [
        (0, kv[0], "kv_cache"),
        (0, kv.transpose(4, 5), "contiguous"),
        (2, 8, "page_size"),
        (1, page_table.long(), "page_table"),
        (3, seq_lens.long(), "seq_lens"),
        (4, accept_index.int(), "accept_index"),
        (5, accept_len[:1], "accept_len"),
    ]:
        with pytest.raises(ValueError, match=match):
            commit_kv(*args[:i], bad, *args[i + 1:])


# ---- pool_slots --------------------------------------------------------------------------------------------------
@needs_kernel
@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("masked", [False, True], ids=["all", "masked"])
@pytest.mark.parametrize("page_size", [1, 5, 16])
@pytest.mark.parametrize("B,T", [(1, 1), (3, 8), (2, 64), (2, 1500)])
def test_pool_slots_matches_reference(B, T, page_size, masked, pos_dtype):
    gen = torch.Generator().manual_seed(B * 1000 + T + page_size)
    P = -(-(T + 40) // page_size)  # pages per request
    page_table = torch.randperm(B * P + 3, generator=gen)[: B * P].view(B, P).int()  # [B, P] shuffled pages
    positions = torch.randint(0, P * page_size, (B, T), generator=gen).to(pos_dtype)  # [B, T]
    valid = torch.rand(B, T, generator=gen) < 0.6 if masked else None  # [B, T]
    if masked:  # a masked position need not lie in the table: the kernel reads nothing for it
        positions = torch.where(valid, positions, P * page_size + 7)
    want = pool_slots_ref(page_table, torch.where(valid, positions, 0) if masked else positions, page_size, valid)
    dev_valid = None if valid is None else valid.to(DEVICE)
    got = pool_slots(page_table.to(DEVICE), positions.to(DEVICE), page_size, dev_valid)
    assert got.dtype == torch.int64 and torch.equal(got.cpu(), want)


@needs_kernel
def test_pool_slots_strided_rows_and_empty():
    """Rows of a wider tensor (the engine slices page tables and offsets), and B = 0 / T = 0."""
    gen = torch.Generator().manual_seed(3)
    table = torch.randperm(64, generator=gen)[:48].view(4, 12).int()  # [4, 12]
    wide = torch.randint(0, 12 * 4, (3, 20), generator=gen)  # [3, 20]
    pt, pos = table[1:4], wide[:, 5:13]  # [3, 12], [3, 8]: row strides 12 and 20
    got = pool_slots(pt.to(DEVICE), pos.to(DEVICE), 4)
    assert torch.equal(got.cpu(), pool_slots_ref(pt, pos, 4))
    for B, T in ((0, 5), (2, 0)):
        out = pool_slots(torch.zeros(B, 3, dtype=torch.int32, device=DEVICE),
                         torch.zeros(B, T, dtype=torch.int64, device=DEVICE), 16)
        assert out.shape == (B, T) and out.dtype == torch.int64


def test_pool_slots_rejects_bad_input():
    pt, pos = torch.zeros(2, 3, dtype=torch.int32), torch.zeros(2, 4, dtype=torch.int64)
    with pytest.raises(ValueError, match="share B"):
        pool_slots(pt, pos[:1], 16)
    with pytest.raises(ValueError, match="integers"):
        pool_slots(pt, pos.float(), 16)
    with pytest.raises(ValueError, match="valid must be"):
        pool_slots(pt, pos, 16, torch.ones(2, 3, dtype=torch.bool))


@gpu_only
def test_pool_slots_in_a_cuda_graph():
    """Captured once, replayed after the positions, the mask and the page table changed in place (a decode step)."""
    gen = torch.Generator().manual_seed(5)
    pt = torch.randperm(200, generator=gen)[:64].view(4, 16).int().to(DEVICE)  # [4, 16]
    pos = torch.randint(0, 16 * 16, (4, 9), generator=gen).to(DEVICE)  # [4, 9]
    valid = (torch.rand(4, 9, generator=gen) < 0.5).to(DEVICE)  # [4, 9]
    pool_slots(pt, pos, 16, valid)  # compile before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = pool_slots(pt, pos, 16, valid)
    pos.random_(0, 16 * 16)
    valid.copy_(torch.rand(4, 9, device=DEVICE) < 0.5)
    pt.copy_(pt.flip(1))
    graph.replay()
    assert torch.equal(out, pool_slots_ref(pt, pos, 16, valid))


# ---- step_slots --------------------------------------------------------------------------------------------------
@needs_kernel
@pytest.mark.parametrize("with_index", [False, True], ids=["all", "index"])
@pytest.mark.parametrize("page_size", [1, 5, 16])
@pytest.mark.parametrize("B,T,P", [(1, 1, 3), (3, 8, 40), (5, 24, 700), (2, 0, 5)])
def test_step_slots_matches_reference(B, T, P, page_size, with_index):
    """Rows out of order among more requests, page tables longer than a copy chunk (700 > 512), accept-index-like
    masks (-1 past a path's end), and a request whose last positions lie past its page table (where masked)."""
    gen = torch.Generator().manual_seed(B * 100 + T + page_size)
    R = B + 2
    req_to_page = torch.randperm(R * P + 5, generator=gen)[: R * P].view(R, P).int()  # [R, P]
    rows = torch.randperm(R, generator=gen)[:B]  # [B]
    seq_lens = torch.randint(0, P * page_size - T + 1, (B,), generator=gen).int()  # [B]
    index = None
    if with_index:
        lens = torch.randint(0, T + 1, (B,), generator=gen)  # [B]
        index = torch.where(torch.arange(T) < lens[:, None], torch.arange(T), -1)  # [B, T]
        seq_lens[0] = P * page_size - int(lens[0])  # its valid positions end at the table's last slot
    want = step_slots_ref(req_to_page, rows, seq_lens, T, page_size, index)
    got = step_slots(req_to_page.to(DEVICE), rows.to(DEVICE), seq_lens.to(DEVICE), T, page_size,
                     None if index is None else index.to(DEVICE))
    for g, w, dtype in zip(got, want, (torch.int32, torch.int64, torch.int64)):
        assert g.dtype == dtype and torch.equal(g.cpu(), w)
    # the spec by hand: positions seq_len + t, slot = page * page_size + offset, 0 where index < 0
    for b in range(B):
        for t in range(T):
            p = int(seq_lens[b]) + t
            ok = index is None or index[b, t] >= 0
            slot = int(req_to_page[rows[b], p // page_size]) * page_size + p % page_size if ok else 0
            assert int(got[1][b, t]) == p and int(got[2][b, t]) == slot


def test_step_slots_rejects_bad_input():
    r2p, rows, lens = torch.zeros(4, 3, dtype=torch.int32), torch.zeros(2, dtype=torch.int64), torch.zeros(
        2, dtype=torch.int32)
    with pytest.raises(ValueError, match="seq_lens .B."):
        step_slots(r2p, rows, lens[:1], 4, 16)
    with pytest.raises(ValueError, match=r"index must be \[B, T\] = \[2, 4\]"):
        step_slots(r2p, rows, lens, 4, 16, torch.zeros(2, 3, dtype=torch.int64))


@gpu_only
def test_step_slots_in_a_cuda_graph():
    """Captured once, replayed after the rows, lengths, index and pages changed in place."""
    gen = torch.Generator().manual_seed(6)
    r2p = torch.randperm(300, generator=gen)[:96].view(6, 16).int().to(DEVICE)  # [6, 16]
    rows = torch.tensor([4, 1, 2], device=DEVICE)  # [3]
    lens = torch.tensor([3, 100, 200], dtype=torch.int32, device=DEVICE)  # [3]
    index = torch.tensor([[0, 1, -1, -1], [0, -1, -1, -1], [0, 1, 2, 3]], device=DEVICE)  # [3, 4]
    step_slots(r2p, rows, lens, 4, 16, index)  # compile before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step_slots(r2p, rows, lens, 4, 16, index)
    rows.copy_(torch.tensor([0, 5, 3]))
    lens.copy_(torch.tensor([50, 7, 150]))
    index.copy_(index.flip(0))
    r2p.copy_(r2p.flip(1))
    graph.replay()
    for g, w in zip(out, step_slots_ref(r2p, rows, lens, 4, 16, index)):
        assert torch.equal(g, w)
