"""Helpers shared by the benchmark and probe scripts, which run as modules from the repository root
(`python -m benchmarks.bench_projection`, `python -m benchmarks.probes.probe_tree_attention`) and import this as
`benchmarks._common`."""

from __future__ import annotations

import argparse
import datetime
import math
import os
import sys
import time

import torch
import triton
import triton.testing

DEV = "cuda"
DTYPE = torch.bfloat16  # the GPU benchmarks' activations and weights
BYTES = DTYPE.itemsize
GRAPH_REPEATS = 20  # calls a `bench_graph` graph holds
COLD_BYTES = 128 * 2**20  # weight copies per graph: enough to leave L2 (50 MB on an H200) behind


def command() -> str:
    """The command line that runs this script, as a table records it: `python -m benchmarks.<script> args`."""
    main = sys.modules["__main__"].__spec__  # None when run by path (with the repository root on PYTHONPATH)
    script = f"-m {main.name}" if main else os.path.relpath(sys.argv[0])
    return " ".join(["python", script, *sys.argv[1:]])


def provenance() -> str:
    """The first lines of every recorded table: the command that made it, the date and the device."""
    return (f"Command: `{command()}`  \n"
            f"Date: {datetime.date.today()}  \n"
            f"Device: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}  \n")


def bench(fn) -> float:
    """Median microseconds, eager (host launch included), cold L2."""
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def fmt(x, spec: str = ".1f") -> str:
    """A table cell: None = the provider ran and failed; a string (e.g. "not run") as it is."""
    return "failed" if x is None else x if isinstance(x, str) else format(x, spec)


def report(header: str, md: str, md_path: str | None, rows: list[dict]) -> None:
    """Print the table (and write it to md_path); exit non-zero if a row's rel err vs the torch reference is not
    below 1e-2."""
    if md_path:
        with open(md_path, "w") as f:
            f.write(header + "\n" + md + "\n")
    print(header)
    print(md)
    bad = [r for r in rows if not r["err"] < 1e-2]
    if bad:
        raise SystemExit(f"eaglet disagrees with the torch reference in {len(bad)} rows")


# --smoke: a kernel benchmark run on CPU in Triton's interpreter at tiny shapes, to show that it and its check run.
SMOKE_HEADER = "Smoke run: CPU, Triton interpreter (times are not kernel times)\n"


def kernel_bench_args(doc: str) -> argparse.Namespace:
    """The arguments of a kernel benchmark: --md (write the table there too) and --smoke."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--md", default=None, help="also write the table as markdown here")
    ap.add_argument("--smoke", action="store_true", help="CPU under TRITON_INTERPRET=1, tiny shapes (no GPU numbers)")
    args = ap.parse_args()
    if args.smoke and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("--smoke runs the kernels in Triton's interpreter: set TRITON_INTERPRET=1")
    return args


def timed(fn, smoke: bool, host: bool = False) -> float:
    """Median µs of a GPU call (`bench`); for a host call, or under --smoke, one call's wall time after a first."""
    if not (smoke or host):
        return bench(fn)
    fn()
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e6


def graph_us(fn, smoke: bool) -> float | str:
    """Median µs of CUDA-graph replays of fn (how the decode step runs: no launch cost); "not run" under --smoke."""
    return "not run" if smoke else triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e3


def bench_graph(fn, n_copies: int) -> float | None:
    """Median microseconds per call inside a CUDA graph of GRAPH_REPEATS calls fn(i % n_copies) (`weights` gives the
    copies: every call then reads its weights from HBM, as in a decode step whose layer weights were evicted since the
    last step); None, with the reason printed, when the capture fails."""
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


def weights(n: int, k: int) -> list[torch.Tensor]:
    """Copies of one nn.Linear-like weight [n, k], enough for cold reads inside a graph (at least COLD_BYTES in all,
    at most GRAPH_REPEATS)."""
    copies = min(GRAPH_REPEATS, max(1, math.ceil(COLD_BYTES / (n * k * BYTES))))
    w = torch.randn(n, k, device=DEV, dtype=DTYPE) * k**-0.5  # [n, k]
    return [w] + [w.clone() for _ in range(copies - 1)]


def tree_mask(B: int, N: int) -> torch.Tensor:
    """[B, N, N] ancestor-or-self mask of a 4-ary EAGLE-2-like tree of N tokens, parents first, on DEV."""
    parents = [-1] + [(i - 1) // 4 for i in range(1, N)]
    m = torch.zeros(N, N, dtype=torch.bool)
    for i in range(N):
        j = i
        while j >= 0:
            m[i, j], j = True, parents[j]
    return m[None].expand(B, N, N).contiguous().to(DEV)  # [B, N, N]


def random_model(name: str):
    """The architecture `name` (models/llama.py) with random weights: N(0, 0.02) everywhere, the norm weights in
    [0.5, 1.5] -> (ModelArgs, Transformer) on the GPU in DTYPE."""
    from eaglet.models.llama import ModelArgs, Transformer

    args = ModelArgs.from_name(name)
    with torch.device(DEV):
        net = Transformer(args).to(DTYPE)
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0, 0.02)
        for layer in net.model.layers:
            layer.input_layernorm.weight.uniform_(0.5, 1.5)
            layer.post_attention_layernorm.weight.uniform_(0.5, 1.5)
    return args, net.eval()
