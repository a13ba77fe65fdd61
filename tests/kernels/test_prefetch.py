"""l2_prefetch (kernels/prefetch.py): the kernel reads exactly the requested bytes (its per-program xor
checksums fold to the reference's), and the fork/join of models/prefetch.py inside a CUDA graph.

On CPU run with TRITON_INTERPRET=1 (CI does) so the Triton kernel itself is tested; the L2 effect is timed
on the GPU by benchmarks/bench_prefetch.py, not here."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from eaglet.kernels.prefetch import _BLOCK, l2_prefetch, l2_prefetch_ref
from eaglet.models.prefetch import WeightPrefetch
from kernel_testing import DEVICE, gpu_only, needs_kernel


def fold(sums: torch.Tensor) -> int:
    acc = 0
    for s in sums.tolist():
        acc ^= s
    return acc


def test_reference_is_the_xor_of_the_words():
    t = torch.tensor([1, 2, 4, 8, 16], dtype=torch.int32)  # golden: 1^2^4^8^16 = 31, first 3 words 7
    assert int(l2_prefetch_ref(t)) == 31
    assert int(l2_prefetch_ref(t, 12)) == 7
    assert int(l2_prefetch_ref(t, 13)) == 7  # a partial word is not read
    assert int(l2_prefetch_ref(t, 0)) == 0


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8], ids=str)
@pytest.mark.parametrize(
    "numel,frac,programs",
    [
        pytest.param(1, 1.0, 3, id="one-element"),
        pytest.param(4093, 1.0, 2, id="odd"),
        pytest.param(4093, 0.37, 5, id="odd-partial"),
        pytest.param(3 * _BLOCK + 17, 1.0, 2, id="loops-over-blocks"),  # each program runs several iterations
        pytest.param(5 * _BLOCK, 0.5, 7, id="more-programs-than-blocks"),
        pytest.param(1000, 0.0, 4, id="nothing"),
    ],
)
def test_kernel_reads_exactly_the_range(dtype, numel, frac, programs):
    gen = torch.Generator().manual_seed(numel)
    t = torch.randint(-100, 100, (numel,), generator=gen).to(dtype).to(DEVICE)  # [numel]
    nbytes = int(t.numel() * t.element_size() * frac)
    out = torch.full((programs,), 12345, dtype=torch.int32, device=DEVICE)  # [P], poisoned
    sums = l2_prefetch(t, nbytes, out=out)
    assert sums is out
    assert fold(sums) == int(l2_prefetch_ref(t, nbytes))
    assert fold(l2_prefetch(t)) == int(l2_prefetch_ref(t))  # default: the whole tensor, default programs


def test_bad_arguments_are_named():
    t = torch.zeros(8, 8)
    with pytest.raises(ValueError, match="contiguous"):
        l2_prefetch(t.t())
    with pytest.raises(ValueError, match="nbytes=257"):
        l2_prefetch(t, 257)
    with pytest.raises(ValueError, match="out must be"):
        l2_prefetch(t, out=torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="weight_prefetch.attn: unknown projection"):
        WeightPrefetch({"attn": 1.0})
    with pytest.raises(ValueError, match=r"weight_prefetch.o_proj=1.5"):
        WeightPrefetch({"o_proj": 1.5})


@gpu_only
def test_fork_and_join_in_a_cuda_graph():
    """The model's pattern: prefetch on a side stream beside other work, join, GEMM; captured and replayed."""
    w = torch.randn(1024, 2048, device="cuda", dtype=torch.bfloat16)  # [N, K]
    x = torch.randn(8, 2048, device="cuda", dtype=torch.bfloat16)  # [M, K]
    pf = WeightPrefetch({"o_proj": 1.0}, "cuda")

    def step():
        pf.fork("o_proj", w)
        y = x * 2  # [M, K]: the window's work on the main stream
        pf.join()
        return F.linear(y, w)  # [M, N]

    eager = step()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = step()
    x.mul_(-1)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, -eager)
    assert fold(pf._sink) == int(l2_prefetch_ref(w))
