"""The block drafter's objective (models/block_head.py; `train/head=block`), DFlash's recipe with DSpark's term.

Per sequence, `train.head.anchors` anchors a are drawn at random among the positions whose next token is an
assistant token; the block of anchor a ([tokens[a], mask, ...], positions a .. a+K-1) reads the target's features
of p < a, and its row j (1..K-1) predicts tokens[a+j] against the target's distribution at a+j-1. Every anchor's
block is one more set of rows in the same dense forward (`BlockHead.forward_dense`).

loss = sum_j decay_j * (ce_weight * CE(tokens[a+j]) + kl_weight * KL(P_target || Q)) / rows_j,
decay_j = exp(-(j-1) / train.head.decay): later rows are accepted only after the earlier ones, so they count less
(DFlash weighs its block positions the same way). rows_j: the rows of block row j over the whole optimiser step and
every process, as for the EAGLE objectives (training/losses.py), so accumulation and DDP give one big batch's
gradient. The statistics are training/losses.py's STATS per block row, so train/acc_k is block row k+1's accuracy.

The loop draws the anchors before the forward (`prepare`), because `counts` must know the rows first: they travel
in the loss mask (bit 1: assistant token, bit 2: anchor).

With a draft vocabulary (train.head.draft_vocab_size, the head's d2t map) both terms are over the draft tokens, as
EAGLE-3's objective (training/losses.py): the KL's target is the target's distribution renormalised over them, and a
row whose token is outside them cannot be learnt: its CE (answer token outside) or KL (the target's greedy token
outside) is zero, the row still counted (a miss in train/acc_k). Accuracy compares target ids.
"""

from __future__ import annotations

import math

import torch
from omegaconf import DictConfig
from torch import nn

from eaglet.models.block_head import BlockHead
from eaglet.training.losses import STATS, head_vocab, repeated_ngrams

ASSISTANT, ANCHOR = 1, 2  # bits of the prepared mask


