"""How much of a synthesized chunk is the target looping, and how well does a head predict the rest? For each
sequence of one synthesize.py chunk the trainer's teacher-forced step 0 (`train/acc_0`) is counted apart on the
assistant tokens inside a verbatim repeat (the token 8-gram ending there occurred earlier in the sequence:
training/losses.py's `repeated_ngrams`, whose complement gives the trainer's train/acc_0_fresh) and on the others,
and on the first 128 tokens of each sequence's first answer (what the trainer's held-out evaluation decodes).

    python -m benchmarks.probes.loop_share /tmp/synth --chunk 12 --num 30 --heads heads/smollm2_135m_eagle3 DIR2

A training accuracy dominated by loop tokens says little about the held-out eval/acc_0 (training/filters.py's
LoopStop cites what this measured). CPU, fp32; about two minutes a head for 30 sequences.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import torch

from eaglet.data.assets import asset_path
from eaglet.models.head_checkpoint import load_draft_head
from eaglet.models.llama import Transformer
from eaglet.training.chain_replay import step_hits
from eaglet.training.features import OnlineFeatures
from eaglet.training.losses import repeated_ngrams
from eaglet.training.synth_store import chunk_path, read_chunk


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("synth", help="synthesize.py's out_dir")
    ap.add_argument("--chunk", type=int, default=0, help="the chunk read")
    ap.add_argument("--num", type=int, default=30, help="sequences drawn from it (seeded)")
    ap.add_argument("--heads", nargs="+", required=True, help="head directories")
    args = ap.parse_args()
    torch.manual_seed(0)
    target = Transformer.from_pretrained(asset_path("smollm2_gguf"), dtype=torch.float32, device="cpu").eval()
    samples = read_chunk(chunk_path(Path(args.synth), args.chunk))
    random.Random(0).shuffle(samples)
    samples = samples[:args.num]
    print(f"chunk {args.chunk} of {args.synth}: {len(samples)} sequences")
    print("| head | acc_0, repeated tokens | acc_0, other tokens | acc_0, first 128 answer tokens | share repeated |")
    print("|---|---|---|---|---|")
    for hp in args.heads:
        head = load_draft_head(Path(hp), target, torch.float32, "cpu").eval()
        feats = OnlineFeatures(target, head)
        c = {"loop": [0, 0], "fresh": [0, 0], "first128": [0, 0]}
        for s in samples:
            ids, mask = s.ids.tolist(), s.mask.tolist()
            first = mask.index(True)
            hits = step_hits(target, head, feats, ids, first, 1)[:, 0].tolist()  # [rows] row r is position first-1+r
            rep = repeated_ngrams(s.ids[None])[0].tolist()  # [T] the trainer's rule (train/acc_0_fresh)
            for r, hit in enumerate(hits):
                q = first + r + 1  # the token step 0 drafts at row r (step_hits: position p drafts token p + 2)
                if q >= len(ids) or not mask[q]:
                    continue
                c["loop" if rep[q] else "fresh"][0] += hit
                c["loop" if rep[q] else "fresh"][1] += 1
                if q - first < 128:
                    c["first128"][0] += hit
                    c["first128"][1] += 1
        acc = {k: a / max(b, 1) for k, (a, b) in c.items()}
        share = c["loop"][1] / max(c["loop"][1] + c["fresh"][1], 1)
        print(f"| {hp} | {acc['loop']:.3f} ({c['loop'][1]}) | {acc['fresh']:.3f} ({c['fresh'][1]}) | "
              f"{acc['first128']:.3f} ({c['first128'][1]}) | {share:.2f} |", flush=True)


if __name__ == "__main__":
    main()
