"""Write the ShareGPT subset that travels to an offline GPU box for training (scripts/offline_gpu_env.sh):
the first N conversations of the embedded file plus every held-out one, as one xz-compressed JSON list.

    python scripts/sharegpt_subset.py --first 9000 --out .asset4/ShareGPT_V3_unfiltered_cleaned_split.json.xz
    python scripts/sharegpt_subset.py --first 0 --first-exchange --out .asset6/sharegpt_first_exchange.json.xz
    python scripts/sharegpt_subset.py --first 0 --user-turns --out .asset7/sharegpt_user_turns.json.xz

--first-exchange keeps of each training conversation only the raw messages of its first user/assistant
exchange (what `data.max_turns=1` trains on; the assistant turn is regenerated anyway): all 17,671 conversations
then fit in a few MB. --user-turns keeps every turn but replaces each assistant message's text by "." (what
`data.max_turns=null` with regeneration reads: the user turns, replayed one by one). Held-out conversations stay
whole.
"""

import argparse
import json
import lzma

from eaglet.data.assets import asset_path
from eaglet.data.prompts import _ROLES, _normalise, sharegpt_split


def first_exchange(conv: dict) -> dict:
    """conv with its raw messages cut to those that make its first two normalised messages (banners and
    merged same-speaker parts included), so `data.max_turns=1` reads the same exchange from either file."""
    turns = conv["conversations"]
    keep = next((k - 1 for k in range(1, len(turns) + 1) if len(_normalise(conv["id"], turns[:k])) > 2), len(turns))
    return {**conv, "conversations": turns[:keep]}


def user_turns(conv: dict) -> dict:
    """conv with each non-empty assistant message's text replaced by "." and banners emptied: the same normalised
    roles and user turns (regeneration replays the user turns and writes its own answers), in fewer bytes."""
    def cut(t: dict) -> dict:
        role = _ROLES.get(t["from"], "user")  # an unknown speaker stays as it is: the loader names it
        if role is None:
            return {**t, "value": ""}
        return {**t, "value": "."} if role == "assistant" and t["value"].strip() else t
    return {**conv, "conversations": [cut(t) for t in conv["conversations"]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--first", type=int, default=9000, help="leading conversations kept (train and held-out); 0: all")
    ap.add_argument("--first-exchange", action="store_true", help="training conversations: their first exchange only")
    ap.add_argument("--user-turns", action="store_true", help="training conversations: every turn, assistant text cut")
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
        heldout = sharegpt_split(conv["id"]) == "heldout"
        if a.first == 0 or seen < a.first or heldout:
            if not heldout:
                conv = first_exchange(conv) if a.first_exchange else user_turns(conv) if a.user_turns else conv
            kept.append(conv)
        seen += 1
    with lzma.open(a.out, "wt", preset=6) as f:
        json.dump(kept, f)
    print(f"{len(kept)} of {seen} conversations -> {a.out}")


if __name__ == "__main__":
    main()
