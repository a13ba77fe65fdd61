"""Trie-graft benchmark: eaglet `graft` (Triton, one launch) vs its torch reference `graft_ref` (~150 small ops).

    python -m benchmarks.bench_trie_graft --md results/trie_graft_h200.md
    TRITON_INTERPRET=1 python -m benchmarks.bench_trie_graft --smoke     # CPU: the script and the check, tiny shapes

Rows: B requests, the grafts eaglet launches at the trees of `kernels/_compile_cases.TREES` (steps S / top-k K / N
draft tokens): the n-gram drafter's (K matches of S tokens onto the bare root, N - 1 new nodes at most) and two
n-gram branches on an EAGLE tree (2 paths of S tokens onto a random EAGLE-2 tree of N nodes, 2S new nodes at most),
where they fit the kernel's MAX_NODES (`launched_shapes`). The paths follow the tree for a while and then depart,
over a small vocabulary so that they share prefixes.
  * eaglet: `graft` (kernels/trie_graft.py); do_bench median (host launch included, cold L2) and a CUDA-graph replay
    (how the draft runs).
  * torch: `graft_ref`, the batched torch ops it replaced, in a CUDA graph too.
Correctness per row: both equal `graft_sequential` (the plain-Python insertion) exactly.
--smoke runs on CPU under TRITON_INTERPRET=1 (the kernel in Triton's interpreter): its times are the interpreter's,
not a GPU's; it proves that the script and the check run.
"""

from __future__ import annotations

import torch

from benchmarks._common import SMOKE_HEADER, fmt, graph_us, kernel_bench_args, provenance, report, timed
from eaglet.kernels._compile_cases import TREES
from eaglet.kernels.build_tree import build_tree, random_candidates
from eaglet.kernels.trie_graft import graft, graft_ref, graft_sequential, launched_shapes

BATCHES = (1, 8, 64)
SMOKE = dict(batches=(2,), trees=("chain", "eagle2"))


def inputs(B: int, tree, N: int, P: int, S: int, gen: torch.Generator):
    """A tree of N nodes a request (the bare root, or a random EAGLE-2 tree) and [B, P, S] paths along it."""
    K = tree.topk
    vocab = K + 2
    roots = torch.randint(vocab, (B,), generator=gen)  # [B]
    seq_lens = torch.randint(100, 2000, (B,), generator=gen).int()  # [B]
    if N == 1:
        none = torch.full((B, 1), -1, dtype=torch.long)  # [B, 1]
        t = (roots[:, None], seq_lens[:, None].long(), none, none, torch.ones(B, 1, 1, dtype=torch.bool))
    else:
        bt = build_tree(*random_candidates(B, K, tree.steps, vocab, gen), roots, seq_lens, N, K, tree.steps)
        t = (bt.draft_tokens, bt.positions, bt.retrieve_next_token, bt.retrieve_next_sibling, bt.tree_mask)
    # a path: the tokens down to a random node, then random ones, cut at a random length
    paths = torch.randint(vocab, (B, P, S), generator=gen)  # [B, P, S]
    for b in range(B):
        for p in range(P):
            anc = t[4][b, int(torch.randint(N, (1,), generator=gen))].nonzero()[:, 0].tolist()[1:]
            head = t[0][b, anc][:S]
            paths[b, p, :len(head)] = head
            cut = int(torch.randint(S // 2, S + 1, (1,), generator=gen))
            paths[b, p, cut:] = -1
    return t, paths


def run(B: int, label: str, tree, N: int, P: int, S: int, extra: int, dev: str, smoke: bool) -> dict:
    gen = torch.Generator().manual_seed(B * 1000 + N * 10 + P)
    host, paths_host = inputs(B, tree, N, P, S, gen)
    t, paths = tuple(x.to(dev) for x in host), paths_host.to(dev)
    want = graft_sequential(host, paths_host, extra)
    ok = all(torch.equal(a.cpu(), w) for got in (graft(t, paths, extra), graft_ref(t, paths, extra))
             for a, w in zip(got, want))
    r = dict(B=B, shape=f"{label} {tree.steps}/{tree.topk}/{tree.num_draft_tokens}", P=P, S=S, M=N + extra,
             err=0.0 if ok else 1.0,
             created=int((want[2] >= 0).sum() + (want[3] >= 0).sum()) // B - (N - 1))
    r["eaglet"] = timed(lambda: graft(t, paths, extra), smoke)
    r["graph"] = graph_us(lambda: graft(t, paths, extra), smoke)
    r["torch_graph"] = graph_us(lambda: graft_ref(t, paths, extra), smoke)
    return r


def table(rows: list[dict]) -> str:
    head = ("| B | graft (steps/top-k/tokens) | paths P x S | nodes M | new nodes a request | eaglet µs "
            "| eaglet graph µs | torch graph µs | eaglet speedup (graphs) | equal to the reference |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        g, peer = r["graph"], r["torch_graph"]
        speedup = peer / g if isinstance(g, float) and isinstance(peer, float) else "n/a"
        lines.append(f"| {r['B']} | {r['shape']} | {r['P']} x {r['S']} | {r['M']} | {r['created']} "
                     f"| {r['eaglet']:.1f} | {fmt(g)} | {fmt(peer)} | {fmt(speedup)} "
                     f"| {'yes' if r['err'] == 0 else 'NO'} |")
    return "\n".join(lines)


def main() -> None:
    args = kernel_bench_args(__doc__)
    dev = "cpu" if args.smoke else "cuda"
    batches = SMOKE["batches"] if args.smoke else BATCHES
    trees = [t for t in TREES if t.name in SMOKE["trees"]] if args.smoke else TREES
    rows = [run(B, *s, dev, args.smoke) for s in launched_shapes(trees) for B in batches]
    header = (SMOKE_HEADER if args.smoke else
              provenance() + "Median µs via triton.testing.do_bench (host launch included, cold L2); 'graph' = "
              "CUDA-graph replay (do_bench_cudagraph). New nodes: the average a request created.\n")
    report(header, table(rows), args.md, rows)


if __name__ == "__main__":
    main()
