"""L2 prefetch: read a weight ahead of the GEMM that needs it, so that the GEMM finds it in the L2 cache.

A decode or verify step of a large model is a chain of weight-streaming GEMMs (HBM-bound) and short
latency-bound kernels (RoPE, attention at a short prefix, norms) during which HBM idles. Issued on a side
stream at the start of such a window, `l2_prefetch` streams the next GEMM's weight (or its first bytes)
from HBM into L2 while the window's kernels run; the GEMM then reads those bytes from L2. The weight is
still read from HBM once per step: the prefetch moves the read off the critical path (the approach of
PRESERVE, arXiv:2501.08192, for weights during collective communication). `models/prefetch.py` places the
windows; the H200's L2 holds 50 MB (Llama-3-8B's o_proj is 33.5 MB).

The kernel loads each 4-byte word of the range once and folds them into one xor checksum per program: the
loads cannot be eliminated, and the result says exactly which bytes were read (the reference is the xor of
the whole range). Plain loads, so the same kernel runs under ROCm Triton (MI300's Infinity Cache).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from eaglet.kernels._utils import is_interpret, use_triton

_BLOCK = 8192  # words per program per iteration: 32 KB in flight per program (8 warps, 8 x 16 B loads a thread)


def _words(t: torch.Tensor, nbytes: int | None) -> torch.Tensor:
    """The first `nbytes` of t (all of it when None), rounded down to whole 4-byte words, as int32 [n]."""
    if not t.is_contiguous():
        raise ValueError(f"t must be contiguous (a weight matrix), got strides {t.stride()}")
    if nbytes is None:
        nbytes = t.numel() * t.element_size()
    if nbytes < 0 or nbytes > t.numel() * t.element_size():
        raise ValueError(f"nbytes={nbytes} must be in [0, {t.numel() * t.element_size()}] (t's size in bytes)")
    raw = t.reshape(-1).view(torch.uint8)[: nbytes // 4 * 4]  # [4n] bytes
    return raw.view(torch.int32)  # [n]


def l2_prefetch_ref(t: torch.Tensor, nbytes: int | None = None) -> torch.Tensor:
    """Torch reference (the spec): the xor of the first `nbytes` of t as int32 words, a 0-d int32 tensor."""
    w = _words(t, nbytes)  # [n]
    acc = torch.zeros((), dtype=torch.int32, device=t.device)
    while w.numel() > 1:  # halving xor fold
        half = w.numel() // 2
        if w.numel() % 2:
            acc ^= w[-1]
        w = w[:half] ^ w[half : 2 * half]  # [n/2]
    return acc ^ w[0] if w.numel() else acc


@triton.jit
def _prefetch_kernel(w_ptr, n, sink_ptr, BLOCK: tl.constexpr, EVICT: tl.constexpr):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    # the programs sweep the range side by side (program p reads blocks p, p + P, ...): each iteration's
    # loads are one contiguous run of P * 32 KB, which is what DRAM pages favour
    for start in range(pid * BLOCK, n, step):
        offs = start + tl.arange(0, BLOCK).to(tl.int64)  # [BLOCK]
        acc ^= tl.load(w_ptr + offs, mask=offs < n, other=0, eviction_policy=EVICT)  # [BLOCK]
    tl.store(sink_ptr + pid, tl.xor_sum(acc, axis=0))


def default_programs(device: torch.device) -> int:
    """One program per SM (or CU): enough loads in flight to stream at HBM speed beside the window's kernels."""
    if device.type == "cpu":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def l2_prefetch(t: torch.Tensor, nbytes: int | None = None, *, out: torch.Tensor | None = None,
                evict_last: bool = True) -> torch.Tensor:
    """Read the first `nbytes` of contiguous t (all of it when None; whole 4-byte words) into the L2 cache.

    Returns the per-program xor checksums, int32 [programs]; their xor is `l2_prefetch_ref(t, nbytes)`.
    `out` (int32 [P], P >= 1) is where they go: P programs, and no allocation (a CUDA graph reuses it).
    `evict_last` marks the lines to stay while the window's other traffic (KV, activations) passes.
    On CPU tensors (outside the interpreter) it returns the reference's checksum: there is no L2 to fill."""
    w = _words(t, nbytes)  # [n]
    if out is not None and (out.dtype != torch.int32 or out.dim() != 1 or out.numel() == 0
                            or out.device != t.device):
        raise ValueError(f"out must be a non-empty int32 [programs] tensor on {t.device}, got "
                         f"{out.dtype} {tuple(out.shape)} on {out.device}")
    if not use_triton(t):
        ref = l2_prefetch_ref(t, nbytes)
        if out is None:
            return ref.reshape(1)  # [1]
        out.zero_()[0] = ref
        return out
    if out is None:
        out = torch.empty(default_programs(t.device), dtype=torch.int32, device=t.device)  # [P]
    evict = "evict_last" if evict_last and not is_interpret() else ""
    _prefetch_kernel[(out.numel(),)](w, w.numel(), out, BLOCK=_BLOCK, EVICT=evict, num_warps=8)
    return out
