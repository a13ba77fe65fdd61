"""Draft top-k benchmark: eaglet `topk_logprobs` (Triton) vs its torch reference vs the HBM floor.

    python benchmarks/bench_topk.py --md benchmarks/results/topk_h200.md
    TRITON_INTERPRET=1 python benchmarks/bench_topk.py --smoke     # CPU: the script and the check, tiny shapes

Rows: the draft's top-k calls, `rows` logit rows (B * K tree nodes of a draft step; 1 for a root) of V ids (the
EAGLE-3 draft vocabularies of SmolLM2 and Llama-3-8B, SmolLM2's and Llama-3's full vocabularies), top k.
  * eaglet: `topk_logprobs` (kernels/topk.py); do_bench median (cold L2) and a CUDA-graph replay (how the draft runs).
  * torch: `topk_logprobs_ref`, the reference the tests use (log_softmax, then a top-k whose ties go to the lower id).
  * HBM floor: the logits read once / measured device-to-device copy bandwidth (`copy_bandwidth`).
Correctness per row: the ids must equal the reference's exactly; "rel err" is that of the log-probabilities.
--smoke runs on CPU under TRITON_INTERPRET=1 (the kernels in Triton's interpreter): its times are the
interpreter's, not a GPU's; it proves that the script and the check run.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import triton.testing
from _common import bench, fmt, provenance, rel_err, report

from eaglet.kernels._utils import copy_bandwidth
from eaglet.kernels.topk import topk_logprobs, topk_logprobs_ref

CONFIGS = [(rows, V, k) for V in (8192, 32000, 49152, 128256) for rows, k in ((1, 4), (4, 4), (64, 4), (640, 10))]
SMOKE_CONFIGS = [(2, 1000, 4), (2, 3000, 4)]  # one chunk (V <= 1,024 ids), and chunks + the rows kernel


def timed(fn, smoke: bool) -> float:
    """Median µs: do_bench on the GPU; under --smoke one interpreted call's wall time."""
    if not smoke:
        return bench(fn)
    fn()
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e6


def run(rows: int, V: int, k: int, dtype: torch.dtype, dev: str, bw: float | None, smoke: bool) -> dict:
    gen = torch.Generator().manual_seed(rows * V + k)
    logits = (torch.randn(rows, V, generator=gen) * 3.0).to(dev, dtype)  # [rows, V]
    lp, ids = topk_logprobs(logits, k)  # [rows, k] each
    rlp, rids = topk_logprobs_ref(logits, k)  # [rows, k] each
    r = dict(rows=rows, V=V, k=k, err=rel_err(lp, rlp) if torch.equal(ids, rids) else float("inf"))
    r["eaglet"] = timed(lambda: topk_logprobs(logits, k), smoke)
    r["graph"] = "not run" if smoke else triton.testing.do_bench_cudagraph(
        lambda: topk_logprobs(logits, k), rep=50, return_mode="median") * 1e3
    r["torch"] = timed(lambda: topk_logprobs_ref(logits, k), smoke)
    r["floor"] = "n/a" if bw is None else logits.numel() * logits.element_size() / bw * 1e6
    return r


def table(rows: list[dict]) -> str:
    head = ("| rows | V | k | HBM floor µs | eaglet µs | eaglet graph µs | torch ref µs | floor / eaglet graph "
            "| eaglet speedup vs torch | ids equal, lp rel err |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        graph, floor = r["graph"], r["floor"]
        frac = floor / graph if isinstance(graph, float) and isinstance(floor, float) else "n/a"
        lines.append(f"| {r['rows']} | {r['V']} | {r['k']} | {fmt(floor, '.2f')} "
                     f"| {r['eaglet']:.1f} | {fmt(graph)} | {r['torch']:.1f} | {fmt(frac, '.2f')} "
                     f"| {r['torch'] / r['eaglet']:.1f} | {r['err']:.1e} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--md", default=None, help="also write the table as markdown here")
    ap.add_argument("--smoke", action="store_true", help="CPU under TRITON_INTERPRET=1, tiny shapes (no GPU numbers)")
    args = ap.parse_args()
    if args.smoke and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("--smoke runs the kernels in Triton's interpreter: set TRITON_INTERPRET=1")
    dev, dtype = ("cpu", torch.float32) if args.smoke else ("cuda", torch.bfloat16)  # the interpreter's bf16 is wrong
    bw = None if args.smoke else copy_bandwidth()
    rows = [run(r, V, k, dtype, dev, bw, args.smoke) for r, V, k in (SMOKE_CONFIGS if args.smoke else CONFIGS)]
    header = ("Smoke run: CPU, Triton interpreter (times are not kernel times)\n" if args.smoke else
              provenance() + f"Measured copy bandwidth {bw / 1e12:.2f} TB/s (read+write); {dtype} logits; "
              "median µs via triton.testing.do_bench (cold L2), 'graph' = CUDA-graph replay.\n")
    report(header, table(rows), args.md, rows)


if __name__ == "__main__":
    main()