class BlockObjective(nn.Module):
    with_vloss = False

    def __init__(self, head: BlockHead, hc: DictConfig):
        super().__init__()
        self.head = head
        self.anchors = int(hc.anchors)
        K = head.block_size
        self.weights = [math.exp(-j / float(hc.decay)) for j in range(K - 1)]  # block rows 1..K-1
        self.ce_weight, self.kl_weight = float(hc.ce_weight), float(hc.kl_weight)

    @property
    def steps(self) -> int:
        """Block rows with a loss (1..K-1): the per-row statistics' length."""
        return self.head.block_size - 1

    def prepare(self, loss_mask: torch.Tensor) -> torch.Tensor:
        """loss_mask [B, T] bool -> [B, T] uint8 with the anchors drawn (torch's RNG: a resumed run draws the same)."""
        B, T = loss_mask.shape
        ok = torch.zeros(B, T, dtype=torch.bool, device=loss_mask.device)
        ok[:, 1:T - 1] = loss_mask[:, 2:]  # anchor a >= 1 (some context) whose next token is an assistant token
        u = torch.rand(B, T, device=loss_mask.device).masked_fill(~ok, 2.0)  # [B, T]
        pick = u.topk(min(self.anchors, T), dim=1, largest=False).indices  # [B, A]
        anchor = torch.zeros(B, T, dtype=torch.bool, device=loss_mask.device)
        anchor.scatter_(1, pick, ok.gather(1, pick))
        return loss_mask.to(torch.uint8) * ASSISTANT | anchor.to(torch.uint8) * ANCHOR

    def counts(self, prepared: torch.Tensor) -> torch.Tensor:
        """Rows of each block row j in a prepared mask: anchors a whose token a+j is an assistant token [K-1]."""
        anchor, asst = (prepared & ANCHOR) > 0, (prepared & ASSISTANT) > 0  # [B, T] each
        T = prepared.shape[1]
        return torch.stack([(anchor[:, :T - j] & asst[:, j:]).sum() for j in range(1, self.steps + 1)]).float()

    def forward(self, tokens, prepared, feature, final_hidden, norm):
        """-> (loss, statistics [K-1, len(STATS)]) of one micro-batch (module doc)."""
        head, K = self.head, self.head.block_size
        B, T = tokens.shape
        dev = tokens.device
        anchor_mask, asst = (prepared & ANCHOR) > 0, (prepared & ASSISTANT) > 0  # [B, T] each
        A = max(int(anchor_mask.sum(1).max()), 1)
        order = anchor_mask.float().topk(A, dim=1)  # anchors first, padded with non-anchors
        anchors, real = order.indices.clamp(min=1), order.values > 0  # [B, A] each
        logits = head.forward_dense(tokens, feature, anchors)  # [B, A, K-1, Vd]
        j = torch.arange(1, K, device=dev)  # [K-1]
        at = anchors[:, :, None] + j  # [B, A, K-1] position of each row's label
        inside = at < T
        at = at.clamp(max=T - 1)
        flat = at.view(B, -1)  # [B, A*(K-1)]
        valid = real[:, :, None] & inside & asst.gather(1, flat).view_as(at)  # [B, A, K-1]
        labels = tokens.gather(1, flat).view_as(at)  # [B, A, K-1] target ids
        with torch.no_grad():
            prev = final_hidden.gather(1, (flat - 1)[:, :, None].expand(-1, -1, final_hidden.shape[-1]))
            p_logits = head.target.logits(prev).view(*at.shape, -1)  # [B, A, K-1, V] target at a+j-1
            greedy = p_logits.argmax(-1)  # [B, A, K-1] target ids
            fresh = ~repeated_ngrams(tokens).gather(1, flat).view_as(at)  # [B, A, K-1]
            p, logp, labels, ce_on, kl_on = self._targets(p_logits, labels, greedy)
        logq = torch.log_softmax(logits.float(), -1)  # [B, A, K-1, Vd]
        ce = -logq.gather(-1, labels[..., None])[..., 0] * ce_on  # [B, A, K-1]
        kl = (logp.exp() * (logp - logq)).sum(-1) * kl_on  # [B, A, K-1]
        v = valid.float()
        loss, stats = logits.sum() * 0.0, []
        for r in range(K - 1):
            ce_r, kl_r = (ce[:, :, r] * v[:, :, r]).sum(), (kl[:, :, r] * v[:, :, r]).sum()
            loss = loss + self.weights[r] * (self.ce_weight * ce_r + self.kl_weight * kl_r) / norm[r].clamp(min=1)
            with torch.no_grad():
                pred = head.to_target_ids(logits[:, :, r].argmax(-1))  # [B, A] target ids
                right = (pred == greedy[:, :, r]).float() * v[:, :, r]  # [B, A]
                accept = torch.minimum(p[:, :, r], logq[:, :, r].exp()).sum(-1) * v[:, :, r]
                f = fresh[:, :, r].float() * v[:, :, r]
                row = {"rows": v[:, :, r].sum(), "ploss": ce_r + kl_r, "correct": right.sum(), "accept": accept.sum(),
                       "aloss": ce_r * 0, "vloss": ce_r * 0, "rows_fresh": f.sum(), "correct_fresh": (right * f).sum()}
                stats.append(torch.stack([row[name].detach().float() for name in STATS]))
        return loss, torch.stack(stats)  # scalar, [K-1, len(STATS)]

    def _targets(self, p_logits: torch.Tensor, labels: torch.Tensor, greedy: torch.Tensor):
        """The target's side over the head's draft vocabulary: p_logits [..., V], labels and greedy [...] target ids
        -> (p [..., Vd] the target's probability of each draft token (softmax over all V: the acceptance statistic),
        logp [..., Vd] the KL's target (log_softmax over the draft tokens: EAGLE-3's renormalised labels), labels
        [...] as draft ids (0 where outside), ce_on and kl_on [...] fp32: 1 where the answer's token / the target's
        greedy token is a draft token, else 0)."""
        vocab = head_vocab(self.head)  # [Vd] target ids, None: all of them
        if vocab is None:
            logp = torch.log_softmax(p_logits, -1)  # [..., V]
            ones = torch.ones_like(labels, dtype=torch.float32)
            return logp.exp(), logp, labels, ones, ones
        sub = p_logits[..., vocab]  # [..., Vd]
        p = (sub - torch.logsumexp(p_logits, -1, keepdim=True)).exp()  # [..., Vd]
        draft_id = torch.full((p_logits.shape[-1],), -1, dtype=torch.long, device=p_logits.device)  # [V]
        draft_id[vocab] = torch.arange(vocab.numel(), device=vocab.device)
        drafted, greedy_id = draft_id[labels], draft_id[greedy]  # [...] each, -1 outside
        return (p, torch.log_softmax(sub, -1), drafted.clamp(min=0), (drafted >= 0).float(),
                (greedy_id >= 0).float())


@torch.no_grad()
def block_hits(target, head: BlockHead, feats, tokens: list[int], first: int, steps: int) -> torch.Tensor:
    """`chain_replay.step_hits` for a block drafter: tokens = a prompt and the target's greedy answer from index
    `first` on -> [rows, steps] bool, whether block row k+1 of the block rooted at position a (rows: a = first ..
    T-1) drafts the target's greedy token after a+k, its parent taken as the answer's (what a chain accepts)."""
    t = torch.tensor([tokens], device=target.device)  # [1, T]
    feature, final = feats(t)  # [1, T, F], [1, T, H]
    greedy = target.logits(final)[0].argmax(-1)  # [T]
    T = t.shape[1]
    anchors = torch.arange(max(first, 1), T, device=t.device)  # [rows]
    hits = []
    for part in anchors.split(64):  # 64 blocks a forward bound the dense attention's memory
        pred = head.to_target_ids(head.forward_dense(t, feature, part[None])[0, :, :steps].argmax(-1))  # [n, steps]
        at = part[:, None] + torch.arange(steps, device=t.device)  # [n, steps] the parent's position
        hits.append((at + 1 < T) & (pred == greedy[at.clamp(max=T - 1)]))
    return torch.cat(hits).cpu()
