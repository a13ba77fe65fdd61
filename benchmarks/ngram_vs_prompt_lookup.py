"""Acceptance of eaglet's n-gram drafter against Hugging Face's prompt-lookup decoding, same prompts and model.

The embedded SmolLM2-135M-Instruct in fp32 on the CPU, greedy, MT-bench first turns (chat template), for each
(k, n): HF `generate(..., prompt_lookup_num_tokens=k, max_matching_ngram_size=n)` one prompt at a time, and eaglet's
speculative engine with the n-gram drafter (engine/drafters/ngram.py, n_max = n, n_min = 1) as a chain of k draft
tokens (tree steps = k, topk = 1, num_draft_tokens = k + 1) over all prompts as one batch. Both stop at EOS or after
--max-new tokens.

Tokens per verify, the tokens a target forward that checks a draft emits (the accepted ones and one more):
  HF      new tokens / target forwards (a forward pre-hook counts them). HF has no separate prefill: its first
          forward runs the prompt and a draft looked up in the prompt, so every forward is a verify.
  eaglet  tau of `StepStats.summary`: the tokens each verify step emitted; the prefill emits one token of its own
          and is not a step. Its verifies: the steps of each request that emitted tokens (a request's last step
          in flight, after its end, emits none).
A request's last step counts whole in eaglet's tau and cut at the budget in HF's count, which moves the two by at
most one step a prompt. The drafters also pick different matches when an n-gram recurs: eaglet's the most recent
occurrence, HF's the first one (left to right).

Identical: the fraction of prompts whose tokens equal HF's plain greedy `generate` (no lookup), for HF's lookup
(assisted decoding must not change greedy output) and for eaglet (the same weights, other kernels: equal, or nearly).

    OMP_NUM_THREADS=2 python -m benchmarks.ngram_vs_prompt_lookup --limit 5 --max-new 128 --k 4 --n 3 \
        --md results/ngram_vs_prompt_lookup_cpu.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import time

import torch

from benchmarks._common import command


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def hf_generate(hf, ids: list[int], max_new: int, eos: list[int], pad: int, **lookup) -> tuple[list[int], int]:
    """Greedy HF `generate` of one prompt -> (its new tokens, the target forwards it ran)."""
    forwards = 0

    def count(module, args, kwargs):
        nonlocal forwards
        forwards += 1

    x = torch.tensor([ids])  # [1, T]
    hook = hf.register_forward_pre_hook(count, with_kwargs=True)
    try:
        out = hf.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=max_new, do_sample=False,
                          eos_token_id=eos, pad_token_id=pad, **lookup)  # [1, T + new]
    finally:
        hook.remove()
    return out[0, len(ids):].tolist(), forwards


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=5, help="MT-bench first turns (the first N questions)")
    ap.add_argument("--max-new", type=int, default=128, help="token budget of each answer")
    ap.add_argument("--k", type=int_list, default=[4], help="draft tokens a step, comma list (HF's "
                    "prompt_lookup_num_tokens; eaglet's tree.steps)")
    ap.add_argument("--n", type=int_list, default=[3], help="longest n-gram matched, comma list (HF's "
                    "max_matching_ngram_size; eaglet's draft.n_max, draft.n_min = 1)")
    ap.add_argument("--no-fold-norms", action="store_true", help="eaglet keeps its norm weights (run_spec.py's "
                    "fold_norms=false); by default it runs as run_spec.py does: invariant, norms folded")
    ap.add_argument("--md", default=None, help="also write the table as markdown here")
    args = ap.parse_args()

    import transformers

    from eaglet.data.assets import asset_path
    from eaglet.data.chat import encode_turns
    from eaglet.data.prompts import load_prompts
    from eaglet.engine.drafters.ngram import NgramDrafter
    from eaglet.engine.requests import Request
    from eaglet.engine.speculative import SpeculativeEngine, StepStats, TreeSpec
    from eaglet.models.checkpoint import load_checkpoint, load_tokenizer
    from eaglet.models.llama import ModelArgs, Transformer

    torch.manual_seed(0)
    dev, dtype = torch.device("cpu"), torch.float32
    path = asset_path("smollm2_gguf")
    hf_cfg, sd = load_checkpoint(path)
    tok = load_tokenizer(path)
    model = Transformer.from_state_dict(ModelArgs.from_hf_config(hf_cfg), sd, dtype, dev)  # copies sd
    if not args.no_fold_norms:
        model.fold_norm_weights()
    model.set_invariant(True)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **{k: v for k, v in hf_cfg.items() if k != "architectures"})).to(dtype)
    hf.load_state_dict(sd, strict=False)
    hf.tie_weights()
    hf = hf.eval()
    del sd

    eos = set(model.args.eos_token_ids) | ({tok.eos_token_id} if tok.eos_token_id is not None else set())
    eos_list, pad = sorted(eos), tok.pad_token_id if tok.pad_token_id is not None else 0
    prompts = [encode_turns(tok, [{"role": "user", "content": p.turns[0]}], True)
               for p in load_prompts("mt_bench", limit=args.limit, max_turns=1)]
    max_context = max(len(p) for p in prompts) + args.max_new + 16
    print(f"{len(prompts)} prompts ({min(map(len, prompts))}..{max(map(len, prompts))} tokens), "
          f"{torch.get_num_threads()} threads", flush=True)

    t0 = time.perf_counter()
    greedy = [hf_generate(hf, p, args.max_new, eos_list, pad)[0] for p in prompts]
    print(f"HF greedy: {sum(map(len, greedy))} tokens in {time.perf_counter() - t0:.0f} s", flush=True)

    rows = []
    for k in args.k:
        for n in args.n:
            t0 = time.perf_counter()
            hf_out, hf_forwards = [], 0
            for p in prompts:
                out, f = hf_generate(hf, p, args.max_new, eos_list, pad, prompt_lookup_num_tokens=k,
                                     max_matching_ngram_size=n)
                hf_out.append(out)
                hf_forwards += f
            hf_s = time.perf_counter() - t0

            t0 = time.perf_counter()
            engine = SpeculativeEngine(model, NgramDrafter(n_max=n, n_min=1), TreeSpec(k, 1, k + 1),
                                       max_batch=len(prompts), max_context=max_context, eos_ids=eos_list,
                                       use_cuda_graph=False, time_phases=False)
            reqs = [Request(p, args.max_new, rid=i) for i, p in enumerate(prompts)]
            stats = engine.generate(reqs, stats=StepStats())
            summary = stats.summary(k)
            eg_s = time.perf_counter() - t0
            del engine

            hf_new = sum(map(len, hf_out))
            row = {
                "k": k, "n": n, "prompts": len(prompts),
                "hf_new": hf_new, "eaglet_new": stats.new_tokens,
                "hf_verifies": hf_forwards, "eaglet_verifies": len(stats.accept_lens),
                "hf_tpv": hf_new / hf_forwards, "tau": summary["tau"],
                "hf_identical": sum(a == b for a, b in zip(hf_out, greedy)) / len(prompts),
                "eaglet_identical": sum(r.output_ids == g for r, g in zip(reqs, greedy)) / len(prompts),
            }
            rows.append(row)
            print(f"{row} (HF {hf_s:.0f} s, eaglet {eg_s:.0f} s)", flush=True)

    lines = ["| k | n | prompts | new tokens (HF / eaglet) | verifies (HF / eaglet) | HF tokens/verify | eaglet tau "
             "| identical to HF greedy: HF lookup | identical to HF greedy: eaglet |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['k']} | {r['n']} | {r['prompts']} | {r['hf_new']} / {r['eaglet_new']} "
                     f"| {r['hf_verifies']} / {r['eaglet_verifies']} | {r['hf_tpv']:.2f} | {r['tau']:.2f} "
                     f"| {r['hf_identical']:.2f} | {r['eaglet_identical']:.2f} |")
    table = "\n".join(lines)
    if args.md:
        with open(args.md, "w") as f:
            f.write(f"# eaglet's n-gram drafter against Hugging Face prompt lookup, SmolLM2-135M-Instruct (fp32, "
                    f"CPU)\n\nCommand: `{command()}`  \nDate: {datetime.date.today()}  \n"
                    f"Machine: {os.cpu_count()}-core CPU ({torch.get_num_threads()} threads), torch "
                    f"{torch.__version__}, transformers {transformers.__version__}  \n"
                    f"MT-bench first turns (chat template), greedy, EOS or {args.max_new} new tokens. Tokens per "
                    f"verify: the module doc of benchmarks/ngram_vs_prompt_lookup.py.\n\n{table}\n")
    print(table)


if __name__ == "__main__":
    main()
