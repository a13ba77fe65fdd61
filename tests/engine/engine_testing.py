"""What the engine tests share (imported as `engine_testing`, like tests/kernels/kernel_testing.py; the `target`
fixture over `oracle_target` is in conftest.py): a small random target whose greedy continuation an oracle-like
head can predict, the trees and prompts the tests decode, plain decoding's outputs to compare with, and a counter of
the launches an engine runs between its graphs."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from eaglet.engine.autoregressive import AREngine
from eaglet.engine.cuda_graph import GraphRunner
from eaglet.engine.requests import Request
from eaglet.engine.speculative import TreeSpec
from eaglet.models.head_checkpoint import new_draft_head
from eaglet.models.kv_cache import KVCache
from eaglet.models.llama import ModelArgs, Transformer

TREES = {"chain": TreeSpec(4, 1, 5), "eagle2": TreeSpec(4, 3, 8)}
ARGS = ModelArgs(family="llama", vocab_size=256, dim=128, n_layers=8, n_heads=2, n_kv_heads=1, head_dim=64,
                 intermediate_size=256, rope_theta=10000.0, max_seq_len=512)
PROMPTS = [[5, 17, 33, 2, 9], list(range(40, 63)), [100], [7, 7, 7, 8, 8, 8, 200, 1, 3]]


def oracle_target() -> Transformer:
    """A random target whose greedy next token is mostly a fixed function of the current token
    (attention and MLP scaled down), with enough context dependence that attention still decides
    some tokens: an oracle-like head then accepts deep paths, and a wrong verify shows."""
    torch.manual_seed(0)
    model = Transformer(ARGS).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(0.5)
            layer.mlp.down_proj.weight.mul_(0.2)
    return model


def oracle_like(kind, target, num_layers=None):
    """A head that predicts 'the target's next token after the token it is given': fc passes the
    embedding through, the layer adds a small perturbation (so it is sometimes wrong)."""
    head = new_draft_head(kind, target, num_layers=num_layers, dtype=target.dtype, device=target.device)
    H = target.args.dim
    with torch.no_grad():
        for layer in getattr(head, "layers", []):
            fc = layer.fc if hasattr(layer, "fc") else head.fc
            fc.weight.zero_()
            fc.weight[:, :H] = torch.eye(H)
            if fc.bias is not None:
                fc.bias.zero_()
            for p in (layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight):
                p.mul_(0.3)
    return head


def oracle_block(target, block_size=5):
    """A block drafter whose dependency term is the target's LM head over the parent's embedding (scaled up to
    dominate the random forward): it proposes 'the target's next token after the parent', as `oracle_like`."""
    H = target.args.dim
    head = new_draft_head("block", target, num_layers=1, block_size=block_size, dep_rank=H, dtype=target.dtype,
                          device=target.device)
    with torch.no_grad():
        head.dep_in.weight.copy_(torch.eye(H))
        head.dep_out.weight.copy_(4 * target.lm_head.weight)
    return head


def ar_outputs(target, prompts, max_new, use_cuda_graph=None):
    """Plain greedy decoding's output ids, one list per prompt."""
    kv = KVCache.for_model(target.args, max_reqs=len(prompts), max_context=256, page_size=8, dtype=target.dtype,
                           device=target.device)
    reqs = [Request(p, max_new, rid=i) for i, p in enumerate(prompts)]
    AREngine(target, kv, len(prompts), use_cuda_graph=use_cuda_graph).generate(reqs)
    return [r.output_ids for r in reqs]


class LaunchCount(TorchDispatchMode):
    """On a CPU, the ops a GPU would launch as kernels (not views or allocations), by name, appended to `windows[-1]`
    while the mode is on, except inside what `hidden` wraps (a graph's function: its ops are the graph's, not the
    host loop's)."""

    NOT_KERNELS = ("empty", "empty_strided", "detach", "alias")

    def __init__(self):
        super().__init__()
        self.windows: list[list[str]] = [[]]
        self.inside = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not self.inside and not func.is_view and name not in self.NOT_KERNELS:
            self.windows[-1].append(name)
        return func(*args, **(kwargs or {}))

    def hidden(self, fn, label: str | None = None, new_window: bool = False):
        """fn with its ops not counted; `label`: counted as one launch of that name (a Triton kernel on a GPU);
        `new_window`: each call starts a new window (e.g. a decode step's)."""
        def run(*a, **k):
            if new_window:
                self.windows.append([])
            if label and not self.inside:
                self.windows[-1].append(label)
            self.inside += 1
            try:
                return fn(*a, **k)
            finally:
                self.inside -= 1
        return run



def as_graph(monkeypatch) -> None:
    """Eager runs with a captured graph's batch (for the CPU, where graphs are off): inputs staged into their bucket's
    buffers, the rows past B zero-filled (token 0, position 0, request row 0, as cuda_graph.py stages them), and the
    function run over the whole bucket, as a replay runs it. The runner's own eager mode runs the first B rows only,
    so a bucket's padding is never exercised on the CPU otherwise."""
    def stage(self, **inputs):
        B = next(iter(inputs.values())).shape[0]
        Bp = self.bucket(B)
        if Bp not in self._graphs:
            self._graphs[Bp] = (None, {n: t.clone() for n, t in self.example_inputs(Bp).items()}, ())
        buffers = self._graphs[Bp][1]
        for name, t in inputs.items():
            buffers[name][:B].copy_(t)
            buffers[name][B:].zero_()
        return B

    def replay(self, B):
        out = self.fn(**self._graphs[self.bucket(B)][1])
        res = tuple(o[:B] for o in (out if isinstance(out, tuple) else (out,)))
        return res if len(res) != 1 else res[0]

    def call(self, *inputs):
        return replay(self, stage(self, **dict(zip(self.example_inputs(1), inputs))))

    monkeypatch.setattr(GraphRunner, "stage", stage)
    monkeypatch.setattr(GraphRunner, "replay", replay)
    monkeypatch.setattr(GraphRunner, "__call__", call)
