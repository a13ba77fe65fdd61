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
A second table times a drafter step's history work in CUDA graphs, B requests of 4,096 tokens, M = 2 branches of
S = 7 tokens: `ngram_continuations` (the match and the continuations in one launch) against `ngram_match` followed by
the torch gather it replaced (`ngram_continuations_ref`'s after the kernel's starts), and `append_accepted` (one
launch) against its torch reference; each equal to its reference.
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
from eaglet.kernels.ngram_match import (
    append_accepted,
    append_accepted_ref,
    ngram_continuations,
    ngram_continuations_ref,
    ngram_match,
    ngram_match_ref,
)

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


def gather_after(history, rows, lengths, starts, steps: int) -> torch.Tensor:
    """The torch gather after `ngram_match` that `ngram_continuations` replaced (8 launches): [B, M, steps]."""
    at = starts.long()[:, :, None] + torch.arange(steps, device=history.device)  # [B, M, steps]
    ok = (starts[:, :, None] >= 0) & (at < lengths[:, None, None])  # [B, M, steps]
    return torch.where(ok, history[rows[:, None, None], at.clamp(0, history.shape[1] - 1)], -1)


def run_step(B: int, dev: str, smoke: bool, L: int = 4096, M: int = 2, S: int = 7) -> dict:
    """A drafter step's history work (module doc), in graphs."""
    gen = torch.Generator().manual_seed(B)
    vocab = SMOKE_VOCAB if smoke else 64  # a small vocabulary: the suffixes recur, the continuations are read
    history = torch.randint(0, vocab, (B, L + S + 2), generator=gen).to(dev)  # [B, W]
    rows, lengths = torch.arange(B, device=dev), torch.full((B,), L, dtype=torch.int32, device=dev)  # [B] each
    kw = dict(n_max=4, n_min=1, num_matches=M)
    two = lambda: gather_after(history, rows, lengths, ngram_match(history, rows, lengths, **kw)[0], S)  # noqa: E731
    one = lambda: ngram_continuations(history, rows, lengths, steps=S, **kw)  # noqa: E731
    N = 16
    tokens = torch.randint(0, vocab, (B, N), generator=gen).to(dev)  # [B, N]
    index = torch.arange(S + 1).clamp(max=N - 1).expand(B, S + 1).contiguous().to(dev)  # [B, S+1]
    accept_len = torch.randint(1, S + 2, (B,), generator=gen).int().to(dev)  # [B]
    bonus, seq = tokens[:, -1].clone(), lengths.clone()  # [B] each
    hist2 = history.clone()
    append_accepted(history, tokens, index, accept_len, bonus, seq, rows)
    append_accepted_ref(hist2, tokens, index, accept_len, bonus, seq, rows)
    equal = torch.equal(one(), ngram_continuations_ref(history, rows, lengths, steps=S, **kw)) and torch.equal(
        one(), two()) and torch.equal(history, hist2)
    return dict(B=B, err=0.0 if equal else 1.0, cont=graph_us(one, smoke), cont_torch=graph_us(two, smoke),
                append=graph_us(lambda: append_accepted(history, tokens, index, accept_len, bonus, seq, rows), smoke),
                append_torch=graph_us(lambda: append_accepted_ref(hist2, tokens, index, accept_len, bonus, seq, rows),
                                      smoke))


def step_table(rows: list[dict]) -> str:
    head = ("| B | continuations graph µs | match + torch gather graph µs | append graph µs | torch append graph µs "
            "| equal to the references |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(f"| {r['B']} | {fmt(r['cont'])} | {fmt(r['cont_torch'])} | {fmt(r['append'])} | "
                     f"{fmt(r['append_torch'])} | {'yes' if r['err'] == 0 else 'NO'} |")
    return "\n".join(lines)


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
    steps = [run_step(B, dev, args.smoke) for B in ((2,) if args.smoke else (1, 8, 64))]
    report(header, table(rows) + "\n\nA drafter step's history work (CUDA graphs)\n\n" + step_table(steps), args.md,
           rows + steps)


if __name__ == "__main__":
    main()
