"""EAGLE drafting (`drafter: eagle`): an EAGLE-1, EAGLE-3 or multi-layer head (models/eagle.py) grows an EAGLE-2
tree from the target's features.

  propose  S-1 head steps from the last update's top-k (EAGLE-2: keep the best K of K*K expansions by cumulative
           log-prob, `expand_step`), then `build_tree` -> the N best candidates as the verify's tree
  update   the draft-extend: the head over the accepted path's (feature, next token) pairs, whose last row gives the
           next step's root top-k and hidden state
  prefill  the head over the prompt's pairs, the same way

Sequence alignment (EAGLE): the draft input at position p is (target feature at p, token at p+1), so draft and
target KV positions coincide: the head's paged KV pool has the target's rows and positions. The per-request state
between steps: the root's top-k (`top_lp`, `top_tok`, target ids) and the head's hidden state at the root.
"""

from __future__ import annotations

import torch

from eaglet.engine.drafter import Drafter, ModelDrafter, PrefillBatch, register
from eaglet.engine.drafters.eagle_config import head_dir, no_head
from eaglet.kernels.build_tree import num_candidates
from eaglet.kernels.draft_expand import expand_step
from eaglet.kernels.kv_ops import step_slots
from eaglet.kernels.topk import topk_logprobs
from eaglet.models.kv_cache import ForwardBatch, slots_for


def check_eagle_tree(steps: int, topk: int, num_draft_tokens: int, vocab: int,
                     root_children: int | None = None) -> None:
    """An EAGLE-2 tree of `steps` head steps keeping `topk` candidates each (the root's root_children, None: topk),
    over a draft vocabulary of `vocab`."""
    if topk > vocab:
        raise ValueError(f"tree.topk={topk} exceeds the draft vocabulary ({vocab} tokens)")
    cap = num_candidates(topk, steps, root_children) + 1
    if num_draft_tokens > cap:
        raise ValueError(f"tree.num_draft_tokens={num_draft_tokens} is more than a tree of steps={steps}, "
                         f"topk={topk} can hold ({cap} with the root); lower it or raise tree.steps/topk")


