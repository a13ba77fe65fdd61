"""The draft phase of the model drafters, each half in a CUDA graph as the engine runs it: propose (the tree) and
update (after accept), random weights at SmolLM2-135M's and Llama-3.1-8B's shapes after a 1k-token prompt, against
the read of the drafter's weights once.

    python -m benchmarks.bench_draft --md results/draft_h200.md [--models SmolLM2-135M,Llama-3.1-8B] [--batches 1,8]
        [--trees 7/1/8,5/4/8] [--block-layers 1,2,3] [--root-children 16]
    TRITON_INTERPRET=1 python -m benchmarks.bench_draft --smoke     # CPU, a tiny target: the script runs

Drafters: the EAGLE-3 head (engine/drafters/eagle.py: S-1 head forwards, then the extend over the accepted path) and a
block drafter per --block-layers count and block vocabulary of `MODELS` (engine/drafters/block.py: one forward and
the per-depth tree, then the context store). Llama-3.1-8B: both over 32,000 of its 128,256 tokens (the public EAGLE-3
heads' draft vocabulary); SmolLM2: EAGLE-3 over the shipped head's 8,192, the block drafter over the whole 49,152
(its LM head is 57 MB, ~17 µs a propose; conf/train/head/block.yaml says why that is its default) and over 8,192.
The update is timed with the whole path accepted (S+1 tokens), its longest. Floor: the drafter's own weights, the
target LM head rows its logits read and its dependency tables, read once at the measured copy bandwidth; the EAGLE
head re-reads its layer at every step, so its floor is a lower bound of a lower bound.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re

import torch

from benchmarks._common import BYTES, bench, fmt, provenance, random_model
from benchmarks.probes.graph_trace import trace_graph
from eaglet.engine.drafter import PrefillBatch
from eaglet.engine.drafters.block import BlockDrafter
from eaglet.engine.drafters.eagle import EagleDrafter
from eaglet.engine.speculative import TreeSpec
from eaglet.kernels._utils import copy_bandwidth
from eaglet.models.head_checkpoint import new_draft_head
from eaglet.models.llama import ModelArgs, Transformer

# registry name, EAGLE-3 draft vocabulary, block drafter draft vocabularies (None: the target's)
MODELS = {"SmolLM2-135M": ("smollm2_135m", 8192, (None, 8192)), "Llama-3.1-8B": ("llama3_8b", 32000, (32000,))}
PREFIX, CONTEXT, PAGE = 1024, 2048, 16
SMOKE = ModelArgs(family="llama", vocab_size=512, dim=128, n_layers=8, n_heads=2, n_kv_heads=1, head_dim=64,
                  intermediate_size=256, max_seq_len=512)


def drafters(target: Transformer, draft_vocab: int, block_vocabs: tuple, block_layers: list[int]):
    """(label, drafter) of each kind, random weights in the target's dtype, on the invariant path, norms folded as
    run_spec's fold_norms=true serves them. A random map is the first Vd target ids: the same bytes as a trained
    one's."""
    yield "EAGLE-3", EagleDrafter(new_draft_head("eagle3", target, draft_vocab_size=min(
        draft_vocab, target.args.vocab_size)).fold_norm_weights())
    for block_vocab in block_vocabs:
        for n in block_layers:
            head = new_draft_head("block", target, num_layers=n, block_size=8, dep_rank=64,
                                  draft_vocab_size=block_vocab)
            with torch.no_grad():
                head.dep_out.weight.normal_(0, 0.02)
            head.fold_norm_weights()
            vd = "" if block_vocab is None else f", Vd {block_vocab}"
            yield f"block, {n} layer{'s' if n > 1 else ''}{vd}", BlockDrafter(head)


def weight_bytes(target: Transformer, drafter) -> int:
    """What one propose + update reads at least once: the drafter's weights, the target LM head rows its logits use
    (the block drafter's: those of its draft vocabulary, [Vd, H]), the block drafter's dependency tables (fp32 dep_in
    [V, r] and dep_out [r, Vd], counted whole: a propose gathers only its candidates' rows of dep_in)."""
    own = sum(p.numel() * p.element_size() for p in drafter.head.parameters())  # EAGLE-3's LM head among them
    if not isinstance(drafter, BlockDrafter):
        return own
    lm = drafter.head.lm_head_rows().numel() * BYTES  # [Vd, H]
    tables = (drafter.dep_in.numel() + drafter.dep_out.numel()) * 4  # fp32, made by setup
    return own + lm + tables


def graph_of(fn, smoke: bool):
    """fn captured in a CUDA graph (after two warm-up calls on a side stream), or fn itself under --smoke."""
    if smoke:
        return fn
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(), fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def time_us(fn, smoke: bool) -> float | str:
    """Median µs of fn's calls; under --smoke one call, "not run"."""
    if smoke:
        fn()
        return "not run"
    return bench(fn)


