"""N-gram drafting (`drafter: ngram`, prompt lookup): no model. Each request's token history (its prompt, then what
it emitted) lives in a device buffer; a step matches the history's last n tokens, n from `n_max` down to `n_min`,
against the earlier history (kernels/ngram_match.py) and proposes what followed the most recent matches.

  propose  up to K = tree.topk matches (most recent first), each continued by up to S = tree.steps tokens, merged
           into a trie in one launch (kernels/trie_graft.py; equal prefixes share nodes; a node's children are
           distinct tokens, as tree speculative sampling needs), the first N - 1 nodes in match order kept: parents
           come before children. Slots of a tree with fewer nodes are padding: a leaf under the root that no child or
           sibling link reaches, so the verify computes it and never accepts it
  update   the accepted path and the bonus written into the history
  prefill  the prompt and the first token written into the history

`NgramBranches` adds the same n-gram proposals as branches of another drafter's tree (`draft.ngram_branches`).

Everything is on the device and of fixed shape (no host sync), so the draft and the update are CUDA graphs. The
history row of a request is its KV row; its valid length is seq_len + 1 (the cached tokens and the root).
"""

from __future__ import annotations

import dataclasses

import torch

from eaglet.engine.drafter import Drafter, DraftTree, PrefillBatch, register
from eaglet.engine.drafters._trie import graft, root_tree
from eaglet.kernels.ngram_match import MAX_M, MAX_N, append_accepted, ngram_continuations


@register("ngram")
class NgramDrafter(Drafter):
    name = "ngram"

    def __init__(self, n_max: int = 4, n_min: int = 1):  # conf/draft/ngram.yaml's defaults
        if not 1 <= n_min <= n_max <= MAX_N:
            raise ValueError(f"draft.n_min={n_min}, draft.n_max={n_max}: need 1 <= n_min <= n_max <= {MAX_N}")
        self.n_max, self.n_min = n_max, n_min

    @classmethod
    def from_config(cls, draft, target_cfg, target, *, invariant: bool, fold_norms: bool) -> "NgramDrafter":
        return cls(draft.n_max, draft.n_min)

    @classmethod
    def check_config(cls, c, cfg, target) -> None:  # the values: ngram_config.check_values, in layer 1
        with c.catching():
            check_ngram_tree(cfg.tree.steps, cfg.tree.topk, cfg.tree.num_draft_tokens)

    def check_tree(self, tree) -> None:
        super().check_tree(tree)
        check_ngram_tree(tree.steps, tree.topk, tree.num_draft_tokens)

    def setup(self, *, target, tree, depth, max_batch, max_context, page_size, num_pages, device) -> None:
        self.tree = tree
        # a step writes the accepted path and the bonus at seq_len .. seq_len + depth + 1, seq_len < max_context (a
        # graph's padding rows, accept_len 0, write nothing); by KV row: requests hold rows 1..max_batch, row 0 is the
        # padding row (models/kv_cache.PAD_ROW)
        self.history = torch.zeros(max_batch + 1, max_context + depth + 2, dtype=torch.long,
                                   device=device)  # [R + 1, W]

    def state_spec(self, device):
        return {}  # the history buffer holds everything, by row

    def prefill(self, batch: PrefillBatch) -> dict[str, torch.Tensor]:
        tokens, valid, lens, rows = batch.tokens, batch.valid, batch.lengths, batch.rows
        n, T = tokens.shape
        self.history[rows, :T] = torch.where(valid, tokens, 0)  # [n, T]
        self.history[rows, lens] = batch.roots  # the root follows the prompt
        return {}

    def propose(self, seq_lens, roots, rows) -> DraftTree:
        paths = self.continuations(seq_lens, rows, self.tree.topk)  # [B, K, S]
        return graft(root_tree(roots, seq_lens), paths, self.tree.num_draft_tokens - 1)

    def continuations(self, seq_lens, rows, num: int) -> torch.Tensor:
        """What followed the `num` most recent matches of each request's history suffix -> [B, num, S] int64, up to
        S = tree.steps tokens each, -1 past the history's end and for matches not found."""
        return ngram_continuations(self.history, rows, seq_lens + 1, n_max=self.n_max, n_min=self.n_min,
                                   num_matches=num, steps=self.tree.steps)  # [B, num, S]; + 1: the root

    def update(self, tokens, feats, accept_index, accept_len, bonus, seq_lens, rows):
        """Write the accepted path (root, a1..am) and the bonus at seq_len .. seq_len + accept_len."""
        append_accepted(self.history, tokens, accept_index, accept_len, bonus, seq_lens, rows)
        return {}


