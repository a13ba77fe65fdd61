"""Answers from a regeneration cache, as `head_accuracy.py` reads them: the target's own first answers to training
conversations that a head saw in training, and to ones it did not (the same distribution, never trained on).

    python scripts/regen_subsets.py CACHE_DIR SHAREGPT.json --split-at 9000 --num 24 --out DIR
    python -m benchmarks.probes.head_accuracy DIR/seen.jsonl --head heads/smollm2_135m_eagle3
    python -m benchmarks.probes.head_accuracy DIR/unseen.jsonl --head heads/smollm2_135m_eagle3

CACHE_DIR holds a training run's `regen-*.part*.jsonl` (`data.cache_dir`; `gpu_session.sh train` returns it as
regen.txz.*). The shipped head trained on the training conversations among the first 9,000 of the ShareGPT file
(`heads/smollm2_135m_eagle3/TRAINING.md`), so `--split-at 9000` puts the first `--num` of those in seen.jsonl and the
first `--num` after them in unseen.jsonl.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from eaglet.data.prompts import _iter_json_array


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cache_dir", type=Path, help="folder of regen-*.part*.jsonl files")
    ap.add_argument("sharegpt", type=Path, help="the ShareGPT JSON file the regeneration read (its order), or the "
                    "embedded one (the same order)")
    ap.add_argument("--split-at", type=int, required=True, help="file position of the first unseen conversation")
    ap.add_argument("--num", type=int, default=24, help="answers per subset")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    order = {c["id"]: i for i, c in enumerate(_iter_json_array(args.sharegpt))}  # also reads a cut-off file
    parts = sorted(args.cache_dir.glob("regen-*.part*.jsonl"))
    if not parts:
        raise SystemExit(f"{args.cache_dir}: no regen-*.part*.jsonl files; pass a training run's data.cache_dir")
    # conversations whose first prompt left no room for an answer have none
    recs = sorted((r for p in parts for r in map(json.loads, p.open()) if r["output_ids"]),
                  key=lambda r: order[r["id"]])
    args.out.mkdir(parents=True, exist_ok=True)
    for name, keep in (("seen", lambda pos: pos < args.split_at), ("unseen", lambda pos: pos >= args.split_at)):
        chosen = [r for r in recs if keep(order[r["id"]])][: args.num]
        with (args.out / f"{name}.jsonl").open("w") as f:
            for r in chosen:
                f.write(json.dumps({"turns": [r["messages"][0][1]], "token_ids": r["output_ids"][0]}) + "\n")
        print(f"{name}: {len(chosen)} answers, {sum(len(r['output_ids'][0]) for r in chosen)} tokens, file positions "
              f"{order[chosen[0]['id']]}..{order[chosen[-1]['id']]}")


if __name__ == "__main__":
    main()
