"""The block drafter's config (conf/draft/block.yaml) checked before anything loads, torch-free (runner/config.py);
what reads the head (its kind, the tree's fit to its block) is `BlockDrafter.check_config`'s, in the last layer."""

from __future__ import annotations

from eaglet.engine.drafters.eagle_config import check_head_source


def check_values(c) -> None:
    c.choice("draft.name", ("block",))
    c.integer("draft.num_layers", lo=1)
    c.integer("draft.block_size", lo=2)
    c.integer("draft.dep_rank", lo=1)
    if c.has("draft.draft_vocab_size"):  # absent: configs written before the key (the full vocabulary)
        c.integer("draft.draft_vocab_size", lo=1, null=True)  # its upper bound, the target's V: check_config
    check_head_source(c, "block")
