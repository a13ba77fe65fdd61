"""The launch table of kernels/projection.py's `_proj_kernel`: the one place its launch configs come from.

    launch_config(N, K, M, epi, dtype, device, head_dim=64, two=False, norm=0) -> the kernel's meta-parameters

A weight [N, K]'s reduction plan (SPLITS ranges of SPLIT_K columns, the K tile BLOCK_K: what fixes an output
element's order) is a function of the weight's shape and dtype only (`_config`); the row count M picks the tiles
only (`_table`, `_prefill_tiles`), which a row's bits do not depend on (kernels/projection.py's module doc). The
sweeps behind these rules, with every number they measured: results/invariant_h200/projection_tuning.md.
"""

from __future__ import annotations

import torch
import triton

from eaglet.kernels._utils import is_hip, sm_count

_PLAIN, _ADD, _SILU, _ROPE = 0, 1, 2, 3  # the epilogue

# rows up to which the split-K grid runs (decode, verify: B=8 x 16 tree tokens is 128); above, the prefill tiles,
# whose grid of 128 x 128 tiles leaves most SMs idle at these rows (SmolLM2's layer at 128 rows:
# 22.7 µs on the split-K grid, 50.3 in prefill tiles; results/invariant_h200/projection_tuning.md)
MAX_SPLIT_M = 256


def _config(N: int, K: int, epi: int, dtype: torch.dtype, sms: int, hip: bool) -> dict:
    """The reduction plan and tiles of an [N, K] weight (K: one input's columns): a function of the weight's shape and
    dtype only, never of M. SPLITS doubles (up to 16) while the doubled grid of 64-row tiles still fits one wave of
    one program per SM and each split keeps at least 384 columns: more splits than one wave holds cost more in their
    reduction than they gain (the 8B's o: 2 splits 11.8 µs, 8 splits 15.0; results/invariant_h200/sweep.md).
    BLOCK_N = 64 (the RoPE epilogue's tile holds 32 rotary pairs of one head)."""
    wide = dtype.itemsize == 2 and K >= 1024
    block_k = 128 if wide or K >= 128 else 64
    tiles = triton.cdiv(N, 64)
    splits = 1
    while splits < 16 and 2 * tiles * splits <= sms and K // (2 * splits) >= 384:
        splits *= 2
    split_k = triton.cdiv(triton.cdiv(K, splits), block_k) * block_k
    cfg = dict(BLOCK_N=64, BLOCK_K=block_k, SPLITS=triton.cdiv(K, split_k), SPLIT_K=split_k)
    if hip:  # MI300: compiled and resource-checked only (PORTABILITY.md); 2 stages as in tutorial 06's AMD entries
        return dict(cfg, num_warps=4, num_stages=2, waves_per_eu=2)
    return dict(cfg, num_warps=4, num_stages=4 if dtype.itemsize == 2 else 2)


# MI300, 64-row x tiles: in 4 waves they reach the 256 VGPRs that waves_per_eu=2 allows (an EAGLE-3 two-input qkv
# spilled 6-43 VGPRs); in 8 waves they take 128-220
_HIP_WARPS_64 = 8


def _prefill_tiles(cfg: dict, N: int, M: int, epi: int, norm: int, head_dim: int, dtype: torch.dtype, sms: int,
                   hip: bool, two: bool = False) -> dict:
    """More than MAX_SPLIT_M rows (prefill, compute-bound): one program per (weight tile, x tile) that loops over the
    plan's splits in their order, or, for a weight of long splits and no norm, the split-K grid in the same tiles (one
    program a split, one accumulator; the last to arrive adds the partials in split order; their fp32 traffic, 8
    bytes an output a split, is small beside a split's 2,048 or more multiply-adds an output). Each row's sum of
    squares comes from `_sumsq_kernel` in the plan's lanes (SUMSQ_K), so the K loop keeps none and its MMA's K tile
    is free: 64, in 4 stages (a chain of the same k16 MMAs as the plan's 128; tests/kernels/test_projection.py checks
    the rows' bits). sm_90 (bf16 / fp16), 8 warps: the first tile of (weight rows x rows) 128 x 256, 128 x 128,
    64 x 256, 64 x 128 that
      * keeps a RoPE tile within a head (64 weight rows at head_dim 64);
      * takes 256 rows only with one accumulator (one split or the split-K grid: a looped split's chain from zero
        lives beside the running sum, a second input's sum beside the first's) and, at 128 weight rows, with x left
        in shared memory (x * g, NORM 2, spilled; so did the RoPE epilogue, 716 B a thread in the 8B's qkv);
      * has at least half as many programs as the GPU has SMs (SmolLM2's o at 2,048 rows: 40 of 128 x 256);
    else the tile of the most programs; 3 stages at 64 x 256 (the sweep's choices: the 8B's gate_up 874 µs in
    128 x 256 against 1,036 in 128 x 128; results/invariant_h200/prefill_tiles_sweep.md). MI300: 64 weight rows x
    64 x rows (32 with two inputs: two accumulators) in 8 waves, 2 stages, the plan's K tile. fp32: 64 x 64 rows,
    4 warps."""
    if hip:
        return dict(cfg, BLOCK_M=32 if two else 64, num_warps=_HIP_WARPS_64, num_stages=2, IN_PROGRAM=True)
    if dtype.itemsize == 4:
        return dict(cfg, BLOCK_M=64, num_warps=4, num_stages=2, IN_PROGRAM=True)
    grid = cfg["SPLITS"] > 1 and not two and norm == 0 and cfg["SPLIT_K"] >= 2048
    one_acc = grid or (cfg["SPLITS"] == 1 and not two)
    splits = cfg["SPLITS"] if grid else 1
    tiles = [(bn, bm) for bn, bm in ((128, 256), (128, 128), (64, 256), (64, 128))
             if not (epi == _ROPE and head_dim % bn)
             and (bm == 128 or (one_acc and (bn == 64 or (norm < 2 and epi != _ROPE))))]
    programs = [triton.cdiv(N, bn) * triton.cdiv(M, bm) * splits for bn, bm in tiles]
    full = [t for t, n in zip(tiles, programs) if 2 * n >= sms]
    block_n, block_m = full[0] if full else tiles[programs.index(max(programs))]
    return dict(cfg, BLOCK_N=block_n, BLOCK_M=block_m, BLOCK_K=64, SUMSQ_K=cfg["BLOCK_K"], num_warps=8,
                num_stages=3 if (block_n, block_m) == (64, 256) else 4, IN_PROGRAM=not grid)


