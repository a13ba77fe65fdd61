"""Chunking of `topk_logprobs` (kernels/topk.py): its chunk rule against fixed chunk lengths and torch's
log_softmax + topk, fp32 logits, each call 20 times in one CUDA graph (µs per call, median of replays).

    python -m benchmarks.probes.sweep_topk_chunks

The rule (`_SINGLE_CHUNK`, `_block_v`) comes from this sweep; results/draft_kernels_h200.md has it.
"""

from __future__ import annotations

import torch
import triton

import eaglet.kernels.topk as topk

VARIANTS = {"rule": None, "chunk 1024": 1024, "chunk 2048": 2048, "chunk 4096": 4096, "one chunk <= 8192": 8192}


def graph_us(fn, reps: int = 20) -> float:
    fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    return triton.testing.do_bench(graph.replay, warmup=25, rep=100, return_mode="median") * 1e3 / reps


def main() -> None:
    rule = (topk._SINGLE_CHUNK, topk._block_v)
    print("| V | rows | k | torch | " + " | ".join(VARIANTS) + " |\n|" + "---|" * (4 + len(VARIANTS)))
    for V in (8192, 32000, 128256):
        for R, k in ((1, 1), (4, 4), (32, 4)):
            x = torch.randn(R, V, device="cuda") * 3  # [R, V]
            cells = [graph_us(lambda: torch.log_softmax(x, -1).topk(k, -1))]
            for chunk in VARIANTS.values():
                if chunk is None:
                    topk._SINGLE_CHUNK, topk._block_v = rule
                elif chunk == 8192:  # a row of up to 8,192 ids in one program, longer rows by the rule
                    topk._SINGLE_CHUNK, topk._block_v = 8192, rule[1]
                else:
                    topk._SINGLE_CHUNK, topk._block_v = 0, (lambda V, c=chunk: c)
                assert torch.equal(topk.topk_logprobs(x, k)[1], topk.topk_logprobs_ref(x, k)[1])
                cells.append(graph_us(lambda: topk.topk_logprobs(x, k)))
            topk._SINGLE_CHUNK, topk._block_v = rule
            print(f"| {V} | {R} | {k} | " + " | ".join(f"{c:.2f}" for c in cells) + " |", flush=True)


if __name__ == "__main__":
    main()
