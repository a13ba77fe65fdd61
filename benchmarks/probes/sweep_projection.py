"""The invariant projections' launch configs around the table's (kernels/projection_config.py): the tuning sweep.

    python -m benchmarks.probes.sweep_projection --md results/sweep.md [--ms 1,8,64] [--projs qkv,o,...]

Folded norms (as the models run them), bf16, µs per call inside a CUDA graph of 20 calls over cold weight copies. At
M <= 16 rows the reduction plans (splits, BLOCK_K) in 16-row tiles of DECODE_TILES; above (up to a SWEEP_PREFILL-row
prefill) the table's plan in other tiles (WIDE_TILES, WIDE_TILES_128 past 64 rows, PREFILL_TILES past MAX_SPLIT_M).
The best candidate's rows are checked bit for bit against the table's calls of other row counts (`rows_invariant`):
the property the launch table must keep. `_config` / `_table` follow what it finds;
results/invariant_h200/projection_tuning.md has what it found.
"""

from __future__ import annotations

import argparse
import itertools

import torch
import triton

import eaglet.kernels.projection as P
from benchmarks._common import DEV, DTYPE, bench_graph, fmt, provenance, weights
from eaglet.kernels import projection_config

MODELS = {
    "SmolLM2-135M": dict(H=576, I=1536, Hq=9, Hkv=3, D=64, V=49152),
    "Llama-3.1-8B": dict(H=4096, I=14336, Hq=32, Hkv=8, D=128, V=128256),
}
EPS = 1e-5
LM_HEAD_MAX_ROWS = 512  # the LM head runs on decode and verify rows only (benchmarks/bench_projection.py)
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
PLAN = ("BLOCK_K", "SPLITS", "SPLIT_K")  # what fixes an element's reduction order


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
        if M > projection_config.MAX_SPLIT_M:
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
            ws.clear()  # the copies freed before the next weights
            torch.cuda.empty_cache()
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--md", default=None, help="also write the table as markdown here")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma list of {','.join(MODELS)}")
    ap.add_argument("--ms", default="1,8,64", help="comma list of row counts (1-16: plans; above: tiles; at most "
                    f"{SWEEP_PREFILL})")
    ap.add_argument("--projs", default=None, help="comma list of qkv, o, gate_up, down, lm_head (default: all)")
    ap.add_argument("--max-split-m", type=int, default=None, help="run with kernels/projection_config.py's "
                    f"MAX_SPLIT_M at this ({projection_config.MAX_SPLIT_M})")
    args = ap.parse_args()
    if args.max_split_m is not None:
        projection_config.MAX_SPLIT_M = args.max_split_m
    torch.manual_seed(0)
    projs = args.projs.split(",") if args.projs else None
    table = run_sweep(args.models.split(","), [int(m) for m in args.ms.split(",")], projs)
    md = "\n".join([provenance() + f"bf16, CUDA graphs; MAX_SPLIT_M {projection_config.MAX_SPLIT_M}.\n",
                    "## Launch-config sweep (invariant projections)", "", table, ""])
    if args.md:
        with open(args.md, "w") as f:
            f.write(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
