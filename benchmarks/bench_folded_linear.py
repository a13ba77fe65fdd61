"""The folded block's fused projections (kernels/folded_linear.py) vs the cuBLAS sequences they replace, at the
verify's row counts.

    python -m benchmarks.bench_folded_linear --md results/folded_linear_h200.md

Per model (Llama-3-8B: H=4096, I=14336, 32/8 heads of 128; SmolLM2-135M: H=576, I=1536, 9/3 heads of 64; the
Llama-3.1-8B EAGLE-3 head's midlayer: Llama-3-8B's shapes, but qkv over [embeds | hidden] = 8192 columns, each half
with its own 1/rms (unfused: two norm kernels, cat, cuBLAS, RoPE), and o out of place (`linear_add`)) and
M rows (8 = the B=1 verify of 8 tree tokens), bf16, the four projections of a folded block (norm weights folded
into qkv_proj and gate_up_proj; x is the residual stream):
  qkv      proj_rope_store(x, W)   vs  F.linear (cuBLAS) -> rope_store(row_norm_of=x)   (1/rms, RoPE, K/V store)
  o        linear_add_(x, o, W)   vs  x.addmm_(o, W.T)                                       (x += o @ W.T)
  gate_up  gate_up_silu(x, W)     vs  F.linear -> silu_and_mul(row_norm_of=x)
  down     linear_add_(x, a, W)   vs  x.addmm_(a, W.T)
Columns: graph µs per call inside a CUDA graph of 20 calls over cold weight copies (benchmarks/bench_linear.py's
method: the gaps between graph nodes count, every call reads its weights from HBM); HBM floor = bytes that must move
(the weights, activations in and out, the K/V written) over a measured device-to-device copy bandwidth; % BW = floor
/ eaglet graph time; the launch config (`_config`); rel err of eaglet's first call against the `*_ref`. The layer
row sums the four per M: what one layer's projections cost in the verify graph, and x n_layers per verify.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import eaglet.kernels.folded_linear as fl
from eaglet.kernels._utils import copy_bandwidth, sm_count
from eaglet.kernels.activation import silu_and_mul
from eaglet.kernels.rmsnorm import rmsnorm
from eaglet.kernels.rope import rope_store

from benchmarks._common import fmt, provenance, rel_err, report
from benchmarks.bench_linear import BYTES, DEV, DTYPE, GRAPH_REPEATS, bench_graph, weights

MODELS = {
    "Llama-3-8B": dict(H=4096, I=14336, Hq=32, Hkv=8, D=128, layers=32),
    "SmolLM2-135M": dict(H=576, I=1536, Hq=9, Hkv=3, D=64, layers=30),
    # the public Llama-3.1-8B EAGLE-3 head's midlayer (DraftHead.fold_norm_weights), run once per draft step: qkv
    # over cat(norm(embeds), norm(hidden)); its residual, the step's hidden input, is not updated in place
    "Llama-3-8B-EAGLE3-head": dict(H=4096, I=14336, Hq=32, Hkv=8, D=128, layers=1, eagle3=True),
}
PROJS = ("qkv", "o", "gate_up", "down")
EPS = 1e-5


def cases(model: str, M: int):
    """(proj, N, K, eaglet fn(i), unfused fn(i), first-call check () -> rel err, bytes moved, n weight copies)."""
    c = MODELS[model]
    H, I, Hq, Hkv, D = c["H"], c["I"], c["Hq"], c["Hkv"], c["D"]
    x = torch.randn(M, H, device=DEV, dtype=DTYPE)  # [M, H] the residual stream
    slots = torch.randperm(4 * M, device=DEV)[:M]  # [M]
    pos = torch.randint(0, 4096, (M,), device=DEV)  # [M]
    inv_freq = (1.0 / 5e5 ** (torch.arange(0, D, 2, device=DEV, dtype=torch.float64) / D)).float()  # [D/2]
    kc, vc = (torch.zeros(4 * M, Hkv, D, device=DEV, dtype=DTYPE) for _ in range(2))  # [S, Hkv, D] each
    rope = (pos, inv_freq, kc, vc, slots, Hq, Hkv, D)
    act = M * H * BYTES

    eagle3 = c.get("eagle3", False)
    # EAGLE-3: the embeddings' rows come first; unfused = the two norm kernels (unit weights), cat, cuBLAS, RoPE
    e = torch.randn(M, H, device=DEV, dtype=DTYPE) if eagle3 else None  # [M, H]
    ones = torch.ones(H, device=DEV, dtype=DTYPE)  # [H]
    first, extra = (e, dict(x2=x)) if eagle3 else (x, {})
    ws = weights((Hq + 2 * Hkv) * D, 2 * H if eagle3 else H)

    def qkv_unfused(i):
        if eagle3:
            a = torch.cat([rmsnorm(e, ones, EPS), rmsnorm(x, ones, EPS)], dim=-1)  # [M, 2H]
            return rope_store(F.linear(a, ws[i]), *rope)
        return rope_store(F.linear(x, ws[i]), *rope, norm_eps=EPS, row_norm_of=x)

    def qkv_err():
        got = fl.proj_rope_store(first, ws[0], *rope, EPS, **extra), kc.clone(), vc.clone()
        want = fl.proj_rope_store_ref(first, ws[0], *rope, EPS, **extra), kc, vc
        return max(rel_err(g, w) for g, w in zip(got, want))

    yield ("qkv", ws[0].shape[0], ws[0].shape[1], lambda i: fl.proj_rope_store(first, ws[i], *rope, EPS, **extra),
           qkv_unfused, qkv_err, ws[0].numel() * BYTES + act * (2 if eagle3 else 1) + M * ws[0].shape[0] * BYTES,
           len(ws))  # x (and e) in; q, k, v out
    o = torch.randn(M, Hq * D, device=DEV, dtype=DTYPE) * 0.1  # [M, Hq*D]
    wo = weights(H, Hq * D)
    if eagle3:  # out of place
        yield ("o", H, Hq * D, lambda i: fl.linear_add(x, o, wo[i]), lambda i: torch.addmm(x, o, wo[i].t()),
               lambda: rel_err(fl.linear_add(x, o, wo[0]), fl.linear_add_ref(x, o, wo[0])),
               wo[0].numel() * BYTES + M * Hq * D * BYTES + 2 * act, len(wo))
    else:
        yield ("o", H, Hq * D, lambda i: fl.linear_add_(x, o, wo[i]), lambda i: x.addmm_(o, wo[i].t()),
               lambda: _add_err(x, o, wo[0]), wo[0].numel() * BYTES + M * Hq * D * BYTES + 2 * act, len(wo))
    wgu = weights(2 * I, H)
    yield ("gate_up", 2 * I, H, lambda i: fl.gate_up_silu(x, wgu[i], EPS),
           lambda i: silu_and_mul(F.linear(x, wgu[i]), row_norm_of=x, eps=EPS),
           lambda: rel_err(fl.gate_up_silu(x, wgu[0], EPS), fl.gate_up_silu_ref(x, wgu[0], EPS)),
           wgu[0].numel() * BYTES + act + M * I * BYTES, len(wgu))
    a = torch.randn(M, I, device=DEV, dtype=DTYPE) * 0.1  # [M, I]
    wd = weights(H, I)
    yield ("down", H, I, lambda i: fl.linear_add_(x, a, wd[i]), lambda i: x.addmm_(a, wd[i].t()),
           lambda: _add_err(x, a, wd[0]), wd[0].numel() * BYTES + M * I * BYTES + 2 * act, len(wd))


def _add_err(x, a, w) -> float:
    out = x.clone()
    return rel_err(fl.linear_add_(out, a, w), fl.linear_add_ref(x, a, w))


def config(proj: str, N: int, K: int) -> str:
    epi = {"qkv": fl._ROPE, "gate_up": fl._SILU}.get(proj, fl._ADD)
    c = fl._config(epi, N, K, DTYPE, sm_count(torch.cuda.current_device()))
    return f"{c['BLOCK_N']}x{c['BLOCK_K']} w{c['num_warps']}s{c['num_stages']}"


def table(rows) -> str:
    head = ("| model | proj | M | N x K | MB moved | HBM floor µs | eaglet graph µs | unfused graph µs | saved µs "
            "| % copy BW | eaglet config | rel err |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        saved = r["g_unfused"] - r["g_eaglet"] if r["g_unfused"] and r["g_eaglet"] else None
        pct = 100 * r["floor"] / r["g_eaglet"] if r["g_eaglet"] else None
        lines.append(f"| {r['model']} | {r['proj']} | {r['M']} | {r['N']} x {r['K']} | {r['bytes'] / 1e6:.2f} "
                     f"| {r['floor']:.2f} | {fmt(r['g_eaglet'], '.2f')} | {fmt(r['g_unfused'], '.2f')} "
                     f"| {fmt(saved, '.2f')} | {fmt(pct, '.0f')} | {r['config']} | {r['err']:.1e} |")
    lines += ["", "| model | M | layer eaglet µs | layer unfused µs | layer floor µs | saved per verify ms |",
              "|---|---|---|---|---|---|"]
    for model, M in dict.fromkeys((r["model"], r["M"]) for r in rows):
        by = [r for r in rows if r["model"] == model and r["M"] == M]
        if len(by) != len(PROJS) or any(r[g] is None for r in by for g in ("g_eaglet", "g_unfused")):
            continue
        e, u, f = (sum(r[g] for r in by) for g in ("g_eaglet", "g_unfused", "floor"))
        lines.append(f"| {model} | {M} | {e:.1f} | {u:.1f} | {f:.1f} | {(u - e) * MODELS[model]['layers'] / 1e3:.3f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--md", default=None, help="also write the tables as markdown here")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma list of {','.join(MODELS)}")
    ap.add_argument("--ms", default="1,8,16", help=f"comma list of row counts M (<= {fl.MAX_M})")
    args = ap.parse_args()
    torch.manual_seed(0)
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy {bw / 1e12:.2f} TB/s (read+write)", flush=True)
    rows = []
    for model in args.models.split(","):
        for M in map(int, args.ms.split(",")):
            for proj, N, K, fn_eaglet, fn_unfused, first_err, nbytes, copies in cases(model, M):
                err = first_err()  # the first call compiles (outside capture) and is compared with the reference
                row = dict(model=model, proj=proj, M=M, N=N, K=K, bytes=nbytes, floor=nbytes / bw * 1e6, err=err,
                           config=config(proj, N, K), g_eaglet=bench_graph(fn_eaglet, copies),
                           g_unfused=bench_graph(fn_unfused, copies))
                rows.append(row)
                print(f"  {model} {proj} M={M}: eaglet {fmt(row['g_eaglet'], '.2f')} µs, unfused "
                      f"{fmt(row['g_unfused'], '.2f')} µs, floor {row['floor']:.2f} µs ({row['config']}), "
                      f"err {err:.1e}",
                      flush=True)
            torch.cuda.empty_cache()
    header = (provenance() + f"Measured copy bandwidth: {bw / 1e12:.2f} TB/s (read+write). bf16; graph = per call "
              f"inside a CUDA graph of {GRAPH_REPEATS} calls over cold weight copies; unfused = cuBLAS + the eaglet "
              "RoPE / SiLU kernel, the sequence that kernels/folded_linear.py fuses.\n")
    md = table(rows)
    report(header, md, args.md, rows)


if __name__ == "__main__":
    main()
