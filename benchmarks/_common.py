"""Helpers shared by the benchmark scripts (run as `python benchmarks/<script>.py`, so this module
is importable as `_common` from the scripts' folder)."""

from __future__ import annotations

import torch
import triton


def bench(fn) -> float:
    """Median microseconds, eager (host launch included), cold L2."""
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def copy_bandwidth(device="cuda") -> float:
    """Measured device-to-device copy bandwidth in bytes/s, counting read + write (1 GiB buffers)."""
    src = torch.empty(2**30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * src.numel() / (bench(lambda: dst.copy_(src)) * 1e-6)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def fmt(x, spec: str = ".1f") -> str:
    return "failed" if x is None else format(x, spec)
