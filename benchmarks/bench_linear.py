"""Fused small-M linear layers (kernels/linear.py) vs the unfused sequences they replace, at decode sizes.

    python -m benchmarks.bench_linear --md results/linear_h200.md

Per model (SmolLM2-135M: H=576, I=1536, V=49,152, 30 layers; Llama-3-8B: H=4096, I=14336,
V=128,256, 32 layers) and M in {1, 8, 32} tokens, bf16, the five projections of a decode step:
  qkv      norm_linear(x, input_layernorm, residual)  vs  rmsnorm kernel (+ residual) -> F.linear
  o        linear                                      vs  F.linear
  gate_up  norm_linear(x, post_attention_layernorm, residual)  vs  rmsnorm kernel -> F.linear
  down     silu_mul_linear(gu)                         vs  silu_and_mul kernel -> F.linear
  lm_head  linear                                      vs  F.linear
Columns:
  * eager µs: median of triton.testing.do_bench (it zeroes a 256 MB buffer before every call: cold L2).
  * graph µs: per call inside a CUDA graph of 20 calls, what the op costs in the decode graph (no host
    launch cost; the gaps between graph nodes count). The 20 calls cycle through enough copies of the
    weights (>= 128 MB in all, or 20) that every call reads its weights from HBM, as in a decode step
    where a layer's weights were evicted since the last step; do_bench flushes L2 between replays.
  * HBM floor: bytes that must move (weights, activations in, output and new residual out) over a
    measured device-to-device copy bandwidth; "% BW" = floor / eaglet graph time.
  * config: the autotuner's pick for the eaglet kernel (gemv = CUDA-core GEMV, dot = tl.dot tile).
  * rel err: eaglet vs the torch reference (`*_ref`), and the new residual must equal it bitwise.
The step estimate adds, per M, n_layers x (qkv + o + gate_up + down) + lm_head graph times: what the
projections (with the norms and SiLU·mul they absorb) cost in one decode step, fused vs unfused.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch
import torch.nn.functional as F

import eaglet.kernels.linear as lin
from eaglet.kernels._utils import copy_bandwidth
from eaglet.kernels.activation import silu_and_mul
from eaglet.kernels.linear import (
    linear,
    linear_ref,
    norm_linear,
    norm_linear_ref,
    silu_mul_linear,
    silu_mul_linear_ref,
)
from eaglet.kernels.rmsnorm import rmsnorm

from benchmarks._common import bench, fmt, provenance, rel_err, report

DEV = "cuda"
DTYPE = torch.bfloat16
BYTES = DTYPE.itemsize
MODELS = {
    "SmolLM2-135M": dict(H=576, qkv=960, I=1536, V=49152, layers=30),
    "Llama-3-8B": dict(H=4096, qkv=6144, I=14336, V=128256, layers=32),
}
MS = (1, 8, 32)
GRAPH_REPEATS = 20
COLD_BYTES = 128 * 2**20  # weight copies per graph: enough to leave L2 (50 MB on an H200) behind
EPS = 1e-6
LAYER_PROJS = ("qkv", "o", "gate_up", "down")




def bench_graph(fn, n_copies: int) -> float | None:
    """Median microseconds per call inside a CUDA graph of GRAPH_REPEATS calls fn(i % n_copies)."""
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(GRAPH_REPEATS):
                fn(i % n_copies)
        t = bench(graph.replay) / GRAPH_REPEATS
        del graph
        return t
    except Exception as e:  # noqa: BLE001 - report, do not abort the table
        print(f"  graph capture failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}", file=sys.stderr)
        return None


def err_with_residual(out, ref) -> float:
    """rel err of y; inf unless the new residual is bitwise the reference's."""
    return rel_err(out[0], ref[0]) if torch.equal(out[1], ref[1]) else math.inf


def weights(n: int, k: int) -> list[torch.Tensor]:
    """Copies of one nn.Linear-like weight [n, k], enough for cold reads inside a graph."""
    copies = min(GRAPH_REPEATS, max(1, math.ceil(COLD_BYTES / (n * k * BYTES))))
    w = torch.randn(n, k, device=DEV, dtype=DTYPE) * k**-0.5  # [n, k]
    return [w] + [w.clone() for _ in range(copies - 1)]


