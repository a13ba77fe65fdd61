"""Draft top-k and the greedy argmax: eaglet `topk_logprobs` / `argmax` (Triton) vs torch vs the HBM floor.

    python -m benchmarks.bench_topk --md results/topk_h200.md
    TRITON_INTERPRET=1 python -m benchmarks.bench_topk --smoke     # CPU: the script and the check, tiny shapes

Rows: the draft's top-k calls, `rows` logit rows (B * K tree nodes of a draft step; 1 for a root) of V ids (the
EAGLE-3 draft vocabularies of SmolLM2 and Llama-3-8B, SmolLM2's and Llama-3's full vocabularies), top k.
  * eaglet: `topk_logprobs` (kernels/topk.py); do_bench median (cold L2) and a CUDA-graph replay (how the draft runs).
  * torch: `topk_logprobs_ref`, the reference the tests use (log_softmax, then a top-k whose ties go to the lower id).
  * HBM floor: the logits read once / measured device-to-device copy bandwidth (`copy_bandwidth`).
Correctness per row: the ids must equal the reference's exactly; "rel err" is that of the log-probabilities.
Then the greedy argmax (`argmax`, topk_logprobs' kernels at k = 1) against torch's argmax over the target's logits
in bf16: 1 row (a plain decoding step), 31 (a SmolLM2 verify of 16 + 15 nodes), 248 (8 such requests); CUDA-graph
replays, ids equal.
--smoke runs on CPU under TRITON_INTERPRET=1 (the kernels in Triton's interpreter): its times are the
interpreter's, not a GPU's; it proves that the script and the check run.
"""

from __future__ import annotations

import torch

from benchmarks._common import SMOKE_HEADER, fmt, graph_us, kernel_bench_args, provenance, rel_err, report, timed
from eaglet.kernels._utils import copy_bandwidth
from eaglet.kernels.topk import argmax, topk_logprobs, topk_logprobs_ref

CONFIGS = [(rows, V, k) for V in (8192, 32000, 49152, 128256) for rows, k in ((1, 4), (4, 4), (64, 4), (640, 10))]
SMOKE_CONFIGS = [(2, 1000, 4), (2, 3000, 4)]  # one chunk (V <= 1,024 ids), and chunks + the rows kernel
ARGMAX_CONFIGS = [(rows, V) for V in (49152, 128256) for rows in (1, 31, 248)]
SMOKE_ARGMAX = [(3, 3000)]


def run(rows: int, V: int, k: int, dtype: torch.dtype, dev: str, bw: float | None, smoke: bool) -> dict:
    gen = torch.Generator().manual_seed(rows * V + k)
    logits = (torch.randn(rows, V, generator=gen) * 3.0).to(dev, dtype)  # [rows, V]
    lp, ids = topk_logprobs(logits, k)  # [rows, k] each
    rlp, rids = topk_logprobs_ref(logits, k)  # [rows, k] each
    r = dict(rows=rows, V=V, k=k, err=rel_err(lp, rlp) if torch.equal(ids, rids) else float("inf"))
    r["eaglet"] = timed(lambda: topk_logprobs(logits, k), smoke)
    r["graph"] = graph_us(lambda: topk_logprobs(logits, k), smoke)
    r["torch"] = timed(lambda: topk_logprobs_ref(logits, k), smoke)
    r["floor"] = "n/a" if bw is None else logits.numel() * logits.element_size() / bw * 1e6
    return r


def run_argmax(rows: int, V: int, dtype: torch.dtype, dev: str, bw: float | None, smoke: bool) -> dict:
    gen = torch.Generator().manual_seed(rows + V)
    logits = (torch.randn(rows, V, generator=gen) * 3.0).to(dev, dtype)  # [rows, V]
    equal = torch.equal(argmax(logits), logits.argmax(-1))
    r = dict(rows=rows, V=V, equal=equal, err=0.0 if equal else float("inf"))  # `report` fails a row of unequal ids
    r["eaglet"] = graph_us(lambda: argmax(logits), smoke)
    r["torch"] = graph_us(lambda: logits.argmax(-1), smoke)
    r["floor"] = "n/a" if bw is None else logits.numel() * logits.element_size() / bw * 1e6
    return r


def argmax_table(rows: list[dict]) -> str:
    head = "| rows | V | HBM floor µs | eaglet argmax graph µs | torch argmax graph µs | torch / eaglet | ids equal |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        e, t = r["eaglet"], r["torch"]
        ratio = t / e if isinstance(e, float) and isinstance(t, float) else "n/a"
        lines.append(f"| {r['rows']} | {r['V']} | {fmt(r['floor'], '.2f')} | {fmt(e)} | {fmt(t)} | {fmt(ratio, '.2f')} "
                     f"| {r['equal']} |")
    return "\n".join(lines)


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
    args = kernel_bench_args(__doc__)
    dev, dtype = ("cpu", torch.float32) if args.smoke else ("cuda", torch.bfloat16)  # the interpreter's bf16 is wrong
    bw = None if args.smoke else copy_bandwidth()
    rows = [run(r, V, k, dtype, dev, bw, args.smoke) for r, V, k in (SMOKE_CONFIGS if args.smoke else CONFIGS)]
    header = (SMOKE_HEADER if args.smoke else
              provenance() + f"Measured copy bandwidth {bw / 1e12:.2f} TB/s (read+write); {dtype} logits; "
              "median µs via triton.testing.do_bench (cold L2), 'graph' = CUDA-graph replay.\n")
    greedy = [run_argmax(r, V, dtype, dev, bw, args.smoke) for r, V in (SMOKE_ARGMAX if args.smoke else ARGMAX_CONFIGS)]
    report(header, table(rows) + "\n\n" + argmax_table(greedy), args.md, rows + greedy)


if __name__ == "__main__":
    main()
