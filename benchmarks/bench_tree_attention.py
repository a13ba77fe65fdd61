"""Tree attention roofline benchmark: eaglet (Triton, paged) vs SDPA vs FlexAttention vs the floors.

    python -m benchmarks.bench_tree_attention --md results/tree_attention_h200.md
    python -m benchmarks.bench_tree_attention --invariant --md results/invariant_h200/attn.md [--trace DIR]

Setup per row: bf16, Hq=32, Hkv=8, D=128, page_size 16 with shuffled pages, prefix L, N tree
tokens whose mask is ancestor-or-self of a random, really branching parent array.
  * eaglet: `tree_attention` on the paged pool (max_prefix_len=L).
  * SDPA: K/V gathered to dense [B, Hq, L+N, D] and a dense bool mask [B, 1, N, L+N]; only the
    attention call is timed.
  * Flex: torch.compile(flex_attention) on dense [B, Hkv, L+N, D] K/V (enable_gqa) with a block
    mask; 'failed' when it does not compile/run.
  * HBM floor: bytes that must move (K/V of the L+N keys once, q and out) / measured
    device-to-device copy bandwidth. Compute floor: 4*B*Hq*N*(L+N)*D FLOPs / measured bf16
    matmul rate. The larger one bounds the row ("bound" column).
Times are medians of triton.testing.do_bench, which zeroes a 256 MB buffer before every call,
so every call starts with a cold L2 (no input rotation needed). The eager eaglet time hides the
launcher's host time behind that zeroing only while the host time is shorter; "host µs" is the
launcher's own wall time per call (back-to-back calls, no synchronisation). Correctness: eaglet vs SDPA
relative error per row (must be < 1e-2).

--invariant: instead, what batch invariance costs in attention: `tree_attention(..., invariant=True)` against the
split-KV kernel at SmolLM2-135M's and Llama-3.1-8B's heads, at decode (N = 1) and verify shapes (ATTN_CASES: B=1 and
8, a 4-ary tree of N tokens each, a 1k or 4k prefix, the grid bound 64 keys above it as the engines pass it). Per call
inside a CUDA graph of 20 calls (`benchmarks._common.bench_graph`); KV floor = the K/V bytes over the measured copy
bandwidth. --trace DIR: each invariant call's graph profiled, the split pass against the merge.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import eaglet.kernels.tree_attention_splitkv as sk
from benchmarks._common import bench, bench_graph, fmt, provenance, rel_err, tree_mask
from benchmarks.probes.graph_trace import trace_graph
from eaglet.kernels._utils import copy_bandwidth, sm_count
from eaglet.kernels.tree_attention import tree_attention

HQ, HKV, D, PAGE = 32, 8, 128, 16
DEV = "cuda"
DTYPE = torch.bfloat16
CONFIGS = [(b, l, n) for b in (1, 8) for l in (1024, 4096, 16384, 65536) for n in (16, 64)]
# --sweep: host-plan knobs of eaglet.kernels.tree_attention_splitkv to try (module constants).
SWEEP = [
    {},  # the default plan, timed twice (here and in the table) to show the run-to-run spread
    {"_PROGRAMS_PER_SM": 1},
    {"_PROGRAMS_PER_SM": 2},
    {"_PROGRAMS_PER_SM": 8},
    {"_CHUNK_PER_ROW": 2},
    {"_CHUNK_PER_ROW": 32},
    {"_MIN_CHUNK": 128},
    {"_PROGRAMS_PER_SM": 8, "_CHUNK_PER_ROW": 2, "_MIN_CHUNK": 128},
    {"_MAX_SPLITS": 64, "_CHUNK_PER_ROW": 2},
    {"_MAX_BLOCK_M": 64},
]


def bench_graph_cold(fn) -> float:
    """Median microseconds of replaying fn captured in a CUDA graph (how the verify step runs:
    no Python launch cost), still with do_bench's cold L2 before every replay."""
    fn()  # compile / autotune outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return bench(graph.replay)