def unfused_norm_linear(x, nw, w, res):
    """What models/llama.py runs today: the rmsnorm kernel (residual add fused), then cuBLAS."""
    h, new_res = rmsnorm(x, nw, EPS, res)  # [M, K] each
    return F.linear(h, w), new_res


def cases(model: str, M: int):
    """(projection, N, K, eaglet fn(i), unfused fn(i), ref fn(), compare, bytes moved, n weight copies)."""
    c = MODELS[model]
    H, I = c["H"], c["I"]
    x = torch.randn(M, H, device=DEV, dtype=DTYPE)  # [M, H]
    res = torch.randn(M, H, device=DEV, dtype=DTYPE)  # [M, H]
    nw = 1 + 0.1 * torch.randn(H, device=DEV, dtype=DTYPE)  # [H]
    act = M * H * BYTES  # one [M, H] activation
    for name, n in (("qkv", c["qkv"]), ("gate_up", 2 * I)):
        ws = weights(n, H)
        yield (name, n, H,
               lambda i, ws=ws: norm_linear(x, nw, EPS, ws[i], residual=res),
               lambda i, ws=ws: unfused_norm_linear(x, nw, ws[i], res),
               lambda ws=ws: norm_linear_ref(x, nw, EPS, ws[0], residual=res), err_with_residual,
               n * H * BYTES + 3 * act + H * BYTES + M * n * BYTES, len(ws))  # x, res in; new res, y out
    ws = weights(H, H)
    yield ("o", H, H, lambda i: linear(x, ws[i]), lambda i: F.linear(x, ws[i]), lambda: linear_ref(x, ws[0]),
           rel_err, H * H * BYTES + 2 * act, len(ws))
    gu = torch.randn(M, 2 * I, device=DEV, dtype=DTYPE) * 2  # [M, 2I]
    wd = weights(H, I)
    yield ("down", H, I, lambda i: silu_mul_linear(gu, wd[i]), lambda i: F.linear(silu_and_mul(gu), wd[i]),
           lambda: silu_mul_linear_ref(gu, wd[0]), rel_err, H * I * BYTES + 2 * M * I * BYTES + act, len(wd))
    wh = weights(c["V"], H)
    yield ("lm_head", c["V"], H, lambda i: linear(x, wh[i]), lambda i: F.linear(x, wh[i]),
           lambda: linear_ref(x, wh[0]), rel_err, c["V"] * H * BYTES + act + M * c["V"] * BYTES, len(wh))


def picked_config(M: int) -> str:
    """The config the autotuner used for the last eaglet launch at M rows."""
    kernel, bucket = lin._kernel_for(M)
    cfg = getattr(kernel, "best_config", None)
    if cfg is None:
        return "?"
    kw = {**bucket, **cfg.kwargs}
    kind = "gemv" if kw.get("BLOCK_M") == 1 else f"dot{kw.get('BLOCK_M')}"
    return f"{kind} {kw['BLOCK_N']}x{kw['BLOCK_K']} w{cfg.num_warps}s{cfg.num_stages}"


def tuning_log(M: int) -> str:
    """The autotuner's timings of its last tuning run (ms), fastest first: for the record."""
    kernel, _ = lin._kernel_for(M)
    timings = getattr(kernel, "configs_timings", None) or {}
    best = sorted(timings.items(), key=lambda kv: kv[1] if not isinstance(kv[1], list) else kv[1][0])
    return "; ".join(f"{c.kwargs} w{c.num_warps}s{c.num_stages}: {t}" for c, t in best[:6])




