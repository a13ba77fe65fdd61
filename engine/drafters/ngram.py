"""N-gram drafting (`drafter: ngram`, prompt lookup): no model. Each request's token history (its prompt, then what
it emitted) lives in a device buffer; a step matches the history's last n tokens, n from `n_max` down to `n_min`,
against the earlier history (kernels/ngram_match.py) and proposes what followed the most recent matches.

  propose  up to K = tree.topk matches (most recent first), each continued by up to S = tree.steps tokens, merged
           into a trie (equal prefixes share nodes; a node's children are distinct tokens, as tree speculative
           sampling needs), the first N - 1 nodes in match order kept: parents come before children. Slots of a
           tree with fewer nodes are padding: a leaf under the root that no child or sibling link reaches, so the
           verify computes it and never accepts it
  update   the accepted path and the bonus written into the history
  prefill  the prompt and the first token written into the history

Everything is on the device and of fixed shape (no host sync), so the draft and the update are CUDA graphs. The
history row of a request is its KV row; its valid length is seq_len + 1 (the cached tokens and the root).
"""

from __future__ import annotations

import torch

from eaglet.engine.drafter import Drafter, DraftTree, PrefillBatch, register
from eaglet.kernels.ngram_match import MAX_M, MAX_N, ngram_match


@register("ngram")
class NgramDrafter(Drafter):
    name = "ngram"

    def __init__(self, n_max: int, n_min: int = 1):
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

    def check_tree(self, steps: int, topk: int, num_draft_tokens: int) -> None:
        check_ngram_tree(steps, topk, num_draft_tokens)

    def setup(self, *, target, tree, max_batch, max_context, page_size, num_pages, device) -> None:
        self.tree = tree
        # a step writes the accepted path and the bonus at seq_len .. seq_len + S + 1, seq_len < max_context; the
        # last row takes the writes of a graph's padding rows, which would otherwise land in row 0
        self.history = torch.zeros(max_batch + 1, max_context + tree.steps + 2, dtype=torch.long,
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
        S, K, N = self.tree.steps, self.tree.topk, self.tree.num_draft_tokens
        B = seq_lens.shape[0]
        dev = seq_lens.device
        length = seq_lens + 1  # [B] int32: the cached tokens and the root
        starts, _ = ngram_match(self.history, rows, length, n_max=self.n_max, n_min=self.n_min,
                                num_matches=K)  # [B, K]
        d = torch.arange(S, device=dev)  # [S]
        at = starts.long()[:, :, None] + d  # [B, K, S] history positions of each match's continuation
        ok = (starts[:, :, None] >= 0) & (at < length[:, None, None])  # [B, K, S]
        at = at.clamp(0, self.history.shape[1] - 1)
        cont = torch.where(ok, self.history[rows[:, None, None], at], -1)  # [B, K, S]
        # trie: node (m, d) is the first match m2 <= m whose continuation equals m's up to depth d
        same = (cont[:, :, None, :] == cont[:, None, :, :]) & ok[:, :, None, :] & ok[:, None, :, :]  # [B, K, K, S]
        same = same.int().cumprod(dim=-1).bool()  # [B, m, m2, d]: prefixes 0..d equal
        rep = same.int().argmax(dim=2)  # [B, K, S] the first such m2 (m itself where ok)
        new = ok & (rep == torch.arange(K, device=dev)[:, None])  # [B, K, S] nodes of their own
        order = new.reshape(B, K * S).long().cumsum(dim=1)  # [B, K*S] 1-based node index of each new node
        keep = new.reshape(B, K * S) & (order <= N - 1)  # [B, K*S]
        index = order.view(B, K, S).gather(1, rep)  # [B, K, S] node index of (rep(m, d), d)
        parent = torch.cat([torch.zeros(B, K, 1, dtype=torch.long, device=dev), index[:, :, :-1]], dim=2)
        parent = torch.where(d == 0, 0, parent)  # [B, K, S]; depth-0 nodes hang under the root
        # scatter the kept nodes into tree slots 1..N-1; slot 0 is the root, unused slots stay padding
        slot = torch.where(keep, order, N)  # [B, K*S]; N: a dump column, cut below
        tokens = torch.zeros(B, N + 1, dtype=torch.long, device=dev)  # [B, N+1]
        parents = torch.zeros(B, N + 1, dtype=torch.long, device=dev)  # [B, N+1]
        depth = torch.ones(B, N + 1, dtype=torch.long, device=dev)  # [B, N+1]
        real = torch.zeros(B, N + 1, dtype=torch.bool, device=dev)  # [B, N+1]
        tokens.scatter_(1, slot, cont.reshape(B, K * S))
        parents.scatter_(1, slot, parent.reshape(B, K * S))
        depth.scatter_(1, slot, (d + 1).expand(B, K, S).reshape(B, K * S))
        real.scatter_(1, slot, keep)
        tokens, parents, depth, real = tokens[:, :N], parents[:, :N], depth[:, :N], real[:, :N]  # [B, N] each
        tokens[:, 0], parents[:, 0], depth[:, 0], real[:, 0] = roots, 0, 0, True
        # ancestor-or-self: each pass adds one more generation (depth <= S)
        eye = torch.eye(N, dtype=torch.bool, device=dev).expand(B, N, N)  # [B, N, N]
        mask = eye
        for _ in range(S):
            mask = eye | mask.gather(1, parents[:, :, None].expand(B, N, N))  # [B, N, N]
        j = torch.arange(N, device=dev)  # [N]
        # first child / next sibling among the real nodes (slots ascend in match order, parents first)
        child = real[:, None, :] & (parents[:, None, :] == j[None, :, None]) & (j > 0)  # [B, i, j]
        sib = (real[:, None, :] & (parents[:, None, :] == parents[:, :, None]) & (j[None, None, :] > j[:, None])
               & real[:, :, None] & (j > 0)[None, :, None])  # [B, i, j]
        next_token = torch.where(child.any(-1), child.int().argmax(-1), -1)  # [B, N]
        next_sibling = torch.where(sib.any(-1), sib.int().argmax(-1), -1)  # [B, N]
        positions = seq_lens[:, None].long() + depth  # [B, N]
        return DraftTree(tokens, positions, next_token.long(), next_sibling.long(), mask)

    def update(self, tokens, feats, accept_index, accept_len, bonus, seq_lens, rows):
        """Write the accepted path (root, a1..am) and the bonus at seq_len .. seq_len + accept_len."""
        S1 = accept_index.shape[1]
        j = torch.arange(S1 + 1, device=tokens.device)  # [S+2]
        path = tokens.gather(1, accept_index.clamp(min=0))  # [B, S+1]
        path = torch.cat([path, bonus[:, None]], dim=1)  # [B, S+2]
        n = accept_len.long()[:, None]  # [B, 1]
        value = torch.where(j == n, bonus[:, None], path)  # [B, S+2]: path, the bonus at accept_len
        pos = seq_lens.long()[:, None] + j  # [B, S+2]
        row = torch.where(n > 0, rows[:, None], self.history.shape[0] - 1)  # [B, 1]; padding (accept_len 0) apart
        cur = self.history[row, pos]  # [B, S+2]
        self.history[row, pos] = torch.where(j <= n, value, cur)
        return {}


def check_ngram_tree(steps: int, topk: int, num_draft_tokens: int) -> None:
    """tree.topk matches of up to tree.steps tokens each, merged into tree.num_draft_tokens nodes."""
    if topk > MAX_M:
        raise ValueError(f"tree.topk={topk}: the n-gram drafter follows at most {MAX_M} matches")
    cap = 1 + steps * topk
    if num_draft_tokens > cap:
        raise ValueError(f"tree.num_draft_tokens={num_draft_tokens} is more than {topk} matches of {steps} tokens "
                         f"can fill ({cap} with the root); lower it or raise tree.steps/topk")
