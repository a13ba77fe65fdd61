"""Probe: where `grow_tree`'s chain (K = 1) loses time at large vocabularies, and which launch settings recover it.

    python -m benchmarks.probes.probe_block_tree --md results/probe_block_tree_h100.md

Why: on an H100 (code b32d727) the block drafter's propose at tree 7/1/8 took 554 µs over SmolLM2's 49,152 ids and
614 µs at Llama-3.1-8B's 32,000-id draft vocabulary, against 185 and 437 µs at 5/4/8 and 198 µs at 7/1/8 over
8,192 ids (results/draft_phase_h100.md): ~50 µs a depth more, only for K = 1 and only at the larger vocabularies.
The kernel's per-program work is small at every K, so the probe times, in CUDA graphs, one tree of S depths
(S + 1 launches) and one of a single depth (2 launches) under each variant of `_launch_meta`: as it is (the parents'
axis padded to 2 rows), one parent row (KP = 1, where triton 3.6 emitted 542 shared stores:
results/block_tree_k1_sass.md), and other warp counts. Every variant's tokens and parents must equal the
reference's.

    python -m benchmarks.probes.probe_block_tree --alt /path/to/block_tree.py

--alt (repeatable) times another version of kernels/block_tree.py beside this one (a branch's, carried to the GPU
machine as a file): the A/B of a kernel change before it lands, rows labelled by the file's name. The candidates
tried so far lost and were deleted (results/block_drafter_h100/probe_block_tree_candidates.md).
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import torch

import eaglet.kernels.block_tree as bt
from benchmarks._common import fmt, graph_us, provenance
from benchmarks.bench_block_tree import RANK, inputs

CASES = (("SmolLM2", 49152, 49152, False), ("Llama-3.1-8B Vd", 128256, 32000, True), ("SmolLM2 Vd", 49152, 8192, True))
# (S, K, K1): the 1-depth tree first, the per-depth cost's base; K = 8 as the 6/8/32 and 7/8/32 trees run it; K1
# (None: K) the root's children (tree.root_children)
TREES = ((1, 1, None), (7, 1, None), (1, 4, None), (5, 4, None), (7, 4, None), (1, 8, None), (7, 8, None),
         (1, 4, 16), (5, 4, 16))


def variants(K: int, mod=bt) -> list[tuple[str, dict, dict]]:
    """(label, _launch_meta's keyword arguments, constexprs set after it) of each launch setting timed at K."""
    out = [("as is", {}, {})]
    if K == 1:  # the one parent row _launch_meta had (now at least 2)
        out.append(("KP=1", {}, dict(KP=1)))
    # K = 8 spills at 2 warps on sm_90 (tests/portability); 4 does not under triton 3.6
    out += [(f"num_warps={w}", dict(num_warps=w), {}) for w in ((4, 8) if K == 8 else (2, 8))]
    # longer chunks: fewer programs and a shorter merge (parents x chunks x K keys), a larger logits tile each; the
    # warps that keep them unspilled on sm_90 over 49,152 ids (512 at 2 warps and 1,024 at 4 spill under triton 3.6)
    if K == 4:
        out += [(f"BLOCK_V={v} num_warps={w}", dict(block_v=v, num_warps=w), {})
                for v, w in ((512, 4), (512, 8), (1024, 8))]
    # shorter chunks: more programs (32 over 8,192 ids at 256), each a quarter of the logits tile at 64 ids
    if K <= 4:
        out += [(f"BLOCK_V={v} num_warps=2", dict(block_v=v, num_warps=2), {}) for v in (128, 64)]
    return out


def load(path: str):
    """kernels/block_tree.py of another version, imported from its file (its imports are this package's)."""
    spec = importlib.util.spec_from_file_location("eaglet.kernels._block_tree_alt", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--md", default=None)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--alt", action="append", default=[],
                    help="another version's kernels/block_tree.py, timed beside this one (repeatable)")
    ap.add_argument("--trees", default=None, help="S/K[/K1] to time, e.g. 1/4,7/4,5/4/16 (K1: the root's children; "
                    "default: all of TREES)")
    ap.add_argument("--cases", default=None, help="vocabularies to time by label prefix, in this order, e.g. "
                    "'SmolLM2' (both SmolLM2 cases) or 'SmolLM2_Vd,Llama' (spaces as _)")
    args = ap.parse_args()
    modules = [("", bt)] + [(Path(a).stem + " ", load(a)) for a in args.alt]
    rows, times = [], {}  # (vocabulary, S, K, variant) -> µs
    trees = ([(*map(int, t.split("/")), None)[:3] for t in args.trees.split(",")] if args.trees else TREES)
    # in the order asked: the 300 s of the block_l8b stage may end before the last case
    cases = CASES if args.cases is None else list(dict.fromkeys(
        c for p in args.cases.split(",") for c in CASES if c[0].replace(" ", "_").startswith(p)))
    for label, V, Vd, has_d2t in cases:
        for S, K, K1 in trees:
            x = inputs(args.batch, S, V, Vd, has_d2t, "cuda")
            want = bt.grow_tree_ref(*x[:4], S, K, x[4], K1)
            k1 = {} if K1 is None else dict(root_children=K1)  # an older version has no root_children
            tree = f"{S}/{K}" + ("" if K1 is None else f"/{K1}")
            for prefix, mod in modules:
                launch_meta = mod._launch_meta
                for name, kw, over in variants(K, mod):
                    name = prefix + name
                    mod._launch_meta = lambda *a, f=launch_meta, kw=kw, over=over: {**f(*a, **kw), **over}
                    try:
                        got = mod.grow_tree(*x[:4], S, K, x[4], **k1)
                        ok = torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
                        us = graph_us(lambda mod=mod: mod.grow_tree(*x[:4], S, K, x[4], **k1), False)
                    except Exception as e:  # noqa: BLE001 - a variant that raises (a candidate refusing it) is a row too
                        ok, us = None, float("nan")
                        print(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:100]}", flush=True)
                    finally:
                        mod._launch_meta = launch_meta
                    key = f"{label} {Vd}"
                    times[key, S, K, K1, name] = us
                    one = times.get((key, 1, K, K1, name))
                    per_depth = "" if S == 1 or one is None else fmt((us - one) / (S - 1))
                    equal = "raised (printed above)" if ok is None else "yes" if ok else "NO"
                    rows.append(f"| {key} | {tree} | {name} | {fmt(us)} | {per_depth} | {equal} |")
                    print(rows[-1], flush=True)
    md = (
        provenance() + f"B={args.batch}, rank {RANK}, CUDA-graph replay µs; a depth's cost is (S-depth tree - "
        "1-depth tree) / (S - 1)" + (f"; alt: {', '.join(args.alt)}" if args.alt else "") + ".\n\n"
        "| vocabulary | S/K[/K1] | launch meta | graph µs | µs a depth | equal |\n|---|---|---|---|---|---|\n"
        + "\n".join(rows)
    )
    print(md)
    if args.md:
        with open(args.md, "w") as f:
            f.write(md + "\n")


if __name__ == "__main__":
    main()
