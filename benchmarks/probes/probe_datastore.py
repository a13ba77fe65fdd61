"""Probe: would a corpus n-gram datastore (REST-style retrieval) make a better n-gram branch than the request's own
history? Pure Python on recorded greedy answers; no model runs.

    python -m benchmarks.probes.probe_datastore --outputs RUN/outputs.jsonl [--conversations 2000] [--md FILE]

RUN is a run_spec.py run on MT-bench (its outputs.jsonl holds the greedy answers' token ids; any drafter: lossless
runs write the same tokens). The datastore maps each n-gram (n <= 4) of the assistant turns of the first
`--conversations` ShareGPT train-split conversations (SmolLM2's tokenizer) to its most frequent 15-token continuation.
At every position t of every answer (history = the prompt's tokens + the answer's first t), each source proposes 15
tokens and scores the length of its prefix that the answer continues with:
  history       what the n-gram branch proposes (kernels/ngram_match.py: the most recent match of the longest suffix,
                n from 4 down to 1, read cyclically)
  datastore     the most frequent continuation of the longest suffix the datastore holds (n >= n_min)
  history, else datastore   the history's where it matches a suffix of n >= 2, else the datastore's
  best of both  an upper bound of any choice between them
A per-position proxy: the drafter's tree is not in it (where the drafter already proposes a phrase, neither source
adds anything), so the gains are upper bounds of what a datastore branch could add to tau.
"""

from __future__ import annotations

import argparse
import collections
import json

from eaglet.data.assets import asset_path
from eaglet.data.chat import encode_turns
from eaglet.data.prompts import load_sharegpt_conversations
from eaglet.models.checkpoint import load_tokenizer

N_MAX, DEPTH = 4, 15  # the branch's n-gram and length (conf/draft/block.yaml, NgramDrafter)


def history_continuation(h: list[int]) -> tuple[list[int], int]:
    """`ngram_match_ref`'s choice for one branch: the most recent earlier match of the longest suffix (n <= N_MAX),
    continued cyclically -> (DEPTH tokens or [], n)."""
    L = len(h)
    for n in range(N_MAX, 0, -1):
        s = h[L - n:]
        for i in range(L - n - 1, -1, -1):
            if h[i:i + n] == s:
                c = i + n
                return [h[c + t] if c + t < L else h[c + t % (L - c)] for t in range(DEPTH)], n
    return [], 0


def build_datastore(corpus: list[list[int]]) -> dict[int, dict[tuple, tuple]]:
    """n -> {n-gram: its most frequent DEPTH-token continuation} over the corpus."""
    counts = {n: collections.defaultdict(collections.Counter) for n in range(1, N_MAX + 1)}
    for seq in corpus:
        for i in range(len(seq)):
            for n in range(1, min(N_MAX, i + 1) + 1):
                counts[n][tuple(seq[i - n + 1:i + 1])][tuple(seq[i + 1:i + 1 + DEPTH])] += 1
    return {n: {k: c.most_common(1)[0][0] for k, c in table.items()} for n, table in counts.items()}


def datastore_continuation(store, h: list[int], n_min: int) -> tuple[tuple, int]:
    for n in range(N_MAX, n_min - 1, -1):
        hit = store[n].get(tuple(h[-n:]))
        if hit is not None:
            return hit, n
    return (), 0


def accepted(proposal, truth) -> int:
    k = 0
    for a, b in zip(proposal, truth):
        if a != b:
            break
        k += 1
    return k


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--outputs", required=True, help="a run_spec.py run's outputs.jsonl (MT-bench, first turns)")
    ap.add_argument("--conversations", type=int, default=2000, help="ShareGPT train-split conversations to index")
    ap.add_argument("--md", default=None)
    args = ap.parse_args()
    tok = load_tokenizer(asset_path("smollm2_gguf"))
    corpus = [tok(text, add_special_tokens=False)["input_ids"]
              for conv in load_sharegpt_conversations("train")[:args.conversations]
              for role, text in conv.messages if role == "assistant"]
    store = build_datastore(corpus)
    answers = [json.loads(line) for line in open(args.outputs)]
    sums, positions, no_match = collections.Counter(), 0, 0
    for a in answers:
        out = a["token_ids"]
        h0 = encode_turns(tok, [{"role": "user", "content": a["prompt"]}], True)
        for t in range(1, len(out)):
            h, truth = h0 + out[:t], out[t:t + DEPTH]
            hc, hn = history_continuation(h)
            a_h = accepted(hc, truth)
            no_match += hn == 0
            sums["history"] += a_h
            for n_min in (1, 2):
                dc, dn = datastore_continuation(store, h, n_min)
                a_d = accepted(dc, truth)
                sums[f"datastore (n >= {n_min})"] += a_d
                sums[f"history, else datastore (n >= {n_min})"] += a_h if hn >= 2 else a_d
                sums[f"best of both (n >= {n_min})"] += max(a_h, a_d)
            positions += 1
    base = sums["history"] / positions
    rows = [f"| {k} | {v / positions:.3f} | {v / positions / base - 1:+.1%} |" for k, v in sums.items()]
    md = (f"{len(answers)} answers ({positions} positions) of `{args.outputs}`; datastore: {sum(map(len, corpus)):,} "
          f"tokens of {args.conversations} ShareGPT train-split conversations; the history matched no suffix at "
          f"{no_match / positions:.1%} of the positions.\n\n"
          "| source | tokens accepted a position (mean) | against the history |\n|---|---|---|\n" + "\n".join(rows))
    print(md)
    if args.md:
        with open(args.md, "w") as f:
            f.write(md + "\n")


if __name__ == "__main__":
    main()