def table(rows) -> str:
    head = ("| model | proj | M | N x K | MB moved | HBM floor µs | eaglet µs | unfused µs | eaglet graph µs "
            "| unfused graph µs | graph speedup | % copy BW | eaglet config | rel err |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        gs = r["g_unfused"] / r["g_eaglet"] if r["g_unfused"] and r["g_eaglet"] else None
        bw = 100 * r["floor"] / r["g_eaglet"] if r["g_eaglet"] else None
        lines.append(
            f"| {r['model']} | {r['proj']} | {r['M']} | {r['N']} x {r['K']} | {r['bytes'] / 1e6:.2f} "
            f"| {r['floor']:.2f} | {r['eaglet']:.1f} | {r['unfused']:.1f} | {fmt(r['g_eaglet'], '.2f')} "
            f"| {fmt(r['g_unfused'], '.2f')} | {fmt(gs, '.2f')}x | {fmt(bw, '.0f')} | {r['config']} | {r['err']:.1e} |"
        )
    return "\n".join(lines)


def step_table(rows) -> str:
    head = ("| model | M | layer (4 proj) eaglet µs | layer unfused µs | lm_head eaglet µs | lm_head unfused µs "
            "| step eaglet ms | step unfused ms | saved ms/step |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    keys = sorted({(r["model"], r["M"]) for r in rows}, key=lambda k: (list(MODELS).index(k[0]), k[1]))
    for model, M in keys:
        by = {r["proj"]: r for r in rows if r["model"] == model and r["M"] == M}
        complete = set(by) == {*LAYER_PROJS, "lm_head"}
        if not complete or any(by[p][g] is None for p in by for g in ("g_eaglet", "g_unfused")):
            continue
        layer = {g: sum(by[p][g] for p in LAYER_PROJS) for g in ("g_eaglet", "g_unfused")}
        n = MODELS[model]["layers"]
        step = {g: (n * layer[g] + by["lm_head"][g]) / 1e3 for g in layer}
        lines.append(
            f"| {model} | {M} | {layer['g_eaglet']:.1f} | {layer['g_unfused']:.1f} | {by['lm_head']['g_eaglet']:.1f} "
            f"| {by['lm_head']['g_unfused']:.1f} | {step['g_eaglet']:.3f} | {step['g_unfused']:.3f} "
            f"| {step['g_unfused'] - step['g_eaglet']:.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--md", default=None, help="also write the tables as markdown here")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma list of {','.join(MODELS)}")
    ap.add_argument("--ms", default=",".join(map(str, MS)), help="comma list of token counts M (<= 64)")
    args = ap.parse_args()
    torch.manual_seed(0)
    bw = copy_bandwidth()
    dev = torch.cuda.get_device_name()
    print(f"{dev}: copy {bw / 1e12:.2f} TB/s (read+write)", flush=True)
    rows = []
    for model in args.models.split(","):
        for M in map(int, args.ms.split(",")):
            for proj, N, K, fn_eaglet, fn_unfused, fn_ref, compare, nbytes, copies in cases(model, M):
                t0 = time.perf_counter()
                fn_eaglet(0)  # autotune + compile outside timing and capture
                torch.cuda.synchronize()
                tune_s = time.perf_counter() - t0
                config = picked_config(M)
                log = tuning_log(M)
                print(f"  tuned {model} {proj} M={M} in {tune_s:.1f} s: {config} | {log}",
                      file=sys.stderr, flush=True)
                fn_unfused(0)
                ref = fn_ref()
                err = compare(fn_eaglet(0), ref)
                row = dict(model=model, proj=proj, M=M, N=N, K=K, bytes=nbytes, floor=nbytes / bw * 1e6, err=err,
                           config=config, eaglet=bench(lambda: fn_eaglet(0)), unfused=bench(lambda: fn_unfused(0)),
                           g_eaglet=bench_graph(fn_eaglet, copies), g_unfused=bench_graph(fn_unfused, copies))
                rows.append(row)
                print(f"  {model} {proj} M={M}: eaglet {row['eaglet']:.1f} µs (graph {fmt(row['g_eaglet'], '.2f')}), "
                      f"unfused {row['unfused']:.1f} µs (graph {fmt(row['g_unfused'])}), floor {row['floor']:.2f} µs, "
                      f"err {err:.1e}", flush=True)
            torch.cuda.empty_cache()
    md = table(rows) + "\n\nDecode-step estimate (graph times):\n\n" + step_table(rows)
    header = (
        provenance() +
        f"Measured copy bandwidth: {bw / 1e12:.2f} TB/s (read+write). bf16; eager = median of do_bench (cold L2); "
        f"graph = per call inside a CUDA graph of {GRAPH_REPEATS} calls over cold weight copies; unfused = the "
        "eaglet rmsnorm / silu_and_mul kernel + F.linear (cuBLAS), what models/llama.py runs above one token; "
        "eaglet configs: autotuned (the invariant projections: benchmarks/bench_invariant.py); "
        "rel err = eaglet vs the torch reference.\n"
    )
    report(header, md, args.md, rows)


if __name__ == "__main__":
    main()
