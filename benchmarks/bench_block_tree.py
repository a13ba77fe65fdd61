"""Block-tree benchmark: eaglet `grow_tree` (Triton, S + 1 launches) vs its torch reference `grow_tree_ref` (a gather,
a batched GEMM, log_softmax and topk a depth), against the read of its inputs once.

    python -m benchmarks.bench_block_tree --md results/block_tree_h200.md
    TRITON_INTERPRET=1 python -m benchmarks.bench_block_tree --smoke     # CPU: the script and the check, tiny shapes

Rows: B requests, the block drafter's vocabularies (SmolLM2's 49,152 ids and an 8,192-id draft vocabulary,
Llama-3.1-8B's 32,000-id draft vocabulary), rank 64, the trees of `kernels/_compile_cases.TREES` with K <= MAX_K.
Floor: dep_out [r, Vd] fp32 once a depth (every request's program reads its columns) and each request's base logits
[S, Vd] fp32, at the measured copy bandwidth. Both in CUDA graphs (how the draft runs). Correctness per row: tokens
and parents equal the reference's.
"""

from __future__ import annotations

import torch

from benchmarks._common import SMOKE_HEADER, fmt, graph_us, kernel_bench_args, provenance, report
from eaglet.kernels._compile_cases import TREES
from eaglet.kernels._utils import copy_bandwidth
from eaglet.kernels.block_tree import MAX_K, grow_tree, grow_tree_ref

VOCABS = (("SmolLM2", 49152, 49152, False), ("SmolLM2 Vd", 49152, 8192, True), ("Llama-3.1-8B Vd", 128256, 32000, True))
BATCHES = (1, 8)
RANK = 64
SMOKE = dict(vocabs=(("tiny", 600, 500, True),), batches=(2,), trees=("eagle2",))


def inputs(B: int, S: int, V: int, Vd: int, d2t: bool, dev: str):
    g = torch.Generator().manual_seed(B * 100 + S)
    base = (3 * torch.randn(B, S, Vd, generator=g)).to(dev)  # [B, S, Vd]
    dep_in = torch.randn(V, RANK, generator=g).to(dev)  # [V, r]
    dep_out = (torch.randn(RANK, Vd, generator=g) / RANK**0.5).to(dev)  # [r, Vd]
    roots = torch.randint(0, V, (B,), generator=g).to(dev)  # [B]
    ids = torch.randperm(V, generator=g)[:Vd].sort().values if d2t else None
    return base, dep_in, dep_out, roots, None if ids is None else (ids - torch.arange(Vd)).to(dev)


def run(B: int, vocab, tree, bw: float | None, dev: str, smoke: bool) -> dict:
    label, V, Vd, has_d2t = vocab
    S, K, K1 = tree.steps, tree.topk, tree.root_children
    args = inputs(B, S, V, Vd, has_d2t, dev)
    got, want = grow_tree(*args[:4], S, K, args[4], K1), grow_tree_ref(*args[:4], S, K, args[4], K1)
    ok = torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
    floor = None if bw is None else S * (RANK + B) * Vd * 4 / bw * 1e6
    return dict(B=B, vocab=f"{label} {Vd}", tree=f"{tree.name} {S}/{K}/{tree.num_draft_tokens}",
                err=0.0 if ok else 1.0,
                eaglet=graph_us(lambda: grow_tree(*args[:4], S, K, args[4], K1), smoke),
                torch=graph_us(lambda: grow_tree_ref(*args[:4], S, K, args[4], K1), smoke), floor=floor)


def table(rows: list[dict]) -> str:
    head = ("| B | vocabulary | tree (steps/top-k/tokens) | eaglet graph µs | torch graph µs | eaglet speedup "
            "| inputs read once µs | equal to the reference |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        e, t = r["eaglet"], r["torch"]
        speedup = t / e if isinstance(e, float) and isinstance(t, float) else "n/a"
        lines.append(f"| {r['B']} | {r['vocab']} | {r['tree']} | {fmt(e)} | {fmt(t)} | {fmt(speedup)} "
                     f"| {'n/a' if r['floor'] is None else fmt(r['floor'])} | {'yes' if r['err'] == 0 else 'NO'} |")
    return "\n".join(lines)


def main() -> None:
    args = kernel_bench_args(__doc__)
    dev = "cpu" if args.smoke else "cuda"
    vocabs = SMOKE["vocabs"] if args.smoke else VOCABS
    batches = SMOKE["batches"] if args.smoke else BATCHES
    trees = [t for t in TREES if t.topk <= MAX_K and (not args.smoke or t.name in SMOKE["trees"])]
    bw = None if args.smoke else copy_bandwidth()
    rows = [run(B, v, t, bw, dev, args.smoke) for v in vocabs for t in trees for B in batches]
    header = (SMOKE_HEADER if args.smoke else
              provenance() + f"CUDA-graph replay µs (do_bench_cudagraph); copy bandwidth {bw / 1e12:.2f} TB/s.\n")
    report(header, table(rows), args.md, rows)


if __name__ == "__main__":
    main()