def check_ngram_tree(steps: int, topk: int, num_draft_tokens: int) -> None:
    """tree.topk matches of up to tree.steps tokens each, merged into tree.num_draft_tokens nodes."""
    if topk > MAX_M:
        raise ValueError(f"tree.topk={topk}: the n-gram drafter follows at most {MAX_M} matches")
    cap = 1 + steps * topk
    if num_draft_tokens > cap:
        raise ValueError(f"tree.num_draft_tokens={num_draft_tokens} is more than {topk} matches of {steps} tokens "
                         f"can fill ({cap} with the root); lower it or raise tree.steps/topk")


class NgramBranches(Drafter):
    """Another drafter's tree plus n-gram branches (`draft.ngram_branches=K` on any drafter's config): what followed the
    K most recent matches of the history's suffix, up to `depth` tokens each (`draft.ngram_depth`, default
    tree.steps), grafted onto the drafter's tree as a trie (engine/drafters/_trie.py), so a loop the drafter misses is
    still proposed. Branches may reach deeper than the drafter's tree: once a step is inside a repeated stretch it
    tends to stay there (the shipped block drafter's MT-bench run accepted depths 5-7 at 0.78-0.87 given the one
    above, and all 8 tokens in 13% of its steps), and its continuation is known further than the drafter drafts: on
    20 MT-bench turns (CPU) one branch of 15 under its 7-deep tree raised tau 3.341 -> 3.697 at 31 verified nodes
    against two of 7's 30 (results/block_drafter_h100/cpu_trees.md). The verify sees `num_nodes(tree)` = the
    drafter's N + K*depth nodes. Where the branches create no node (no match: ~60% of MT-bench steps) those slots
    hold the drafter's own tree widened to N + K*depth nodes from the same candidates (`propose_widened`), not
    padding: decode tokens/s +4.1% at the block drafter's 5/4/16 + 15 (MT-bench, B=1, H100; both trees now come
    from one `build_tree_pair` launch; results/widened_h100/README.md). Where they create some, the slots left
    over stay padding. The history is the n-gram drafter's own (its prefill and update); everything else is the
    drafter's."""

    def __init__(self, base: Drafter, branches: int, ngram: NgramDrafter | None = None, depth: int | None = None):
        if not 1 <= branches <= MAX_M:
            raise ValueError(f"draft.ngram_branches={branches}: need 1..{MAX_M} (0: no branches)")
        if depth is not None and depth < 1:
            raise ValueError(f"draft.ngram_depth={depth}: need >= 1 (null: tree.steps)")
        self.base, self.branches, self.ngram, self.branch_depth = base, branches, ngram or NgramDrafter(), depth
        self.name, self.feature_size = f"{base.name}+ngram", base.feature_size

    def _length(self, tree) -> int:
        """Tokens a branch: draft.ngram_depth, else tree.steps."""
        return self.branch_depth or tree.steps

    def depth(self, tree) -> int:
        return max(self.base.depth(tree), self._length(tree))

    def capture_layers(self, n_layers: int) -> tuple[int, ...]:
        return self.base.capture_layers(n_layers)

    def target_feature(self, hidden, captured):
        return self.base.target_feature(hidden, captured)

    def check_tree(self, tree) -> None:
        self.base.check_tree(tree)

    def num_nodes(self, tree) -> int:
        return self.base.num_nodes(tree) + self.branches * self._length(tree)

    def setup(self, **kw) -> None:
        self.base.setup(**kw)
        self.ngram.setup(**{**kw, "tree": dataclasses.replace(kw["tree"], steps=self._length(kw["tree"]))})

    def alloc_request(self, row: int) -> None:
        self.base.alloc_request(row)

    def free_request(self, row: int) -> None:
        self.base.free_request(row)

    def reserve(self, bounds: list[tuple[int, int]]) -> None:
        self.base.reserve(bounds)

    def state_spec(self, device):
        return self.base.state_spec(device)

    def prefill(self, batch: PrefillBatch) -> dict[str, torch.Tensor]:
        self.ngram.prefill(batch)
        return self.base.prefill(batch)

    def propose(self, seq_lens, roots, rows, **state) -> DraftTree:
        paths = self.ngram.continuations(seq_lens, rows, self.branches)  # [B, K, depth]
        extra = self.branches * paths.shape[2]
        tree, wide = self.base.propose_widened(seq_lens, roots, rows, extra, **state)  # [B, N], [B, N + extra] ...
        return graft(tree, paths, extra, wide)  # [B, N + extra] ...

    def update(self, tokens, feats, accept_index, accept_len, bonus, seq_lens, rows, **state):
        self.ngram.update(tokens, feats, accept_index, accept_len, bonus, seq_lens, rows)
        return self.base.update(tokens, feats, accept_index, accept_len, bonus, seq_lens, rows, **state)
