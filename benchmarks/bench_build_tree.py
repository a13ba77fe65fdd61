"""Tree-build benchmark: eaglet `build_tree` (Triton) vs its reference vs the HBM floor.

    python -m benchmarks.bench_build_tree --md results/build_tree_h200.md
    TRITON_INTERPRET=1 python -m benchmarks.bench_build_tree --smoke     # CPU: the script and the check, tiny shapes

Rows: B requests, the trees eaglet runs (`kernels/_compile_cases.TREES`: conf/tree's and the EAGLE-2 paper's, steps S
/ top-k K / N draft tokens), each mask format N allows (QLEN_ONLY: what `tree_attention` reads; BITPACKED for N <= 32;
FULL with 1k-token prefixes), candidates from `random_candidates` (trees that really branch).
  * eaglet: `build_tree` (kernels/build_tree.py, one launch); do_bench median (cold L2) and a CUDA-graph replay (how
    the decode step runs).
  * reference: `build_tree_ref`, the pure-Python spec the tests compare against, on the CPU copies: what a step
    costs without the kernel (the engine's CPU path).
  * HBM floor: the candidates read and the tree written, once / measured device-to-device copy bandwidth
    (`copy_bandwidth`); the kernel is a few µs of launch and dependent latency far above it.
Correctness per row: every output equals the reference's exactly ("matches").
A second table: `build_tree_pair` (a tree and its widened fallback, engine/drafter.py, from one launch) against
`build_tree` twice, both CUDA-graph replays, at the drafters' widened shapes (`trie_graft.launched_shapes`).
--smoke runs on CPU under TRITON_INTERPRET=1 (the kernel in Triton's interpreter): its times are the
interpreter's, not a GPU's; it proves that the script and the check run.
"""

from __future__ import annotations

import torch

from benchmarks._common import SMOKE_HEADER, fmt, graph_us, kernel_bench_args, provenance, report, timed
from eaglet.kernels._compile_cases import TREES
from eaglet.kernels._utils import copy_bandwidth
from eaglet.kernels.build_tree import build_tree, build_tree_pair, build_tree_ref, num_candidates, random_candidates
from eaglet.kernels.trie_graft import launched_shapes

BATCHES = (1, 8, 64)
PREFIX = (100, 2000)  # seq_lens drawn from [100, 2000)
SMOKE = dict(batches=(2,), trees=("chain", "eagle2"))


def formats(N: int) -> list[str]:
    return ["qlen_only"] + (["bitpacked"] if N <= 32 else []) + ["full"]


def run(B: int, tree, fmt_name: str, dev: str, bw: float | None, smoke: bool) -> dict:
    S, K, N, K1 = tree.steps, tree.topk, tree.num_draft_tokens, tree.root_children
    gen = torch.Generator().manual_seed(B * 1000 + N)
    scores, tokens, parents = random_candidates(B, K, S, 4096, gen, root_children=K1)  # [B, C] each
    roots = torch.randint(0, 4096, (B,), generator=gen)  # [B]
    seq_lens = torch.randint(*PREFIX, (B,), generator=gen).int()  # [B]
    # FULL is sized by the host int seq_lens_sum
    extra = dict(seq_lens_sum=int(seq_lens.sum())) if fmt_name == "full" else {}
    extra["root_children"] = K1
    host = (scores, tokens, parents, roots, seq_lens)
    inputs = [t.to(dev) for t in host]
    got = build_tree(*inputs, N, K, S, fmt_name, **extra)
    want = build_tree_ref(*host, N, K, S, fmt_name, **extra)
    ok = all(torch.equal(g.cpu(), w) for g, w in zip(got, want))
    moved = sum(t.numel() * t.element_size() for t in (*host, *want))  # bytes read + written
    r = dict(B=B, tree=f"{tree.name} {S}/{K}/{N}", fmt=fmt_name, C=num_candidates(K, S, K1), err=0.0 if ok else 1.0)
    r["eaglet"] = timed(lambda: build_tree(*inputs, N, K, S, fmt_name, **extra), smoke)
    r["graph"] = graph_us(lambda: build_tree(*inputs, N, K, S, fmt_name, **extra), smoke)
    r["ref"] = timed(lambda: build_tree_ref(*host, N, K, S, fmt_name, **extra), smoke, host=True)
    r["floor"] = "n/a" if bw is None else moved / bw * 1e6
    return r


