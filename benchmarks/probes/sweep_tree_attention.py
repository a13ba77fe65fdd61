"""Tuning sweep of the invariant tree attention's merge block (kernels/tree_attention_invariant.py).

Rows and warps a merge program, optionally under a fixed row tile, on decode and verify cases of both models:

    python -m benchmarks.probes.sweep_tree_attention --md results/invariant_h200/attn_sweep.md [--rows 16]

Per call inside a CUDA graph of 20 calls (`benchmarks._common.bench_graph`), bf16, the inputs of
`bench_tree_attention --invariant` (`attn_inputs`); µs per case and their sum, a row per candidate. A row's bits do
not depend on these (tests/kernels/test_tree_attention.py checks it on the GPU). The leaf length, key tile and merge
block are module constants that fix the arithmetic: not swept here (results/tree_attention_notes.md).
"""

from __future__ import annotations

import argparse
import contextlib

import torch

import eaglet.kernels.tree_attention_invariant as inv
from benchmarks._common import bench_graph, fmt, provenance
from benchmarks.bench_tree_attention import MODELS, attn_inputs
from eaglet.kernels.tree_attention import tree_attention


@contextlib.contextmanager
def invariant_attention_tiles(rows: int | None = None, merge_rows: int | None = None, merge_warps: int | None = None):
    """Run invariant tree attention with this row tile for every call (None: the module's choice per call) and this
    many rows and warps a merge program (None: the module's constants)."""
    saved = inv._inv_rows, inv._INVARIANT_MERGE_ROWS, inv._INVARIANT_MERGE_WARPS
    inv._inv_rows = saved[0] if rows is None else (lambda b_hkv, n, group: rows)
    inv._INVARIANT_MERGE_ROWS = saved[1] if merge_rows is None else merge_rows
    inv._INVARIANT_MERGE_WARPS = saved[2] if merge_warps is None else merge_warps
    inv.prepare.cache_clear()
    try:
        yield
    finally:
        inv._inv_rows, inv._INVARIANT_MERGE_ROWS, inv._INVARIANT_MERGE_WARPS = saved
        inv.prepare.cache_clear()


ATTN_SWEEP_CASES = [(1, 1, 1024), (1, 8, 1024), (8, 1, 1024), (8, 8, 1024), (8, 16, 1024), (1, 8, 4096),
                    (8, 8, 4096)]  # (B, N, L)


def run_attn_sweep(models: list[str], rows: int | None = None) -> str:
    """Invariant tree attention with 1-16 rows a merge program in 4 and 8 warps (the module's constants first): µs per
    case and their sum (rows: every call in row tiles of this many rows; None: the module's choice per call)."""
    cands = [(None, None), (1, 4), (2, 4), (4, 4), (4, 8), (8, 4), (16, 8)]
    cases = [(model, B, N, L) for model in models for B, N, L in ATTN_SWEEP_CASES]
    head = "| merge rows | merge warps | " + " | ".join(f"{m.split('-')[0]} B={B} N={N} L={L}" for m, B, N, L in cases)
    out = [head + " | sum µs |", "|" + "---|" * (len(cases) + 3)]
    inputs = {(m, B, N, L): attn_inputs(B, N, MODELS[m]["Hq"], MODELS[m]["Hkv"], MODELS[m]["D"], L)
              for m, B, N, L in cases}
    for merge_rows, warps in cands:
        ts = []
        with invariant_attention_tiles(rows=rows, merge_rows=merge_rows, merge_warps=warps):
            for key in cases:
                args, bound = inputs[key], key[3] + 64

                def call(i, args=args, bound=bound):
                    return tree_attention(*args, max_prefix_len=bound, invariant=True)
                try:
                    call(0)
                    ts.append(bench_graph(call, 1))
                except Exception as e:  # noqa: BLE001 - a config that does not compile is skipped
                    print(f"    {merge_rows, warps} {key}: {type(e).__name__}", flush=True)
                    ts.append(None)
        total = sum(ts) if all(t is not None for t in ts) else None
        mod = (inv._INVARIANT_MERGE_ROWS, inv._INVARIANT_MERGE_WARPS)
        out.append(f"| {merge_rows or f'{mod[0]} (module)'} | {warps or mod[1]} | "
                   + " | ".join(fmt(t, ".2f") for t in ts) + f" | {fmt(total, '.1f')} |")
        print("  " + out[-1], flush=True)
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--md", default=None, help="also write the table as markdown here")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma list of {','.join(MODELS)}")
    ap.add_argument("--rows", type=int, default=None, choices=inv._INVARIANT_ROWS,
                    help="every call in row tiles of this many rows (default: the module's choice per call)")
    args = ap.parse_args()
    torch.manual_seed(0)
    tiles = f"{args.rows}-row tiles" if args.rows else "the module's row tile per call"
    md = (provenance() + f"bf16, CUDA graphs; {tiles}.\n\n"
          "## Invariant tree attention: rows and warps a merge program\n\n"
          + run_attn_sweep(args.models.split(","), args.rows) + "\n")
    if args.md:
        with open(args.md, "w") as f:
            f.write(md)
    print(md)


if __name__ == "__main__":
    main()