def host_time(fn, calls: int = 200) -> float:
    """Mean host wall time of one call in µs, calls back to back (the launches queue up)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return t


def measure_ceilings() -> tuple[float, float]:
    """(copy bandwidth in bytes/s counting read + write, bf16 matmul FLOP/s), on random data."""
    src = torch.randn(2**30 // 2, device=DEV, dtype=DTYPE)  # 1 GiB
    dst = torch.empty_like(src)
    t = bench(lambda: dst.copy_(src)) * 1e-6
    bw = 2 * src.numel() * src.element_size() / t
    a = torch.randn(8192, 8192, device=DEV, dtype=DTYPE)
    b = torch.randn(8192, 8192, device=DEV, dtype=DTYPE)
    t = bench(lambda: a @ b) * 1e-6
    return bw, 2 * 8192**3 / t


def ancestor_masks(B: int, N: int, gen: torch.Generator) -> torch.Tensor:
    """[B, N, N] ancestor-or-self masks of random parent arrays (parent[i] < i)."""
    masks = torch.zeros(B, N, N, dtype=torch.bool)
    for b in range(B):
        parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, N)]
        for i in range(N):
            j = i
            while j >= 0:
                masks[b, i, j] = True
                j = parents[j]
    return masks


def make_inputs(B: int, L: int, N: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    pages_per_req = math.ceil((L + N) / PAGE)
    num_pages = B * pages_per_req
    page_table = torch.randperm(num_pages, generator=gen).view(B, pages_per_req).int().to(DEV)  # [B, P]
    k_cache = torch.randn(num_pages, PAGE, HKV, D, device=DEV, dtype=DTYPE)  # [pages, PAGE, Hkv, D]
    v_cache = torch.randn(num_pages, PAGE, HKV, D, device=DEV, dtype=DTYPE)  # [pages, PAGE, Hkv, D]
    q = torch.randn(B, N, HQ, D, device=DEV, dtype=DTYPE)  # [B, N, Hq, D]
    prefix_lens = torch.full((B,), L, dtype=torch.int32, device=DEV)  # [B]
    tree_mask = ancestor_masks(B, N, gen).to(DEV)  # [B, N, N]
    return q, k_cache, v_cache, page_table, prefix_lens, tree_mask


def dense_kv(k_cache, page_table, L, N):
    """Paged pool -> dense [B, Hkv, L+N, D] in position order."""
    pos = torch.arange(L + N, device=DEV)  # [L+N]
    slots = page_table[:, pos // PAGE].long() * PAGE + pos % PAGE  # [B, L+N]
    return k_cache.reshape(-1, HKV, D)[slots].transpose(1, 2).contiguous()  # [B, Hkv, L+N, D]


def run_row(B, L, N, providers, ceilings, sweep):
    q, k_cache, v_cache, page_table, prefix_lens, tree_mask = make_inputs(B, L, N)
    bw, flops_rate = ceilings
    kv_bytes = 2 * B * (L + N) * HKV * D * DTYPE.itemsize
    io_bytes = 2 * B * N * HQ * D * DTYPE.itemsize + tree_mask.numel() + page_table.numel() * 4
    hbm_floor = (kv_bytes + io_bytes) / bw * 1e6
    flop_floor = 4 * B * HQ * N * (L + N) * D / flops_rate * 1e6
    row = dict(B=B, L=L, N=N, hbm=hbm_floor, flop=flop_floor, floor=max(hbm_floor, flop_floor))
    row["bound"] = "HBM" if hbm_floor >= flop_floor else "compute"

    def eaglet():
        return tree_attention(q, k_cache, v_cache, page_table, prefix_lens, tree_mask, max_prefix_len=L)

    num_sms = sm_count(0)
    out = eaglet()  # [B, N, Hq, D]; the first call of a shape class autotunes
    row["config"] = str(sk._fwd_kernel.best_config)
    for variant in sweep:  # host-side plan knobs, e.g. {"_PROGRAMS_PER_SM": 2}, timed as graph replays
        saved = {name: getattr(sk, name) for name in variant}  # AttributeError for a misspelt knob
        for name, value in variant.items():
            setattr(sk, name, value)
        sk._plan.cache_clear()
        sk.prepare.cache_clear()  # its recipes hold the plan and the kernel's constexprs
        t = bench_graph_cold(eaglet)
        plan = (*sk._plan(B, N, HQ, HKV, L + N, N, num_sms), str(sk._fwd_kernel.best_config),
                f"rel err vs default {rel_err(eaglet(), out):.1e}")
        row.setdefault("sweep", []).append((variant, t, plan))
        for name, value in saved.items():
            setattr(sk, name, value)
        sk._plan.cache_clear()
        sk.prepare.cache_clear()
    row["eaglet"] = bench(eaglet)
    row["host"] = host_time(eaglet)
    row["graph"] = bench_graph_cold(eaglet)
    plan = sk._plan(B, N, HQ, HKV, L + N, N, num_sms)
    row["splits"] = f"{plan[2]}{' (tree apart)' if plan[4] else ''}"

    allowed = torch.cat([torch.ones(B, N, L, dtype=torch.bool, device=DEV), tree_mask], dim=2)  # [B, N, L+N]
    qh = q.transpose(1, 2).contiguous()  # [B, Hq, N, D]
    # SDPA always runs once: it is the correctness check.
    k = dense_kv(k_cache, page_table, L, N).repeat_interleave(HQ // HKV, dim=1)  # [B, Hq, L+N, D]
    v = dense_kv(v_cache, page_table, L, N).repeat_interleave(HQ // HKV, dim=1)  # [B, Hq, L+N, D]
    mask4 = allowed[:, None]  # [B, 1, N, L+N]
    ref = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask4).transpose(1, 2)  # [B, N, Hq, D]
    row["err"] = rel_err(out, ref)
    row["sdpa"] = (
        bench(lambda k=k, v=v: F.scaled_dot_product_attention(qh, k, v, attn_mask=mask4))
        if "sdpa" in providers else "not run"
    )
    del k, v
    row["flex"] = run_flex(qh, k_cache, v_cache, page_table, allowed, L, N, ref) if "flex" in providers else "not run"
    return row


_flex = None


def run_flex(qh, k_cache, v_cache, page_table, allowed, L, N, ref):
    global _flex
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if _flex is None:
        torch._dynamo.config.cache_size_limit = 64  # one compile per row shape; the default 8 falls back to eager
        _flex = torch.compile(flex_attention)
    B = qh.shape[0]
    k = dense_kv(k_cache, page_table, L, N)  # [B, Hkv, L+N, D]
    v = dense_kv(v_cache, page_table, L, N)  # [B, Hkv, L+N, D]

    def mask_mod(b, h, q_idx, kv_idx):
        return allowed[b, q_idx, kv_idx]

    try:
        block_mask = create_block_mask(mask_mod, B, None, N, L + N, device=DEV)
        fn = lambda: _flex(qh, k, v, block_mask=block_mask, enable_gqa=True)  # noqa: E731
        err = rel_err(fn().transpose(1, 2), ref)
        print(f"  flex B={B} L={L} N={N}: rel err vs SDPA {err:.1e}", file=sys.stderr)
        return bench(fn)
    except Exception as e:  # noqa: BLE001 - report any compile/run failure as 'failed'
        print(f"  flex B={B} L={L} N={N} failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}", file=sys.stderr)
        return None


def ratio(peer, ours):
    return peer / ours if isinstance(peer, float) else peer


def table(rows) -> str:
    head = (
        "| B | L | N | bound | HBM floor µs | compute floor µs | eaglet µs | eaglet graph µs | eaglet host µs "
        "| floor / eaglet "
        "| SDPA µs | Flex µs "
        "| eaglet speedup vs SDPA | vs Flex | splits | rel err vs SDPA |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        sdpa, flex = r["sdpa"], r["flex"]
        lines.append(
            f"| {r['B']} | {r['L']} | {r['N']} | {r['bound']} | {r['hbm']:.1f} | {r['flop']:.1f} | {r['eaglet']:.1f} "
            f"| {r['graph']:.1f} "
            f"| {r['host']:.1f} | {r['floor'] / r['eaglet']:.2f} | {fmt(sdpa)} | {fmt(flex)} "
            f"| {fmt(ratio(sdpa, r['eaglet']))} | {fmt(ratio(flex, r['eaglet']))} | {r['splits']} | {r['err']:.1e} |"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------
# --invariant: invariant against split-KV tree attention at the models' heads

MODELS = {  # the attention heads of models/llama.py's transformer_configs
    "SmolLM2-135M": dict(name="smollm2_135m", Hq=9, Hkv=3, D=64),
    "Llama-3.1-8B": dict(name="llama3_8b", Hq=32, Hkv=8, D=128),
}
# (B, N, L); N = 16-64: the verifies of the wider trees (sweep_tree)
ATTN_CASES = [(1, 1, 1024), (1, 8, 1024), (8, 1, 1024), (8, 8, 1024), (1, 8, 4096), (8, 8, 4096), (1, 16, 1024),
              (1, 64, 1024), (8, 16, 1024)]


def attn_inputs(B, N, Hq, Hkv, D, prefix, page_size=16, tree=True, seed=0):
    """bf16 q [B, N, Hq, D], a paged pool of shuffled pages holding prefix + N keys a request, and (tree, N > 1) the
    mask of a 4-ary EAGLE-2-like tree, parents first."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    pages_per = math.ceil((prefix + N) / page_size)
    num_pages = B * pages_per
    k = torch.randn(num_pages, page_size, Hkv, D, device=DEV, dtype=DTYPE, generator=gen)
    v = torch.randn(num_pages, page_size, Hkv, D, device=DEV, dtype=DTYPE, generator=gen)
    pt = torch.randperm(num_pages, device=DEV, generator=gen).view(B, pages_per).int()  # [B, P]
    pl = torch.full((B,), prefix, device=DEV, dtype=torch.int32)  # [B]
    q = torch.randn(B, N, Hq, D, device=DEV, dtype=DTYPE, generator=gen)  # [B, N, Hq, D]
    mask = tree_mask(B, N) if tree and N > 1 else None  # [B, N, N]
    return q, k, v, pt, pl, mask



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
            floor = B * (L + N) * c["Hkv"] * c["D"] * 2 * DTYPE.itemsize / bw * 1e6
            ratio = t["invariant"] / t["split"] if t["invariant"] and t["split"] else None
            out.append(f"| {model} | {B} | {N} | {L} | {floor:.2f} | {fmt(t['invariant'], '.2f')} | "
                       f"{fmt(t['split'], '.2f')} | {fmt(ratio, '.3f')} |")
            print("  " + out[-1], flush=True)
    return "\n".join(out)


