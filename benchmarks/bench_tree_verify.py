"""Benchmark the structural decode-step kernels: build_tree, verify_greedy, verify_simulated, verify_sampling,
emitted_record, commit_kv.

    python -m benchmarks.bench_tree_verify [--out results/tree_verify_h200.md]

Each op is first checked against the reference the tests use, then timed two ways:
`triton.testing.do_bench` (median, one launch per call, L2 flushed between calls) and
`do_bench_cudagraph` (median of CUDA-graph replays: launch overhead removed, as in the
engine, whose decode step runs as a graph). Prints a table last and writes it as markdown.
Targets: build_tree and verify_greedy for B=64, N=64 under 20 us on an H200.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys

import torch
import triton
import triton.testing

from benchmarks._common import command
from eaglet.kernels.build_tree import build_tree, build_tree_ref, random_candidates
from eaglet.kernels.kv_ops import commit_kv, commit_kv_ref
from eaglet.kernels.verify import (
    emitted_record,
    emitted_record_ref,
    verify_greedy,
    verify_greedy_ref,
    verify_sampling,
    verify_sampling_ref,
    verify_simulated,
    verify_simulated_ref,
)

B = 64
TREES = {"EAGLE-2 6/10/64": (6, 10, 64), "SGLang 5/4/8": (5, 4, 8)}  # name: (steps S, topk K, N)


def make_tree(S, K, N, vocab, seed=0):
    gen = torch.Generator().manual_seed(seed)
    scores, tokens, parents = random_candidates(B, K, S, min(vocab, 4096), gen)
    roots = torch.randint(0, vocab, (B,), generator=gen)  # [B]
    seq_lens = torch.randint(100, 2000, (B,), generator=gen).int()  # [B]
    return [t.cuda() for t in (scores, tokens, parents, roots, seq_lens)]


def deep_target(tree):
    """target_predict [B, N]: every node predicts its LAST child's token (leaves: -1), so the
    greedy walk tries every sibling and goes as deep as the tree: the slow path."""
    par, tok = tree.parents, tree.draft_tokens  # [B, N]
    j = torch.arange(par.shape[1], device=par.device)
    is_child = par[:, None, :] == j[None, :, None]  # [B, N, N]: [b, i, j] = j is a child of i
    last = torch.where(is_child, j, -1).amax(-1)  # [B, N]
    return torch.where(last >= 0, tok.gather(1, last.clamp_min(0)), -1)  # [B, N]


def drafty_probs(tree, V):
    """target_probs [B, N, V]: softmax of noise with every drafted child boosted (paths go deep)."""
    N = tree.parents.shape[1]
    logits = torch.randn(B, N, V, device="cuda")  # [B, N, V]
    rows = torch.arange(B, device="cuda")
    for i in range(1, N):
        logits[rows, tree.parents[:, i], tree.draft_tokens[:, i]] += float(torch.log(torch.tensor(V)))
    return torch.softmax(logits, -1)


def same(a, b) -> bool:
    return all(torch.equal(x.cpu(), y.cpu()) for x, y in zip(a, b))


def timeit(fn):
    fn()
    torch.cuda.synchronize()
    eager = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
    graph = triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e3
    return eager, graph


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "tree_verify_h200.md"))
    args = ap.parse_args()
    rows = []  # (op, config, eager us, graph us, note, ok)

    for name, (S, K, N) in TREES.items():
        inputs = make_tree(S, K, N, vocab=128256)
        tree = build_tree(*inputs, N, K, S, "qlen_only")
        ok = same(tree, build_tree_ref(*[t.cpu() for t in inputs], N, K, S, "qlen_only"))
        rows.append(("build_tree QLEN_ONLY", f"B={B} {name}",
                     *timeit(lambda: build_tree(*inputs, N, K, S, "qlen_only")), f"C={inputs[0].shape[1]}", ok))

        draft, nxt, sib = tree.draft_tokens, tree.retrieve_next_token, tree.retrieve_next_sibling
        pred = deep_target(tree)
        res = verify_greedy(draft, pred, nxt, sib, S)
        ok = same(res, verify_greedy_ref(draft, pred, nxt, sib, S))
        rows.append(("verify_greedy", f"B={B} {name}", *timeit(lambda: verify_greedy(draft, pred, nxt, sib, S)),
                     f"mean accept_len {res.accept_len.float().mean():.2f} (worst-case walk)", ok))
        # the step's record for the host (accept_len and the emitted tokens), against its ~13 torch ops
        ok = torch.equal(emitted_record(draft, res), emitted_record_ref(draft, res))
        ref_graph = timeit(lambda res=res: emitted_record_ref(draft, res))[1]
        rows.append(("emitted_record", f"B={B} {name}", *timeit(lambda res=res: emitted_record(draft, res)),
                     f"torch reference {ref_graph:.1f} us (graph)", ok))

        # tree=simulate's accept (a drawn length along the deepest path), against its torch ops
        cdf = torch.linspace(0.3, 1.0, S + 1, device="cuda")  # [S+1]
        u = torch.rand(B, device="cuda")  # [B]
        sim = (pred.clamp_min(0), tree.tree_mask, cdf, u, S)
        ok = same(verify_simulated(*sim), verify_simulated_ref(*sim))
        ref_graph = timeit(lambda sim=sim: verify_simulated_ref(*sim))[1]
        rows.append(("verify_simulated", f"B={B} {name}", *timeit(lambda sim=sim: verify_simulated(*sim)),
                     f"torch reference {ref_graph:.1f} us (graph)", ok))

        for V in (49152, 128256):
            probs = drafty_probs(tree, V)
            u = torch.rand(B, N, device="cuda")
            uf = torch.rand(B, device="cuda")
            res = verify_sampling(draft, nxt, sib, probs, u, uf, S)
            ok = same(res, verify_sampling_ref(draft, nxt, sib, probs, u, uf, S))
            rows.append(("verify_sampling", f"B={B} {name} V={V}",
                         *timeit(lambda probs=probs: verify_sampling(draft, nxt, sib, probs, u, uf, S)),
                         f"mean accept_len {res.accept_len.float().mean():.2f}", ok))
            del probs

    for L, Hkv, D in ((30, 3, 64), (32, 8, 128)):
        S, N, page_size, max_len = 5, 8, 16, 1024
        gen = torch.Generator().manual_seed(0)
        P = (max_len + N) // page_size + 1
        num_pages = B * P
        kv = torch.randn(L, 2, num_pages, page_size, Hkv, D, dtype=torch.bfloat16, device="cuda")
        page_table = torch.randperm(num_pages, generator=gen).view(B, P).int().cuda()  # [B, P]
        seq0 = torch.randint(1, max_len, (B,), generator=gen).int().cuda()  # [B]
        idx = torch.full((B, S + 1), -1, dtype=torch.int64)
        lens = torch.randint(1, S + 2, (B,), generator=gen).int()  # [B]
        for b in range(B):
            idx[b, : lens[b]] = torch.cat([torch.zeros(1, dtype=torch.int64),
                                          torch.randperm(N - 1, generator=gen)[: lens[b] - 1].add(1).sort().values])
        idx, lens = idx.cuda(), lens.cuda()
        seq = seq0.clone()
        kv_ref, seq_ref = kv.clone(), seq0.clone()
        commit_kv(kv, page_table, page_size, seq, idx, lens)
        commit_kv_ref(kv_ref, page_table, page_size, seq_ref, idx, lens)
        ok = torch.equal(kv, kv_ref) and torch.equal(seq, seq_ref)
        del kv_ref

        def run(kv=kv):
            seq.copy_(seq0)  # the moves are repeatable, seq_lens must not run away
            commit_kv(kv, page_table, page_size, seq, idx, lens)

        eager, graph = timeit(run)
        moved = int((lens - 1).sum()) * L * 2 * Hkv * D * kv.element_size() * 2  # bytes read + written
        rows.append(("commit_kv bf16", f"B={B} L={L} Hkv={Hkv} D={D} S={S}", eager, graph,
                     f"{moved / 1e6:.2f} MB moved, {moved / graph / 1e3:.0f} GB/s (graph)", ok))
        del kv, run  # run's default holds kv too: free it before the next pool is allocated

    dev = torch.cuda.get_device_name()
    head = ["op", "config", "do_bench median (us)", "graph replay median (us)", "note", "matches ref"]
    table = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    table += [f"| {op} | {cfg} | {e:.1f} | {g:.1f} | {note} | {'yes' if ok else 'NO'} |"
              for op, cfg, e, g, note, ok in rows]
    md = "\n".join([
        "# Tree build / verify / KV commit kernels",
        "",
        f"- command: `{command()}`",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
        f"- device: {dev}; torch {torch.__version__}, triton {triton.__version__}, Python {platform.python_version()}",
        "- do_bench: one launch per call (launch overhead included, L2 flushed); graph: CUDA-graph replays",
        "  (commit_kv includes a 64-int seq_lens reset copy and the seq_lens update)",
        "- targets: build_tree and verify_greedy, B=64 N=64, under 20 us",
        "",
        *table,
        "",
    ])
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(md)
    print(md)
    if not all(r[-1] for r in rows):
        sys.exit("some kernel did not match its reference")


if __name__ == "__main__":
    main()
