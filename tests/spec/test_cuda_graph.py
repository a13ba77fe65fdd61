"""GraphRunner without graphs (CPU, eager): stage + replay is the function on the staged inputs."""

import torch

from eaglet.spec.cuda_graph import GraphRunner


def test_disabled_runner_stages_into_static_buffers_and_runs_on_them():
    calls = []

    def fn(a, b):
        calls.append((a.data_ptr(), a.shape[0]))
        return a * 2 + b  # [B, 3]

    runner = GraphRunner(fn, lambda B: [torch.zeros(B, 3), torch.zeros(B, 3)], max_batch=4, enabled=False)
    for B in (3, 1, 4):
        a, b = torch.randn(B, 3), torch.randn(B, 3)
        out = runner.replay(runner.stage(a, b))
        assert torch.equal(out, a * 2 + b)
    # every call read the one set of static buffers (sized for the largest bucket), not the caller's tensors
    assert len({ptr for ptr, _ in calls}) == 1 and [n for _, n in calls] == [3, 1, 4]
    assert torch.equal(runner(a, b), a * 2 + b)  # __call__ without staging still runs the function directly


def test_inputs_staged_in_parts_equal_staged_at_once():
    """The verify stages its draft-independent inputs before the draft ends and the rest after (overlap_split)."""
    fn = lambda a, b, c: a * 100 + b * 10 + c  # [B, 2]
    runner = GraphRunner(fn, lambda B: [torch.zeros(B, 2) for _ in range(3)], max_batch=4, enabled=False)
    a, b, c = (torch.randn(3, 2) for _ in range(3))
    assert runner.stage(a) == 3 and runner.stage(b, c, first=1) == 3
    assert torch.equal(runner.replay(3), fn(a, b, c))
    runner.stage(a, first=2)  # a later part replaces only its own buffers
    assert torch.equal(runner.replay(3), fn(a, b, a))