def _table(N: int, K: int, M: int, epi: int, dtype: torch.dtype, sms: int, hip: bool, head_dim: int = 64,
           two: bool = False, norm: int = 0) -> dict:
    """The config of a call on a GPU of `sms` SMs (CUs), AMD's when `hip`, with a second input when `two`, NORM
    `norm` (the larger of two inputs'; only the prefill tiles depend on it). Up to 16 rows one 16-row x tile (each
    weight tile read by one program per split); for 17-MAX_SPLIT_M rows the smallest x tile (of 16 / 32 / 64 rows)
    whose grid still fits one wave (the programs of a weight tile then read it once from HBM and again from L2:
    SmolLM2's qkv at 64 rows 5.33 µs in 16-row tiles, 9.73 in one 64-row tile; results/invariant_h200/rows64.md),
    and 128-row weight tiles where none does (past 64 rows with 128-row x tiles where their grid fills a wave)."""
    cfg = _config(N, K, epi, dtype, sms, hip)
    if M > MAX_SPLIT_M:
        return _prefill_tiles(cfg, N, M, epi, norm, head_dim, dtype, sms, hip, two)
    block_m = 16 if M <= 16 else 32 if M <= 32 else 64
    if block_m > 16:
        grid = triton.cdiv(N, cfg["BLOCK_N"]) * cfg["SPLITS"] * (2 if two else 1)  # programs per x tile
        fits = [bm for bm in (16, 32, 64) if bm <= block_m and triton.cdiv(M, bm) * grid <= sms]
        if fits:
            block_m = fits[0]
        elif not hip and dtype.itemsize == 2 and not (epi == _ROPE and head_dim % 128):
            # a grid past one wave in every tile (LM heads, the 8B's gate_up; past 64 rows also its qkv, o, down):
            # 128 weight rows a program, so that its x tile is at most its weight tile, in 48 KB stages at 64 rows
            # (MI300's 64 KB of LDS holds no two; fp32 doubles them), one stage fewer where K is under 8 tiles
            # (the 8B's LM head at 32 rows 248 µs against 262 in 64-row weight tiles:
            # results/invariant_h200/tiles_32_64.md). Past 64 rows a 128-row x tile where its grid still fills a
            # wave (each weight tile read once a split, not twice), in 3 stages of 64 KB (the 8B's gate_up at 128
            # rows 92.6 µs against 115.8 in 64-row x tiles: results/invariant_h200/rows128_sweep.md)
            stages = (3 if block_m == 32 else 4) - (K < 8 * cfg["BLOCK_K"])
            if M > 64 and triton.cdiv(N, 128) * cfg["SPLITS"] * (2 if two else 1) >= sms:
                block_m, stages = 128, 3
            cfg = dict(cfg, BLOCK_N=128, num_warps=4 if block_m == 32 else 8, num_stages=stages)
    if hip and block_m == 64:
        cfg = dict(cfg, num_warps=_HIP_WARPS_64)
    if not hip and M <= 16 and dtype.itemsize == 2 and triton.cdiv(N, 64) * cfg["SPLITS"] <= sms:
        # a grid within one wave: each program streams a long slab, and 5 stages of 20 KB keep more of it in flight
        # (the 8B's qkv 16.0 µs, in 4 stages 16.6; results/invariant_h200/sweep.md); with more programs than SMs, 4
        cfg = dict(cfg, num_stages=5)
    return dict(cfg, BLOCK_M=block_m, IN_PROGRAM=False)


def launch_config(N: int, K: int, M: int, epi: int, dtype: torch.dtype, device: torch.device,
                  head_dim: int = 64, two: bool = False, norm: int = 0) -> dict:
    """The config a call runs with on `device` (public for the benchmarks): `_table` at its SM count."""
    sms = sm_count(device.index or 0) if device.type == "cuda" else 8  # the interpreter: few SMs, still splits
    return _table(N, K, M, epi, dtype, sms, is_hip(), head_dim, two, norm)
