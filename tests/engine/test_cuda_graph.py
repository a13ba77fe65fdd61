"""GraphRunner without graphs (CPU, eager): stage + replay is the function on the inputs staged by name."""

import pytest
import torch

from eaglet.engine.cuda_graph import GraphRunner, copy_all


def test_disabled_runner_stages_into_static_buffers_and_runs_on_them():
    calls = []

    def fn(a, b):
        calls.append((a.data_ptr(), a.shape[0]))
        return a * 2 + b  # [B, 3]

    runner = GraphRunner(fn, lambda B: dict(a=torch.zeros(B, 3), b=torch.zeros(B, 3)), max_batch=4, enabled=False)
    for B in (3, 1, 4):
        a, b = torch.randn(B, 3), torch.randn(B, 3)
        out = runner.replay(runner.stage(a=a, b=b))
        assert torch.equal(out, a * 2 + b)
    # every call read the one set of static buffers (sized for the largest bucket), not the caller's tensors
    assert len({ptr for ptr, _ in calls}) == 1 and [n for _, n in calls] == [3, 1, 4]
    assert torch.equal(runner(a, b), a * 2 + b)  # __call__ without staging still runs the function directly


def test_inputs_staged_in_parts_equal_staged_at_once():
    """The verify stages its draft-independent inputs before the draft ends and the rest after (overlap_split)."""

    def fn(a, b, c):  # [B, 2]
        return a * 100 + b * 10 + c

    runner = GraphRunner(fn, lambda B: {name: torch.zeros(B, 2) for name in "abc"}, max_batch=4, enabled=False)
    a, b, c = (torch.randn(3, 2) for _ in range(3))
    assert runner.stage(a=a) == 3 and runner.stage(c=c, b=b) == 3  # by name, in any order
    assert torch.equal(runner.replay(3), fn(a, b, c))
    runner.stage(c=a)  # a later part replaces only its own buffers
    assert torch.equal(runner.replay(3), fn(a, b, a))
    with pytest.raises(ValueError, match="no static input named d"):
        runner.stage(d=a)


def _pairs(device):
    """Staging pairs of several dtypes and shapes, with a strided source, a broadcast source and a dtype cast (the
    three that cannot go through the byte copy)."""
    g = torch.Generator().manual_seed(0)
    srcs = [torch.randn(3, 4, generator=g).bfloat16(), torch.randint(0, 99, (3,), generator=g, dtype=torch.int32),
            torch.rand(3, 5, 5, generator=g) > 0.5, torch.randint(0, 9, (3, 8), generator=g),
            torch.randn(6, 3, generator=g).t(), torch.randn(1, 2, generator=g), torch.arange(6).view(3, 2)]
    dsts = [torch.zeros_like(s) for s in srcs[:5]] + [torch.zeros(3, 2), torch.zeros(3, 2)]
    return [d.to(device) for d in dsts], [s.to(device) for s in srcs]


def test_copy_all_equals_copy_per_pair():
    dsts, srcs = _pairs("cpu")
    want = [d.clone().copy_(s) for d, s in zip(dsts, srcs)]
    copy_all(dsts, srcs)
    assert all(torch.equal(d, w) and d.dtype == w.dtype for d, w in zip(dsts, want))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")
def test_copy_all_is_one_launch_for_dense_pairs():
    from torch.profiler import ProfilerActivity, profile

    dsts, srcs = _pairs("cuda")
    dense = 4  # the first four pairs are dense with equal shapes and dtypes
    copy_all(dsts[:dense], srcs[:dense])  # warm-up
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        copy_all(dsts[:dense], srcs[:dense])
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert len(kernels) == 1, [e.name for e in kernels]
    assert all(torch.equal(d, s) for d, s in zip(dsts[:dense], srcs[:dense]))
