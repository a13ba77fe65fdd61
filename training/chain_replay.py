"""Does a head accept in serving what it predicts in training? Teacher-forced hits of the unrolled training forward,
replayed as greedy chain decoding would draft.

Step k of the training-time test at answer row p takes the head's own hidden state of step k-1 and the true token
p+k+1, exactly what a chain draft from p sees while its earlier steps were right (`training.losses`). A chain draft
from p is therefore accepted to depth d exactly when steps 0..d-1 are right, and greedy decoding drafts from the
first row after each accepted run and its bonus token. Replaying that over the hits gives the acceptance the engine
must measure on the same answers; tests/engine/test_chain_replay.py checks that it does, and
benchmarks/head_accuracy.py sets it beside `train/acc_k` for a trained head (the gap between the two is the head's
generalisation gap, not serving).
"""

from __future__ import annotations

import torch

from eaglet.models.eagle import DraftHead
from eaglet.models.llama import Transformer
from eaglet.training.features import OnlineFeatures
from eaglet.training.losses import unroll


@torch.inference_mode()
def step_hits(target: Transformer, head: DraftHead, feats: OnlineFeatures, tokens: list[int], first: int,
              steps: int) -> torch.Tensor:
    """tokens: a prompt and the target's greedy answer from index `first` on -> [rows, steps] bool, whether
    unrolled step k at row p drafts the target's greedy token p+k+2. Rows start at first-1, the first row the
    engine drafts from (token `first`, the root, comes from the target's prefill); a step whose token lies past
    the answer counts as a miss."""
    t = torch.tensor([tokens], device=target.device)  # [1, T]
    feature, final = feats(t)  # [1, T, F], [1, T, H]
    greedy = target.logits(final)[0].argmax(-1)  # [T] the target's greedy token after each position
    T = t.shape[1]
    rows = torch.arange(max(first - 1, 0), T - 2, device=t.device)  # [rows]
    hits = torch.zeros(len(rows), steps, dtype=torch.bool, device=t.device)
    for k, (_, logits) in enumerate(unroll(head, t, feature, steps)):
        pred = head.to_target_ids(logits[0].argmax(-1))  # [T] step k's draft at each row: token p+k+2
        ok = rows + k + 2 < T  # [rows] the predicted token is part of the answer
        tgt = (rows + k + 1).clamp(max=T - 1)  # [rows]
        hits[:, k] = ok & (pred[rows] == greedy[tgt])
    return hits.cpu()


def replay_chain(hits: torch.Tensor) -> list[tuple[int, int]]:
    """Greedy chain decoding over hits [rows, steps] -> (row drafted from, accept length = drafts accepted + the
    bonus token) per step: from row 0, a draft accepts its leading run of right steps, and the next starts after
    them and the bonus token."""
    steps, p = [], 0
    while p < hits.shape[0]:
        n = int(hits[p].cumprod(0).sum()) + 1
        steps.append((p, n))
        p += n
    return steps


def chain_rates(hits: torch.Tensor, starts: list[int] | None = None) -> tuple[torch.Tensor, float]:
    """Per-depth acceptance P(step k right | steps < k right) [steps] and tau (1 + mean accepted run) of chain
    drafts from the rows `starts` of hits [rows, steps] (default: every row)."""
    h = hits if starts is None else hits[starts]
    reach = torch.cat([torch.ones(1), h.cumprod(1).float().mean(0)])  # [steps + 1]
    return reach[1:] / reach[:-1].clamp(min=1e-9), 1 + float(reach[1:].sum())
