"""Write the ShareGPT subset that travels to an offline GPU box for training (benchmarks/offline_gpu_env.sh):
the first N conversations of the embedded file plus every held-out one, as one xz-compressed JSON list.

    python benchmarks/sharegpt_subset.py --first 9000 --out .asset4/ShareGPT_V3_unfiltered_cleaned_split.json.xz
"""

import argparse
import json
import lzma

from eaglet.data.assets import asset_path
from eaglet.data.prompts import sharegpt_split


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--first", type=int, default=9000, help="leading conversations kept (train and held-out)")
    ap.add_argument("--out", required=True, help="output .json.xz")
    a = ap.parse_args()
    text = asset_path("sharegpt").read_text()
    dec, pos, kept, seen = json.JSONDecoder(), text.index("[") + 1, [], 0
    while True:  # the file is cut off mid-way: decode whole conversations until the first broken one
        while pos < len(text) and text[pos] in " \n\r\t,":
            pos += 1
        try:
            conv, pos = dec.raw_decode(text, pos)
        except json.JSONDecodeError:
            break
        if seen < a.first or sharegpt_split(conv["id"]) == "heldout":
            kept.append(conv)
        seen += 1
    with lzma.open(a.out, "wt", preset=6) as f:
        json.dump(kept, f)
    print(f"{len(kept)} of {seen} conversations -> {a.out}")


if __name__ == "__main__":
    main()
