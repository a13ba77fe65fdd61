"""N-gram match benchmark: eaglet `ngram_match` (Triton) vs batched torch `unfold` matching vs the HBM floor.

    python -m benchmarks.bench_ngram_match --md results/ngram_match_h200.md
    python -m benchmarks.bench_ngram_match --tile 8192       # the kernel at another tile (elements a block)
    TRITON_INTERPRET=1 python -m benchmarks.bench_ngram_match --smoke     # CPU: the script and the check, tiny shapes

Rows: B requests with histories of L int64 tokens (all valid), n-gram sizes 1..3, M matches. The tokens are random
over SmolLM2's 49,152 ids, so the 3-token suffix recurs nowhere and every request scans its whole history: the
kernel's worst case (a suffix that recurs near the end stops the scan within a block).
  * eaglet: `ngram_match` (kernels/ngram_match.py); do_bench median (cold L2) and a CUDA-graph replay (how a draft
    runs).
  * unfold: the same answer in batched torch, matched as Hugging Face's prompt lookup matches
    (`history.unfold(1, n, 1) == suffix`), for every n, then the largest n that matched and its M most recent starts
    by a top-k; no host sync, so it is timed in a CUDA graph too.
  * HBM floor: the histories read once (B * L * 8 bytes) / measured device-to-device copy bandwidth
    (`copy_bandwidth`).
Correctness per row: eaglet and unfold both equal `ngram_match_ref` (the plain-Python spec) exactly.
--smoke runs on CPU under TRITON_INTERPRET=1 (the kernel in Triton's interpreter): its times are the
interpreter's, not a GPU's; it proves that the script and the check run.
"""

from __future__ import annotations

import argparse
import os

import torch

import eaglet.kernels.ngram_match as ngm
from benchmarks._common import SMOKE_HEADER, fmt, graph_us, provenance, report, timed
from eaglet.kernels._utils import copy_bandwidth
from eaglet.kernels.ngram_match import ngram_match, ngram_match_ref

N_MIN, N_MAX = 1, 3
VOCAB = 49152
CONFIGS = [(B, L, M) for B in (1, 8, 64) for L in (1024, 4096, 16384) for M in (1, 4)]
SMOKE_CONFIGS = [(2, 100, 1), (3, 300, 4)]
SMOKE_VOCAB = 8  # small enough that the smoke run's suffixes recur at every n


