"""Does a head accept in serving what it predicts in training? Its teacher-forced accuracy on the target's own answers,
next to what the engine measured on the same answers.

    python run_spec.py draft=none data.limit=24 data.max_turns=1 gen.batch_size=8 logger=none hydra.run.dir=AR
    python run_spec.py draft=eagle3 tree=chain data.limit=24 data.max_turns=1 gen.batch_size=8 gen.compare_ar=false \
        logger=none hydra.run.dir=SPEC
    python -m benchmarks.probes.head_accuracy AR/outputs.jsonl --head heads/smollm2_135m_eagle3 --spec SPEC/metrics.json

For every answer the script runs the training forward (`training.losses.unroll`: the frozen target's features, then
the head's unrolled steps, each step on its own previous hidden state and the true next token) and counts, per
answer position p, whether step k's greedy token equals the target's (the trainer's `train/acc_k`). A chain draft
from p is accepted to depth d exactly when steps 0..d-1 are all right, so the share of positions whose first d steps
are right, over those whose first d-1 are, is the per-depth acceptance a chain draft should see: from every position,
and from only the positions that greedy chain decoding drafts from (the first after each accepted run and its bonus
token), replayed over the same answers. With `--spec`, the engine's measured `accept_rate_depth` and tau (a
`tree=chain` run over the same prompts) are printed beside them: if the head serves as it trains, the replayed
column equals the engine's, up to rounding differences between the two forwards.
The gap between `train/acc_0` on training batches and the first column here is the head's generalisation gap.
CPU, fp32; a minute for 24 answers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from eaglet.data.assets import asset_path
from eaglet.data.chat import encode_turns
from eaglet.models.checkpoint import load_tokenizer
from eaglet.models.head_checkpoint import load_draft_head
from eaglet.models.llama import Transformer
from eaglet.training.chain_replay import chain_rates, replay_chain, step_hits
from eaglet.training.features import OnlineFeatures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outputs", help="outputs.jsonl of a plain (draft=none) run_spec.py run: the target's answers")
    ap.add_argument("--head", required=True, help="the head directory (config.json + model.safetensors)")
    ap.add_argument("--spec", help="metrics.json of a tree=chain run over the same prompts (its accept_rate_depth)")
    ap.add_argument("--steps", type=int, default=5, help="unrolled steps = chain depth")
    args = ap.parse_args()
    torch.manual_seed(0)
    path = asset_path("smollm2_gguf")
    target = Transformer.from_pretrained(path, dtype=torch.float32, device="cpu").eval()
    tok = load_tokenizer(path)
    head = load_draft_head(Path(args.head), target, torch.float32, "cpu").eval()
    feats = OnlineFeatures(target, head)
    hits = []
    for line in Path(args.outputs).open():
        r = json.loads(line)
        if r["turn"] != 0:  # a later turn's prompt holds the conversation before it: first answers only
            continue
        prompt = encode_turns(tok, [{"role": "user", "content": r["prompt"]}], True)
        hits.append(step_hits(target, head, feats, prompt + r["token_ids"], len(prompt), args.steps))
    h = torch.cat(hits)  # [rows, steps]
    acc = h.float().mean(0)  # [steps] unconditional, as train/acc_k
    every, every_tau = chain_rates(h)  # drafting from every position
    served = torch.cat([x[[p for p, _ in replay_chain(x)]] for x in hits])  # only where greedy decoding drafts
    served_rates, served_tau = chain_rates(served)
    measured = json.loads(Path(args.spec).read_text()) if args.spec else {}
    rates = measured.get("accept_rate_depth", [])
    print(f"{len(hits)} answers, {h.shape[0]} positions; head {args.head}")
    print("| depth | teacher-forced acc (train/acc_k) | chain acceptance, every position | chain acceptance, the "
          "positions decoding drafts from | engine measured (tree=chain) |")
    print("|---|---|---|---|---|")
    for k in range(args.steps):
        m = f"{rates[k]:.3f}" if k < len(rates) else "-"
        print(f"| {k + 1} | {acc[k]:.3f} | {every[k]:.3f} | {served_rates[k]:.3f} | {m} |")
    m = f"{measured['tau']:.2f}" if "tau" in measured else "-"
    print(f"| tau | | {every_tau:.2f} | {served_tau:.2f} | {m} |")


if __name__ == "__main__":
    main()
