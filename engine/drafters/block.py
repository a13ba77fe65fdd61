"""Block drafting (`drafter: block`): a block drafter (models/block_head.py) proposes every depth of the tree in one
forward, DFlash-style, and its dependency term turns that one forward into a tree.

  propose  one forward of the block [root, mask, ...] at seq_len .. seq_len + block_size - 1 over the context in the
           head's pool -> base logits of depths 1..S; then, per depth, the K kept candidates' children: top-K of
           log_softmax(base[d] + dependency term of the candidate), EAGLE-2's selection of the K best of K*K by
           cumulative log-prob (kernels/block_tree.py: S + 1 launches), and `build_tree` (ModelDrafter.propose)
           -> the N best candidates as the verify's tree.
           With a draft vocabulary (Vd < V, the head's d2t map) the logits and top-k are over draft ids; candidates
           are target ids from the first depth on (dep_in, build_tree and the verify take target ids)
  update   the accepted path's target features (root, a1..am at seq_len ..) written into the pool as context
  prefill  the prompt's target features written the same way

No per-request state is carried between steps: the context lives in the pool, by row, and the root is the
engine's. The block's own K/V go to the positions past the context and are overwritten by the next update, as
EAGLE's draft scratch is.
"""

from __future__ import annotations

import torch

from eaglet.engine.drafter import ModelDrafter, PrefillBatch, register
from eaglet.engine.drafters.eagle import check_eagle_tree
from eaglet.engine.drafters.eagle_config import head_dir, no_head
from eaglet.kernels.block_tree import grow_tree
from eaglet.kernels.kv_ops import step_slots
from eaglet.models.kv_cache import ForwardBatch, slots_for


def check_block_tree(steps: int, topk: int, num_draft_tokens: int, block_size: int, vocab: int,
                     root_children: int | None = None) -> None:
    """An EAGLE-2 tree of `steps` depths from one block of `block_size` rows (the root and block_size - 1 mask rows),
    the root with root_children candidates (None: topk; >= topk: TreeSpec.validate), over a draft vocabulary of
    `vocab` ids."""
    if steps > block_size - 1:
        raise ValueError(f"tree.steps={steps}: a block of {block_size} rows drafts at most {block_size - 1} depths")
    if root_children is not None and root_children > vocab:
        raise ValueError(f"tree.root_children={root_children} exceeds the draft vocabulary ({vocab} tokens)")
    check_eagle_tree(steps, topk, num_draft_tokens, vocab, root_children)