@register("eagle")
class EagleDrafter(ModelDrafter):
    name = "eagle"

    @classmethod
    def from_config(cls, draft, target_cfg, target, *, invariant: bool, fold_norms: bool) -> Drafter:
        """draft.path's head; else a random one (draft.random_init); else the head eaglet ships for the target."""
        from eaglet.models.head_checkpoint import load_draft_head, new_draft_head

        path = head_dir(draft, target_cfg)
        if path is not None:
            head = load_draft_head(path, target, target.dtype, target.device)
            if head.KIND != draft.name:
                raise ValueError(f"draft={draft.name} but {path} holds a {head.KIND} head; use draft={head.KIND}")
        elif not draft.get("random_init"):
            raise ValueError(no_head(draft.name, target_cfg.name))
        else:
            head = new_draft_head(draft.name, target,
                                  num_layers=draft.num_layers if draft.name == "multi_layer" else None,
                                  draft_vocab_size=draft.get("draft_vocab_size"), dtype=target.dtype,
                                  device=target.device)
        if fold_norms:
            head.fold_norm_weights()
        head.set_invariant(invariant)  # the target's kernels (models/kernel_paths.py)
        return cls(head)

    @classmethod
    def check_config(cls, c, cfg, target) -> None:
        from eaglet.models.head_checkpoint import new_draft_head

        d, t = cfg.draft, cfg.tree  # the values: eagle_config.check_values, in layer 1
        name, layers, vocab = d.name, d.num_layers, d.get("draft_vocab_size")
        head = head_dir(d, cfg.target)
        if head is not None:
            if cls.head_config(c, d, head) is None:
                return
        else:  # a random head: built on meta, its checks run now
            with c.catching("draft", name):
                new_draft_head(name, target, num_layers=layers if name == "multi_layer" else None,
                               draft_vocab_size=vocab, device="meta")
        with c.catching():
            check_eagle_tree(t.steps, t.topk, t.num_draft_tokens, vocab or 2**31)

    @classmethod
    def kv_layers(cls, draft) -> int:
        return draft.num_layers if draft.name == "multi_layer" else 1

    # ---- what the engine asks -------------------------------------------------------------------------------
    def check_tree(self, tree) -> None:
        super().check_tree(tree)
        check_eagle_tree(tree.steps, tree.topk, tree.num_draft_tokens, self.head.draft_vocab_size)

    def setup(self, *, target, tree, depth, max_batch, max_context, page_size, num_pages, device) -> None:
        self.tree, self.max_context = tree, max_context
        self.kv = self.head.kv_cache(max_reqs=max_batch, max_context=max_context, page_size=page_size,
                                     num_pages=num_pages, dtype=target.dtype, device=device)
        # constants the steps slice instead of building (each a launch in the step's graph, five a step); the
        # update's accepted paths are depth + 1 long (deeper than the head's tree where n-gram branches are)
        S, K = tree.steps, tree.topk
        self._iota = torch.arange(max(S + 1, depth + 1, K), device=device)  # [max(S+1, depth+1, K)]
        self._eye = torch.eye(K, dtype=torch.bool, device=device)  # [K, K]

    def reserve(self, bounds: list[tuple[int, int]]) -> None:
        self.kv.reserve_many(bounds)

    def state_spec(self, device):
        K = self.tree.topk
        return {"top_lp": ((K,), torch.float32), "top_tok": ((K,), torch.long),
                "hidden": ((self.head.hidden_size,), self.head.dtype)}

    # ---- device work ----------------------------------------------------------------------------------------
    def prefill(self, batch: PrefillBatch) -> dict[str, torch.Tensor]:
        """The head over the prompt's pairs (feature p, token p+1): the prompt shifted by one, then the root."""
        tokens, pos, valid, lens, rows = batch.tokens, batch.positions, batch.valid, batch.lengths, batch.rows
        n = tokens.shape[0]
        feats = self.head.target_feature(batch.hidden, batch.captured)  # [n, T, F]
        last = (lens - 1)[:, None]  # [n, 1]
        shifted = torch.cat([tokens[:, 1:], tokens[:, :1]], dim=1)  # [n, T]
        pair_tok = torch.where(pos == last, batch.roots[:, None], shifted)  # [n, T]
        pt = self.kv.req_to_page[rows]  # [n, P]
        slots = slots_for(pt, pos, self.kv.page_size, valid)  # [n, T]
        zeros = torch.zeros(n, dtype=torch.int32, device=tokens.device)
        h, logits = self.head(pair_tok, feats, pos, ForwardBatch(pt, zeros, slots, None, 0), self.kv)
        return self._next(h, logits, last)

    def _next(self, h, logits, last) -> dict[str, torch.Tensor]:
        """The state from the head's rows `last` [B, 1]: the root's top-k (target ids) and hidden state."""
        B = h.shape[0]
        h_last = h.gather(1, last[:, :, None].expand(B, 1, h.shape[-1]))[:, 0]  # [B, H]
        logits_last = logits.gather(1, last[:, :, None].expand(B, 1, logits.shape[-1]))[:, 0]  # [B, Vd]
        top_lp, top_tok = topk_logprobs(logits_last, self.tree.topk)  # [B, K]
        return {"top_lp": top_lp, "top_tok": self.head.to_target_ids(top_tok), "hidden": h_last}

    def candidates(self, seq_lens, roots, rows, top_lp, top_tok, hidden):
        S, K = self.tree.steps, self.tree.topk
        B = seq_lens.shape[0]
        dev = seq_lens.device
        # the candidates (kernels/build_tree.py's layout), written in place by each step
        C = num_candidates(K, S)
        scores = torch.empty(B, C, dtype=torch.float32, device=dev)  # [B, C]
        tokens = torch.empty(B, C, dtype=torch.long, device=dev)  # [B, C]
        parents = torch.empty(B, C, dtype=torch.long, device=dev)  # [B, C]
        scores[:, :K], tokens[:, :K], parents[:, :K] = top_lp, top_tok, -1
        cur_lp, cur_tok, cur_flat = top_lp, top_tok, self._iota[:K].expand(B, K)  # [B, K] each
        cur_h = hidden[:, None].expand(B, K, hidden.shape[-1])  # [B, K, H]
        mask = self._eye.expand(B, K, K)  # [B, K, i*K]: the draft KV step i sees
        # nodes of depth i sit at draft position seq_len + i - 1; their KV goes to the scratch block
        # seq_len + (i-1)*K + k (overwritten by the next update). All steps' at once: per step, this metadata
        # would be a dozen small kernels in the draft graph.
        page_table, _, slots = step_slots(self.kv.req_to_page, rows, seq_lens, (S - 1) * K, self.kv.page_size)
        slots = slots.view(B, S - 1, K)  # [B, S-1, K]
        slots = slots.transpose(0, 1).contiguous()  # [S-1, B, K]
        depth = self._iota[:S - 1, None, None]  # [S-1, 1, 1]
        pos = (seq_lens[None, :, None] + depth).expand(S - 1, B, K).contiguous()  # [S-1, B, K] int64
        for i in range(1, S):
            batch = ForwardBatch(page_table, seq_lens, slots[i - 1], mask, self.max_context)
            h, logits = self.head(cur_tok, cur_h, pos[i - 1], batch, self.kv, step=i)  # [B, K, H], [B, K, Vd]
            lp, tk = topk_logprobs(logits, K)  # [B, K, K] each
            cur_lp, cur_tok, cur_flat, cur_h, mask = expand_step(
                cur_lp, lp, tk, cur_flat, mask, h, scores, tokens, parents, K + (i - 1) * K * K,
                self.head.d2t_offsets, keep_ancestors=self.head.DRAFT_ANCESTORS_CACHED)
        return scores, tokens, parents  # [B, C] each

    def update(self, tokens, feats, accept_index, accept_len, bonus, seq_lens, rows, top_lp, top_tok, hidden):
        """The draft-extend: pairs (feature of node a_j, token of a_{j+1}), the last pair's token the bonus."""
        B, S1 = accept_index.shape  # S1: the engine's depth + 1
        j = self._iota[:S1]  # [S1]
        idx = accept_index.clamp(min=0)  # [B, S1]
        path = tokens.gather(1, idx)  # [B, S1] root, a1, ..., am
        last = (accept_len.long() - 1).clamp(min=0)[:, None]  # [B, 1]; padded rows (accept_len 0) read row 0
        nxt = torch.cat([path[:, 1:], path[:, :1]], dim=1)  # [B, S1] a1..am, junk
        pair_tok = torch.where(j == last, bonus[:, None], nxt)  # [B, S1] a1..am, bonus
        pair_feat = feats.gather(1, idx[:, :, None].expand(B, S1, feats.shape[-1]))  # [B, S1, F]
        page_table, pos, slots = step_slots(self.kv.req_to_page, rows, seq_lens, S1, self.kv.page_size,
                                            accept_index)  # [B, P], [B, S1] x2
        batch = ForwardBatch(page_table, seq_lens, slots, None, self.max_context)
        h, logits = self.head(pair_tok, pair_feat, pos, batch, self.kv, step=None)  # [B, S1, H], [B, S1, Vd]
        return self._next(h, logits, last)
