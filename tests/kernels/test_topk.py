"""topk_logprobs (kernels/topk.py) against its torch reference: ids exactly, log-probabilities to fp32 rounding.

On CPU run with TRITON_INTERPRET=1 (CI does) so the Triton kernels themselves are tested; on a GPU the same tests
run there, plus bf16 logits, Llama-3's vocabulary and a CUDA graph.
"""

from __future__ import annotations

import pytest
import torch
from kernel_testing import CUDA, DEVICE, gpu_only, needs_kernel

import eaglet.kernels.topk as tk
from eaglet.kernels.topk import topk_logprobs, topk_logprobs_ref


def make(shape, seed=0, scale=3.0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * scale).to(DEVICE, dtype)  # [..., V]


def check(logits, k):
    lp, ids = topk_logprobs(logits, k)
    rlp, rids = topk_logprobs_ref(logits, k)
    assert lp.shape == ids.shape == (*logits.shape[:-1], k)
    assert lp.dtype == torch.float32 and ids.dtype == torch.int64
    assert torch.equal(ids, rids)
    torch.testing.assert_close(lp, rlp, rtol=1e-6, atol=2e-6)
    return lp, ids


@needs_kernel
@pytest.mark.parametrize(
    "shape, k",
    [
        pytest.param((4, 8192), 4, id="chunks-8k-k4"),
        pytest.param((3, 100), 1, id="odd-V-k1"),
        pytest.param((2, 5, 32000), 10, id="3d-32k-k10"),
        pytest.param((1, 49152), 8, id="smollm2-vocab-2048-chunks"),
        pytest.param((7, 37), 37, id="k-equals-V"),
        pytest.param((5, 8193), 3, id="last-chunk-one-id"),
    ],
)
def test_matches_reference(shape, k):
    check(make(shape), k)


def test_reference_is_log_softmax_topk():
    """Without ties the spec is what the engine ran before: log_softmax then topk."""
    x = make((6, 3000), seed=1)
    lp, ids = topk_logprobs_ref(x, 5)
    want_lp, want_ids = torch.log_softmax(x, -1).topk(5)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(lp, want_lp)


@needs_kernel
@pytest.mark.parametrize("V", [9000, 50], ids=["chunks", "one-chunk"])
def test_ties_take_the_lower_id(V):
    """Integer logits tie everywhere: equal values come lowest id first, also across chunks."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randint(0, 4, (5, V), generator=gen).float().to(DEVICE)  # [5, V]
    _, ids = check(x, 6)
    top = x.max(-1).values  # [5]
    first = torch.stack([(r == t).nonzero()[:6, 0] for r, t in zip(x, top)])  # [5, 6] lowest ids of the max
    assert torch.equal(ids, first)
    assert torch.equal(topk_logprobs(torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0]], device=DEVICE), 2)[1].cpu(),
                       torch.tensor([[1, 2]]))


@needs_kernel
def test_infinite_logits():
    """-inf ids (a masked vocabulary) are never taken before finite ones; their log-probability is -inf."""
    x = -torch.rand(3, 20000, generator=torch.Generator().manual_seed(3)).to(DEVICE) * 5  # [3, V]
    x[1] = float("-inf")
    x[1, 7] = x[1, 9] = 0.0
    lp, ids = check(x, 3)
    assert ids[1].tolist() == [7, 9, 0]
    assert lp[1, :2].tolist() == pytest.approx([-0.6931472] * 2) and lp[1, 2].item() == float("-inf")


@needs_kernel
def test_strided_rows_and_empty():
    wide = make((6, 5000), seed=4)
    check(wide[:, 100:4100], 4)  # a column slice: row stride 5000
    lp, ids = topk_logprobs(make((0, 300)), 2)
    assert lp.shape == ids.shape == (0, 2)


def test_large_k_takes_the_reference(monkeypatch):
    """k above MAX_K: the reference runs (same semantics)."""
    x = make((2, 500), seed=5)
    calls = []
    monkeypatch.setattr(tk, "MAX_K", 4)
    monkeypatch.setattr(tk, "topk_logprobs_ref", lambda logits, k: calls.append(k) or topk_logprobs_ref(logits, k))
    lp, ids = topk_logprobs(x, 8)
    assert calls == [8] and torch.equal(ids, topk_logprobs_ref(x, 8)[1])


@pytest.mark.parametrize(
    "logits, k, match",
    [
        (torch.zeros(3, 10), 0, "k=0"),
        (torch.zeros(3, 10), 11, r"k=11 must be an int in \[1, 10\]"),
        (torch.zeros(3, 10), 2.0, "must be an int"),
        (torch.zeros(3, 10, dtype=torch.int64), 2, "float32/bfloat16/float16"),
        (torch.zeros(3, 0), 1, "V >= 1"),
    ],
)
def test_bad_input(logits, k, match):
    with pytest.raises(ValueError, match=match):
        topk_logprobs(logits, k)


@gpu_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("V", [8192, 32000, 128256])
def test_half_logits_gpu(dtype, V):
    check(make((8, 4, V), seed=6, dtype=dtype), 4)


@gpu_only
def test_cuda_graph():
    x = make((4, 32000), seed=7)
    topk_logprobs(x, 4)  # compile before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        lp, ids = topk_logprobs(x, 4)
    x.copy_(make((4, 32000), seed=8))
    graph.replay()
    rlp, rids = topk_logprobs_ref(x, 4)
    assert CUDA and torch.equal(ids, rids)
    torch.testing.assert_close(lp, rlp, rtol=1e-6, atol=2e-6)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(31, 49152), (1, 49152), (2, 3, 1000), (4, 5000)], ids=str)
def test_argmax_is_torch_argmax(shape, dtype):
    """The greedy pick: torch's argmax exactly, its first maximum on ties (bf16 logits tie often): values on a grid
    0.25 apart, and every row's maximum copied to its last id, so that each row holds its maximum at least twice."""
    x = (make(shape, seed=1, scale=1.0, dtype=torch.float32) * 4).round().div(4).to(dtype)  # [..., V]
    x[..., -1] = x.amax(-1)  # a tie at the last id
    got = tk.argmax(x)
    assert got.dtype == torch.int64 and got.shape == shape[:-1]
    assert torch.equal(got, x.argmax(-1))
    assert (x == x.amax(-1, keepdim=True)).sum(-1).gt(1).all() and not got.eq(shape[-1] - 1).any()
