"""Draft-head objectives: EAGLE-1 (feature regression + soft cross-entropy) and EAGLE-3's training-time test;
multi-layer heads take EAGLE-1's objective at every unrolled step (step k trains layer min(k, S-1)).

Alignment (as the heads, models/eagle.py): row p of a draft step takes (hidden at p, token p+1) and its logits
predict token p+2, whose target distribution is the target's at position p+1 (P_{p+1}, softmax of lm_head of
the target's final hidden state f_{p+1}). Unrolled step k (the training-time test, TTT) at row p continues the
chain drafted from the prefix ending at p: it takes (step k-1's hidden at p, token p+k+1) at position p+k, so
its logits predict token p+k+2 against P_{p+k+1}. Its attention (`TTTPattern`; `ttt_attention_mask` is its dense
form, the reference the tests check it against) sees the step-0 keys of rows <= p (the accepted prefix the
extend cached) and, in steps 1..k, only row p's own keys (its ancestors in the chain), exactly what the
engine's chain draft sees: tests/training check this against the paged inference path. A multi-layer head's
draft steps do not see their ancestors (each step runs its own layer, whose KV holds the accepted prefix):
there step k attends the step-0 keys of rows <= p and row p's key of step k alone (`TTTPattern(k,
ancestors=False)`). Positions p+k match the engine's (draft step i at seq_len + i - 1) and EAGLE-3's
training code (`position_ids + lck`).

A row takes part in step k when token p+k+2 is an assistant token (the data's loss mask). Losses are SUMS over
rows; the loop divides by the number of such rows over the whole optimiser step and all processes, so that
gradient accumulation and DDP give exactly the gradient of one big batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn

from eaglet.models.eagle import DraftHead
from eaglet.models.ttt_attention import DenseKV, TTTPattern

# Per-step statistics, summed over rows (and later over micro-batches and processes); *_fresh: over the rows whose
# predicted token is not inside a verbatim repeat (`repeated_ngrams`)
STATS = ("rows", "ploss", "correct", "accept", "aloss", "vloss", "rows_fresh", "correct_fresh")


def repeated_ngrams(tokens: torch.Tensor, n: int = 8) -> torch.Tensor:
    """tokens [B, T] -> [B, T] bool: whether the token n-gram ending at each position occurred earlier in its row.
    Why: SmolLM2's greedy answers loop; ~80% of the assistant tokens of its self-generated data are inside such
    repeats, where a head's step-0 accuracy is 0.82 against 0.52 elsewhere (benchmarks/probes/loop_share.py, the
    same rule), so train/acc_0 mostly measures loops and train/acc_0_fresh the rest. A stable sort of the n-grams'
    hashes (mod 2^31 - 1; a collision marks one token, ~2^-31 a pair) marks each occurrence after the first."""
    B, T = tokens.shape
    out = torch.zeros(B, T, dtype=torch.bool, device=tokens.device)
    if T < n:
        return out
    h = torch.zeros(B, T - n + 1, dtype=torch.int64, device=tokens.device)  # [B, T-n+1] n-gram ending at i+n-1
    for j in range(n):
        h = (h * 1_000_003 + tokens[:, j:T - n + 1 + j]) % 2_147_483_647
    srt, idx = torch.sort(h, dim=1, stable=True)  # [B, T-n+1] equal hashes in index order
    dup = torch.zeros_like(srt, dtype=torch.bool)
    dup[:, 1:] = srt[:, 1:] == srt[:, :-1]
    out[:, n - 1:] = torch.zeros_like(dup).scatter_(1, idx, dup)
    return out


def ttt_attention_mask(T: int, k: int, device=None) -> torch.Tensor:
    """Attention of unrolled step k over the keys of steps 0..k: [T, (k+1)*T] bool, True = attend.
    Block 0 (step-0 keys) is causal (key j <= query i); blocks 1..k (the unrolled steps) are the diagonal.
    The dense form of `TTTPattern(k)`, which training uses; tests check one against the other."""
    i = torch.arange(T, device=device)
    causal = i[None, :] <= i[:, None]  # [T, T]
    diag = (i[None, :] == i[:, None]).repeat(1, k)  # [T, k*T]
    return torch.cat([causal, diag], dim=1)  # [T, (k+1)*T]


def step_counts(loss_mask: torch.Tensor, steps: int) -> torch.Tensor:
    """Rows that take part in each unrolled step: [steps] float (token p+k+2 is an assistant token)."""
    return torch.stack([loss_mask[:, k + 2:].sum() for k in range(steps)]).float()  # [steps]


def unroll(head: DraftHead, tokens: torch.Tensor, feature: torch.Tensor, steps: int):
    """Run the head over a whole sequence for `steps` unrolled steps -> [(hidden [B, T, H], logits [B, T, Vd])].
    tokens [B, T], feature [B, T, F] (the target's, at each row)."""
    B, T = tokens.shape
    cache = DenseKV() if steps > 1 else None
    pos = torch.arange(T, device=tokens.device).expand(B, T)  # [B, T]
    hidden, outs = feature, []
    for k in range(steps):
        inp = F.pad(tokens[:, k + 1:], (0, k + 1))  # [B, T] token p+k+1 (0 past the end: such rows never count)
        hidden, logits = head.forward_dense(inp, hidden, pos + k, TTTPattern(k, head.DRAFT_ANCESTORS_CACHED), cache)
        outs.append((hidden, logits))
    return outs


@dataclass
class TargetDist:
    """The target's next-token distributions at every position, restricted to the draft vocabulary."""

    probs: torch.Tensor  # [B, T, Vd] target probability of each draft token (full-vocabulary softmax)
    labels: torch.Tensor  # [B, T, Vd] soft labels: `probs` renormalised over the draft vocabulary
    argmax: torch.Tensor  # [B, T] the target's greedy token (target ids)
    in_vocab: torch.Tensor  # [B, T] bool: argmax is in the draft vocabulary


@torch.no_grad()
def target_distribution(logits: torch.Tensor, vocab: torch.Tensor | None) -> TargetDist:
    """logits [B, T, V] of the target -> TargetDist over `vocab` (draft id -> target id [Vd]; None = all)."""
    logits = logits.float()
    argmax = logits.argmax(-1)  # [B, T]
    if vocab is None:
        probs = torch.softmax(logits, -1)  # [B, T, V]
        return TargetDist(probs, probs, argmax, torch.ones_like(argmax, dtype=torch.bool))
    lse = torch.logsumexp(logits, -1, keepdim=True)  # [B, T, 1]
    sub = logits[..., vocab]  # [B, T, Vd]
    in_vocab = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
    in_vocab[vocab] = True
    # EAGLE-3 / SpecForge: the draft learns the target's distribution renormalised over its vocabulary
    return TargetDist((sub - lse).exp(), torch.softmax(sub, -1), argmax, in_vocab[argmax])


def step_terms(head: DraftHead, k: int, hidden: torch.Tensor, logits: torch.Tensor, dist: TargetDist,
               loss_mask: torch.Tensor, final_hidden: torch.Tensor | None,
               repeated: torch.Tensor | None = None, accept_grad: bool = False) -> dict[str, torch.Tensor]:
    """Sums over the rows of unrolled step k: soft cross-entropy `ploss` (with grad), `vloss` (EAGLE-1's SmoothL1
    to the next target feature, with grad; zero without `final_hidden`), `aloss` (-log of the acceptance
    probability, with grad only when `accept_grad`), and the statistics (no grad): `rows`, `correct` (draft top-1 ==
    target top-1), `accept` (sum over rows of a = sum_x min(p(x), q(x)), the acceptance probability of speculative
    sampling at temperature 1), and `rows_fresh` / `correct_fresh` over the rows whose predicted token is not marked
    in `repeated` [B, T] (all rows without it)."""
    T = loss_mask.shape[1]
    n = T - k - 2  # rows whose predicted token p+k+2 exists
    zero = logits.sum() * 0.0
    if n <= 0:
        return {name: zero for name in STATS}
    valid = loss_mask[:, k + 2:].float()  # [B, n]
    tgt = slice(k + 1, k + 1 + n)  # the target position p+k+1 of rows 0..n-1
    logq = torch.log_softmax(logits[:, :n].float(), -1)  # [B, n, Vd]
    ce = -(dist.labels[:, tgt] * logq).sum(-1)  # [B, n]
    # a target token outside the draft vocabulary cannot be learnt: those rows only count as misses
    ce = ce * dist.in_vocab[:, tgt]
    out = {"ploss": (ce * valid).sum()}
    if final_hidden is not None:
        v = F.smooth_l1_loss(hidden[:, :n].float(), final_hidden[:, tgt].float(), reduction="none").mean(-1)  # [B, n]
        out["vloss"] = (v * valid).sum()
    else:
        out["vloss"] = zero
    with torch.set_grad_enabled(accept_grad and torch.is_grad_enabled()):
        accept = torch.minimum(dist.probs[:, tgt], logq.exp()).sum(-1)  # [B, n]
        # the floor keeps the log finite where the draft puts no mass on the target's tokens (and its gradient
        # then zero: such rows learn from ploss alone)
        out["aloss"] = (-accept.clamp(min=1e-6).log() * valid).sum()
    with torch.no_grad():
        pred = head.to_target_ids(logits[:, :n].argmax(-1))  # [B, n]
        out["rows"] = valid.sum()
        right = (pred == dist.argmax[:, tgt]).float()  # [B, n]
        out["correct"] = (right * valid).sum()
        out["accept"] = (accept * valid).sum()
        fresh = valid if repeated is None else valid * (~repeated[:, k + 2:]).float()  # [B, n]
        out["rows_fresh"] = fresh.sum()
        out["correct_fresh"] = (right * fresh).sum()
    return out


def draft_loss(head: DraftHead, tokens: torch.Tensor, loss_mask: torch.Tensor, feature: torch.Tensor,
               final_hidden: torch.Tensor, norm: torch.Tensor, *, steps: int, step_weight: float,
               p_weight: float = 1.0, v_weight: float = 0.0,
               a_weight: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One micro-batch: the loss to backpropagate and the per-step statistics [steps, len(STATS)] (sums, no grad).

    loss = sum_k step_weight^k * (p_weight * ploss_k + v_weight * vloss_k + a_weight * aloss_k) / norm[k], with
    aloss_k = sum over rows of -log sum_x min(p(x), q(x)) (the acceptance itself as a loss, as in the LK losses;
    `train.head.accept_weight`; a_weight None: off, no gradient through it) and `norm` [steps] the rows of step k
    over the whole optimiser step and every process (times 1/world_size, as DDP averages).
    EAGLE-1: steps=1, p_weight=0.1, v_weight=1 (EAGLE's weights). EAGLE-3: steps=7, step_weight=0.8, p_weight=1,
    v_weight=0 (no feature regression: its hidden state is its own, not the target's). Multi-layer: EAGLE-1's
    weights, steps=S (one per layer), step_weight=0.8."""
    with torch.no_grad():
        dist = target_distribution(head.target.logits(final_hidden), head_vocab(head))
        repeated = repeated_ngrams(tokens)  # [B, T]
    regress = final_hidden if v_weight else None
    loss, stats = 0.0, []
    for k, (hidden, logits) in enumerate(unroll(head, tokens, feature, steps)):
        # `is not None`, not `> 0`: under torch.compile a float argument is symbolic, and a branch on it fails
        t = step_terms(head, k, hidden, logits, dist, loss_mask, regress, repeated, accept_grad=a_weight is not None)
        terms = p_weight * t["ploss"] + v_weight * t["vloss"] + (0.0 if a_weight is None else a_weight * t["aloss"])
        loss = loss + step_weight**k * terms / norm[k].clamp(min=1)
        stats.append(torch.stack([t[name].detach().float() for name in STATS]))
    return loss, torch.stack(stats)  # scalar, [steps, len(STATS)]


def head_vocab(head: DraftHead) -> torch.Tensor | None:
    """Target ids of the head's draft vocabulary [Vd] (None for a full-vocabulary head)."""
    if head.draft_vocab_size == head.target.args.vocab_size:
        return None
    return head.to_target_ids(torch.arange(head.draft_vocab_size, device=head.device))


# ---------------------------------------------------------------------------------------------------
# The objective as a module (what DDP wraps), and the logged metrics of its statistics


class DraftObjective(nn.Module):
    """The head's training forward + loss for one micro-batch; its parameters are the head's (the target is
    a plain attribute of the head, so DDP neither broadcasts nor all-reduces it)."""

    def __init__(self, head: DraftHead, hc: DictConfig):
        super().__init__()
        self.head = head
        steps = int(hc.ttt_length)
        if head.KIND == "multi_layer" and steps < head.num_kv_layers:
            # layer i runs from unrolled step i on: a shorter unroll leaves layers untrained (and DDP without
            # find_unused_parameters stops on their missing gradients)
            raise ValueError(f"train.head.ttt_length={steps} < {head.num_kv_layers} layers of the multi-layer head: "
                             f"unrolled step i trains layer i, so unroll at least as many steps as layers")
        # EAGLE-1 and multi-layer heads output target features (the target's lm_head reads them): regress them
        regress = head.KIND in ("eagle1", "multi_layer")
        self.kw = dict(steps=steps, step_weight=float(hc.step_weight),
                       p_weight=float(hc.p_weight) if regress else 1.0, v_weight=float(hc.v_weight) if regress else 0.0,
                       a_weight=float(hc.get("accept_weight", 0.0)) or None)

    @property
    def steps(self) -> int:
        return self.kw["steps"]

    @property
    def with_vloss(self) -> bool:
        return bool(self.kw["v_weight"])

    def prepare(self, loss_mask: torch.Tensor) -> torch.Tensor:
        """The micro-batch's mask as `forward` and `counts` take it (the loss mask itself)."""
        return loss_mask

    def counts(self, loss_mask: torch.Tensor) -> torch.Tensor:
        """Rows of each unrolled step [steps] (`step_counts`)."""
        return step_counts(loss_mask, self.steps)

    def forward(self, tokens, loss_mask, feature, final_hidden, norm):
        return draft_loss(self.head, tokens, loss_mask, feature, final_hidden, norm, **self.kw)


def window_metrics(w: torch.Tensor, with_vloss: bool) -> dict[str, float]:
    """Summed statistics [steps, len(STATS)] of a logging window -> train/acc_k, ploss_k, expected_accept_k,
    aloss_k (and vloss_k) as means over the counted rows; train/expected_accept is step 0's; train/acc_0_fresh step 0's
    accuracy outside verbatim repeats."""
    rows = w[:, STATS.index("rows")].clamp(min=1)  # [steps]
    out = {}
    for k in range(w.shape[0]):
        mean = {name: float(w[k, STATS.index(name)] / rows[k]) for name in STATS}
        out |= {f"train/acc_{k}": mean["correct"], f"train/ploss_{k}": mean["ploss"],
                f"train/expected_accept_{k}": mean["accept"], f"train/aloss_{k}": mean["aloss"]}
        if with_vloss:
            out[f"train/vloss_{k}"] = mean["vloss"]
    out["train/expected_accept"] = out["train/expected_accept_0"]
    # step 0 on the tokens outside verbatim repeats: what the held-out eval/acc_0 compares with on looping targets
    out["train/acc_0_fresh"] = float(w[0, STATS.index("correct_fresh")] / w[0, STATS.index("rows_fresh")].clamp(min=1))
    return out
