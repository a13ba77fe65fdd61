"""Probe: what programmatic dependent launch (PDL, Hopper) takes off a chain of decode-sized kernels in a CUDA graph.

    python -m benchmarks.probes.probe_pdl [--md results/probe_pdl_h100.md]

Why: a decode step is launch-bound at B=1. SmolLM2's plain step is ~150 launches in 0.80 ms, the speculative step's
draft phase ~30 launches in ~0.28 ms, against weights that take a few µs to read: most of a launch's 2-4 µs is the
gap where one kernel drains and the next starts. With PDL a kernel may start while the one before it finishes: it
runs what does not depend on it (here: loading its weight tile) and then waits (`gdc_wait`, griddepcontrol.wait)
for the previous kernel's writes. Every kernel of a chain launched with PDL must wait before it reads what the one
before wrote; a kernel that does not is a race.

The chain: L matrix-vector products y_{i+1} = W_i y_i (fp32 accumulation of bf16), alternating [I, H] and [H, I]
weights (SmolLM2's MLP: 576 and 1,536; Llama-3.1-8B's: 4,096 and 14,336), one token, captured in one CUDA graph,
each W_i its own copy (a weight is read from HBM as in a decode step). Variants, each checked equal to the first:
  plain           launched one after another (eaglet's kernels today)
  pdl             launch_pdl=True, gdc_wait first thing
  pdl+prefetch    launch_pdl=True, the weight tile loaded before gdc_wait
  pdl+early       as pdl+prefetch, and gdc_launch_dependents right after the wait (the next kernel may start its
                  prologue during this one's main work)
µs per kernel = graph µs / L. CUDA only (the probe exits elsewhere); Triton's `launch_pdl` launch option.
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from benchmarks._common import fmt, graph_us, provenance

SHAPES = (("SmolLM2-135M MLP", 576, 1536), ("Llama-3.1-8B MLP", 4096, 14336))
VARIANTS = (("plain", False, False, False), ("pdl", True, False, False), ("pdl+prefetch", True, True, False),
            ("pdl+early", True, True, True))


@triton.jit
def _gemv(W, X, Y, N, K, PDL: tl.constexpr, PREFETCH: tl.constexpr, EARLY: tl.constexpr, BLOCK_N: tl.constexpr,
          BLOCK_K: tl.constexpr):
    """y[n] = sum_k W[n, k] x[k] over BLOCK_N rows a program; K a multiple of BLOCK_K (the shapes above)."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    nok = n < N
    k = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    acc = tl.zeros([BLOCK_N], tl.float32)
    if PREFETCH:  # the first weight tile does not depend on the kernel before
        w = tl.load(W + n[:, None] * K + k[None, :], mask=nok[:, None], other=0.0)  # [BLOCK_N, BLOCK_K]
    if PDL:
        gdc_wait()  # the previous kernel's writes (x) are visible after this
        if EARLY:
            gdc_launch_dependents()
    for k0 in range(0, K, BLOCK_K):
        if not PREFETCH or k0 > 0:
            w = tl.load(W + n[:, None] * K + (k0 + k)[None, :], mask=nok[:, None], other=0.0)  # [BLOCK_N, BLOCK_K]
        x = tl.load(X + k0 + k)  # [BLOCK_K]
        acc += tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], 1)  # [BLOCK_N]
    tl.store(Y + n, acc.to(Y.dtype.element_ty), mask=nok)


def chain(ws: list[torch.Tensor], xs: list[torch.Tensor], pdl: bool, prefetch: bool, early: bool) -> None:
    """xs[i + 1] = ws[i] @ xs[i] for each i, one launch each."""
    for i, w in enumerate(ws):
        N, K = w.shape
        _gemv[(triton.cdiv(N, 16),)](w, xs[i], xs[i + 1], N, K, PDL=pdl, PREFETCH=prefetch, EARLY=early,
                                     BLOCK_N=16, BLOCK_K=64, num_warps=2, launch_pdl=pdl)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--md", default=None)
    ap.add_argument("--layers", type=int, default=60, help="kernels in the chain (L)")
    args = ap.parse_args()
    if not torch.cuda.is_available() or torch.version.hip:
        raise SystemExit("probe_pdl: PDL is a CUDA (Hopper and later) feature; no CUDA GPU here")
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for label, H, inter in SHAPES:
        L = args.layers
        ws = [torch.randn((inter, H) if i % 2 == 0 else (H, inter), generator=g, device="cuda", dtype=torch.bfloat16)
              / H**0.5 for i in range(L)]
        first = torch.randn(H, generator=g, device="cuda", dtype=torch.bfloat16)
        want = None
        for name, pdl, prefetch, early in VARIANTS:
            xs = [first] + [torch.empty(w.shape[0], device="cuda", dtype=torch.bfloat16) for w in ws]
            chain(ws, xs, pdl, prefetch, early)
            torch.cuda.synchronize()
            if want is None:
                want = xs[-1].clone()
            ok = torch.equal(xs[-1], want)
            try:
                us = graph_us(lambda xs=xs, pdl=pdl, prefetch=prefetch, early=early: chain(ws, xs, pdl, prefetch,
                                                                                         early), False)
                per = fmt(us / L, ".2f")
            except Exception as e:  # noqa: BLE001 - a capture PDL cannot enter is a result too
                us, per = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:80]}", "-"
            rows.append(f"| {label} | {L} | {name} | {fmt(us)} | {per} | {'yes' if ok else 'NO'} |")
            print(rows[-1], flush=True)
    md = (provenance() + "One token, bf16 weights (one copy a kernel), CUDA-graph replay µs.\n\n"
          "| chain | kernels | variant | graph µs | µs a kernel | equal |\n|---|---|---|---|---|---|\n"
          + "\n".join(rows))
    print(md)
    if args.md:
        with open(args.md, "w") as f:
            f.write(md + "\n")


if __name__ == "__main__":
    main()
