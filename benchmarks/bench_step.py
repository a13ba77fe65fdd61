"""A whole forward of random-weight models in a CUDA graph, invariant numerics against the stock path.

    python -m benchmarks.bench_step --md results/step_h200.md [--models ...] [--step-cases 1x1,8x1,1x8,8x8]

SmolLM2-135M's and Llama-3.1-8B's architectures (models/llama.py) with random bf16 weights, after a 1k-token prefix:
decode (B requests, 1 token each) and verify (B requests, T tree tokens each, a 4-ary tree), the forward and its
logits captured in one CUDA graph, median ms a replay. Variants:
  invariant         `set_invariant(True)`, the norm weights applied in the projections;
  stock             `set_invariant(False)`: torch / cuBLAS and eaglet's split-KV tree attention;
  invariant folded  the norm weights folded into the projections (`fold_norm_weights`, run_spec.py's default).
--trace DIR: each invariant graph's replays profiled, trace files into DIR, a per-kernel table printed
(benchmarks/probes/graph_trace.py's summary).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks._common import DEV, DTYPE, bench, provenance, random_model, tree_mask
from benchmarks.probes.graph_trace import trace_graph
from eaglet.kernels import projection_config
from eaglet.models.kv_cache import ForwardBatch, KVCache, slots_for
from eaglet.models.llama import ModelArgs

MODELS = {"SmolLM2-135M": "smollm2_135m", "Llama-3.1-8B": "llama3_8b"}
STEP_CASES = ((1, 1), (8, 1), (1, 8), (8, 8))  # (B, T): decode and verify, T tokens per request
PREFIX, CONTEXT = 1024, 2048
VARIANTS = ("invariant", "stock", "invariant folded")  # in this order: folding is in place




def step_inputs(args: ModelArgs, B: int, T: int) -> tuple:
    """(label, tokens [B, T], positions [B, T], ForwardBatch, KVCache) of B requests with a PREFIX-token prefix."""
    kv = KVCache.for_model(args, max_reqs=B, max_context=CONTEXT, page_size=16, dtype=DTYPE, device=DEV)
    reqs = [kv.alloc_request() for _ in range(B)]
    for r in reqs:
        kv.reserve(r, PREFIX + T)
    pt = kv.req_to_page[reqs]  # [B, P]
    at = PREFIX + torch.arange(T, device=DEV)[None].expand(B, T)  # [B, T]
    batch = ForwardBatch(pt, torch.full((B,), PREFIX, dtype=torch.int32, device=DEV), slots_for(pt, at, 16),
                         tree_mask(B, T) if T > 1 else None, CONTEXT - T)  # the engines' graph bound: the context
    tokens = torch.randint(0, args.vocab_size, (B, T), device=DEV)  # [B, T]
    return f"B={B} T={T}", tokens, at.clone(), batch, kv


def time_model(model: str, trace_dir: str | None, step_cases) -> list[str]:
    """One model's table rows: every case under every variant (VARIANTS, in order)."""
    name = MODELS[model]
    args, net = random_model(name)
    cases = [step_inputs(args, B, T) for B, T in step_cases]
    times = {}
    for variant in VARIANTS:
        if variant == "invariant folded":
            net.fold_norm_weights()
        net.set_invariant(variant != "stock")
        for label, tokens, positions, batch, kv in cases:
            def fwd():
                h, _ = net(tokens, positions, batch, kv)
                return net.logits(h)

            with torch.inference_mode():
                fwd()
                fwd()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    fwd()
                times[variant, label] = bench(graph.replay) / 1e3
                if trace_dir and variant != "stock":
                    tag = f"{name}_{label.replace('=', '').replace(' ', '_')}_{variant.replace(' ', '_')}"
                    print(f"  -- {model} {label} {variant} graph:\n"
                          + trace_graph(graph, f"{trace_dir}/{tag}.json"), flush=True)
                del graph
            print(f"  {model} {label} {variant}: {times[variant, label]:.3f} ms", flush=True)
    rows = []
    for label, *_ in cases:
        inv, stock, inv_folded = (times[v, label] for v in VARIANTS)
        rows.append(f"| {model} | {label} | {inv_folded:.3f} | {inv:.3f} | {stock:.3f} | {inv_folded / stock:.3f} |")
    return rows


def run_step(models: list[str], trace_dir: str | None = None, step_cases=STEP_CASES) -> str:
    out = ["| model | case | invariant folded ms | invariant ms | stock ms | inv folded / stock |",
           "|---|---|---|---|---|---|"]
    for model in models:
        out += time_model(model, trace_dir, step_cases)
        torch.cuda.empty_cache()  # the model and its caches freed with time_model's frame
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--md", default=None, help="also write the table as markdown here")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma list of {','.join(MODELS)}")
    ap.add_argument("--step-cases", default=",".join(f"{b}x{t}" for b, t in STEP_CASES),
                    help="comma list of BxT (requests x tokens each; T > 1: a verify)")
    ap.add_argument("--max-split-m", type=int, default=None, help="run with kernels/projection_config.py's "
                    "MAX_SPLIT_M at this (the rows up to which the split-K grid runs; "
                    f"{projection_config.MAX_SPLIT_M})")
    ap.add_argument("--trace", default=None, help="profile each invariant graph's replays, trace files into this "
                    "folder, a per-kernel table printed")
    args = ap.parse_args()
    if args.max_split_m is not None:
        projection_config.MAX_SPLIT_M = args.max_split_m
    if args.trace:
        Path(args.trace).mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    step_cases = [tuple(map(int, c.split("x"))) for c in args.step_cases.split(",")]
    table = run_step(args.models.split(","), args.trace, step_cases)
    md = "\n".join([provenance() + f"bf16, CUDA graphs; MAX_SPLIT_M {projection_config.MAX_SPLIT_M}.\n",
                    f"## Whole forward (random weights, {PREFIX}-token prefix)", "", table, ""])
    if args.md:
        with open(args.md, "w") as f:
            f.write(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
