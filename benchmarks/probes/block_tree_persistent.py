"""A candidate version of kernels/block_tree.py for `benchmarks/probes/probe_block_tree.py --alt`, not used by eaglet:
the same `grow_tree` (the same per-level work, `_level`, and outputs; the module doc of kernels/block_tree.py) in
ONE launch instead of S + 1. Its B * NC programs each do their (request, chunk) item of every level, and a grid
barrier (an arrival counter in global memory) stands where a launch boundary stood: level d + 1's merge reads the
partials every chunk of level d wrote, so every program must be past level d first.

Why it may pay: over 8,192 ids a 7/4 tree takes ~60 µs in 8 launches (H100, results/block_drafter_h100/
probe_block_tree_bv.md), ~9 µs a depth against a launch's 2-4 µs of drain and ramp; a barrier is an atomic and a
few polls of one L2 line (~1-2 µs).

Deadlock-free only if all programs are resident at once: `grow_tree` refuses more than MAX_WARPS_PER_SM warps of
them a multiprocessor (8 programs of 2 warps; B=1 over 8,192 ids takes 32 programs, B=8 256; kernels of other
streams beside it finish and make room, none waits on this one). A loop of several items a program would lift that
bound, but it spilled ~500 B a thread on sm_90 (ptxas, triton 3.9) against 24 without it. On CPU
(TRITON_INTERPRET=1: programs run one after another) the levels' items run in one program, G = 1, and the barrier
never waits.
The counter is left at 0 by the last program out (all G have arrived at the exit, so none polls it again), so a
graph replay starts from 0 without a reset launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from eaglet.kernels._utils import use_triton

# _launch_meta: the probe patches it on this module
from eaglet.kernels.block_tree import MAX_K, _launch_meta, _level, grow_tree_ref, level_operands
from eaglet.kernels.build_tree import num_candidates


@triton.jit
def _grid_barrier(CTR, target):
    """Every program's writes before it are visible to every program after it, once `target` arrivals are counted
    (cooperative groups' grid sync: CTA barrier, one release arrival, acquire polls, CTA barrier)."""
    tl.debug_barrier()
    tl.atomic_add(CTR, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(CTR, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = tl.atomic_add(CTR, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _persistent_kernel(BASE, stride_bb, stride_bs, DEP_IN, DEP_OUT, D2T, ROOTS, PMAX, PSUM, PKEY, ST_LP, ST_TOK,
                       ST_FLAT, SCORES, TOKENS, PARENTS, CTR, B, Vd, NC, C, G,
                       S: tl.constexpr, LOOP: tl.constexpr, R: tl.constexpr, K: tl.constexpr, KP: tl.constexpr,
                       HAS_D2T: tl.constexpr, KD: tl.constexpr, RC: tl.constexpr, BLOCK_V: tl.constexpr,
                       BLOCK_C: tl.constexpr, BLOCK_CK: tl.constexpr):
    """Grid (G,): levels 0..S-1 over the B * NC items (request, chunk), a barrier after each; level S (the last
    merge) over the B requests; then the exit arrival. LOOP: program g takes items g, g + G, ... (the interpreter's
    G = 1); else G = B * NC and item g alone."""
    g = tl.program_id(0)
    for level in tl.static_range(S + 1):
        n = B * NC if level < S else B
        if LOOP:
            for item in range(g, n, G):
                _item(item, BASE, stride_bb, stride_bs, DEP_IN, DEP_OUT, D2T, ROOTS, PMAX, PSUM, PKEY, ST_LP, ST_TOK,
                      ST_FLAT, SCORES, TOKENS, PARENTS, level, B, Vd, NC, C, S, R, K, KP, HAS_D2T, KD, RC, BLOCK_V,
                      BLOCK_C, BLOCK_CK)
        elif g < n:
            _item(g, BASE, stride_bb, stride_bs, DEP_IN, DEP_OUT, D2T, ROOTS, PMAX, PSUM, PKEY, ST_LP, ST_TOK,
                  ST_FLAT, SCORES, TOKENS, PARENTS, level, B, Vd, NC, C, S, R, K, KP, HAS_D2T, KD, RC, BLOCK_V,
                  BLOCK_C, BLOCK_CK)
        if level < S:
            _grid_barrier(CTR, G * (level + 1))
    tl.debug_barrier()
    last = tl.atomic_add(CTR, 1, sem="acq_rel", scope="gpu") == G * (S + 1) - 1
    if last:
        tl.atomic_xchg(CTR, 0, sem="relaxed", scope="gpu")


@triton.jit
def _item(item, BASE, stride_bb, stride_bs, DEP_IN, DEP_OUT, D2T, ROOTS, PMAX, PSUM, PKEY, ST_LP, ST_TOK, ST_FLAT,
          SCORES, TOKENS, PARENTS, level: tl.constexpr, B, Vd, NC, C, S: tl.constexpr, R: tl.constexpr,
          K: tl.constexpr, KP: tl.constexpr, HAS_D2T: tl.constexpr, KD: tl.constexpr, RC: tl.constexpr,
          BLOCK_V: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_CK: tl.constexpr):
    """`_level` of one item: (request item // NC, chunk item % NC) below level S, request `item` at the last merge."""
    if level < S:
        _level(tl.zeros([], tl.int64) + item // NC, item % NC, BASE, stride_bb, stride_bs, DEP_IN, DEP_OUT, D2T,
               ROOTS, PMAX, PSUM, PKEY, ST_LP, ST_TOK, ST_FLAT, SCORES, TOKENS, PARENTS, level, B, Vd, NC, C, R, K,
               KP, HAS_D2T, level > 0, level == 1, True, KD, RC, BLOCK_V, BLOCK_C, BLOCK_CK)
    else:
        _level(tl.zeros([], tl.int64) + item, 0, BASE, stride_bb, stride_bs, DEP_IN, DEP_OUT, D2T, ROOTS, PMAX, PSUM,
               PKEY, ST_LP, ST_TOK, ST_FLAT, SCORES, TOKENS, PARENTS, level, B, Vd, NC, C, R, K, KP, HAS_D2T, True,
               level == 1, False, KD, RC, BLOCK_V, BLOCK_C, BLOCK_CK)


_counters: dict[torch.device, torch.Tensor] = {}
# warps a multiprocessor of programs that must be resident at once: 8 programs of 2 warps (sm_90 holds 16 such at
# <= 64 registers a thread, and the kernel takes fewer), which leaves room for whatever runs beside it
MAX_WARPS_PER_SM = 16


def _programs(dev: torch.device, items: int, num_warps: int) -> tuple[int, bool]:
    """(G, LOOP): one program an item on a GPU, where all must be resident (MAX_WARPS_PER_SM); one looping program
    under the interpreter."""
    if dev.type == "cpu":
        return 1, True
    sms = torch.get_device_module(dev).get_device_properties(dev).multi_processor_count
    if items * num_warps > MAX_WARPS_PER_SM * sms:
        raise ValueError(f"{items} programs of {num_warps} warps: at most {MAX_WARPS_PER_SM * sms} warps may wait on "
                         f"each other at a grid barrier here")
    return items, False


def grow_tree(base, dep_in, dep_out, roots, S: int, K: int, d2t=None):
    """kernels/block_tree.grow_tree in one launch (module doc); the same arguments and outputs."""
    B, Vd = roots.shape[0], dep_out.shape[1]
    if K > MAX_K or not use_triton(base, dep_in, dep_out, roots):
        return grow_tree_ref(base, dep_in, dep_out, roots, S, K, d2t)
    dev = roots.device
    meta = _launch_meta(Vd, K, dep_in.shape[1])
    outs, operands, NC = level_operands(base, dep_in, dep_out, roots, S, K, d2t, meta)
    if B == 0:
        return outs
    if dev not in _counters:  # made once, outside any capture; 0 between launches (module doc)
        _counters[dev] = torch.zeros(1, dtype=torch.int32, device=dev)
    G, loop = _programs(dev, B * NC, meta["num_warps"])
    _persistent_kernel[(G,)](*operands, _counters[dev], B, Vd, NC, num_candidates(K, S), G, S=S, LOOP=loop,
                             HAS_D2T=d2t is not None, **meta)
    return outs