def main_invariant(args: argparse.Namespace) -> None:
    """--invariant: `run_attn`'s table (to --md as well)."""
    if args.trace:
        Path(args.trace).mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy {bw / 1e12:.2f} TB/s (read+write)", flush=True)
    md = (provenance() + f"Measured copy bandwidth: {bw / 1e12:.2f} TB/s (read+write). bf16, CUDA graphs.\n\n"
          "## Tree attention: invariant against split-KV\n\n" + run_attn(args.models.split(","), bw, args.trace) + "\n")
    if args.md:
        with open(args.md, "w") as f:
            f.write(md)
    print(md)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--providers", default="eaglet,sdpa,flex", help="comma list of eaglet,sdpa,flex")
    ap.add_argument("--md", default=None, help="also write the table as markdown here")
    ap.add_argument("--sweep", action="store_true", help="also time host-plan variants (split count, row tile)")
    ap.add_argument("--configs", default=None, help="subset, e.g. '1x4096x64,8x16384x16' (BxLxN)")
    ap.add_argument("--invariant", action="store_true", help="instead: invariant against split-KV tree attention at "
                    "the models' decode and verify shapes (ATTN_CASES)")
    ap.add_argument("--models", default=",".join(MODELS), help=f"--invariant: comma list of {','.join(MODELS)}")
    ap.add_argument("--trace", default=None, help="--invariant: profile each invariant call's graph, trace files "
                    "into this folder, a per-kernel table printed")
    args = ap.parse_args()
    if args.invariant:
        return main_invariant(args)
    providers = set(args.providers.split(","))
    torch.manual_seed(0)
    ceilings = measure_ceilings()
    dev = torch.cuda.get_device_name()
    print(f"{dev}: copy {ceilings[0] / 1e12:.2f} TB/s (read+write), bf16 matmul {ceilings[1] / 1e12:.0f} TFLOP/s")
    configs = [tuple(map(int, c.split("x"))) for c in args.configs.split(",")] if args.configs else CONFIGS
    header = (
        provenance() +
        f"Measured ceilings: copy {ceilings[0] / 1e12:.2f} TB/s (read+write), "
        f"bf16 matmul {ceilings[1] / 1e12:.0f} TFLOP/s  \n"
        f"Setup: bf16, Hq={HQ}, Hkv={HKV}, D={D}, page_size {PAGE} (shuffled pages), random branching tree masks; "
        "median µs via triton.testing.do_bench (cold L2 before every call); 'eaglet graph' = the same call replayed "
        "from a CUDA graph (no Python launch cost).\n"
    )
    rows = []
    for B, L, N in configs:
        row = run_row(B, L, N, providers, ceilings, SWEEP if args.sweep else [])
        rows.append(row)
        print(
            f"  B={B} L={L} N={N}: eaglet {row['eaglet']:.1f} µs (graph {row['graph']:.1f}, host {row['host']:.1f}; "
            f"floor {row['floor']:.1f}, {row['bound']}), "
            f"SDPA {fmt(row['sdpa'])}, Flex {fmt(row['flex'])}, err {row['err']:.1e}, {row['config']}",
            flush=True,
        )
        for variant, t, plan in row.get("sweep", []):
            print(f"    sweep {variant}: {t:.1f} µs  plan(BLOCK_M, tiles, splits, chunk, apart)={plan}", flush=True)
        if args.md:  # rewritten after every row, so a run cut short still leaves its rows
            with open(args.md, "w") as f:
                f.write(header + "\n" + table(rows) + "\n")
        torch.cuda.empty_cache()
    print(header)
    print(table(rows))
    bad = [r for r in rows if not r["err"] < 1e-2]
    if bad:
        raise SystemExit(f"eaglet disagrees with SDPA in {len(bad)} rows")


if __name__ == "__main__":
    main()
