"""Triton reductions in an order written out in the source, the same for every tile shape and register layout.

`tl.sum`'s order follows the tensor's layout, which Triton picks from the tile shape and the warp count: a row
reduced in a 16-row tile and in a 128-row one may round differently. The batch-invariant kernels
(kernels/projection.py, kernels/tree_attention_invariant.py) sum with `fixed_sum0` wherever the same logical
reduction runs in tiles of different shapes.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _halve(t, H: tl.constexpr, BM: tl.constexpr):
    """t [2H, BM] -> t[:H] + t[H:] [H, BM] (the halves by logical index): a sum over an axis of two, which every
    layout adds as a + b (IEEE addition commutes), with no layout conversion, at close to a bare tl.sum's speed (the
    folded qkv of SmolLM2-135M at M=1: 4.87 µs, tl.sum 4.81; results/invariant_h200/projection_tuning.md)."""
    return tl.sum(tl.reshape(t, (2, H, BM)), axis=0)


@triton.jit
def fixed_sum0(t, N: tl.constexpr, BM: tl.constexpr):
    """Sum over axis 0 of t [N, BM] (N a power of two, 1..256) -> [BM], pairwise: row i + row i + N/2, then again on
    the half, down to one row."""
    if N >= 256:
        t = _halve(t, 128, BM)
    if N >= 128:
        t = _halve(t, 64, BM)
    if N >= 64:
        t = _halve(t, 32, BM)
    if N >= 32:
        t = _halve(t, 16, BM)
    if N >= 16:
        t = _halve(t, 8, BM)
    if N >= 8:
        t = _halve(t, 4, BM)
    if N >= 4:
        t = _halve(t, 2, BM)
    if N >= 2:
        t = _halve(t, 1, BM)
    return tl.reshape(t, (BM,))


@triton.jit
def _halve1(t, BM: tl.constexpr, H: tl.constexpr):
    """t [BM, 2H] -> t[:, :H] + t[:, H:] [BM, H] (`_halve` along axis 1)."""
    return tl.sum(tl.reshape(t, (BM, 2, H)), axis=1)


@triton.jit
def fixed_sum1(t, BM: tl.constexpr, N: tl.constexpr):
    """Sum over axis 1 of t [BM, N] (N a power of two, 1..256) -> [BM], pairwise as `fixed_sum0`: column j +
    column j + N/2, then again on the half."""
    if N >= 256:
        t = _halve1(t, BM, 128)
    if N >= 128:
        t = _halve1(t, BM, 64)
    if N >= 64:
        t = _halve1(t, BM, 32)
    if N >= 32:
        t = _halve1(t, BM, 16)
    if N >= 16:
        t = _halve1(t, BM, 8)
    if N >= 8:
        t = _halve1(t, BM, 4)
    if N >= 4:
        t = _halve1(t, BM, 2)
    if N >= 2:
        t = _halve1(t, BM, 1)
    return tl.reshape(t, (BM,))
