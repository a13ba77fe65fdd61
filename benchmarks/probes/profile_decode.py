"""Where one decode step's time goes: per-kernel CUDA time of an eager step (torch.profiler) and the
CUDA-graph step time, for a random-weight model of a registry shape (no checkpoint needed).

    python -m benchmarks.probes.profile_decode --model smollm2_135m --batch 1 --context 512 2048 [--invariant]
"""

from __future__ import annotations

import argparse

import torch

from eaglet.engine.autoregressive import AREngine
from eaglet.engine.requests import Request
from eaglet.models.kv_cache import KVCache
from eaglet.models.llama import ModelArgs, Transformer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2_135m")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=300)
    ap.add_argument("--context", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--invariant", action="store_true", help="the invariant numerics (run_spec.py's default)")
    args = ap.parse_args()
    margs = ModelArgs.from_name(args.model)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Transformer(margs).to(torch.bfloat16).eval().set_invariant(args.invariant)
    for ctx in args.context:
        kv = KVCache.for_model(margs, max_reqs=args.batch, max_context=ctx, dtype=torch.bfloat16, device="cuda")
        eng = AREngine(model, kv, args.batch)
        reqs = [Request(list(range(1, args.prompt + 1)), 64) for _ in range(args.batch)]
        st = eng.generate(reqs)  # includes capture
        reqs = [Request(list(range(1, args.prompt + 1)), 128) for _ in range(args.batch)]
        st = eng.generate(reqs)
        print(f"context {ctx}: graph step {1e3 * (st.total_s - st.prefill_s) / st.decode_steps:.3f} ms")
    # eager per-kernel profile of one decode step
    kv = KVCache.for_model(margs, max_reqs=args.batch, max_context=args.context[0], dtype=torch.bfloat16,
                           device="cuda")
    eng = AREngine(model, kv, args.batch, use_cuda_graph=False)
    r = kv.alloc_request()
    kv.reserve(r, args.prompt + 8)
    tok = torch.ones(args.batch, dtype=torch.long, device="cuda")
    pos = torch.full((args.batch,), args.prompt, dtype=torch.int32, device="cuda")
    rows = torch.full((args.batch,), r, dtype=torch.long, device="cuda")
    for _ in range(3):
        eng._decode_fn(tok, pos, rows)
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            eng._decode_fn(tok, pos, rows)
        torch.cuda.synchronize()
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total)
    total = sum(e.self_device_time_total for e in rows)
    n = sum(e.count for e in rows if e.self_device_time_total > 0)
    print(f"eager step: {total / 10 / 1e3:.3f} ms of kernel time in {n / 10:.0f} kernels")
    print(f"{'kernel':90s} {'calls/step':>10s} {'us/call':>8s} {'us/step':>8s}")
    for e in rows[:25]:
        t = e.self_device_time_total
        if t <= 0:
            continue
        print(f"{e.key[:90]:90s} {e.count / 10:10.1f} {t / e.count:8.2f} {t / 10:8.1f}")


if __name__ == "__main__":
    main()