def ngram_match_unfold(history: torch.Tensor, rows: torch.Tensor, lengths: torch.Tensor, n_max: int, n_min: int,
                       M: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`ngram_match` in batched torch ops (the peer): each n's windows `unfold(1, n, 1)` compared with the suffix,
    the largest n with a match kept; no host sync."""
    h = history[rows]  # [B, L]
    B, L = h.shape
    lens = lengths.long()[:, None]  # [B, 1]
    starts = torch.full((B, M), -1, dtype=torch.int32, device=h.device)  # [B, M]
    ngram = torch.zeros(B, dtype=torch.int32, device=h.device)  # [B]
    for n in range(n_min, n_max + 1):  # a larger n that matched overwrites
        if L < n + 1:  # no window with a continuation
            continue
        suffix = h.gather(1, (lens - n + torch.arange(n, device=h.device)).clamp(min=0))  # [B, n]
        i = torch.arange(L - n + 1, device=h.device)  # [L-n+1] window starts
        hit = (h.unfold(1, n, 1) == suffix[:, None, :]).all(-1) & (i + n < lens)  # [B, L-n+1]
        top = torch.where(hit, i, -1).topk(min(M, L - n + 1), dim=-1).values  # [B, <= M] largest i first, -1 past
        top = torch.nn.functional.pad(top, (0, M - top.shape[1]), value=-1)  # [B, M]
        found = hit.any(-1)  # [B]
        starts = torch.where(found[:, None], torch.where(top >= 0, top + n, -1).int(), starts)  # [B, M]
        ngram = torch.where(found, n, ngram)  # [B]
    return starts, ngram


def run(B: int, L: int, M: int, dev: str, bw: float | None, smoke: bool) -> dict:
    gen = torch.Generator().manual_seed(B * L + M)
    vocab = SMOKE_VOCAB if smoke else VOCAB
    history = torch.randint(0, vocab, (B + 1, L), generator=gen).to(dev)  # [B + 1, L] int64, one row unused
    rows = torch.randperm(B + 1, generator=gen)[:B].to(dev)  # [B]
    lengths = torch.full((B,), L, dtype=torch.int32, device=dev)  # [B]
    kw = dict(n_max=N_MAX, n_min=N_MIN, num_matches=M)
    want = ngram_match_ref(history, rows, lengths, **kw)
    got = ngram_match(history, rows, lengths, **kw)
    peer = ngram_match_unfold(history, rows, lengths, N_MAX, N_MIN, M)
    ok = all(torch.equal(a, b) for x in (got, peer) for a, b in zip(x, want))
    r = dict(B=B, L=L, M=M, err=0.0 if ok else 1.0, ngram=int(want[1].max()))
    r["eaglet"] = timed(lambda: ngram_match(history, rows, lengths, **kw), smoke)
    r["graph"] = graph_us(lambda: ngram_match(history, rows, lengths, **kw), smoke)
    r["unfold"] = timed(lambda: ngram_match_unfold(history, rows, lengths, N_MAX, N_MIN, M), smoke)
    r["unfold_graph"] = graph_us(lambda: ngram_match_unfold(history, rows, lengths, N_MAX, N_MIN, M), smoke)
    r["floor"] = "n/a" if bw is None else B * L * history.element_size() / bw * 1e6
    return r


def table(rows: list[dict]) -> str:
    head = ("| B | L | M | largest n matched | HBM floor µs | eaglet µs | eaglet graph µs | unfold µs "
            "| unfold graph µs | floor / eaglet graph | eaglet vs unfold (graphs) | equal to the reference |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        graph, floor, peer = r["graph"], r["floor"], r["unfold_graph"]
        frac = floor / graph if isinstance(graph, float) and isinstance(floor, float) else "n/a"
        speedup = peer / graph if isinstance(graph, float) and isinstance(peer, float) else "n/a"
        lines.append(f"| {r['B']} | {r['L']} | {r['M']} | {r['ngram']} | {fmt(floor, '.2f')} | {r['eaglet']:.1f} "
                     f"| {fmt(graph)} | {r['unfold']:.1f} | {fmt(peer)} | {fmt(frac, '.2f')} | {fmt(speedup)} "
                     f"| {'yes' if r['err'] == 0 else 'NO'} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--md", default=None, help="also write the table as markdown here")
    ap.add_argument("--smoke", action="store_true", help="CPU under TRITON_INTERPRET=1, tiny shapes (no GPU numbers)")
    ap.add_argument("--tile", type=int, default=None, help=f"the kernel's tile in elements (default {ngm._TILE})")
    args = ap.parse_args()
    if args.smoke and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("--smoke runs the kernels in Triton's interpreter: set TRITON_INTERPRET=1")
    if args.tile is not None:
        ngm._TILE = args.tile
    dev = "cpu" if args.smoke else "cuda"
    bw = None if args.smoke else copy_bandwidth()
    rows = [run(B, L, M, dev, bw, args.smoke) for B, L, M in (SMOKE_CONFIGS if args.smoke else CONFIGS)]
    header = (SMOKE_HEADER if args.smoke else
              provenance() + f"Measured copy bandwidth {bw / 1e12:.2f} TB/s (read+write); int64 histories, n = "
              f"{N_MIN}..{N_MAX}, kernel tile {ngm._TILE}; median µs via triton.testing.do_bench (cold L2), "
              "'graph' = CUDA-graph replay.\n")
    report(header, table(rows), args.md, rows)


if __name__ == "__main__":
    main()
