"""Helpers shared by the benchmark scripts (run as `python benchmarks/<script>.py`, so this module
is importable as `_common` from the scripts' folder)."""

from __future__ import annotations

import torch
import triton


def bench(fn) -> float:
    """Median microseconds, eager (host launch included), cold L2."""
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def fmt(x, spec: str = ".1f") -> str:
    return "failed" if x is None else format(x, spec)
