"""Where a decoder block prefetches its projection weights into L2 (`kernels/prefetch.py`), and on which stream.

Each projection has a window of latency-bound kernels before it, in which HBM idles:

    qkv      the input norm (with its residual add)
    o_proj   RoPE + K/V store, tree attention and its split merge
    gate_up  the post-attention norm
    down     silu_and_mul

(only o_proj's window exists where the norms are fused into the projections: one token, invariant numerics).

`fork(name, weight)` starts the prefetch of the first `fractions[name]` of the weight's bytes on a side
stream once the main stream's work so far is done (the previous GEMM, whose weight traffic it would
otherwise compete with); `join()` makes the main stream wait for it before the projection. Both are
captured by CUDA graphs as a fork and a join of the graph. A fraction of 0 (the default) does nothing: no
stream, no launch. Prefetching changes no value the model computes, only where the GEMM finds its bytes.
"""

from __future__ import annotations

import torch

from eaglet.kernels.prefetch import default_programs, l2_prefetch

WINDOWS = ("qkv", "o_proj", "gate_up", "down")


class WeightPrefetch:
    def __init__(self, fractions: dict[str, float] | None = None, device: torch.device | str = "cpu",
                 programs: int | None = None):
        fractions = dict(fractions or {})
        for name, f in fractions.items():
            if name not in WINDOWS:
                raise ValueError(f"weight_prefetch.{name}: unknown projection; choose among {', '.join(WINDOWS)}")
            if not 0.0 <= float(f) <= 1.0:
                raise ValueError(f"weight_prefetch.{name}={f}: a fraction of the weight's bytes, in [0, 1]")
        self.fractions = {k: float(v) for k, v in fractions.items() if float(v) > 0}
        self.device = torch.device(device)
        self._mod = torch.get_device_module(self.device)
        self._stream = self._mod.Stream(self.device) if self.fractions else None
        programs = programs or default_programs(self.device)
        self._sink = (torch.empty(programs, dtype=torch.int32, device=self.device)
                      if self.fractions else None)  # [programs]: the checksums nobody reads
        self._pending = False

    def fork(self, name: str, weight: torch.Tensor) -> None:
        f = self.fractions.get(name)
        if f is None:
            return
        self._stream.wait_stream(self._mod.current_stream(self.device))
        with self._mod.stream(self._stream):
            l2_prefetch(weight, int(weight.numel() * weight.element_size() * f), out=self._sink)
        self._pending = True

    def join(self) -> None:
        if self._pending:
            self._mod.current_stream(self.device).wait_stream(self._stream)
            self._pending = False


NO_PREFETCH = WeightPrefetch()