@register("block")
class BlockDrafter(ModelDrafter):
    name = "block"
    ROOT_CHILDREN = True

    @classmethod
    def from_config(cls, draft, target_cfg, target, *, invariant: bool, fold_norms: bool) -> "BlockDrafter":
        """draft.path's block drafter; else a random one (draft.random_init); else the one shipped for the target.
        fold_norms: its norm weights folded into its projections (BlockHead.fold_norm_weights), as the target's."""
        from eaglet.models.head_checkpoint import load_draft_head, new_draft_head

        path = head_dir(draft, target_cfg)
        if path is not None:
            head = load_draft_head(path, target, target.dtype, target.device, kind="block")
        elif not draft.get("random_init"):
            raise ValueError(no_head(draft.name, target_cfg.name))
        else:
            head = new_draft_head("block", target, num_layers=draft.num_layers, block_size=draft.block_size,
                                  dep_rank=draft.dep_rank, draft_vocab_size=draft.get("draft_vocab_size"),
                                  dtype=target.dtype, device=target.device)
        if fold_norms:
            head.fold_norm_weights()
        head.set_invariant(invariant)
        return cls(head)

    @classmethod
    def check_config(cls, c, cfg, target) -> None:
        from eaglet.models.head_checkpoint import new_draft_head

        d, t = cfg.draft, cfg.tree  # the values: block_config.check_values, in layer 1
        path = head_dir(d, cfg.target)
        block, vocab = d.block_size, d.get("draft_vocab_size")
        if path is not None:
            raw = cls.head_config(c, d, path)
            if raw is None:
                return
            block, vocab = raw.get("block_size", block), raw.get("draft_vocab_size")  # a loaded head's own
        else:
            if vocab is not None and vocab > target.args.vocab_size:  # >= 1: block_config.check_values
                c.bad("draft.draft_vocab_size", vocab, f"must be at most the target's vocabulary "
                                                       f"({target.args.vocab_size} tokens), or null (all of it)")
                return
            with c.catching("draft", d.name):
                new_draft_head("block", target, num_layers=d.num_layers, block_size=d.block_size,
                               dep_rank=d.dep_rank, draft_vocab_size=vocab, device="meta")
        with c.catching():
            check_block_tree(t.steps, t.topk, t.num_draft_tokens, block, vocab or target.args.vocab_size,
                             t.get("root_children"))

    @classmethod
    def kv_layers(cls, draft) -> int:
        return draft.num_layers

    # ---- what the engine asks -------------------------------------------------------------------------------
    def check_tree(self, tree) -> None:
        check_block_tree(tree.steps, tree.topk, tree.num_draft_tokens, self.head.block_size, self.head.draft_vocab_size,
                         tree.root_children)

    def setup(self, *, target, tree, depth, max_batch, max_context, page_size, num_pages, device) -> None:
        # the whole block is written past the context, however few of its depths the tree uses
        self.tree, self.max_context = tree, max_context + self.head.block_size
        self.kv = self.head.kv_cache(max_reqs=max_batch, max_context=self.max_context, page_size=page_size,
                                     num_pages=num_pages, dtype=target.dtype, device=device)
        # the dependency term as two fp32 tables, which kernels/block_tree.py reads (a parent's row of dep_in, then
        # [K, r] @ dep_out), instead of an embedding and two projections a depth. dep_in is indexed by the parent's
        # target id (any of the V), dep_out's columns are draft ids.
        with torch.no_grad():
            h = self.head
            self.dep_in = h.dep_in(h.embed(torch.arange(target.args.vocab_size, device=device))).float()  # [V, r]
            self.dep_out = h.dep_out.weight.t().float().contiguous()  # [r, Vd]
            # the LM-head rows block_logits reads (folded: a copy times the final norm's weight), made now: not inside
            # a captured graph
            h.logit_rows() if h.invariant else h.lm_head_rows()
        # a constant the steps slice rather than build (a launch inside the step's graph): the block's own attention
        # mask, all True (non-causal inside the block)
        Kb = self.head.block_size
        self._full = torch.ones(max_batch, Kb, Kb, dtype=torch.bool, device=device)  # [max_batch, Kb, Kb]

    def reserve(self, bounds: list[tuple[int, int]]) -> None:
        self.kv.reserve_many([(row, min(n + self.head.block_size, self.max_context)) for row, n in bounds])

    def state_spec(self, device):
        return {}

    # ---- device work ----------------------------------------------------------------------------------------
    def prefill(self, batch: PrefillBatch) -> dict[str, torch.Tensor]:
        pt = self.kv.req_to_page[batch.rows]  # [n, P]
        slots = slots_for(pt, batch.positions, self.kv.page_size, batch.valid)  # [n, T]
        self.head.store_context(self.head.target_feature(batch.hidden, batch.captured), batch.positions, slots,
                                self.kv)
        return {}

    def candidates(self, seq_lens, roots, rows):
        S, K = self.tree.steps, self.tree.topk
        Kb = self.head.block_size
        B = seq_lens.shape[0]
        pt, pos, slots = step_slots(self.kv.req_to_page, rows, seq_lens, Kb, self.kv.page_size)  # [B, P], [B, Kb] x2
        batch = ForwardBatch(pt, seq_lens, slots, self._full[:B], self.max_context)
        x = self.head.forward_block(roots, pos, batch, self.kv)  # [B, Kb, H]
        base = self.head.block_logits(x[:, 1:S + 1])  # [B, S, Vd]
        return grow_tree(base, self.dep_in, self.dep_out, roots.long(), S, K, self.head.d2t_offsets,
                         self.tree.root_children)  # scores, tokens (target ids), parents [B, C] each

    def update(self, tokens, feats, accept_index, accept_len, bonus, seq_lens, rows):
        """The accepted path's features (root, a1..am) as context at seq_len .. seq_len + accept_len - 1."""
        B, S1 = accept_index.shape  # S1: the engine's depth + 1 (deeper than the block where n-gram branches are)
        idx = accept_index.clamp(min=0)  # [B, S1]
        feat = feats.gather(1, idx[:, :, None].expand(B, S1, feats.shape[-1]))  # [B, S1, F]
        _, pos, slots = step_slots(self.kv.req_to_page, rows, seq_lens, S1, self.kv.page_size, accept_index)
        self.head.store_context(feat, pos, slots, self.kv)  # pos, slots [B, S1]
        return {}
