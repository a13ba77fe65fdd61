"""Where a short tree-attention call's time goes: each forward config and split length, timed from CUDA graphs.

    python -m benchmarks.probes.probe_tree_attention --configs 1x1024x16,1x4096x16,1x16384x16,1x1024x8@4096
    ncu --clock-control none -k regex:_fwd_kernel --section SpeedOfLight --section WarpStateStats \
        python -m benchmarks.probes.probe_tree_attention --configs 1x4096x16 --ncu

A row BxLxN@bound plans the grid for max_prefix_len=bound instead of L, as a CUDA graph captured for a longer
context does (the engine's verify graph is planned for max_context). The table's rows use bench_tree_attention's
inputs (bf16, Hq=32, Hkv=8, D=128, page_size 16, shuffled pages, branching tree masks). Every time is the median of
a graph replay after zeroing a 256 MB buffer (as do_bench does: the K/V come from HBM, a cold L2). Replays back to
back would time the host instead: a graph of one empty kernel replays every 16.6 µs that way on an H200. Printed
per row:
  * the launch floor: a graph of one and of two empty Triton kernels (what no kernel can go under);
  * the autotuned config and its time, with and without the merge kernel;
  * every forward config of the autotune grid at the planned split length;
  * split lengths (chunk) from 64 to 2048 keys with the best config, with the new keys in the last split and in
    a split of their own (TREE_APART: the tree tiles run beside the prefix tiles instead of after them; the plan
    takes it while the grid stays within one program per SM).
--ncu launches each config once (for ncu's per-kernel report) and times nothing.
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

import eaglet.kernels.tree_attention_splitkv as sk
from benchmarks.bench_tree_attention import HKV, HQ, make_inputs
from eaglet.kernels.tree_attention import tree_attention
from eaglet.kernels.tree_attention_plan import meta


@triton.jit
def _empty_kernel(X):
    tl.store(X + tl.program_id(0), 0)


def graph_us(fn, reps: int = 200) -> float:
    """Median µs of replaying fn captured in a CUDA graph, the L2 flushed before each replay."""
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")  # 256 MB, over the H200's 50 MB of L2
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        flush.zero_()
        s.record()
        graph.replay()
        e.record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))
    return times[len(times) // 2]


class Call:
    """One tree_attention call with the launch recipe opened up: the forward config and the split length are
    set here instead of by the autotuner and the plan. Buffers are allocated once (graph-capturable)."""

    def __init__(self, B: int, L: int, N: int, bound: int | None = None):
        self.B, self.L, self.N, self.bound = B, L, N, bound or L
        self.inputs = make_inputs(B, self.bound, N)
        self.inputs[4].fill_(L)  # prefix_lens [B]: the pool holds the bound's pages, the requests use L
        q, mask = self.inputs[0], self.inputs[5]  # [B, N, Hq, D], [B, N, N]
        metas = [meta(t) for t in self.inputs]
        self.recipe = sk.prepare(*metas, None, self.bound, False)
        self.kv_max = self.bound + N
        self.out = torch.empty_like(q)  # [B, N, Hq, D]
        self.mask = mask.view(torch.uint8)  # [B, N, N]

    def default(self):
        q, k, v, pt, pl, mask = self.inputs
        return tree_attention(q, k, v, pt, pl, mask, max_prefix_len=self.bound)

    def planned_chunk(self) -> int:
        return self.recipe[2][1]

    def planned_apart(self) -> bool:
        return self.recipe[3]["TREE_APART"]

    def launcher(self, chunk: int, cfg: dict, merge: bool = True, apart: bool | None = None):
        """A callable running the forward (with cfg: BLOCK_N, num_warps, num_stages) and the merge; apart: the new
        keys in a split of their own (None: as planned)."""
        q, k, v, pt, pl, _ = self.inputs
        _, (m_tiles, _, bh), fwd_args, fwd_kw, _, _ = self.recipe
        apart = self.planned_apart() if apart is None else apart
        splits = sk._num_splits(self.kv_max, self.N, chunk, apart)
        group = HQ // HKV
        fwd_args = (fwd_args[0], chunk, splits, *fwd_args[3:])
        kw = dict(fwd_kw, SPLIT=splits > 1, TREE_APART=apart, **cfg)
        ws_numel = self.B * HKV * splits * self.N * group * (q.shape[-1] + 1)  # partial outputs + LSEs
        ws = torch.empty(ws_numel, device="cuda") if splits > 1 else self.out
        merge_kw = dict(GROUP=group, HEAD_DIM=q.shape[-1], HAS_MASK=True, BLOCK_S=triton.next_power_of_2(splits),
                        num_warps=4 if splits <= 32 else 8, TREE_APART=apart, FIXED_CHUNK=False)  # fmt: skip

        def run():
            sk._fwd_kernel.fn[(m_tiles, splits, bh)](q, k, v, pt, pl, self.mask, ws, *fwd_args, **kw)
            if merge and splits > 1:
                sk._merge_kernel[(self.N * group, bh)](ws, pl, self.out, chunk, splits, self.N, self.N, HKV, **merge_kw)
            return self.out

        return run


def fwd_configs(block_m: int) -> list[dict]:
    kept = sk._prune_fwd_configs(sk._fwd_configs(), {}, BLOCK_M=block_m)
    return [dict(BLOCK_N=c.kwargs["BLOCK_N"], num_warps=c.num_warps, num_stages=c.num_stages) for c in kept]


def cfg_str(c: dict) -> str:
    return f"BLOCK_N {c['BLOCK_N']}, {c['num_warps']} warps, {c['num_stages']} stages"


def probe_row(B: int, L: int, N: int, bound: int | None) -> list[str]:
    call = Call(B, L, N, bound)
    ref = call.default()  # autotunes this shape class
    bc = sk._fwd_kernel.best_config
    tuned = dict(BLOCK_N=bc.kwargs["BLOCK_N"], num_warps=bc.num_warps, num_stages=bc.num_stages)
    chunk = call.planned_chunk()
    apart = call.planned_apart()
    splits = sk._num_splits(call.kv_max, N, chunk, apart)
    where = "in a split of their own" if apart else "in the last split"
    planned = f" (grid planned for {bound})" if bound else ""
    lines = [f"## B={B} L={L} N={N}{planned}: plan {splits} splits x {chunk} keys, new keys {where}; "
             f"autotuned {cfg_str(tuned)}", ""]
    lines.append(f"- autotuned, full call: {graph_us(call.default):.1f} µs")
    lines.append(f"- autotuned, forward only: {graph_us(call.launcher(chunk, tuned, merge=False)):.1f} µs")
    lines += ["", "| forward config | µs | max abs diff vs default call |", "|---|---|---|"]
    timed = []
    for cfg in fwd_configs(call.recipe[3]["BLOCK_M"]):
        run = call.launcher(chunk, cfg)
        try:
            diff = (run().float() - ref.float()).abs().max().item()
        except OutOfResources as e:  # the autotuner skips such configs the same way
            lines.append(f"| {cfg_str(cfg)} | {e} | |")
            continue
        t = graph_us(run)
        timed.append((t, cfg))
        lines.append(f"| {cfg_str(cfg)} | {t:.1f} | {diff:.1e} |")
    best = min(timed, key=lambda t: t[0])[1]
    lines += ["", f"Split length with the best config ({cfg_str(best)}):", "",
              "| chunk | splits | µs | splits, new keys apart | µs, new keys apart |",
              "|---|---|---|---|---|"]  # fmt: skip
    for c in (64, 128, 256, 512, 1024, 2048):
        s, s_apart = sk._num_splits(call.kv_max, N, c, False), sk._num_splits(call.kv_max, N, c, True)
        if c >= best["BLOCK_N"] and s_apart <= sk._MERGE_SPLITS and c < 2 * call.kv_max:
            t, t_apart = graph_us(call.launcher(c, best, apart=False)), graph_us(call.launcher(c, best, apart=True))
            lines.append(f"| {c} | {s} | {t:.1f} | {s_apart} | {t_apart:.1f} |")
    return lines + [""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # 1x1024x8: the shape of a B=1 verify of Llama-3.1-8B with 8 tree tokens (experiments' ablate_overlap), whose
    # graph is planned for max_context=4096 (@4096)
    ap.add_argument("--configs", default="1x1024x8,1x1024x8@4096,1x1024x16,1x4096x16,1x16384x16,1x4096x64")
    ap.add_argument("--ncu", action="store_true", help="launch each config once, time nothing (for ncu)")
    args = ap.parse_args()
    rows = [(*map(int, c.split("@")[0].split("x")), int(c.split("@")[1]) if "@" in c else None)
            for c in args.configs.split(",")]  # fmt: skip
    if args.ncu:
        for B, L, N, bound in rows:
            call = Call(B, L, N, bound)
            for cfg in fwd_configs(call.recipe[3]["BLOCK_M"]):
                print(f"B={B} L={L} N={N} {cfg_str(cfg)}", flush=True)
                try:
                    call.launcher(call.planned_chunk(), cfg)()
                except OutOfResources as e:
                    print(f"  skipped: {e}", flush=True)
        torch.cuda.synchronize()
        return
    x = torch.zeros(1024, device="cuda")
    one = lambda: _empty_kernel[(1,)](x)  # noqa: E731
    two = lambda: (_empty_kernel[(1,)](x), _empty_kernel[(1,)](x))  # noqa: E731
    out = [f"Launch floor (graph replay): one empty kernel {graph_us(one):.1f} µs, two {graph_us(two):.1f}", ""]
    for B, L, N, bound in rows:
        lines = probe_row(B, L, N, bound)
        print("\n".join(lines), flush=True)
        out += lines
    print("\n".join(out))


if __name__ == "__main__":
    main()
