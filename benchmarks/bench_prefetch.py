"""L2 prefetch (kernels/prefetch.py) on the 8B verify's o_proj window: does a weight prefetched beside tree
attention make the o_proj GEMM after it faster, and by how much net?

    python benchmarks/bench_prefetch.py --md benchmarks/results/prefetch_h200.md

A stack of LAYERS layers, each with its own Llama-3-8B o_proj weight (4096 x 4096 bf16, 33.5 MB) and its own
paged K/V (B=1, prefix 1,100 in a graph planned for 4,096, N=8 tree tokens: the engine's verify at
`target=random_llama3_8b tree=simulate`), captured in one CUDA graph; µs per layer are the graph's median
replay (do_bench zeroes 256 MB before each, so layer 0 starts cold too) divided by LAYERS. Rows:
  * prefetch alone: l2_prefetch of each layer's weight, back to back: its bandwidth against the copy bandwidth
    (read + write bytes per second, so a read-only stream at HBM speed reaches ~100%);
  * o_proj cold: F.linear at M=8, each layer's weight read from HBM;
  * o_proj from L2: l2_prefetch then o_proj, minus the prefetch alone;
  * attention -> o_proj: the model without prefetch;
  * attention + prefetch -> o_proj: the model with weight_prefetch.o_proj=1 (models/prefetch.py's fork and join),
    for several program counts of the prefetch.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from _common import bench, provenance
from bench_tree_attention import ancestor_masks

from eaglet.kernels._utils import copy_bandwidth
from eaglet.kernels.prefetch import default_programs, l2_prefetch
from eaglet.kernels.tree_attention import tree_attention
from eaglet.models.prefetch import WeightPrefetch

HQ, HKV, D, PAGE, DIM = 32, 8, 128, 16, 4096
DEV, DTYPE = "cuda", torch.bfloat16


def graph_us(fn, layers: int) -> float:
    """Median µs per layer of fn (all layers) replayed as one CUDA graph."""
    fn()  # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return bench(g.replay) / layers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--prefix", type=int, default=1100)
    ap.add_argument("--bound", type=int, default=4096, help="max_prefix_len the attention grid is planned for")
    ap.add_argument("--tokens", type=int, default=8, help="tree tokens verified (the GEMM's M)")
    ap.add_argument("--md", help="also write the table to this markdown file")
    a = ap.parse_args()
    L, N, n = a.layers, a.tokens, a.prefix
    gen = torch.Generator().manual_seed(0)
    w_o = [torch.randn(DIM, HQ * D, device=DEV, dtype=DTYPE) * 0.02 for _ in range(L)]  # [DIM, Hq*D] each
    pages = -(-(n + N) // PAGE)
    kv = [(torch.randn(pages, PAGE, HKV, D, device=DEV, dtype=DTYPE),
           torch.randn(pages, PAGE, HKV, D, device=DEV, dtype=DTYPE)) for _ in range(L)]  # [pages, PAGE, Hkv, D]
    table = torch.randperm(pages, generator=gen).view(1, pages).int().to(DEV)  # [1, pages]
    lens = torch.tensor([n], dtype=torch.int32, device=DEV)  # [1]
    mask = ancestor_masks(1, N, gen).to(DEV)  # [1, N, N]
    q = torch.randn(1, N, HQ, D, device=DEV, dtype=DTYPE)  # [1, N, Hq, D]
    sm = default_programs(torch.device(DEV))
    sink = torch.empty(sm, dtype=torch.int32, device=DEV)  # [SMs]
    x = torch.randn(1, N, HQ * D, device=DEV, dtype=DTYPE)  # [1, N, Hq*D]

    def attn(i):
        return tree_attention(q, *kv[i], table, lens, mask, max_prefix_len=a.bound)  # [1, N, Hq, D]

    def prefetch_all():
        for w in w_o:
            l2_prefetch(w, out=sink)

    def o_cold():
        for w in w_o:
            F.linear(x, w)

    def o_after_prefetch():
        for w in w_o:
            l2_prefetch(w, out=sink)
            F.linear(x, w)

    def serial():
        for i, w in enumerate(w_o):
            F.linear(attn(i).view(1, N, -1), w)

    def overlapped(pf: WeightPrefetch):
        def fn():
            for i, w in enumerate(w_o):
                pf.fork("o_proj", w)
                o = attn(i)  # [1, N, Hq, D]
                pf.join()
                F.linear(o.view(1, N, -1), w)
        return fn

    bw = copy_bandwidth(DEV)
    mb = w_o[0].numel() * w_o[0].element_size() / 1e6
    rows = []
    t_pf = graph_us(prefetch_all, L)
    rows.append(("prefetch alone", t_pf, f"{mb / t_pf:.2f} TB/s = {mb * 1e12 / t_pf / bw:.0%} of copy BW"))
    t_cold = graph_us(o_cold, L)
    rows.append(("o_proj cold", t_cold, f"HBM floor {mb * 1e12 / bw:.1f} µs"))
    t_hot = graph_us(o_after_prefetch, L) - t_pf
    rows.append(("o_proj from L2 (prefetch -> o_proj, minus prefetch)", t_hot, ""))
    rows.append(("attention alone", graph_us(lambda: [attn(i) for i in range(L)], L), ""))
    t_serial = graph_us(serial, L)
    rows.append(("attention -> o_proj", t_serial, "the model, no prefetch"))
    for p in (sm // 2, sm, 2 * sm):
        t = graph_us(overlapped(WeightPrefetch({"o_proj": 1.0}, DEV, programs=p)), L)
        rows.append((f"attention + prefetch ({p} programs) -> o_proj", t, f"saves {t_serial - t:.1f} µs a layer"))

    lines = [provenance(), f"Copy bandwidth {bw / 1e12:.2f} TB/s; o_proj {mb:.1f} MB; {L} layers; prefix {n} "
             f"(grid for {a.bound}), N={N}.", "", "| variant | µs per layer | note |", "|---|---|---|"]
    lines += [f"| {name} | {t:.2f} | {note} |" for name, t, note in rows]
    text = "\n".join(lines)
    print(text)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