def run_pair(B: int, tree, N2: int, dev: str, smoke: bool) -> dict:
    S, K, N, k1 = tree.steps, tree.topk, tree.num_draft_tokens, dict(root_children=tree.root_children)
    gen = torch.Generator().manual_seed(B * 1000 + N2)
    host = (*random_candidates(B, K, S, 4096, gen, **k1), torch.randint(0, 4096, (B,), generator=gen),
            torch.randint(*PREFIX, (B,), generator=gen).int())  # scores, tokens, parents [B, C]; roots, lens [B]
    inputs = [t.to(dev) for t in host]
    got = build_tree_pair(*inputs, N, N2, K, S, **k1)
    ok = all(torch.equal(g.cpu(), w) for tree_got, n in zip(got, (N, N2))
             for g, w in zip(tree_got, build_tree_ref(*host, n, K, S, **k1)))
    return dict(B=B, tree=f"{tree.name} {S}/{K}/{N} + {N2}", ok=ok, err=0.0 if ok else 1.0,
                pair=graph_us(lambda: build_tree_pair(*inputs, N, N2, K, S, **k1), smoke),
                two=graph_us(lambda: (build_tree(*inputs, N, K, S, **k1), build_tree(*inputs, N2, K, S, **k1)), smoke))


def pair_table(rows: list[dict]) -> str:
    lines = ["| B | tree S/K/N + widened N | `build_tree_pair` graph µs | `build_tree` x 2 graph µs | matches |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['B']} | {r['tree']} | {fmt(r['pair'])} | {fmt(r['two'])} | {'yes' if r['ok'] else 'NO'} |"
              for r in rows]
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    head = ("| B | tree S/K/N | mask | C | HBM floor µs | eaglet µs | eaglet graph µs | reference µs (Python, CPU) "
            "| eaglet speedup vs reference | matches |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(f"| {r['B']} | {r['tree']} | {r['fmt']} | {r['C']} | {fmt(r['floor'], '.3f')} | {r['eaglet']:.1f} "
                     f"| {fmt(r['graph'])} | {r['ref']:.0f} | {r['ref'] / r['eaglet']:.1f} "
                     f"| {'yes' if r['err'] == 0 else 'NO'} |")
    return "\n".join(lines)


def main() -> None:
    args = kernel_bench_args(__doc__)
    dev = "cpu" if args.smoke else "cuda"
    bw = None if args.smoke else copy_bandwidth()
    batches = SMOKE["batches"] if args.smoke else BATCHES
    trees = [t for t in TREES if t.name in SMOKE["trees"]] if args.smoke else TREES
    rows = [run(B, t, f, dev, bw, args.smoke) for t in trees for B in batches for f in formats(t.num_draft_tokens)]
    pairs = [(t, N + extra) for _, t, N, _, _, extra in launched_shapes(trees)
             if N > 1 and N + extra <= num_candidates(t.topk, t.steps, t.root_children) + 1]
    pair_rows = [run_pair(B, t, N2, dev, args.smoke) for t, N2 in pairs for B in batches[:2]]
    header = (SMOKE_HEADER if args.smoke else
              provenance() + f"Measured copy bandwidth {bw / 1e12:.2f} TB/s (read+write); median µs via "
              "triton.testing.do_bench (cold L2), 'graph' = CUDA-graph replay; the reference timed as one host call.\n")
    report(header, table(rows) + "\n\n" + pair_table(pair_rows), args.md, rows + pair_rows)


if __name__ == "__main__":
    main()
