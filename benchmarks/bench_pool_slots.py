"""Pool-slots benchmark: eaglet `pool_slots` (Triton, one launch) vs its torch reference `pool_slots_ref` (the five
to seven small ops that `slots_for` was), and `step_slots` (a drafter step's page table, positions and slots in one
launch) vs `step_slots_ref` (the row gather, the add, the mask and the reference slots), against reading their
inputs and writing their outputs once.

    python -m benchmarks.bench_pool_slots --md results/pool_slots_h100.md
    TRITON_INTERPRET=1 python -m benchmarks.bench_pool_slots --smoke     # CPU: the script and the check, tiny shapes

Rows: B requests x T positions a request, the shapes a decode step asks for (a drafter's update, 8; a verify tree,
64; a 1k-token prefill), with and without a mask (the masked stores of a padded prefill or a cut path). Both in CUDA
graphs (how a step runs). step_slots rows: a drafter's block (T = 8) or path (T = S + 1 = 8, with the
accept-index mask), B requests of 4k-token page tables. Correctness per row: equal to the reference.
"""

from __future__ import annotations

import torch

from benchmarks._common import SMOKE_HEADER, fmt, graph_us, kernel_bench_args, provenance, report
from eaglet.kernels._utils import copy_bandwidth
from eaglet.kernels.kv_ops import pool_slots, pool_slots_ref, step_slots, step_slots_ref

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


def run_step(B: int, T: int, masked: bool, bw: float | None, dev: str, smoke: bool) -> dict:
    """step_slots against its reference: B of 2B request rows, 4k-token page tables."""
    gen = torch.Generator().manual_seed(B * 1000 + T)
    P = -(-4096 // PAGE)
    req_to_page = torch.randperm(2 * B * P + 1, generator=gen)[: 2 * B * P].view(2 * B, P).int().to(dev)  # [2B, P]
    rows = torch.randperm(2 * B, generator=gen)[:B].to(dev)  # [B]
    seq_lens = torch.randint(0, P * PAGE - T, (B,), generator=gen).int().to(dev)  # [B]
    lens = torch.randint(1, T + 1, (B,), generator=gen)  # [B]
    index = torch.where(torch.arange(T) < lens[:, None], torch.arange(T), -1).to(dev) if masked else None  # [B, T]
    args = (req_to_page, rows, seq_lens, T, PAGE, index)
    equal = all(torch.equal(a, b) for a, b in zip(step_slots(*args), step_slots_ref(*args)))
    moved = B * (P * 4 * 2 + T * (8 + 4 + 8 + 8 + (8 if masked else 0)))  # the tables in and out, per position
    return dict(B=B, T=T, masked=masked, err=0.0 if equal else 1.0,
                eaglet=graph_us(lambda: step_slots(*args), smoke), torch=graph_us(lambda: step_slots_ref(*args), smoke),
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
    steps = [run_step(B, 8, masked, bw, dev, args.smoke) for B in ((2,) if args.smoke else (1, 8, 64))
             for masked in (False, True)]
    header = (SMOKE_HEADER if args.smoke else
              provenance() + f"CUDA-graph replay µs (do_bench_cudagraph); copy bandwidth {bw / 1e12:.2f} TB/s.\n")
    report(header, table(rows) + "\n\nstep_slots (page table, positions, slots; mask: an accept index)\n\n" +
           table(steps), args.md, rows + steps)


if __name__ == "__main__":
    main()
