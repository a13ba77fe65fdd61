"""Pool-slots benchmark: eaglet `pool_slots` (Triton, one launch) vs its torch reference `pool_slots_ref` (the five
to seven small ops that `slots_for` was), against reading its inputs and writing its output once.

    python -m benchmarks.bench_pool_slots --md results/pool_slots_h100.md
    TRITON_INTERPRET=1 python -m benchmarks.bench_pool_slots --smoke     # CPU: the script and the check, tiny shapes

Rows: B requests x T positions a request, the shapes a decode step asks for (a drafter's update, 8; a verify tree,
64; a 1k-token prefill), with and without a mask (the masked stores of a padded prefill or a cut path). Both in CUDA
graphs (how a step runs). Correctness per row: equal to the reference.
"""

from __future__ import annotations

import torch

from benchmarks._common import SMOKE_HEADER, fmt, graph_us, kernel_bench_args, provenance, report
from eaglet.kernels._utils import copy_bandwidth
from eaglet.kernels.kv_ops import pool_slots, pool_slots_ref

SHAPES = ((1, 8), (8, 8), (64, 8), (1, 64), (8, 64), (8, 1024))  # (B, T)
PAGE = 16
SMOKE = dict(shapes=((2, 8),))


def run(B: int, T: int, masked: bool, bw: float | None, dev: str, smoke: bool) -> dict:
    gen = torch.Generator().manual_seed(B * 10000 + T)
    P = -(-4096 // PAGE)  # 4k-token requests
    page_table = torch.randperm(B * P + 1, generator=gen)[: B * P].view(B, P).int().to(dev)  # [B, P]
    positions = torch.randint(0, P * PAGE, (B, T), generator=gen).to(dev)  # [B, T] int64
    valid = (torch.rand(B, T, generator=gen) < 0.8).to(dev) if masked else None  # [B, T]
    got, want = pool_slots(page_table, positions, PAGE, valid), pool_slots_ref(page_table, positions, PAGE, valid)
    moved = B * T * (8 + 4 + 8 + (1 if masked else 0))  # positions, a page-table entry, the slot, the mask
    return dict(B=B, T=T, masked=masked, err=0.0 if torch.equal(got, want) else 1.0,
                eaglet=graph_us(lambda: pool_slots(page_table, positions, PAGE, valid), smoke),
                torch=graph_us(lambda: pool_slots_ref(page_table, positions, PAGE, valid), smoke),
                floor=None if bw is None else moved / bw * 1e6)


def table(rows: list[dict]) -> str:
    head = ("| B | T | mask | eaglet graph µs | torch graph µs | eaglet speedup | bytes once µs | equal to the "
            "reference |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        e, t = r["eaglet"], r["torch"]
        speedup = t / e if isinstance(e, float) and isinstance(t, float) else "n/a"
        lines.append(f"| {r['B']} | {r['T']} | {'yes' if r['masked'] else 'no'} | {fmt(e)} | {fmt(t)} | "
                     f"{fmt(speedup)} | {'n/a' if r['floor'] is None else fmt(r['floor'])} | "
                     f"{'yes' if r['err'] == 0 else 'NO'} |")
    return "\n".join(lines)


def main() -> None:
    args = kernel_bench_args(__doc__)
    dev = "cpu" if args.smoke else "cuda"
    shapes = SMOKE["shapes"] if args.smoke else SHAPES
    bw = None if args.smoke else copy_bandwidth()
    rows = [run(B, T, masked, bw, dev, args.smoke) for B, T in shapes for masked in (False, True)]
    header = (SMOKE_HEADER if args.smoke else
              provenance() + f"CUDA-graph replay µs (do_bench_cudagraph); copy bandwidth {bw / 1e12:.2f} TB/s.\n")
    report(header, table(rows), args.md, rows)


if __name__ == "__main__":
    main()
