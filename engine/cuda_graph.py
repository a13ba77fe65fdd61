"""CUDA-graph capture of a step function over named static input buffers, one graph per batch bucket.

The buffers are named after the function's parameters (`example_inputs(B)` returns {name: zeros}), and `stage`
fills them by name, so a caller can stage some inputs on one stream and the rest on another. Inputs are copied
into the static buffers' first B rows; the rest are zeroed. Zero is the padding value every eaglet step accepts:
token 0, position 0, page-table row 0 (the dummy page), request row 0 (models/kv_cache.PAD_ROW, whose page-table row
is the dummy page's), so padded rows only write the KV pool's dummy page.

Disabled (eager, CPU), the runner keeps the graph's buffer semantics: `stage` copies into static input buffers,
the function runs on their first B rows, and its outputs are copied into static output buffers (valid until the
next call, as a replay's). The stream plans read the draft's outputs on the plan stream, and that read of a
buffer main writes is where an unsynchronised plan races; eager runs (the CUDA sanitizer's) must make that write
visibly: CSAN sees ATen ops only, not a Triton kernel, and not tensors built from host lists (the torch
references' tree build).
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import torch

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def copy_all(dsts: Sequence[torch.Tensor], srcs: Sequence[torch.Tensor]) -> None:
    """dst.copy_(src) for every pair, in one launch where it can: pairs of one shape and dtype, both dense, are
    copied as bytes by a single multi-tensor kernel (torch._foreach_copy_ on uint8 views), whatever their dtypes;
    the rest one by one. A decode step stages 20-odd inputs, each copy a kernel launch of a few µs on the GPU."""
    fast_dst, fast_src = [], []
    for d, s in zip(dsts, srcs):
        if d.shape == s.shape and d.dtype == s.dtype and d.dim() > 0 and d.is_contiguous() and s.is_contiguous():
            fast_dst.append(d.view(torch.uint8))
            fast_src.append(s.view(torch.uint8))
        else:
            d.copy_(s)
    if fast_dst:
        torch._foreach_copy_(fast_dst, fast_src)


class GraphRunner:
    def __init__(self, fn: Callable[..., torch.Tensor | tuple[torch.Tensor, ...]],
                 example_inputs: Callable[[int], Mapping[str, torch.Tensor]],
                 max_batch: int, enabled: bool, buckets: Sequence[int] = DEFAULT_BUCKETS):
        self.fn = fn
        self.example_inputs = example_inputs  # B -> {fn's parameter: zero-filled input of batch B}, in fn's order
        self.enabled = enabled
        self.buckets = sorted({b for b in buckets if b < max_batch} | {max_batch})
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, dict[str, torch.Tensor], tuple[torch.Tensor, ...]]] = {}
        self._pool = None
        self._eager_out: tuple[torch.Tensor, ...] | None = None  # disabled: the static outputs, max_batch rows

    def bucket(self, B: int) -> int:
        for b in self.buckets:
            if b >= B:
                return b
        raise ValueError(f"batch {B} exceeds the captured maximum {self.buckets[-1]}; raise gen.batch_size")

    def _capture(self, Bp: int):
        static = {name: t.clone() for name, t in self.example_inputs(Bp).items()}
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # warm-up outside the graph: autotuning, allocator, lazy init
            for _ in range(2):
                self.fn(**static)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = self.fn(**static)
        self._pool = graph.pool()
        out = out if isinstance(out, tuple) else (out,)
        self._graphs[Bp] = (graph, static, out)

    def warmup(self) -> None:
        """Capture every bucket now, so no capture lands inside a timed region (a no-op when disabled)."""
        if self.enabled:
            for b in self.buckets:
                if b not in self._graphs:
                    self._capture(b)

    def _static(self, B: int) -> dict[str, torch.Tensor]:
        """The static input buffers B's inputs go to: its bucket's graph (captured on first use), or when
        disabled one set for the largest bucket."""
        Bp = self.bucket(B) if self.enabled else self.buckets[-1]
        if Bp not in self._graphs:
            if self.enabled:
                self._capture(Bp)
            else:
                self._graphs[Bp] = (None, dict(self.example_inputs(Bp)), ())
        return self._graphs[Bp][1]

    def stage(self, **inputs: torch.Tensor) -> int:
        """Copy inputs [B, ...] into the static buffers of their names (the rows past B zeroed for a graph); the
        copies are enqueued on the current stream, so inputs can be staged in parts, on different streams. A buffer
        not named keeps what was staged in it last. Returns B."""
        B = next(iter(inputs.values())).shape[0]
        buffers = self._static(B)
        unknown = sorted(set(inputs) - set(buffers))
        if unknown:
            raise ValueError(f"no static input named {', '.join(unknown)}; this runner's are {', '.join(buffers)}")
        static = [buffers[name] for name in inputs]
        copy_all([dst[:B] for dst in static], list(inputs.values()))
        pads = [dst[B:] for dst in static if dst.shape[0] > B] if self.enabled else []
        if pads:
            torch._foreach_zero_(pads)
        return B

    def replay(self, B: int):
        """Run on the staged inputs, on the current stream: replay B's bucket, or call the function on the
        first B rows. Either way the outputs are views of static buffers, valid until the next call."""
        if not self.enabled:
            return self._to_static(self.fn(**{name: t[:B] for name, t in self._static(B).items()}), B)
        graph, _, out = self._graphs[self.bucket(B)]
        graph.replay()
        res = tuple(o[:B] for o in out)
        return res if len(res) != 1 else res[0]

    def _to_static(self, out, B: int):
        """Eager: copy the outputs [B, ...] into the static output buffers (allocated on first use)."""
        outs = out if isinstance(out, tuple) else (out,)
        if self._eager_out is None:
            self._eager_out = tuple(o.new_empty(self.buckets[-1], *o.shape[1:]) for o in outs)
        res = tuple(dst[:B].copy_(o) for dst, o in zip(self._eager_out, outs))
        return res if len(res) != 1 else res[0]

    def __call__(self, *inputs: torch.Tensor):
        """Stage every input, in the order of the buffers (fn's parameters), and run."""
        if not self.enabled:
            return self._to_static(self.fn(*inputs), inputs[0].shape[0])
        names = list(self._static(inputs[0].shape[0]))
        if len(inputs) != len(names):
            raise ValueError(f"{len(inputs)} inputs for the {len(names)} static inputs {', '.join(names)}")
        return self.replay(self.stage(**dict(zip(names, inputs))))
