"""The block drafter's tau when each parent's children are sought only among a few hundred ids, by U's sizes and
normaliser: the sweep behind kernels/block_tree.py's BASE_TOP, DEP_TOP and its normaliser ("rest").

    UNION=M,MP,LSE python benchmarks/probes/probe_union_children.py [run_spec.py overrides]
    # e.g. UNION=64,64,rest python benchmarks/probes/probe_union_children.py data.limit=10 data.max_turns=1 \
    #      gen.max_new_tokens=192 gen.compare_ar=false logger=none print_answers=0

Why: the whole-vocabulary tree was S + 1 launches, ~9 µs a depth at 8,192 ids on an H100 (60 µs of the ~200 µs
propose at 7/4/16; results/block_drafter_h100/probe_block_tree_bv.md), because depth d's logits need depth d - 1's
kept parents. Restricting children to the base row's top M alone changed most trees (topm_children.md): the
dependency term moves a parent's children far down the base row. But a parent's term is a function of its token only,
so its own top MP ids can be tabled once at setup ([V, MP] draft ids); a child in a parent's top K of base + term is
almost surely in the base row's top M or in the parent's tabled top MP. With the candidates that few, the tree is one
program's sequential work after one parallel top-k, if tau holds. This probe measures that on the CPU: a run_spec.py
run whose block drafter grows its tree from the union of M and MP ids (the torch reference's selection otherwise:
EAGLE-2's K best by cumulative log-prob), tau in its metrics.json, beside the same turns' runs of other settings.

LSE, the children's log-softmax normaliser, as a kernel could afford it:
  exact  over the whole draft vocabulary (isolates the restriction's effect; the cost this would remove)
  rest   the union's ids with the term, plus the base row's mass outside the union without it
  union  the union's ids alone
"""

from __future__ import annotations

import os
import runpy
import sys

import torch

import eaglet.engine.drafters.block as block_drafter
from eaglet.kernels.block_tree import num_candidates
from eaglet.kernels.draft_expand import expand_step_ref
from eaglet.kernels.topk import top_ids_ref

M, MP, LSE = os.environ.get("UNION", "64,64,rest").split(",")
M, MP = int(M), int(MP)
_table: dict[int, torch.Tensor] = {}


def dep_table(dep_in: torch.Tensor, dep_out: torch.Tensor) -> torch.Tensor:
    """Each parent token's MP largest dependency terms' draft ids -> [V, MP], made once (chunks of 2,048 parents);
    dep_out [r, Vd]."""
    key = dep_in.data_ptr()
    if key not in _table:
        _table[key] = torch.cat([(dep_in[i:i + 2048] @ dep_out).topk(MP, dim=-1).indices
                                 for i in range(0, dep_in.shape[0], 2048)])  # [V, MP]
    return _table[key]


def union_children(base_d, dep_in, dep_out, table, par, K: int):
    """base_d [B, Vd], par [B, n] target ids -> (log-probs, draft ids) [B, n, K] of each parent's K best children
    among base_d's top M and the parent's tabled top MP."""
    B, n = par.shape
    full = base_d[:, None].float() + dep_in[par] @ dep_out  # [B, n, Vd]
    cand = torch.zeros_like(full, dtype=torch.bool)  # [B, n, Vd]
    cand.scatter_(2, base_d.topk(M, dim=-1).indices[:, None].expand(B, n, M), True)
    cand.scatter_(2, table[par], True)
    logits = torch.where(cand, full, float("-inf"))  # [B, n, Vd]
    if LSE == "exact":
        lse = full.logsumexp(-1)  # [B, n]
    elif LSE == "rest":
        rest = torch.where(cand, float("-inf"), base_d[:, None].float()).logsumexp(-1)  # [B, n]
        lse = torch.logaddexp(logits.logsumexp(-1), rest)
    else:
        lse = logits.logsumexp(-1)
    ids = top_ids_ref(logits, K)  # [B, n, K]
    return logits.gather(-1, ids) - lse[..., None], ids


def grow_tree_union(base, dep_in, dep_rows, dep_top, roots, S: int, K: int, d2t=None):
    """kernels/block_tree.py's `grow_tree_ref` with this probe's `union_children` (its own M, MP and normaliser; the
    drafter's dep_top is not used)."""
    B, dev = roots.shape[0], roots.device
    dep_out = dep_rows.t()  # [r, Vd]
    table = dep_table(dep_in, dep_out)
    C = num_candidates(K, S)
    scores = torch.empty(B, C, dtype=torch.float32, device=dev)  # [B, C]
    tokens = torch.empty(B, C, dtype=torch.long, device=dev)  # [B, C]
    parents = torch.empty(B, C, dtype=torch.long, device=dev)  # [B, C]
    lp, tk = union_children(base[:, 0], dep_in, dep_out, table, roots.long()[:, None], K)  # [B, 1, K]
    cur_lp, cur_tok = lp[:, 0], tk[:, 0]  # [B, K]
    if d2t is not None:
        cur_tok = cur_tok + d2t[cur_tok]
    scores[:, :K], tokens[:, :K], parents[:, :K] = cur_lp, cur_tok, -1
    cur_flat = torch.arange(K, device=dev).expand(B, K)  # [B, K]
    h = torch.zeros(B, K, 0, device=dev)  # [B, K, 0]
    mask = torch.zeros(B, K, 0, dtype=torch.bool, device=dev)  # [B, K, 0]
    for d in range(1, S):
        lp, tk = union_children(base[:, d], dep_in, dep_out, table, cur_tok, K)  # [B, K, K]
        cur_lp, cur_tok, cur_flat, _, _ = expand_step_ref(cur_lp, lp, tk, cur_flat, mask, h, scores, tokens,
                                                           parents, K + (d - 1) * K * K, d2t, keep_ancestors=False)
    return scores, tokens, parents


if __name__ == "__main__":
    block_drafter.grow_tree = grow_tree_union
    print(f"[probe_union_children] children among the base row's top {M} and the parent's tabled top {MP}, "
          f"normaliser {LSE}")
    sys.argv = ["run_spec.py"] + sys.argv[1:]
    runpy.run_path("run_spec.py", run_name="__main__")
