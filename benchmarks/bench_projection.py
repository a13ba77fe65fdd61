"""Invariant projections (kernels/projection.py) against the stock path, at SmolLM2-135M's and Llama-3.1-8B's shapes.

    python -m benchmarks.bench_projection --md results/projection_h200.md [--models ...] [--ms 1,8,32,64,2048]

The four projections of a block, each with the op it absorbs (qkv with the norm, RoPE and the K/V store; o with the
residual add; gate_up with the norm and SiLU·mul; down with the residual add), and the LM head with the final norm,
at M = 1, 8, 32, 64 rows and a 2,048-token prefill (the LM head up to LM_HEAD_MAX_ROWS rows), plus an EAGLE-3 draft
head's two-input qkv (not in the layer sums). bf16, µs per call inside a CUDA graph of 20 calls over cold weight
copies (`benchmarks._common.bench_graph`); floor = the bytes that must move over the measured copy bandwidth.
Schemes:
  invariant   the norm weights applied in the kernel;
  inv folded  the norm weights folded into the projections (`Transformer.fold_norm_weights`, the default);
  cublas      the stock path (`invariant=false`): the rmsnorm kernel + cuBLAS + the RoPE / SiLU kernels.
Their op boundaries differ (cuBLAS's o and down do not add the residual), so the fair comparison is the layer: the sum
of a scheme's four projections. Exits non-zero where the invariant kernel's rel err against its reference is not
below 1e-2.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import eaglet.kernels.projection as P
from benchmarks._common import BYTES, DEV, DTYPE, bench_graph, fmt, provenance, rel_err, weights
from eaglet.kernels import projection_config
from eaglet.kernels._utils import copy_bandwidth
from eaglet.kernels.activation import silu_and_mul
from eaglet.kernels.rmsnorm import rmsnorm
from eaglet.kernels.rope import rope_store

MODELS = {
    "SmolLM2-135M": dict(name="smollm2_135m", H=576, I=1536, Hq=9, Hkv=3, D=64, V=49152, layers=30),
    "Llama-3.1-8B": dict(name="llama3_8b", H=4096, I=14336, Hq=32, Hkv=8, D=128, V=128256, layers=32),
}
PROJ_MS = (1, 8, 32, 64, 2048)
# rows up to which the LM head is timed: it runs on decode and verify rows (a B=8 verify of 16 tokens: 128); a
# prefill's logits are its last row's
LM_HEAD_MAX_ROWS = 512
LAYER = ("qkv", "o", "gate_up", "down")
SCHEMES = ("invariant", "inv_folded", "cublas")
EPS = 1e-5


def proj_cases(c: dict, M: int):
    """(proj, weight copies, bytes moved, {scheme: fn(i) over weight copy i}, rel err of the invariant kernel)."""
    H, I, Hq, Hkv, D, V = c["H"], c["I"], c["Hq"], c["Hkv"], c["D"], c["V"]
    x = torch.randn(M, H, device=DEV, dtype=DTYPE)  # [M, H] the residual stream
    res = torch.randn(M, H, device=DEV, dtype=DTYPE)  # [M, H] the stock path's residual
    xs = x.clone()  # [M, H] the stream the in-place adds update (x itself stays the input of the others)
    g = torch.rand(H, device=DEV, dtype=DTYPE) + 0.5  # [H] a norm weight
    slots = torch.randperm(4 * M, device=DEV)[:M]  # [M]
    pos = torch.randint(0, 4096, (M,), device=DEV)  # [M]
    inv_freq = (1.0 / 5e5 ** (torch.arange(0, D, 2, device=DEV, dtype=torch.float64) / D)).float()  # [D/2]
    kc, vc = (torch.zeros(4 * M, Hkv, D, device=DEV, dtype=DTYPE) for _ in range(2))  # [S, Hkv, D] each
    rope = (pos, inv_freq, kc, vc, slots, Hq, Hkv, D)
    act = M * H * BYTES

    ws = weights((Hq + 2 * Hkv) * D, H)
    qkv = {
        "invariant": lambda i: P.proj_rope_store(x, g, ws[i], None, *rope, EPS),
        "inv_folded": lambda i: P.proj_rope_store(x, P.FOLDED, ws[i], None, *rope, EPS),
        "cublas": lambda i: rope_store(F.linear(rmsnorm(x, g, EPS, residual=res)[0], ws[i]), *rope),
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
    }
    ref_q2 = P.proj_rope_store_ref(emb, P.FOLDED, ws2[0], None, *rope, EPS, x2=x, norm_weight2=P.FOLDED)
    yield "eagle3 qkv", len(ws2), ws2[0].numel() * BYTES + 3 * act, qkv2, rel_err(qkv2["invariant"](0), ref_q2)
    ws2.clear()  # the copies freed before the next weights

    o = torch.randn(M, Hq * D, device=DEV, dtype=DTYPE) * 0.1  # [M, Hq*D]
    wo = weights(H, Hq * D)
    ops = {
        "invariant": lambda i: P.linear_add_(xs, o, wo[i]),
        "inv_folded": lambda i: P.linear_add_(xs, o, wo[i]),
        "cublas": lambda i: F.linear(o, wo[i]),
    }
    x0 = x.clone()
    err = rel_err(P.linear_add(x0, o, wo[0]), P.linear_add_ref(x0, o, wo[0]))
    yield "o", len(wo), wo[0].numel() * BYTES + M * Hq * D * BYTES + 2 * act, ops, err

    wgu = weights(2 * I, H)
    ops = {
        "invariant": lambda i: P.gate_up_silu(x, g, wgu[i], EPS),
        "inv_folded": lambda i: P.gate_up_silu(x, P.FOLDED, wgu[i], EPS),
        "cublas": lambda i: silu_and_mul(F.linear(rmsnorm(x, g, EPS, residual=res)[0], wgu[i])),
    }
    yield "gate_up", len(wgu), wgu[0].numel() * BYTES + act + M * I * BYTES, ops, \
        rel_err(ops["invariant"](0), P.gate_up_silu_ref(x, g, wgu[0], EPS))

    a = torch.randn(M, I, device=DEV, dtype=DTYPE) * 0.1  # [M, I]
    wd = weights(H, I)
    ops = {
        "invariant": lambda i: P.linear_add_(xs, a, wd[i]),
        "inv_folded": lambda i: P.linear_add_(xs, a, wd[i]),
        "cublas": lambda i: F.linear(a, wd[i]),
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
        }
        yield "lm_head", len(we), we[0].numel() * BYTES + act + M * V * BYTES, ops, \
            rel_err(ops["invariant"](0), P.linear_ref(x, we[0], None, g, EPS))


def run_proj(models: list[str], bw: float, ms=PROJ_MS) -> list[dict]:
    rows = []
    for model in models:
        c = MODELS[model]
        for M in ms:
            for proj, copies, nbytes, ops, err in proj_cases(c, M):
                times = {}
                for k, f in ops.items():
                    f(0)  # compile outside the graph capture
                    times[k] = bench_graph(f, copies)
                rows.append(dict(model=model, M=M, proj=proj, floor=nbytes / bw * 1e6, err=err, **times))
                print(f"  {model} M={M} {proj}: " + ", ".join(f"{k} {fmt(v, '.2f')}" for k, v in times.items())
                      + f" (floor {nbytes / bw * 1e6:.2f}, err {err:.1e})", flush=True)
            torch.cuda.empty_cache()
    return rows


def ratio(a, b):
    return a / b if a and b else None


def proj_table(rows: list[dict]) -> str:
    head = "| model | M | proj | floor µs | invariant µs | inv folded µs | cublas µs | inv folded / cublas | rel err |"
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        cells = " | ".join(fmt(r.get(k), ".2f") if k in r else "" for k in SCHEMES)
        rel = fmt(ratio(r["inv_folded"], r["cublas"]), ".3f") if "cublas" in r else ""  # no stock peer: eagle3 qkv
        out.append(f"| {r['model']} | {r['M']} | {r['proj']} | {r['floor']:.2f} | {cells} | {rel} | {r['err']:.1e} |")
    out += ["", "Per layer (the four projections; a scheme's sum, so that its op boundaries cancel) and per decode "
            "step (layers x layer + LM head):", "",
            "| model | M | layer floor µs | invariant | inv folded | cublas | inv folded / cublas | "
            "step inv folded µs | step cublas µs |", "|---|---|---|---|---|---|---|---|---|"]
    for model, M in dict.fromkeys((r["model"], r["M"]) for r in rows):
        by = {r["proj"]: r for r in rows if r["model"] == model and r["M"] == M}
        if not all(p in by for p in LAYER):
            continue

        def layer(k):
            v = [by[p].get(k) for p in LAYER]
            return None if any(t is None for t in v) else sum(v)

        sums = {k: layer(k) for k in SCHEMES}
        n = MODELS[model]["layers"]
        head_t = by.get("lm_head", {})

        def step(k):
            return sums[k] * n + (head_t.get(k) or 0) if sums[k] else None

        out.append(f"| {model} | {M} | {sum(by[p]['floor'] for p in LAYER):.1f} | "
                   + " | ".join(fmt(sums[k]) for k in SCHEMES)
                   + f" | {fmt(ratio(sums['inv_folded'], sums['cublas']), '.3f')} | {fmt(step('inv_folded'))} | "
                   f"{fmt(step('cublas'))} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--md", default=None, help="also write the tables as markdown here")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma list of {','.join(MODELS)}")
    ap.add_argument("--ms", default=",".join(map(str, PROJ_MS)), help="comma list of row counts")
    ap.add_argument("--max-split-m", type=int, default=None, help="run with kernels/projection_config.py's "
                    f"MAX_SPLIT_M at this (the rows up to which the split-K grid runs; {P.MAX_SPLIT_M}): a "
                    "measurement of the constant")
    args = ap.parse_args()
    if args.max_split_m is not None:
        projection_config.MAX_SPLIT_M = args.max_split_m
    torch.manual_seed(0)
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy {bw / 1e12:.2f} TB/s (read+write)", flush=True)
    rows = run_proj(args.models.split(","), bw, [int(m) for m in args.ms.split(",")])
    md = "\n".join([provenance() + f"Measured copy bandwidth: {bw / 1e12:.2f} TB/s (read+write). bf16, CUDA graphs; "
                    f"MAX_SPLIT_M {projection_config.MAX_SPLIT_M}.\n", "## Projections", "", proj_table(rows), ""])
    if args.md:
        with open(args.md, "w") as f:
            f.write(md + "\n")
    print(md)
    bad = [r for r in rows if not r["err"] < 1e-2]
    if bad:
        raise SystemExit(f"the invariant kernels disagree with their references in {len(bad)} rows")


if __name__ == "__main__":
    main()
