"""Autoregressive decoding throughput on the embedded SmolLM2-135M-Instruct.

eaglet's AR engine on its two numerics paths (models/kernel_paths.py: invariant and stock; CUDA graphs, and eager
for reference) vs Hugging Face `generate` on the same weights, beside the HBM floor of one decode step (weights + KV
read once / measured copy bandwidth).
Greedy, MT-bench first turns, EOS ignored so every request decodes exactly --max-new tokens (a fixed
amount of work per configuration). Table printed last, also written as markdown with --out.

    python -m benchmarks.bench_ar --batch 1 8 --max-new 256 --out results/ar_h200.md
"""

from __future__ import annotations

import argparse
import datetime
import time

import torch

from benchmarks._common import command


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--max-new", type=int, default=256, help="tokens decoded per request")
    ap.add_argument("--hf-max-new", type=int, default=32, help="tokens per request for HF generate (it is slow)")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--out", default=None, help="write the table as markdown here")
    args = ap.parse_args()

    from eaglet.data.assets import asset_path
    from eaglet.data.chat import encode_turns
    from eaglet.data.prompts import load_mt_bench
    from eaglet.engine.autoregressive import AREngine
    from eaglet.engine.requests import Request
    from eaglet.kernels._utils import copy_bandwidth
    from eaglet.models.checkpoint import load_checkpoint, load_tokenizer
    from eaglet.models.kv_cache import KVCache
    from eaglet.models.llama import ModelArgs, Transformer

    dev, dtype = torch.device("cuda"), torch.bfloat16
    path = asset_path("smollm2_gguf")
    hf_cfg, sd = load_checkpoint(path)
    margs = ModelArgs.from_hf_config(hf_cfg)
    model = Transformer.from_state_dict(margs, sd, dtype, dev)
    tok = load_tokenizer(path)
    prompts = [encode_turns(tok, [{"role": "user", "content": p.turns[0]}], True) for p in load_mt_bench()]
    bw = copy_bandwidth(dev)
    weight_bytes = model.weight_read_bytes()
    kv_bytes_per_token = 2 * margs.n_layers * margs.n_kv_heads * margs.head_dim * 2
    print(f"device={torch.cuda.get_device_name()} copy bandwidth={bw / 1e12:.2f} TB/s "
          f"weights={weight_bytes / 1e6:.1f} MB", flush=True)

    rows = []
    for B in args.batch:
        batch_prompts = prompts[:B]
        mean_ctx = sum(len(p) for p in batch_prompts) / B + args.max_new / 2
        floor_s = (weight_bytes + B * mean_ctx * kv_bytes_per_token) / bw  # one decode step
        # (graphs, invariant): the stock path and the invariant one (run_spec.py's default: lossless bf16
        # speculation), CUDA graphs and the stock path eager
        for graph, inv in ((True, False), (True, True), (False, False)):
            model.set_invariant(inv)
            kv = KVCache.for_model(margs, max_reqs=B, max_context=2048, page_size=16, dtype=dtype, device=dev)
            eng = AREngine(model, kv, B, use_cuda_graph=graph)
            eng.warmup()  # autotuning and graph capture stay out of the timing
            eng.generate([Request(p, 8) for p in batch_prompts])
            reqs = [Request(p, args.max_new, rid=i) for i, p in enumerate(batch_prompts)]
            st = eng.generate(reqs)
            decode_tokens = st.new_tokens - len(reqs)  # the first token of each comes from prefill
            decode_s = st.total_s - st.prefill_s
            tps = decode_tokens / decode_s
            name = ("CUDA graph" if graph else "eager") + (", invariant" if inv else ", stock")
            rows.append({"provider": f"eaglet AR ({name})", "B": B,
                         "tokens/s": tps, "step ms": 1e3 * decode_s / st.decode_steps,
                         "floor ms": 1e3 * floor_s, "floor tokens/s": B / floor_s,
                         "x floor": (decode_s / st.decode_steps) / floor_s})
            print(rows[-1], flush=True)
        model.set_invariant(False)
        if args.no_hf:
            continue
        import transformers

        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            **{k: v for k, v in hf_cfg.items() if k != "architectures"})).to(dtype)
        hf.load_state_dict(sd, strict=False)
        hf.tie_weights()
        hf = hf.to(dev).eval()
        tok.padding_side = "left"
        enc = tok.pad({"input_ids": batch_prompts}, return_tensors="pt").to(dev)
        gen = dict(max_new_tokens=args.hf_max_new, min_new_tokens=args.hf_max_new, do_sample=False,
                   pad_token_id=tok.pad_token_id or 0)
        hf.generate(**enc, **{**gen, "max_new_tokens": 4, "min_new_tokens": 4})  # warm-up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        hf.generate(**enc, **gen)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        rows.append({"provider": "HF generate (eager, bf16)", "B": B, "tokens/s": B * args.hf_max_new / dt,
                     "step ms": 1e3 * dt / args.hf_max_new, "floor ms": 1e3 * floor_s, "floor tokens/s": B / floor_s,
                     "x floor": (dt / args.hf_max_new) / floor_s})
        print(rows[-1], flush=True)
        del hf

    head = "| provider | B | tokens/s | ms / step | HBM floor ms / step | floor tokens/s | x floor |"
    lines = [head, "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['provider']} | {r['B']} | {r['tokens/s']:.0f} | {r['step ms']:.3f} | {r['floor ms']:.4f} "
                     f"| {r['floor tokens/s']:.0f} | {r['x floor']:.1f} |")
    table = "\n".join(lines)
    if args.out:
        with open(args.out, "w") as f:
            f.write(f"# Autoregressive decoding, SmolLM2-135M-Instruct (bf16), MT-bench first turns\n\n"
                    f"{datetime.date.today()} on {torch.cuda.get_device_name()}, torch {torch.__version__}; "
                    f"copy bandwidth {bw / 1e12:.2f} TB/s; {args.max_new} tokens per request "
                    f"(HF: {args.hf_max_new}), EOS ignored.\n\n"
                    f"Command: `{command()}`\n\n"
                    f"{table}\n")
    print(table)


if __name__ == "__main__":
    main()
