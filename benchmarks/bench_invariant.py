"""What batch invariance costs: the invariant kernels (kernels/projection.py, invariant tree attention) against the
fastest non-invariant ones, in one run, on SmolLM2-135M's and Llama-3.1-8B's shapes.

    python -m benchmarks.bench_invariant --md results/invariant_h200.md [--parts proj,attn,step,sweep]

Parts (bf16, CUDA graphs; "graph µs" = per call inside a graph of 20 calls over cold weight copies, the method of
benchmarks/bench_linear.py; floors = bytes that must move over the measured copy bandwidth):
  proj   the four projections of a block (each with the op it absorbs: qkv with the norm, RoPE and the K/V store; o
         with the residual add; gate_up with the norm and SiLU·mul; down with the residual add) and the LM head
         (with the final norm), at M = 1, 8, 32, 64 rows and a 2,048-token prefill, and an EAGLE-3 draft head's
         two-input qkv (not in the layer sums). Peers: the block compositions
         eaglet's non-invariant paths run (cublas: the rmsnorm kernel + cuBLAS + the RoPE / SiLU kernels; fused:
         kernels/linear.py, the GEMV at M = 1; folded: kernels/folded_linear.py up to 16 rows, its cuBLAS fallback
         above). Their op boundaries differ, so the fair comparison is the layer: the sum of a scheme's projections.
  attn   tree attention at decode (N = 1) and verify (B=1: N = 8 tree tokens; B=8: N = 8 each) shapes, invariant
         against the split-KV kernel.
  step   a whole forward of random-weight models in a CUDA graph: decode (B=1, 8; 1 token) and verify (B=1: 8 tree
         tokens; B=8: 8 each) after a 1k-token prefix, invariant (norm weights folded, run_spec.py's default, and
         applied) against the fastest non-invariant model paths (--trace DIR: and the per-kernel time inside the
         graphs but the unfolded non-invariant one).
  sweep  the invariant projections' launch configs around the table's: at M <= 16 the plans (splits, BLOCK_K) and
         16-row tiles, above (up to a 2,048-row prefill) the tiles of the table's plan; the best one's rows checked
         for invariance against the table's other tiles (tuning: `_config` / `_table` follow it; --sweep-ms picks
         the rows).
  attn_sweep  invariant tree attention's row tile (fixed, or the module's per-call choice), split length, key tile,
         stages and merge block (one set for every call), on decode and verify cases (tuning).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

import eaglet.kernels.folded_linear as fl
import eaglet.kernels.linear as lin
import eaglet.kernels.projection as P
import eaglet.kernels.tree_attention as TA
from eaglet.kernels._utils import copy_bandwidth
from eaglet.kernels.activation import silu_and_mul
from eaglet.kernels.rmsnorm import rmsnorm
from eaglet.kernels.rope import rope_store
from eaglet.kernels.tree_attention import tree_attention

from benchmarks._common import bench, fmt, provenance, rel_err
from benchmarks.bench_linear import BYTES, DEV, DTYPE, bench_graph, weights

MODELS = {
    "SmolLM2-135M": dict(name="smollm2_135m", H=576, I=1536, Hq=9, Hkv=3, D=64, V=49152, layers=30),
    "Llama-3.1-8B": dict(name="llama3_8b", H=4096, I=14336, Hq=32, Hkv=8, D=128, V=128256, layers=32),
}
PROJ_MS = (1, 8, 32, 64, 2048)
# rows up to which the LM head is timed: it runs on decode and verify rows (a B=8 verify of 16 tokens: 128); a
# prefill's logits are its last row's
LM_HEAD_MAX_ROWS = 512
LAYER = ("qkv", "o", "gate_up", "down")
EPS = 1e-5


# ----------------------------------------------------------------------------------------------------
# proj: one projection per scheme


def proj_cases(c: dict, M: int):
    """(proj, weight copies, bytes moved, {scheme: fn(i) over weight copy i}, rel err of the invariant kernel).
    Schemes: invariant (the norm weight applied in the kernel), inv_folded (the norm weight folded into the
    projection: `Transformer.fold_norm_weights`), and the non-invariant peers."""
    H, I, Hq, Hkv, D, V = c["H"], c["I"], c["Hq"], c["Hkv"], c["D"], c["V"]
    x = torch.randn(M, H, device=DEV, dtype=DTYPE)  # [M, H] the residual stream
    res = torch.randn(M, H, device=DEV, dtype=DTYPE)  # [M, H] the unfolded paths' residual
    xs = x.clone()  # [M, H] the stream the in-place adds update (x itself stays the input of the others)
    g = torch.rand(H, device=DEV, dtype=DTYPE) + 0.5  # [H] a norm weight
    slots = torch.randperm(4 * M, device=DEV)[:M]  # [M]
    pos = torch.randint(0, 4096, (M,), device=DEV)  # [M]
    inv_freq = (1.0 / 5e5 ** (torch.arange(0, D, 2, device=DEV, dtype=torch.float64) / D)).float()  # [D/2]
    kc, vc = (torch.zeros(4 * M, Hkv, D, device=DEV, dtype=DTYPE) for _ in range(2))  # [S, Hkv, D] each
    rope = (pos, inv_freq, kc, vc, slots, Hq, Hkv, D)
    act = M * H * BYTES
    small = M <= fl.MAX_M

    ws = weights((Hq + 2 * Hkv) * D, H)
    qkv = {
        "invariant": lambda i: P.proj_rope_store(x, g, ws[i], None, *rope, EPS),
        "inv_folded": lambda i: P.proj_rope_store(x, P.FOLDED, ws[i], None, *rope, EPS),
        "cublas": lambda i: rope_store(F.linear(rmsnorm(x, g, EPS, residual=res)[0], ws[i]), *rope),
        "fused": (lambda i: rope_store(lin.norm_linear(x, g, EPS, ws[i], residual=res)[0], *rope))
        if M <= lin.MAX_FAST_M else None,
        "folded": (lambda i: fl.proj_rope_store(x, ws[i], *rope, EPS)) if small
        else (lambda i: rope_store(F.linear(x, ws[i]), *rope, norm_eps=EPS, row_norm_of=x)),
    }
    ref_q = P.proj_rope_store_ref(x, g, ws[0], None, *rope, EPS)
    yield "qkv", len(ws), ws[0].numel() * BYTES + 2 * act, qkv, rel_err(qkv["invariant"](0), ref_q)

    # an EAGLE-3 draft head's midlayer: the qkv of cat(norm(embeds), norm(hidden)), both norms folded
    emb = torch.randn(M, H, device=DEV, dtype=DTYPE)  # [M, H] the token embeddings
    ws2 = weights((Hq + 2 * Hkv) * D, 2 * H)
    qkv2 = {
        "invariant": lambda i: P.proj_rope_store(emb, P.FOLDED, ws2[i], None, *rope, EPS, x2=x,
                                                 norm_weight2=P.FOLDED),
        "inv_folded": lambda i: P.proj_rope_store(emb, P.FOLDED, ws2[i], None, *rope, EPS, x2=x,
                                                  norm_weight2=P.FOLDED),
        "folded": (lambda i: fl.proj_rope_store(emb, ws2[i], *rope, EPS, x2=x)) if small else None,
    }
    ref_q2 = P.proj_rope_store_ref(emb, P.FOLDED, ws2[0], None, *rope, EPS, x2=x, norm_weight2=P.FOLDED)
    yield "eagle3 qkv", len(ws2), ws2[0].numel() * BYTES + 3 * act, qkv2, rel_err(qkv2["invariant"](0), ref_q2)
    del ws2

    o = torch.randn(M, Hq * D, device=DEV, dtype=DTYPE) * 0.1  # [M, Hq*D]
    wo = weights(H, Hq * D)
    ops = {
        "invariant": lambda i: P.linear_add_(xs, o, wo[i]),
        "inv_folded": lambda i: P.linear_add_(xs, o, wo[i]),
        "cublas": lambda i: F.linear(o, wo[i]),
        "fused": (lambda i: lin.linear(o, wo[i])) if M <= lin.MAX_FAST_M else None,
        "folded": (lambda i: fl.linear_add_(xs, o, wo[i])) if small else (lambda i: xs.addmm_(o, wo[i].t())),
    }
    x0 = x.clone()
    err = rel_err(P.linear_add(x0, o, wo[0]), P.linear_add_ref(x0, o, wo[0]))
    yield "o", len(wo), wo[0].numel() * BYTES + M * Hq * D * BYTES + 2 * act, ops, err

    wgu = weights(2 * I, H)
    ops = {
        "invariant": lambda i: P.gate_up_silu(x, g, wgu[i], EPS),
        "inv_folded": lambda i: P.gate_up_silu(x, P.FOLDED, wgu[i], EPS),
        "cublas": lambda i: silu_and_mul(F.linear(rmsnorm(x, g, EPS, residual=res)[0], wgu[i])),
        "fused": (lambda i: lin.norm_linear(x, g, EPS, wgu[i], residual=res)) if M <= lin.MAX_FAST_M else None,
        "folded": (lambda i: fl.gate_up_silu(x, wgu[i], EPS)) if small
        else (lambda i: silu_and_mul(F.linear(x, wgu[i]), row_norm_of=x, eps=EPS)),
    }
    yield "gate_up", len(wgu), wgu[0].numel() * BYTES + act + M * I * BYTES, ops, \
        rel_err(ops["invariant"](0), P.gate_up_silu_ref(x, g, wgu[0], EPS))

    a = torch.randn(M, I, device=DEV, dtype=DTYPE) * 0.1  # [M, I]
    gu = torch.randn(M, 2 * I, device=DEV, dtype=DTYPE)  # [M, 2I] the fused path's down input (SiLU on load)
    wd = weights(H, I)
    ops = {
        "invariant": lambda i: P.linear_add_(xs, a, wd[i]),
        "inv_folded": lambda i: P.linear_add_(xs, a, wd[i]),
        "cublas": lambda i: F.linear(a, wd[i]),
        "fused": (lambda i: lin.silu_mul_linear(gu, wd[i])) if M <= lin.MAX_FAST_M else None,
        "folded": (lambda i: fl.linear_add_(xs, a, wd[i])) if small else (lambda i: xs.addmm_(a, wd[i].t())),
    }
    x0 = x.clone()
    yield "down", len(wd), wd[0].numel() * BYTES + M * I * BYTES + 2 * act, ops, \
        rel_err(P.linear_add(x0, a, wd[0]), P.linear_add_ref(x0, a, wd[0]))

    if M <= LM_HEAD_MAX_ROWS:
        we = weights(V, H)
        ops = {
            "invariant": lambda i: P.linear(x, we[i], None, g, EPS),
            "inv_folded": lambda i: P.linear(x, we[i], None, g, EPS),
            "cublas": lambda i: F.linear(rmsnorm(x, g, EPS), we[i]),
            "fused": lambda i: lin.linear(rmsnorm(x, g, EPS), we[i]),
        }
        yield "lm_head", len(we), we[0].numel() * BYTES + act + M * V * BYTES, ops, \
            rel_err(ops["invariant"](0), P.linear_ref(x, we[0], None, g, EPS))


def run_proj(models: list[str], bw: float, ms=PROJ_MS) -> tuple[list[dict], str]:
    rows = []
    for model in models:
        c = MODELS[model]
        for M in ms:
            for proj, copies, nbytes, ops, err in proj_cases(c, M):
                times = {}
                for k, f in ops.items():
                    if f is not None:
                        f(0)  # compile (and autotune) outside the graph capture
                    times[k] = bench_graph(f, copies) if f is not None else None
                rows.append(dict(model=model, M=M, proj=proj, floor=nbytes / bw * 1e6, err=err, **times))
                print(f"  {model} M={M} {proj}: " + ", ".join(f"{k} {fmt(v, '.2f')}" for k, v in times.items())
                      + f" (floor {nbytes / bw * 1e6:.2f}, err {err:.1e})", flush=True)
            torch.cuda.empty_cache()
    return rows, proj_table(rows)


PEERS = ("cublas", "fused", "folded")


def proj_table(rows: list[dict]) -> str:
    head = ("| model | M | proj | floor µs | invariant µs | inv folded µs | cublas µs | fused µs | folded µs | "
            "inv folded / best | rel err |")
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        best = min([r[p] for p in PEERS if r.get(p)], default=None)
        ratio = r["inv_folded"] / best if best and r.get("inv_folded") else None
        out.append(f"| {r['model']} | {r['M']} | {r['proj']} | {r['floor']:.2f} | {fmt(r['invariant'], '.2f')} | "
                   f"{fmt(r.get('inv_folded'), '.2f')} | "
                   + " | ".join(fmt(r.get(p), ".2f") if r.get(p) is not None else "" for p in PEERS)
                   + f" | {fmt(ratio, '.3f')} | {r['err']:.1e} |")
    out += ["", "Per layer (the four projections; a scheme's sum, so that its op boundaries cancel) and per decode step "
            "(layers x layer + LM head):", "",
            "| model | M | layer floor µs | invariant | inv folded | cublas | fused | folded | inv folded / best | "
            "step inv folded µs | step best µs |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for model, M in dict.fromkeys((r["model"], r["M"]) for r in rows):
        by = {r["proj"]: r for r in rows if r["model"] == model and r["M"] == M}
        if not all(p in by for p in LAYER):
            continue

        def layer(k):
            v = [by[p].get(k) for p in LAYER]
            return None if any(t is None for t in v) else sum(v)

        sums = {k: layer(k) for k in ("invariant", "inv_folded") + PEERS}
        best_k = min((k for k in PEERS if sums[k] is not None), key=lambda k: sums[k], default=None)
        best = sums[best_k] if best_k else None
        n = MODELS[model]["layers"]
        head_t = by.get("lm_head", {})
        step_inv = sums["inv_folded"] * n + (head_t.get("inv_folded") or 0) if sums["inv_folded"] else None
        head_best = min([head_t[p] for p in PEERS if head_t.get(p)], default=0)
        step_best = best * n + head_best if best else None
        ratio = sums["inv_folded"] / best if best and sums["inv_folded"] else None
        out.append(f"| {model} | {M} | {sum(by[p]['floor'] for p in LAYER):.1f} | {fmt(sums['invariant'])} | "
                   f"{fmt(sums['inv_folded'])} | "
                   + " | ".join(fmt(sums[k]) if sums[k] is not None else "" for k in PEERS)
                   + f" | {fmt(ratio, '.3f')} | {fmt(step_inv)} | {fmt(step_best)} |")
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------------
# attn


def attn_inputs(B, N, Hq, Hkv, D, prefix, page_size=16, tree=True, seed=0):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    pages_per = triton.cdiv(prefix + N, page_size)
    num_pages = B * pages_per
    k = torch.randn(num_pages, page_size, Hkv, D, device=DEV, dtype=DTYPE, generator=gen)
    v = torch.randn(num_pages, page_size, Hkv, D, device=DEV, dtype=DTYPE, generator=gen)
    pt = torch.randperm(num_pages, device=DEV, generator=gen).view(B, pages_per).int()  # [B, P]
    pl = torch.full((B,), prefix, device=DEV, dtype=torch.int32)  # [B]
    q = torch.randn(B, N, Hq, D, device=DEV, dtype=DTYPE, generator=gen)  # [B, N, Hq, D]
    mask = None
    if tree and N > 1:  # a 4-ary EAGLE-2-like tree, parents first
        parents = [-1] + [(i - 1) // 4 for i in range(1, N)]
        m = torch.zeros(N, N, dtype=torch.bool)
        for i in range(N):
            j = i
            while j >= 0:
                m[i, j], j = True, parents[j]
        mask = m[None].expand(B, N, N).contiguous().to(DEV)  # [B, N, N]
    return q, k, v, pt, pl, mask


# (B, N, L); N = 16-64: the verifies of the wider trees (sweep_tree)
ATTN_CASES = [(1, 1, 1024), (1, 8, 1024), (8, 1, 1024), (8, 8, 1024), (1, 8, 4096), (8, 8, 4096), (1, 16, 1024),
              (1, 64, 1024), (8, 16, 1024)]


def run_attn(models: list[str], bw: float, trace_dir: str | None = None) -> str:
    """Invariant against split-KV tree attention on ATTN_CASES (trace_dir: and each invariant graph's per-kernel
    time, the split pass against the merge)."""
    head = "| model | B | N | prefix | KV floor µs | invariant µs | split-KV µs | inv / split-KV |"
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for model in models:
        c = MODELS[model]
        for B, N, L in ATTN_CASES:
            inputs = attn_inputs(B, N, c["Hq"], c["Hkv"], c["D"], L)
            bound = L + 64  # a graph's bound on the prefix, a little above it (as the engines pass it)
            t = {}
            for name, inv in (("invariant", True), ("split", False)):
                tree_attention(*inputs, max_prefix_len=bound, invariant=inv)  # compile / autotune outside capture
                t[name] = bench_graph(lambda i, inv=inv: tree_attention(*inputs, max_prefix_len=bound, invariant=inv),
                                      1)
            if trace_dir:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    tree_attention(*inputs, max_prefix_len=bound, invariant=True)
                print(f"  -- {model} attention B={B} N={N} L={L} invariant graph:\n"
                      + trace_graph(graph, f"{trace_dir}/attn_{c['name']}_b{B}_n{N}_l{L}.json"), flush=True)
                del graph
            floor = B * (L + N) * c["Hkv"] * c["D"] * 2 * BYTES / bw * 1e6
            ratio = t["invariant"] / t["split"] if t["invariant"] and t["split"] else None
            out.append(f"| {model} | {B} | {N} | {L} | {floor:.2f} | {fmt(t['invariant'], '.2f')} | "
                       f"{fmt(t['split'], '.2f')} | {fmt(ratio, '.3f')} |")
            print("  " + out[-1], flush=True)
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------------
# step


def trace_graph(graph, path: str, replays: int = 5) -> str:
    """Per-kernel time of a captured graph's replays from a torch.profiler trace written to `path`
    (benchmarks/probes/graph_trace.py's summary: span, kernel time, gaps, µs per kernel)."""
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.probes.graph_trace import replays as graph_replays, summarise

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    prof.export_chrome_trace(path)
    groups = graph_replays(json.load(open(path))["traceEvents"])
    if not groups:
        return f"{path}: no graph kernels in the trace"
    return summarise(list(groups.values()), top=16, by_grid=True)


STEP_CASES = ((1, 1), (8, 1), (1, 8), (8, 8))  # (B, T): decode and verify, T tokens per request


def run_step(models: list[str], trace_dir: str | None = None, step_cases=STEP_CASES) -> str:
    from eaglet.models.kv_cache import ForwardBatch, KVCache, slots_for
    from eaglet.models.llama import ModelArgs, Transformer

    head = ("| model | case | invariant folded ms | invariant ms | non-invariant ms | folded non-invariant ms | "
            "inv folded / fastest |")
    out = [head, "|---|---|---|---|---|---|---|"]
    L, ctx = 1024, 2048
    for model in models:
        c = MODELS[model]
        args = ModelArgs.from_name(c["name"])
        with torch.device(DEV):
            net = Transformer(args).to(DTYPE)
        with torch.no_grad():
            for p in net.parameters():
                p.normal_(0, 0.02)
            for layer in net.model.layers:
                layer.input_layernorm.weight.uniform_(0.5, 1.5)
                layer.post_attention_layernorm.weight.uniform_(0.5, 1.5)
        net.eval()
        cases = []
        for B, T in step_cases:
            kv = KVCache.for_model(args, max_reqs=B, max_context=ctx, page_size=16, dtype=DTYPE, device=DEV)
            reqs = [kv.alloc_request() for _ in range(B)]
            for r in reqs:
                kv.reserve(r, L + T)
            pt = kv.req_to_page[reqs]  # [B, P]
            at = L + torch.arange(T, device=DEV)[None].expand(B, T)  # [B, T]
            mask = attn_inputs(B, T, 1, 1, 64, 0)[5] if T > 1 else None
            batch = ForwardBatch(pt, torch.full((B,), L, dtype=torch.int32, device=DEV), slots_for(pt, at, 16), mask,
                                 ctx - T)  # the engines' graph bound: the context
            tokens = torch.randint(0, args.vocab_size, (B, T), device=DEV)
            cases.append((f"B={B} T={T}", tokens, at.clone(), batch, kv))
        times = {}
        # the norm weights applied, then folded (run_spec.py's default, `fold_norms: true`): folding is in place
        variants = ("invariant", "non-invariant", "folded non-invariant", "invariant folded")
        for variant in variants:
            if variant == "folded non-invariant":
                net.fold_norm_weights()
            net.set_invariant(variant.startswith("invariant"))
            for name, tokens, positions, batch, kv in cases:
                def fwd():
                    h, _ = net(tokens, positions, batch, kv)
                    return net.logits(h)

                with torch.inference_mode():
                    fwd()
                    fwd()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        fwd()
                    times[variant, name] = bench(graph.replay) / 1e3
                    if trace_dir and variant != "non-invariant":
                        tag = f"{c['name']}_{name.replace('=', '').replace(' ', '_')}_{variant.replace(' ', '_')}"
                        print(f"  -- {model} {name} {variant} graph:\n"
                              + trace_graph(graph, f"{trace_dir}/{tag}.json"), flush=True)
                    del graph
                print(f"  {model} {name} {variant}: {times[variant, name]:.3f} ms", flush=True)
        for name, *_ in cases:
            inv, plain, folded, inv_folded = (times[v, name] for v in variants)
            out.append(f"| {model} | {name} | {inv_folded:.3f} | {inv:.3f} | {plain:.3f} | {folded:.3f} | "
                       f"{inv_folded / min(plain, folded):.3f} |")
        del net, cases
        torch.cuda.empty_cache()
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------------
# sweep


# decode plans: (BLOCK_K, BLOCK_N, stages, warps) of the 16-row tiles, each with 1-8 splits
DECODE_TILES = ((128, 64, 4, 4), (128, 64, 5, 4), (256, 64, 4, 4), (128, 32, 4, 4), (128, 128, 4, 8))
# 17-64 rows: the decode plan's splits and BLOCK_K (the order) in other tiles, (BLOCK_N, BLOCK_M, stages)
WIDE_TILES = tuple(itertools.product((64, 128), (16, 32, 64), (2, 3, 4)))
# 65-MAX_SPLIT_M rows on the split-K grid (where the 8B's grids pass one wave even in 64-row x tiles): 64 and 128-row
# x tiles (a 128-row one reads each weight tile once a split, the table's 64-row ones twice at 128 rows)
WIDE_TILES_128 = tuple(itertools.product((64, 128), (64, 128), (2, 3, 4)))
# a prefill (more than MAX_SPLIT_M rows, at most SWEEP_PREFILL): (BLOCK_N, BLOCK_M, stages, the MMA's BLOCK_K) in the
# program (its splits looped) and, for a weight of several splits, on the split-K grid (one program a split, one
# accumulator, the last to arrive adds the partials in split order). The MMA's K tile is not part of the order (a
# chain of the same k16 MMAs); the pre-pass's sums of squares keep the plan's lanes (SUMSQ_K)
PREFILL_TILES = ((128, 128, 3, 128), (128, 256, 2, 128), (128, 128, 4, 64), (128, 256, 3, 64), (128, 256, 4, 64),
                 (64, 128, 4, 64), (64, 256, 3, 64), (64, 256, 4, 64))
SWEEP_PREFILL = 2048


def sweep_shapes(c: dict) -> dict:
    H, I, Hq, Hkv, D = c["H"], c["I"], c["Hq"], c["Hkv"], c["D"]
    return {"qkv": ((Hq + 2 * Hkv) * D, H, P._ROPE), "o": (H, Hq * D, P._ADD), "gate_up": (2 * I, H, P._SILU),
            "down": (H, I, P._ADD), "lm_head": (c["V"], H, P._PLAIN)}


def proj_call(c: dict, N: int, K: int, epi: int, M: int, seed: int = 0):
    """fn(w, cfg) -> the outputs (tuple) of the invariant projection of shape [N, K] on M fixed random rows (the
    first rows of the same stream for every M), folded norms as the models run them."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    rows = max(M, SWEEP_PREFILL)  # the same stream for every M up to a prefill's
    x = torch.randn(rows, K, device=DEV, dtype=DTYPE, generator=gen)[:M]  # [M, K]
    res = torch.randn(rows, N, device=DEV, dtype=DTYPE, generator=gen)[:M] if epi == P._ADD else None  # [M, N]
    Hq, Hkv, D = c["Hq"], c["Hkv"], c["D"]
    pos = torch.randint(0, 4096, (rows,), device=DEV, generator=gen)[:M]  # [M]
    inv_freq = (1.0 / 5e5 ** (torch.arange(0, D, 2, device=DEV, dtype=torch.float64) / D)).float()  # [D/2]
    kc, vc = (torch.zeros(M, Hkv, D, device=DEV, dtype=DTYPE) for _ in range(2))  # [M, Hkv, D] each
    slots = torch.arange(M, device=DEV)  # [M]

    def call(w, cfg):
        if epi == P._ROPE:
            q = P.proj_rope_store(x, P.FOLDED, w, None, pos, inv_freq, kc, vc, slots, Hq, Hkv, D, EPS, cfg=cfg)
            return q, kc, vc
        if epi == P._SILU:
            return (P.gate_up_silu(x, P.FOLDED, w, EPS, cfg=cfg),)
        if epi == P._ADD:
            return (P.linear_add(res, x, w, cfg=cfg),)
        return (P.linear(x, w, None, P.FOLDED, EPS, cfg=cfg),)
    return call


PLAN = ("BLOCK_K", "SPLITS", "SPLIT_K")  # what fixes an element's reduction order


def with_plan(cfg: dict, plan: dict) -> dict:
    return dict(cfg, **{k: plan[k] for k in PLAN})


def rows_invariant(c: dict, N: int, K: int, epi: int, w: torch.Tensor, cfgs: dict) -> bool:
    """Whether every row of the calls {M: cfg} (the table's config with the plan of cfgs[1] at the other M of 1, 8,
    64 and an 80-row prefill) has the bits of the same row in the call of the most rows: the property the launch
    table must keep."""
    ms = sorted({1, 8, 64, 80} | set(cfgs))
    table = {M: P.launch_config(N, K, M, epi, DTYPE, w.device, c["D"]) for M in ms}
    cfgs = {M: cfgs.get(M, with_plan(table[M], cfgs.get(1, table[1]))) for M in ms}
    try:
        outs = {M: proj_call(c, N, K, epi, M)(w, cfg) for M, cfg in cfgs.items()}
    except Exception as e:  # noqa: BLE001 - e.g. a tile out of shared memory: the plan is not usable
        print(f"    invariance check: {type(e).__name__}", flush=True)
        return False
    return all(torch.equal(a[:M], b[:M]) for M in ms[:-1] for a, b in zip(outs[M], outs[ms[-1]]))


def sweep_candidates(c: dict, N: int, K: int, epi: int, M: int, w: torch.Tensor):
    """(label, cfg) of the plans and tiles tried at M rows: up to 16 rows, every split count and 16-row tile of
    DECODE_TILES; above, the table's plan in every tile of WIDE_TILES (WIDE_TILES_128 past 64 rows, PREFILL_TILES
    past MAX_SPLIT_M). RoPE tiles stay within a head."""
    if M <= 16:
        for splits, (bk, bn, stages, warps) in itertools.product((1, 2, 4, 8), DECODE_TILES):
            split_k = triton.cdiv(triton.cdiv(K, splits), bk) * bk
            if triton.cdiv(K, split_k) == splits and not (epi == P._ROPE and c["D"] % bn):
                yield (f"s{splits} k{bk} n{bn} st{stages} w{warps}",
                       dict(BLOCK_N=bn, BLOCK_K=bk, SPLITS=splits, SPLIT_K=split_k, num_warps=warps,
                            num_stages=stages, BLOCK_M=16))
    else:
        plan = P.launch_config(N, K, 1, epi, DTYPE, w.device, c["D"])
        if M > P.MAX_SPLIT_M:
            grids = (True, False) if plan["SPLITS"] > 1 else (True,)  # o, down: no norm, so any K tile on the grid
            for in_program, (bn, bm, stages, bk) in itertools.product(grids, PREFILL_TILES):
                if not (epi == P._ROPE and c["D"] % bn):
                    yield (f"{'' if in_program else 'split '}n{bn} m{bm} st{stages} k{bk}",
                           dict(with_plan(dict(BLOCK_N=bn, BLOCK_M=bm, num_stages=stages, IN_PROGRAM=in_program,
                                               num_warps=8), plan), BLOCK_K=bk, SUMSQ_K=plan["BLOCK_K"]))
            return
        for bn, bm, stages in WIDE_TILES if M <= 64 else WIDE_TILES_128:
            if not (epi == P._ROPE and c["D"] % bn):
                yield f"n{bn} m{bm} st{stages}", with_plan(dict(BLOCK_N=bn, BLOCK_M=bm, num_stages=stages,
                                                                num_warps=8 if bn * bm >= 8192 else 4), plan)


def run_sweep(models: list[str], ms=(1, 8, 64), projs=None) -> str:
    """Time the invariant projections (folded norms; `projs`: only these of `sweep_shapes`) under launch configs around
    the table's (`sweep_candidates`); the best one's rows checked for invariance (`rows_invariant`: a decode plan with
    the table's tiles at 64 and 80 rows; a tile for more rows against the table's calls of fewer)."""
    out = ["| model | proj | N x K | M | table µs | best | best µs | best / table | rows invariant |",
           "|---|---|---|---|---|---|---|---|---|"]
    for model in models:
        c = MODELS[model]
        for proj, (N, K, epi) in sweep_shapes(c).items():
            if projs and proj not in projs:
                continue
            ws = weights(N, K)
            copies = len(ws)
            for M in ms:
                if M > LM_HEAD_MAX_ROWS and epi == P._PLAIN:
                    continue
                call = proj_call(c, N, K, epi, M)
                base = P.launch_config(N, K, M, epi, DTYPE, ws[0].device, c["D"])
                call(ws[0], base)  # compiled, and the split-K counters allocated, outside the capture
                t_base = bench_graph(lambda i: call(ws[i], base), copies)
                best, best_t = None, None
                for label, cfg in sweep_candidates(c, N, K, epi, M, ws[0]):
                    try:
                        call(ws[0], cfg)
                        t = bench_graph(lambda i, cfg=cfg: call(ws[i], cfg), copies)
                    except Exception as e:  # noqa: BLE001 - a config that does not compile is skipped
                        print(f"    {model} {proj} M={M} {label}: {type(e).__name__}", flush=True)
                        continue
                    print(f"    {model} {proj} M={M} {label}: {fmt(t, '.2f')}", flush=True)
                    if t is not None and (best_t is None or t < best_t):
                        best, best_t = (label, cfg), t
                inv = None
                if best:
                    cfgs = {1: best[1], 8: best[1]} if M <= 16 else {M: best[1]}
                    inv = rows_invariant(c, N, K, epi, ws[0], cfgs)
                out.append(f"| {model} | {proj} | {N} x {K} | {M} | {fmt(t_base, '.2f')} | {best[0] if best else ''} "
                           f"| {fmt(best_t, '.2f')} | {fmt(best_t / t_base if best_t and t_base else None, '.3f')} | "
                           f"{inv} |")
                print("  " + out[-1], flush=True)
            del ws
            torch.cuda.empty_cache()
    return "\n".join(out)


@contextlib.contextmanager
def invariant_attention_tiles(rows: int | None = None, merge_rows: int | None = None, merge_warps: int | None = None):
    """Run invariant tree attention with this row tile for every call (None: the module's choice per call) and this
    many rows and warps a merge program (None: the module's constants). The leaf length, key tile and merge block are
    module constants that fix the arithmetic; the sweeps in results/invariant_h200/ measured them."""
    saved = TA._inv_rows, TA._INVARIANT_MERGE_ROWS, TA._INVARIANT_MERGE_WARPS
    TA._inv_rows = saved[0] if rows is None else (lambda b_hkv, n, group: rows)
    TA._INVARIANT_MERGE_ROWS = saved[1] if merge_rows is None else merge_rows
    TA._INVARIANT_MERGE_WARPS = saved[2] if merge_warps is None else merge_warps
    TA._prepare.cache_clear()
    try:
        yield
    finally:
        TA._inv_rows, TA._INVARIANT_MERGE_ROWS, TA._INVARIANT_MERGE_WARPS = saved
        TA._prepare.cache_clear()


ATTN_SWEEP_CASES = [(1, 1, 1024), (1, 8, 1024), (8, 1, 1024), (8, 8, 1024), (8, 16, 1024), (1, 8, 4096),
                    (8, 8, 4096)]  # (B, N, L)


def run_attn_sweep(models: list[str]) -> str:
    """Invariant tree attention with 1-16 rows a merge program in 4 and 8 warps (the module's constants first): µs per
    case and their sum. A row's bits do not depend on these (tests/kernels/test_tree_attention.py checks on the
    GPU)."""
    cands = [(None, None), (1, 4), (2, 4), (4, 4), (4, 8), (8, 4), (16, 8)]
    cases = [(model, B, N, L) for model in models for B, N, L in ATTN_SWEEP_CASES]
    head = "| merge rows | merge warps | " + " | ".join(f"{m.split('-')[0]} B={B} N={N} L={L}" for m, B, N, L in cases)
    out = [head + " | sum µs |", "|" + "---|" * (len(cases) + 3)]
    inputs = {(m, B, N, L): attn_inputs(B, N, MODELS[m]["Hq"], MODELS[m]["Hkv"], MODELS[m]["D"], L)
              for m, B, N, L in cases}
    for merge_rows, warps in cands:
        ts = []
        with invariant_attention_tiles(merge_rows=merge_rows, merge_warps=warps):
            for key in cases:
                args, bound = inputs[key], key[3] + 64

                def call(i, args=args, bound=bound):
                    return tree_attention(*args, max_prefix_len=bound, invariant=True)
                try:
                    call(0)
                    ts.append(bench_graph(call, 1))
                except Exception as e:  # noqa: BLE001 - a config that does not compile is skipped
                    print(f"    {merge_rows, warps} {key}: {type(e).__name__}", flush=True)
                    ts.append(None)
        total = sum(ts) if all(t is not None for t in ts) else None
        mod = (TA._INVARIANT_MERGE_ROWS, TA._INVARIANT_MERGE_WARPS)
        out.append(f"| {merge_rows or f'{mod[0]} (module)'} | {warps or mod[1]} | "
                   + " | ".join(fmt(t, ".2f") for t in ts) + f" | {fmt(total, '.1f')} |")
        print("  " + out[-1], flush=True)
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--md", default=None, help="also write the tables as markdown here")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma list of {','.join(MODELS)}")
    ap.add_argument("--parts", default="proj,attn,step", help="comma list of proj, attn, step, sweep, attn_sweep")
    ap.add_argument("--ms", default=",".join(map(str, PROJ_MS)), help="proj: comma list of row counts")
    ap.add_argument("--sweep-ms", default="1,8,64", help="sweep: comma list of row counts (1-16: plans; above: "
                    f"tiles; at most {SWEEP_PREFILL})")
    ap.add_argument("--sweep-projs", default=None, help="sweep: comma list of qkv, o, gate_up, down, lm_head (all)")
    ap.add_argument("--step-cases", default=",".join(f"{b}x{t}" for b, t in STEP_CASES),
                    help="step: comma list of BxT (requests x tokens each; T > 1: a verify)")
    ap.add_argument("--max-split-m", type=int, default=None, help=f"run with kernels/projection.py's MAX_SPLIT_M "
                    f"at this (the rows up to which the split-K grid runs; {P.MAX_SPLIT_M}): a measurement of the "
                    "constant, as attn_sweep's of the attention's")
    ap.add_argument("--trace", default=None, help="step: profile each invariant and folded graph's replays, trace "
                    "files into this folder, a per-kernel table printed (attn: each invariant call's)")
    args = ap.parse_args()
    if args.max_split_m is not None:
        P.MAX_SPLIT_M = args.max_split_m
    if args.trace:
        Path(args.trace).mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy {bw / 1e12:.2f} TB/s (read+write)", flush=True)
    models = args.models.split(",")
    parts = args.parts.split(",")
    md = [provenance() + f"Measured copy bandwidth: {bw / 1e12:.2f} TB/s (read+write). bf16, CUDA graphs; "
          f"MAX_SPLIT_M {P.MAX_SPLIT_M}.\n"]

    def emit(title: str, table: str) -> None:  # written as each part ends: a run cut short keeps what it measured
        md.extend([f"## {title}", "", table, ""])
        if args.md:
            with open(args.md, "w") as f:
                f.write("\n".join(md) + "\n")

    bad = []
    if "proj" in parts:
        rows, table = run_proj(models, bw, [int(m) for m in args.ms.split(",")])
        emit("Projections", table)
        bad = [r for r in rows if not r["err"] < 1e-2]
    if "attn" in parts:
        emit("Tree attention", run_attn(models, bw, args.trace))
    if "step" in parts:
        step_cases = [tuple(map(int, c.split("x"))) for c in args.step_cases.split(",")]
        emit("Whole forward (random weights, 1k-token prefix)", run_step(models, args.trace, step_cases))
    if "attn_sweep" in parts:
        emit("Invariant tree attention: rows and warps a merge program", run_attn_sweep(models))
    if "sweep" in parts:
        sweep_ms = [int(m) for m in args.sweep_ms.split(",")]
        projs = args.sweep_projs.split(",") if args.sweep_projs else None
        emit("Launch-config sweep (invariant projections)", run_sweep(models, sweep_ms, projs))
    print("\n".join(md))
    if bad:
        raise SystemExit(f"the invariant kernels disagree with their references in {len(bad)} rows")


if __name__ == "__main__":
    main()
