"""Block-tree benchmark: eaglet `grow_tree` (Triton: every depth's base top-k, then one program a request over each
node's candidate union) vs its torch reference `grow_tree_ref`, against the read of its inputs once.

    python -m benchmarks.bench_block_tree --md results/block_tree_h200.md
    python -m benchmarks.bench_block_tree --alt _old/kernels/block_tree.py    # beside another version's grow_tree
    TRITON_INTERPRET=1 python -m benchmarks.bench_block_tree --smoke     # CPU: the script and the check, tiny shapes

Rows: B requests, the block drafter's vocabularies (SmolLM2's 49,152 ids and an 8,192-id draft vocabulary,
Llama-3.1-8B's 32,000-id draft vocabulary), rank 64, the trees of `kernels/_compile_cases.TREES` with K <= MAX_K.
Floor: each request's base logits [S, Vd] fp32 once (the top-k reads them all) and, a depth, its K kept nodes'
candidates' dep_rows rows (K x (BASE_TOP + DEP_TOP) x r fp32), at the measured copy bandwidth. Both in CUDA graphs
(how the draft runs). Correctness per row: tokens and parents equal the reference's.
--alt: another version's kernels/block_tree.py timed on the same inputs (the whole-vocabulary kernel of S + 1
launches, whose grow_tree takes dep_out [r, Vd] and no dep_top, is called so), e.g. the A/B of a kernel change;
its trees are its own (not checked here).
"""

from __future__ import annotations

import importlib.util
import inspect

import torch

from benchmarks._common import SMOKE_HEADER, fmt, graph_us, kernel_bench_args, provenance, report
from eaglet.kernels._compile_cases import TREES
from eaglet.kernels._utils import copy_bandwidth
from eaglet.kernels.block_tree import BASE_TOP, DEP_TOP, MAX_K, dependency_top, grow_tree, grow_tree_ref

VOCABS = (("SmolLM2", 49152, 49152, False), ("SmolLM2 Vd", 49152, 8192, True), ("Llama-3.1-8B Vd", 128256, 32000, True))
BATCHES = (1, 8)
RANK = 64
SMOKE = dict(vocabs=(("tiny", 600, 500, True),), batches=(2,), trees=("eagle2",))


def inputs(B: int, S: int, V: int, Vd: int, d2t: bool, dev: str):
    """(base, dep_in, dep_rows, dep_top, roots, d2t offsets) on dev."""
    g = torch.Generator().manual_seed(B * 100 + S)
    base = (3 * torch.randn(B, S, Vd, generator=g)).to(dev)  # [B, S, Vd]
    dep_in = torch.randn(V, RANK, generator=g).to(dev)  # [V, r]
    dep_rows = (torch.randn(Vd, RANK, generator=g) / RANK**0.5).to(dev)  # [Vd, r]
    roots = torch.randint(0, V, (B,), generator=g).to(dev)  # [B]
    ids = torch.randperm(V, generator=g)[:Vd].sort().values if d2t else None
    return (base, dep_in, dep_rows, dependency_top(dep_in, dep_rows), roots,
            None if ids is None else (ids - torch.arange(Vd)).to(dev))


def load_alt(path: str):
    """Another version's kernels/block_tree.py, imported from its file, and a call of its grow_tree on `inputs`."""
    spec = importlib.util.spec_from_file_location("eaglet.kernels._block_tree_alt", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if "dep_top" in inspect.signature(mod.grow_tree).parameters:
        return lambda x, S, K: mod.grow_tree(*x[:5], S, K, x[5])
    last = {}  # the whole-vocabulary kernel's dep_out [r, Vd] of the latest inputs, made at their first (uncaptured)
    # call: `run` calls once before timing

    def call(x, S, K):
        if last.get("rows") is not x[2]:
            last.update(rows=x[2], dep_out=x[2].t().contiguous())
        return mod.grow_tree(x[0], x[1], last["dep_out"], x[4], S, K, x[5])
    return call


def run(B: int, vocab, tree, bw: float | None, dev: str, smoke: bool, alt=None) -> dict:
    label, V, Vd, has_d2t = vocab
    S, K = tree.steps, tree.topk
    x = inputs(B, S, V, Vd, has_d2t, dev)
    got, want = grow_tree(*x[:5], S, K, x[5]), grow_tree_ref(*x[:5], S, K, x[5])
    ok = torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
    gathered = S * K * (min(BASE_TOP, Vd) + min(DEP_TOP, Vd)) * RANK  # dep_rows elements a request's tree reads
    floor = None if bw is None else B * (S * Vd + gathered) * 4 / bw * 1e6
    if alt is not None:
        alt(x, S, K)  # compiled before capture
    return dict(B=B, vocab=f"{label} {Vd}", tree=f"{tree.name} {S}/{K}/{tree.num_draft_tokens}",
                err=0.0 if ok else 1.0,
                eaglet=graph_us(lambda: grow_tree(*x[:5], S, K, x[5]), smoke),
                torch=graph_us(lambda: grow_tree_ref(*x[:5], S, K, x[5]), smoke), floor=floor,
                alt=None if alt is None else graph_us(lambda: alt(x, S, K), smoke))


def table(rows: list[dict]) -> str:
    alt = any(r["alt"] is not None for r in rows)
    head = ("| B | vocabulary | tree (steps/top-k/tokens) | eaglet graph µs | torch graph µs | eaglet speedup "
            + ("| --alt graph µs " if alt else "") + "| inputs read once µs | equal to the reference |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        e, t = r["eaglet"], r["torch"]
        speedup = t / e if isinstance(e, float) and isinstance(t, float) else "n/a"
        lines.append(f"| {r['B']} | {r['vocab']} | {r['tree']} | {fmt(e)} | {fmt(t)} | {fmt(speedup)} "
                     + (f"| {fmt(r['alt'])} " if alt else "")
                     + f"| {'n/a' if r['floor'] is None else fmt(r['floor'])} | {'yes' if r['err'] == 0 else 'NO'} |")
    return "\n".join(lines)


def main() -> None:
    args = kernel_bench_args(__doc__, alt="another version's kernels/block_tree.py, timed beside")
    dev = "cpu" if args.smoke else "cuda"
    vocabs = SMOKE["vocabs"] if args.smoke else VOCABS
    batches = SMOKE["batches"] if args.smoke else BATCHES
    trees = [t for t in TREES if t.topk <= MAX_K and (not args.smoke or t.name in SMOKE["trees"])]
    bw = None if args.smoke else copy_bandwidth()
    alt = load_alt(args.alt) if args.alt else None
    rows = [run(B, v, t, bw, dev, args.smoke, alt) for v in vocabs for t in trees for B in batches]
    header = (SMOKE_HEADER if args.smoke else
              provenance() + f"CUDA-graph replay µs (do_bench_cudagraph); copy bandwidth {bw / 1e12:.2f} TB/s.\n")
    report(header, table(rows), args.md, rows)


if __name__ == "__main__":
    main()
