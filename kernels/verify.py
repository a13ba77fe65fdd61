"""Accept the longest drafted path the target agrees with: greedy and tree speculative sampling.

Both walk the tree from the root (node 0) through `retrieve_next_token` (first child) and
`retrieve_next_sibling` (next sibling), at most `steps` levels, one program per request.
Outputs (`VerifyResult`):
  accept_index [B, S+1] int64  tree nodes on the accepted path, starting with the root 0, -1 padded
  accept_len   [B]      int32  valid entries of accept_index = accepted drafts + 1 = tokens emitted
  bonus        [B]      int64  the token the target emits after the last accepted node

Sampling (drafts from a deterministic top-k, so q = 1 on the drafted token): at node `cur`
with residual p (initially target_probs[cur], mass 1) try the children in sibling order;
accept child x iff uniforms[child] * mass(p) < p(x), i.e. with probability p(x)/sum(p); on
rejection p(x) := 0 (mass -= p(x)) and try the next sibling. Acceptance moves to the child
with a fresh p = target_probs[child]. If every child is rejected (or there is none) the bonus
is the first token v with cumsum(p)[v] > uniforms_final * mass(p) (inverse CDF of the
residual, summed in fp64; if rounding leaves no such v: the last token with p > 0, else the
last rejected one). The emitted sequence is then distributed exactly as the target's.

`mass` is tracked as 1 - rejected mass (rows of target_probs must sum to 1), so no pass over
the vocabulary is needed until the bonus. A cyclic (malformed) sibling list stops after N
tries instead of hanging.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
import triton
import triton.language as tl

from eaglet.kernels._compile_cases import TREES, CompileCase, Ptr, model_shapes
from eaglet.kernels._utils import use_triton


class VerifyResult(NamedTuple):
    accept_index: torch.Tensor  # [B, S+1] int64, -1 padded
    accept_len: torch.Tensor  # [B] int32, bonus included
    bonus: torch.Tensor  # [B] int64


def _check_tree(draft_tokens, retrieve_next_token, retrieve_next_sibling, steps, extra=()):
    if steps < 1:
        raise ValueError(f"steps={steps} must be >= 1")
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must be [B, N], got shape {tuple(draft_tokens.shape)}")
    B, N = draft_tokens.shape
    for name, t in (("draft_tokens", draft_tokens), ("retrieve_next_token", retrieve_next_token),
                    ("retrieve_next_sibling", retrieve_next_sibling), *extra):
        if tuple(t.shape) != (B, N):
            raise ValueError(f"{name} must be [B, N] = [{B}, {N}], got {tuple(t.shape)}")
        if t.dtype != torch.int64:
            raise ValueError(f"{name} must be int64, got {t.dtype}")
        if t.device != draft_tokens.device:
            raise ValueError(f"{name} is on {t.device}, draft_tokens on {draft_tokens.device}")
    return B, N


def _outputs(B, steps, device):
    return VerifyResult(
        torch.empty(B, steps + 1, dtype=torch.int64, device=device),  # [B, S+1]
        torch.empty(B, dtype=torch.int32, device=device),  # [B]
        torch.empty(B, dtype=torch.int64, device=device),  # [B]
    )


def _pack(paths, bonus, steps, device) -> VerifyResult:
    idx = [p + [-1] * (steps + 1 - len(p)) for p in paths]
    return VerifyResult(
        torch.tensor(idx, dtype=torch.int64, device=device).reshape(len(paths), steps + 1),  # [B, S+1]
        torch.tensor([len(p) for p in paths], dtype=torch.int32, device=device),  # [B]
        torch.tensor(bonus, dtype=torch.int64, device=device),  # [B]
    )


# ----------------------------------------------------------------------------- greedy


def verify_greedy_ref(
    draft_tokens: torch.Tensor,
    target_predict: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    steps: int,
) -> VerifyResult:
    """Pure-Python reference (the spec) of `verify_greedy`."""
    B, N = _check_tree(draft_tokens, retrieve_next_token, retrieve_next_sibling, steps,
                       (("target_predict", target_predict),))
    draft, want = draft_tokens.tolist(), target_predict.tolist()
    nxt, sib = retrieve_next_token.tolist(), retrieve_next_sibling.tolist()
    paths, bonus = [], []
    for b in range(B):
        cur, path = 0, [0]
        for _ in range(steps):
            child, tries = nxt[b][cur], 0
            while child >= 0 and draft[b][child] != want[b][cur] and tries < N:
                child, tries = sib[b][child], tries + 1
            if child < 0 or tries == N:
                break
            path.append(child)
            cur = child
        paths.append(path)
        bonus.append(want[b][cur])
    return _pack(paths, bonus, steps, draft_tokens.device)


@triton.jit
def _verify_greedy_kernel(
    draft_ptr, target_ptr, next_token_ptr, next_sibling_ptr,
    accept_index_ptr, accept_len_ptr, bonus_ptr,
    N, S: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    row = b * N
    out = accept_index_ptr + b * (S + 1)
    cur = tl.zeros([], dtype=tl.int64)
    alive = cur == 0
    n_acc = tl.full([], 1, tl.int32)
    tl.store(out, cur)
    for i in range(S):
        want = tl.load(target_ptr + row + cur)
        child = tl.where(alive, tl.load(next_token_ptr + row + cur), -1)
        tok = tl.load(draft_ptr + row + child, mask=child >= 0, other=0)
        tries = 0
        # Scalar walk: every load after the first few hits L1 (rows are 8*N bytes).
        while (child >= 0) & (tok != want) & (tries < N):
            child = tl.load(next_sibling_ptr + row + child)
            tok = tl.load(draft_ptr + row + child, mask=child >= 0, other=0)
            tries += 1
        child = tl.where(tries < N, child, -1)
        alive = child >= 0
        tl.store(out + i + 1, child)  # -1 once the walk stopped
        n_acc += alive.to(tl.int32)
        cur = tl.where(alive, child, cur)
    tl.store(accept_len_ptr + b, n_acc)
    tl.store(bonus_ptr + b, tl.load(target_ptr + row + cur))


def verify_greedy(
    draft_tokens: torch.Tensor,
    target_predict: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    steps: int,
) -> VerifyResult:
    """Greedy verify. draft_tokens, target_predict (target argmax at every node),
    retrieve_next_token, retrieve_next_sibling: [B, N] int64 -> VerifyResult."""
    B, N = _check_tree(draft_tokens, retrieve_next_token, retrieve_next_sibling, steps,
                       (("target_predict", target_predict),))
    if not use_triton(draft_tokens, target_predict, retrieve_next_token, retrieve_next_sibling):
        return verify_greedy_ref(draft_tokens, target_predict, retrieve_next_token, retrieve_next_sibling, steps)
    res = _outputs(B, steps, draft_tokens.device)
    if B > 0:
        _verify_greedy_kernel[(B,)](
            draft_tokens.contiguous(), target_predict.contiguous(),
            retrieve_next_token.contiguous(), retrieve_next_sibling.contiguous(),
            *res, N, **_greedy_meta(steps),
        )
    return res


# ----------------------------------------------------------------------------- sampling


def _check_sampling(draft_tokens, retrieve_next_token, retrieve_next_sibling, target_probs,
                    uniforms, uniforms_final, steps):
    B, N = _check_tree(draft_tokens, retrieve_next_token, retrieve_next_sibling, steps)
    if target_probs.dim() != 3 or tuple(target_probs.shape[:2]) != (B, N):
        raise ValueError(f"target_probs must be [B, N, V] with B, N = {B}, {N}, got {tuple(target_probs.shape)}")
    for name, t, shape in (("target_probs", target_probs, tuple(target_probs.shape)),
                           ("uniforms", uniforms, (B, N)), ("uniforms_final", uniforms_final, (B,))):
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
        if t.dtype != torch.float32:
            raise ValueError(f"{name} must be float32, got {t.dtype}")
        if t.device != draft_tokens.device:
            raise ValueError(f"{name} is on {t.device}, draft_tokens on {draft_tokens.device}")
    return B, N, target_probs.shape[2]


def verify_sampling_ref(
    draft_tokens: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    target_probs: torch.Tensor,
    uniforms: torch.Tensor,
    uniforms_final: torch.Tensor,
    steps: int,
) -> VerifyResult:
    """Pure-Python reference (the spec) of `verify_sampling`; float32 scalar arithmetic
    (numpy) so that acceptance decisions match the kernel bit for bit."""
    B, N, V = _check_sampling(draft_tokens, retrieve_next_token, retrieve_next_sibling, target_probs,
                              uniforms, uniforms_final, steps)
    draft, nxt, sib = draft_tokens.tolist(), retrieve_next_token.tolist(), retrieve_next_sibling.tolist()
    probs = target_probs.detach().cpu().numpy()  # [B, N, V] float32
    coins = uniforms.detach().cpu().numpy()  # [B, N]
    finals = uniforms_final.detach().cpu().numpy()  # [B]
    paths, bonus = [], []
    for b in range(B):
        cur, path = 0, [0]
        mass, rejected, last_rejected = np.float32(1.0), [], -1
        for _ in range(steps):
            child, tries, accepted = nxt[b][cur], 0, False
            while child >= 0 and not accepted and tries < N:
                x = draft[b][child]
                p_x = np.float32(0.0) if x in rejected else probs[b, cur, x]
                accepted = bool(p_x > 0 and coins[b, child] * mass < p_x)
                if not accepted:
                    rejected.append(x)
                    mass = np.float32(mass - p_x)
                    last_rejected = x
                    child = sib[b][child]
                tries += 1
            if not accepted:
                break
            path.append(child)
            cur, mass, rejected = child, np.float32(1.0), []
        resid = probs[b, cur].copy()  # [V]
        resid[rejected] = 0.0
        cdf = np.cumsum(resid, dtype=np.float64)  # [V], fp64 like the kernel
        hits = np.flatnonzero((cdf > np.float64(finals[b] * mass)) & (resid > 0))
        positive = np.flatnonzero(resid > 0)
        tok = hits[0] if hits.size else (positive[-1] if positive.size else last_rejected)
        paths.append(path)
        bonus.append(int(tok))
    return _pack(paths, bonus, steps, draft_tokens.device)


@triton.jit
def _verify_sampling_kernel(
    draft_ptr, next_token_ptr, next_sibling_ptr, probs_ptr, uniforms_ptr, uniforms_final_ptr,
    accept_index_ptr, accept_len_ptr, bonus_ptr,
    N, V,
    S: tl.constexpr, R_PAD: tl.constexpr, BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    row = b * N
    out = accept_index_ptr + b * (S + 1)
    r = tl.arange(0, R_PAD)
    cur = tl.zeros([], dtype=tl.int64)
    alive = cur == 0
    n_acc = tl.full([], 1, tl.int32)
    mass = tl.full([], 1.0, tl.float32)
    # Tokens rejected at the current node: zeroed in its residual without writing target_probs.
    rejected = tl.full([R_PAD], -1, tl.int64)
    n_rej = tl.zeros([], dtype=tl.int32)
    last_rejected = tl.full([], -1, tl.int64)
    tl.store(out, cur)
    for i in range(S):
        child = tl.where(alive, tl.load(next_token_ptr + row + cur), -1)
        accepted = tl.full([], 0, tl.int1)
        tries = 0
        while (child >= 0) & (accepted == 0) & (tries < N):
            x = tl.load(draft_ptr + row + child)
            p_x = tl.load(probs_ptr + (row + cur) * V + x)
            p_x = tl.where(tl.sum((rejected == x).to(tl.int32), 0) > 0, 0.0, p_x)
            u = tl.load(uniforms_ptr + row + child)
            accepted = (p_x > 0) & (u * mass < p_x)
            rejected = tl.where((r == n_rej) & (accepted == 0), x, rejected)
            n_rej += 1 - accepted.to(tl.int32)
            mass = tl.where(accepted, mass, mass - p_x)
            last_rejected = tl.where(accepted, last_rejected, x)
            child = tl.where(accepted, child, tl.load(next_sibling_ptr + row + child))
            tries += 1
        alive = accepted
        tl.store(out + i + 1, tl.where(alive, child, -1))
        n_acc += alive.to(tl.int32)
        cur = tl.where(alive, child, cur)
        # A fresh residual at the accepted child.
        mass = tl.where(alive, 1.0, mass)
        rejected = tl.where(alive, -1, rejected)
        n_rej = tl.where(alive, 0, n_rej)
    tl.store(accept_len_ptr + b, n_acc)

    # Bonus: inverse CDF of the residual at `cur`, one pass over V that stops at the hit. The CDF
    # is summed in fp64: in fp32 its error over 128k tokens (~1e-6) is a sizeable part of one
    # token's width (~8e-6), so float order alone would move samples between neighbours.
    target = (tl.load(uniforms_final_ptr + b) * mass).to(tl.float64)
    base = probs_ptr + (row + cur) * V
    running = tl.zeros([], dtype=tl.float64)
    hit = tl.full([], -1, tl.int32)
    last_pos = tl.full([], -1, tl.int32)
    offs = tl.arange(0, BLOCK_V)
    p_next = tl.load(base + offs, mask=offs < V, other=0.0)  # [BLOCK_V]
    v0 = 0
    while (v0 < V) & (hit < 0):
        offs = v0 + tl.arange(0, BLOCK_V)
        p = p_next
        # Issue the next block's load before this block's scan so their latencies overlap. The
        # loop is still bound by its per-block cross-warp scan/reductions (results/kernel_choices_h200.md).
        p_next = tl.load(base + offs + BLOCK_V, mask=offs + BLOCK_V < V, other=0.0)  # [BLOCK_V]
        # Rejected tokens fall in at most n_rej blocks: only those pay for the masking.
        if tl.sum(((rejected >= v0) & (rejected < v0 + BLOCK_V)).to(tl.int32), 0) > 0:
            for k in range(n_rej):
                p = tl.where(offs == tl.sum(tl.where(r == k, rejected, 0), 0), 0.0, p)
        cdf = running + tl.cumsum(p.to(tl.float64), 0)  # [BLOCK_V], non-decreasing
        hit = tl.min(tl.where((cdf > target) & (p > 0), offs, V), 0)
        hit = tl.where(hit < V, hit, -1)
        last_pos = tl.maximum(last_pos, tl.max(tl.where(p > 0, offs, -1), 0))
        running = tl.max(cdf, 0)
        v0 += BLOCK_V
    tok = tl.where(hit >= 0, hit.to(tl.int64), tl.where(last_pos >= 0, last_pos.to(tl.int64), last_rejected))
    tl.store(bonus_ptr + b, tok)


def verify_sampling(
    draft_tokens: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    target_probs: torch.Tensor,
    uniforms: torch.Tensor,
    uniforms_final: torch.Tensor,
    steps: int,
) -> VerifyResult:
    """Tree speculative sampling. draft_tokens, retrieve_next_token, retrieve_next_sibling
    [B, N] int64; target_probs [B, N, V] float32 (temperature/top-p applied, rows sum to 1);
    uniforms [B, N] float32 (coin of each node), uniforms_final [B] float32 -> VerifyResult."""
    B, N, V = _check_sampling(draft_tokens, retrieve_next_token, retrieve_next_sibling, target_probs,
                              uniforms, uniforms_final, steps)
    if not use_triton(draft_tokens, retrieve_next_token, retrieve_next_sibling, target_probs,
                      uniforms, uniforms_final):
        return verify_sampling_ref(draft_tokens, retrieve_next_token, retrieve_next_sibling, target_probs,
                                   uniforms, uniforms_final, steps)
    res = _outputs(B, steps, draft_tokens.device)
    if B > 0:
        _verify_sampling_kernel[(B,)](
            draft_tokens.contiguous(), retrieve_next_token.contiguous(), retrieve_next_sibling.contiguous(),
            target_probs.contiguous(), uniforms.contiguous(), uniforms_final.contiguous(),
            *res, N, V, **_sampling_meta(steps, N, V),
        )
    return res


# ----------------------------------------------------------------------------- the step's record for the host


def emitted_record_ref(draft_tokens: torch.Tensor, res: VerifyResult) -> torch.Tensor:
    """Torch reference (the spec) of `emitted_record`."""
    S1 = res.accept_index.shape[1]
    j = torch.arange(S1, device=draft_tokens.device)  # [S+1]
    path = draft_tokens.gather(1, res.accept_index.clamp(min=0))  # [B, S+1] root, a1, ..., am
    last = (res.accept_len.long() - 1).clamp(min=0)[:, None]  # [B, 1]
    nxt = torch.cat([path[:, 1:], path[:, :1]], dim=1)  # [B, S+1] a1..am, junk
    out = torch.where(j == last, res.bonus[:, None], nxt)  # [B, S+1] a1..am, bonus
    emitted = torch.where(res.accept_index >= 0, out, -1)  # [B, S+1]
    return torch.cat([res.accept_len[:, None].long(), emitted], dim=1)  # [B, 1 + S+1]


@triton.jit
def _emitted_record_kernel(draft_ptr, accept_index_ptr, accept_len_ptr, bonus_ptr, out_ptr, N, S1,
                           BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK)  # [BLOCK] the record's columns: accept_len, then S+1 tokens
    t = j - 1  # [BLOCK] the emitted token's index
    L = tl.load(accept_len_ptr + b)  # tokens emitted: the accepted path after the root, then the bonus
    from_path = (t >= 0) & (t < L - 1)  # [BLOCK] a1..am, the nodes at accept_index[t + 1]
    node = tl.load(accept_index_ptr + b * S1 + t + 1, mask=from_path, other=0)  # [BLOCK]
    tok = tl.load(draft_ptr + b * N + node, mask=from_path, other=-1)  # [BLOCK]
    val = tl.where(t == L - 1, tl.load(bonus_ptr + b), tl.where(from_path, tok, -1))  # [BLOCK]
    val = tl.where(j == 0, L.to(tl.int64), val)
    tl.store(out_ptr + b * (S1 + 1) + j, val, mask=j < S1 + 1)


def emitted_record(draft_tokens: torch.Tensor, res: VerifyResult) -> torch.Tensor:
    """draft_tokens [B, N] int64 of the tree and its verify result -> the step's record for the host [B, 1 + S+1]
    int64: accept_len, then the tokens it emits (the accepted path after the root, then the bonus), -1 past them.
    One launch (the torch ops were ~13 small kernels in the verify's graph), no host sync."""
    B, N = draft_tokens.shape
    S1 = res.accept_index.shape[1]
    shapes = tuple(res.accept_index.shape), tuple(res.accept_len.shape), tuple(res.bonus.shape)
    if shapes != ((B, S1), (B,), (B,)):
        raise ValueError(f"accept_index [B, S+1], accept_len [B] and bonus [B] for B={B}, got {shapes}")
    if not use_triton(draft_tokens, *res):
        return emitted_record_ref(draft_tokens, res)
    out = torch.empty(B, S1 + 1, dtype=torch.int64, device=draft_tokens.device)  # [B, 1 + S+1]
    if B > 0:
        _emitted_record_kernel[(B,)](draft_tokens.contiguous(), res.accept_index.contiguous(), res.accept_len,
                                     res.bonus, out, N, S1, BLOCK=triton.next_power_of_2(S1 + 1), num_warps=1)
    return out


# ----------------------------------------------------------------------------- simulated acceptance


def _check_simulated(target_predict, tree_mask, accept_cdf, uniforms, steps):
    if target_predict.dim() != 2:
        raise ValueError(f"target_predict must be [B, N], got shape {tuple(target_predict.shape)}")
    B, N = target_predict.shape
    if tuple(tree_mask.shape) != (B, N, N) or tree_mask.dtype != torch.bool:
        raise ValueError(f"tree_mask must be bool [B, N, N] = [{B}, {N}, {N}], got {tree_mask.dtype} "
                         f"{tuple(tree_mask.shape)}")
    if tuple(accept_cdf.shape) != (steps + 1,) or tuple(uniforms.shape) != (B,):
        raise ValueError(f"accept_cdf must be [S+1] = [{steps + 1}] and uniforms [B] = [{B}], got "
                         f"{tuple(accept_cdf.shape)} and {tuple(uniforms.shape)}")
    return B, N


def verify_simulated_ref(target_predict: torch.Tensor, tree_mask: torch.Tensor, accept_cdf: torch.Tensor,
                         uniforms: torch.Tensor, steps: int) -> VerifyResult:
    """Torch reference of `verify_simulated` (the CPU path)."""
    B, N = _check_simulated(target_predict, tree_mask, accept_cdf, uniforms, steps)
    dev = target_predict.device
    want = 1 + (accept_cdf[None, :steps] <= uniforms[:, None]).sum(-1)  # [B] tokens to emit: inverse CDF
    deep = tree_mask.sum(-1).argmax(-1)  # [B] the first deepest node (the most ancestors-or-self)
    on_path = tree_mask.gather(1, deep[:, None, None].expand(B, 1, N))[:, 0]  # [B, N] its ancestors and itself
    # parents precede children, so the path's node indices in ascending order run root -> deep
    order = torch.where(on_path, torch.arange(N, device=dev), N).sort(dim=1).values[:, : steps + 1]  # [B, S+1]
    length = torch.minimum(want, on_path.sum(-1))  # [B]
    index = torch.where(torch.arange(steps + 1, device=dev) < length[:, None], order, -1)  # [B, S+1]
    last = torch.where(length[:, None] > 0, order.gather(1, (length - 1).clamp(min=0)[:, None]), 0)  # [B, 1]
    return VerifyResult(index, length.int(), target_predict.gather(1, last)[:, 0])


@triton.jit
def _verify_simulated_kernel(pred_ptr, mask_ptr, cdf_ptr, uniforms_ptr, accept_index_ptr, accept_len_ptr, bonus_ptr,
                             N, S: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, BLOCK_N)  # [BLOCK_N] nodes
    inside = (r[:, None] < N) & (r[None, :] < N)  # [BLOCK_N, BLOCK_N]
    m = tl.load(mask_ptr + b * N * N + r[:, None] * N + r[None, :], mask=inside, other=0).to(tl.int32)
    deep = tl.argmax(tl.sum(m, axis=1), axis=0, tie_break_left=True)  # the first node with the most ancestors
    on_path = tl.sum(tl.where(r[:, None] == deep, m, 0), axis=0)  # [BLOCK_N] 0/1: its ancestors and itself
    rank = tl.cumsum(on_path, axis=0) - 1  # [BLOCK_N] a path node's place on the path (ascending = root -> deep)
    t = tl.arange(0, BLOCK_S)  # [BLOCK_S] places on the path
    cdf = tl.load(cdf_ptr + t, mask=t < S, other=2.0)  # [BLOCK_S] P(emitted <= t + 1), the first S
    want = 1 + tl.sum((cdf <= tl.load(uniforms_ptr + b)).to(tl.int32), axis=0)
    length = tl.minimum(want, tl.sum(on_path, axis=0))  # 0 for a row without a tree (bucket padding, warm-up)
    at = (on_path[None, :] == 1) & (rank[None, :] == t[:, None])  # [BLOCK_S, BLOCK_N] the node at each place
    node = tl.sum(tl.where(at, r[None, :], 0), axis=1)  # [BLOCK_S]
    tl.store(accept_index_ptr + b * (S + 1) + t, tl.where(t < length, node, -1).to(tl.int64), mask=t < S + 1)
    tl.store(accept_len_ptr + b, length.to(tl.int32))
    last = tl.sum(tl.where(t == length - 1, node, 0), axis=0)  # node 0 when nothing is accepted
    tl.store(bonus_ptr + b, tl.load(pred_ptr + b * N + last))


def verify_simulated(target_predict: torch.Tensor, tree_mask: torch.Tensor, accept_cdf: torch.Tensor,
                     uniforms: torch.Tensor, steps: int) -> VerifyResult:
    """Simulated acceptance (`tree=simulate`, latency studies without a trained drafter): each row emits a drawn
    number of tokens along its tree's first deepest path, shorter where the path is; the bonus is the target's
    prediction at the path's last node. target_predict [B, N] int64, tree_mask [B, N, N] bool (ancestors-or-self),
    accept_cdf [S+1] float32 (P(emitted <= n), n = 1..S+1), uniforms [B] float32 in [0, 1) -> VerifyResult.
    A row without a tree (an empty mask) accepts nothing and reads node 0 for its bonus (an index of -1 is a
    device-side assert on the GPU). One launch, where the torch ops were ~18 small kernels a step, so simulated
    steps carry no cost a real greedy accept does not."""
    B, N = _check_simulated(target_predict, tree_mask, accept_cdf, uniforms, steps)
    if not use_triton(target_predict, tree_mask, accept_cdf, uniforms):
        return verify_simulated_ref(target_predict, tree_mask, accept_cdf, uniforms, steps)
    res = _outputs(B, steps, target_predict.device)
    if B > 0:
        _verify_simulated_kernel[(B,)](target_predict.contiguous(), tree_mask.contiguous(), accept_cdf.contiguous(),
                                       uniforms.contiguous(), *res, N, **_simulated_meta(steps, N))
    return res


def _greedy_meta(steps: int) -> dict:
    """The greedy kernel's depth and warps: one warp walks a request's tree (a scalar walk)."""
    return dict(S=steps, num_warps=1)


def _sampling_meta(steps: int, N: int, V: int) -> dict:
    """Blocks and warps of the sampling kernel for trees of N tokens and `steps` steps over V target tokens: 2,048-token
    blocks at 4 warps, 16 tokens a thread. 4,096 at 8 (as many a thread) spilled 20 B on sm_90 at S = 4 (the block
    tree; tests/portability); 2,048 at 4 took 59 µs at B = 64 over 128,256 tokens where 4,096 at 8 took 64, in
    earlier versions of the kernel (results/kernel_choices_h200.md)."""
    return dict(S=steps, R_PAD=max(triton.next_power_of_2(N), 2), BLOCK_V=min(max(triton.next_power_of_2(V), 16), 2048),
                num_warps=4)


def _simulated_meta(steps: int, N: int) -> dict:
    """The simulated accept's blocks: the whole [N, N] mask in one program. One warp up to 16 nodes, else 4 (at one
    warp a 32-node tile took 86 SGPRs on gfx942, which LLVM counts 7 waves a SIMD where the occupancy model of
    kernels/_aot.py counts 8; at 4, 40 and 8 waves both)."""
    return dict(S=steps, BLOCK_N=max(triton.next_power_of_2(N), 2), BLOCK_S=max(triton.next_power_of_2(steps + 1), 2),
                num_warps=1 if N <= 16 else 4)


def compile_cases(hip: bool) -> list[CompileCase]:
    """kernels/_compile_cases.py: greedy for every tree's depth; sampling for every tree over each model's
    vocabulary; the simulated accept and the emitted record for every tree; the same on both vendors."""
    i64, i32, f32 = Ptr(torch.int64), Ptr(torch.int32), Ptr(torch.float32)
    cases = []
    for t in TREES:
        N = t.num_draft_tokens
        cases.append(CompileCase.of(
            _verify_greedy_kernel, (t.name,), draft_ptr=i64, target_ptr=i64, next_token_ptr=i64, next_sibling_ptr=i64,
            accept_index_ptr=i64, accept_len_ptr=i32, bonus_ptr=i64, N=N, **_greedy_meta(t.steps)))
        for s in model_shapes():
            cases.append(CompileCase.of(
                _verify_sampling_kernel, (f"{s.name} {t.name}",), draft_ptr=i64, next_token_ptr=i64,
                next_sibling_ptr=i64, probs_ptr=f32, uniforms_ptr=f32, uniforms_final_ptr=f32, accept_index_ptr=i64,
                accept_len_ptr=i32, bonus_ptr=i64, N=N, V=s.vocab, **_sampling_meta(t.steps, N, s.vocab)))
        cases.append(CompileCase.of(
            _verify_simulated_kernel, (t.name,), pred_ptr=i64, mask_ptr=Ptr(torch.bool), cdf_ptr=f32, uniforms_ptr=f32,
            accept_index_ptr=i64, accept_len_ptr=i32, bonus_ptr=i64, N=N, **_simulated_meta(t.steps, N)))
        cases.append(CompileCase.of(
            _emitted_record_kernel, (t.name,), draft_ptr=i64, accept_index_ptr=i64, accept_len_ptr=i32, bonus_ptr=i64,
            out_ptr=i64, N=N, S1=t.steps + 1, BLOCK=triton.next_power_of_2(t.steps + 2), num_warps=1))
    return cases