@torch.inference_mode()
def measure(target: Transformer, drafter, tree: TreeSpec, B: int, smoke: bool, trace: str | None = None) -> tuple:
    """(propose µs, update µs) of `drafter` for B requests of PREFIX cached tokens (64 under --smoke). With `trace`
    (a path prefix), also each graph's per-kernel times (graph_trace.py), printed and written as <trace>_*.json."""
    dev, dt, args = target.device, target.dtype, target.args
    P = 64 if smoke else PREFIX
    drafter.head.set_invariant(True)
    drafter.setup(target=target, tree=tree, depth=drafter.depth(tree), max_batch=B, max_context=CONTEXT,
                  page_size=PAGE, num_pages=None, device=dev)
    for r in range(1, B + 1):  # the KV rows requests take (row 0 pads a graph's batch: models/kv_cache.PAD_ROW)
        drafter.alloc_request(r)
    drafter.reserve([(r, P + 64) for r in range(1, B + 1)])
    rows = torch.arange(1, B + 1, device=dev)  # [B]
    g = torch.Generator(device=dev).manual_seed(0)
    tokens = torch.randint(0, args.vocab_size, (B, P), device=dev, generator=g)  # [B, P]
    pos = torch.arange(P, device=dev).expand(B, P)  # [B, P]
    hidden = torch.randn(B, P, args.dim, device=dev, generator=g).to(dt)  # [B, P, H]
    captured = [hidden.clone() for _ in drafter.capture_layers(args.n_layers)]
    roots = tokens[:, -1].clone()  # [B]
    state = drafter.prefill(PrefillBatch(tokens, pos, torch.ones_like(pos, dtype=torch.bool),
                                         torch.full((B,), P, device=dev), rows, hidden, captured, roots))
    seq_lens = torch.full((B,), P, dtype=torch.int32, device=dev)
    out = {}

    def propose():
        out["tree"] = drafter.propose(seq_lens, roots, rows, **state)

    g_propose = graph_of(propose, smoke)
    t_propose = time_us(g_propose, smoke)
    if trace and not smoke:
        print(f"{trace} propose\n" + trace_graph(g_propose.__self__, f"{trace}_propose.json", in_order=True),
              flush=True)
    S, N = tree.steps, tree.num_draft_tokens
    feats = drafter.target_feature(hidden[:, :N], [c[:, :N] for c in captured]).clone()  # [B, N, F]
    index = torch.arange(S + 1, device=dev).clamp(max=N - 1).expand(B, S + 1).contiguous()  # [B, S+1]
    accept_len = torch.full((B,), S + 1, dtype=torch.int32, device=dev)
    tree_tokens = out["tree"].tokens.clone()  # [B, N]

    def update():
        drafter.update(tree_tokens, feats, index, accept_len, roots, seq_lens, rows, **state)

    g_update = graph_of(update, smoke)
    if trace and not smoke:
        print(f"{trace} update\n" + trace_graph(g_update.__self__, f"{trace}_update.json", in_order=True),
              flush=True)
    return t_propose, time_us(g_update, smoke)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--md", default=None, help="also write the table as markdown here")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--trees", default="7/1/8,5/4/8", help="steps/topk/tokens, comma-separated")
    ap.add_argument("--block-layers", default="1,2,3")
    ap.add_argument("--root-children", default="", help="each block drafter also with the root's this many "
                    "children (tree.root_children), comma-separated; the tree's label gets r<K1>")
    ap.add_argument("--trace", default=None, help="a folder: also each graph's per-kernel times (traces written there)")
    ap.add_argument("--smoke", action="store_true", help="CPU, a tiny target, eager (no GPU numbers)")
    a = ap.parse_args()
    trees = [TreeSpec(*map(int, t.split("/"))) for t in a.trees.split(",")]
    layers = [int(n) for n in a.block_layers.split(",")]
    root_children = [int(k) for k in a.root_children.split(",") if k]
    bw = None if a.smoke else copy_bandwidth()
    lines = ["| model | drafter | B | tree | propose µs | update µs | draft phase µs | weights read once µs |",
             "|---|---|---|---|---|---|---|---|"]
    for model in ["tiny (smoke)"] if a.smoke else a.models.split(","):
        if a.smoke:
            torch.manual_seed(0)
            target, vocab, block_vocabs = Transformer(SMOKE).eval(), 64, (64,)
        else:
            name, vocab, block_vocabs = MODELS[model]
            target = random_model(name)[1]
        for label, drafter in drafters(target, vocab, block_vocabs, layers):
            for B in map(int, a.batches.split(",")):
                for tree in [dataclasses.replace(t, root_children=k) for t in trees
                             for k in [None] + (root_children if isinstance(drafter, BlockDrafter) else [])]:
                    k1 = tree.root_children
                    shape = f"{tree.steps}/{tree.topk}/{tree.num_draft_tokens}" + ("" if k1 is None else f" r{k1}")
                    tag = None if a.trace is None else os.path.join(
                        a.trace, re.sub(r"[^A-Za-z0-9]+", "_", f"{model}_{label}_b{B}_{shape}"))
                    p, u = measure(target, drafter, tree, B, a.smoke, tag)
                    total = p + u if isinstance(p, float) else p
                    read = weight_bytes(target, drafter)  # after `measure`: the tables are made by setup
                    floor = f"n/a ({read / 2**20:.1f} MiB)" if bw is None else read / bw * 1e6
                    lines.append(f"| {model} | {label} | {B} | {shape} | {fmt(p)} | {fmt(u)} | {fmt(total)} | "
                                 f"{fmt(floor)} |")
                    print(lines[-1], flush=True)
        del target
    md = "\n".join(lines)
    header = "Smoke run: CPU (times are not kernel times)\n" if a.smoke else provenance() + \
        f"Copy bandwidth: {bw / 1e12:.2f} TB/s  \n"
    if a.md:
        with open(a.md, "w") as f:
            f.write(header + "\n" + md + "\n")
    print(header)
    print(md)


if __name__ == "__main__":
    main()
