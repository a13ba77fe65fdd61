"""The block drafter's tree from one forward (engine/drafters/block.py): `grow_tree` (kernels/block_tree.py) +
`build_tree` equal a pure-Python construction of the same EAGLE-2 tree, over the target's vocabulary and over a draft
vocabulary (d2t: candidates are target ids); greedy speculative decoding with a draft-vocabulary drafter equals plain
decoding; the tree checks name the key to change."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from eaglet.engine.drafters.block import check_block_tree
from eaglet.kernels.block_tree import grow_tree
from eaglet.kernels.build_tree import build_tree


def python_tree(base: list[list[float]], bias: list[list[float]], root: int, K: int, N: int,
                to_target: list[int] | None = None, K1: int | None = None):
    """base[d][v]: logits of depth d+1 over draft ids v; bias[p][v]: the dependency term after target token p;
    to_target[v]: the target id of draft id v (None: the same) -> the tree as (target tokens, parent node of each
    node) with the root at node 0: the root's K1 (None: K) best children, the K best of them kept; per later depth,
    each kept candidate's K best children by log-prob, the K best of those by cumulative log-prob kept; then the N-1
    best candidates (ties: earlier candidate), in candidate order."""
    tt = (lambda v: v) if to_target is None else to_target.__getitem__
    def top(logits, k):
        m = max(logits)
        lse = m + math.log(sum(math.exp(x - m) for x in logits))
        lp = [x - lse for x in logits]
        return sorted(range(len(lp)), key=lambda v: (-lp[v], v))[:k], lp

    cands = []  # (score, token, parent candidate index or -1)
    ids, lp = top([b + c for b, c in zip(base[0], bias[root])], K1 or K)
    for t in ids:
        cands.append((lp[t], tt(t), -1))
    kept = list(range(K))  # the root's children are in log-prob order
    for d in range(1, len(base)):
        step = []
        for c in kept:
            ids, lp = top([b + x for b, x in zip(base[d], bias[cands[c][1]])], K)
            step += [(cands[c][0] + lp[t], tt(t), c) for t in ids]
        first = len(cands)
        cands += step
        kept = [first + i for i in sorted(range(len(step)), key=lambda i: (-step[i][0], i))[:K]]
    chosen = sorted(sorted(range(len(cands)), key=lambda i: (-cands[i][0], i))[:N - 1])
    node = {c: n + 1 for n, c in enumerate(chosen)}
    return [root] + [cands[c][1] for c in chosen], [-1] + [0 if cands[c][2] < 0 else node[cands[c][2]]
                                                         for c in chosen]


@pytest.mark.parametrize("S, K, N, K1", [(1, 1, 2, None), (4, 1, 5, None), (4, 3, 8, None), (5, 4, 16, None),
                                         (3, 4, 21, None), (5, 4, 16, 16), (3, 2, 12, 7), (1, 2, 9, 12)])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("Vd", [None, 24])
def test_tree_equals_python_construction(S, K, N, K1, seed, Vd):
    g = torch.Generator().manual_seed(seed)
    B, V = 2, 40
    ids = None if Vd is None else torch.randperm(V, generator=g)[:Vd].sort().values  # [Vd] target id of each draft id
    d2t = None if ids is None else ids - torch.arange(Vd)  # [Vd]
    base = 3 * torch.randn(B, S, Vd or V, generator=g)  # [B, S, Vd]
    bias = 2 * torch.randn(V, Vd or V, generator=g)  # [V, Vd]: the term after each parent token (a target id)
    roots = torch.randint(0, V, (B,), generator=g)
    seq_lens = torch.tensor([7, 30], dtype=torch.int32)
    # the term after parent p is bias[p]: dep_in the identity [V, V], dep_out the bias
    scores, tokens, parents = grow_tree(base, torch.eye(V), bias, roots, S, K, d2t, K1)
    tree = build_tree(scores, tokens, parents, roots, seq_lens, N, K, S, root_children=K1)
    for b in range(B):
        want_tok, want_par = python_tree(base[b].tolist(), bias.tolist(), int(roots[b]), K, N,
                                         None if ids is None else ids.tolist(), K1)
        assert tree.draft_tokens[b].tolist() == want_tok
        mask = tree.tree_mask[b]  # [N, N] ancestor-or-self
        depth = mask.sum(-1) - 1
        got_par = [-1] + [max((j for j in range(i) if mask[i, j] and depth[j] == depth[i] - 1)) for i in range(1, N)]
        assert got_par == want_par
        assert tree.positions[b].tolist() == (seq_lens[b] + depth).tolist()


def test_dependency_term_conditions_children():
    """With a zero base the children follow the term of their own parent, not their siblings'."""
    V, K = 10, 2
    bias = torch.full((V, V), -9.0)
    for p in range(V):
        bias[p, (p + 1) % V], bias[p, (p + 5) % V] = 3.0, 2.0  # after p: p+1, then p+5
    scores, tokens, parents = grow_tree(torch.zeros(1, 2, V), torch.eye(V), bias, torch.tensor([0]), 2, K)
    assert tokens[0, :K].tolist() == [1, 5]
    assert tokens[0, K:].tolist() == [2, 6, 6, 0]  # children of 1, then of 5


@pytest.mark.parametrize("args, msg", [((8, 1, 9, 8), r"tree.steps=8: a block of 8 rows"),
                                       ((4, 3, 40, 8), "tree.num_draft_tokens=40"),
                                       ((2, 50, 3, 8), "tree.topk=50 exceeds the draft vocabulary"),
                                       ((2, 4, 8, 8, 40, 41), "tree.root_children=41 exceeds the draft vocabulary"),
                                       ((2, 4, 30, 8, 40, 8), "tree.num_draft_tokens=30")])
def test_tree_checks_name_the_key(args, msg):
    with pytest.raises(ValueError, match=msg):
        check_block_tree(*args) if len(args) > 4 else check_block_tree(*args, vocab=40)


def oracle_block_vocab(target, ids: list[int], block_size=5):
    """engine_testing.oracle_block over the draft vocabulary `ids` (target ids): its dependency term is the target LM
    head's rows of those tokens over the parent's embedding, so it proposes the target's next token when that is one
    of them."""
    from eaglet.models.head_checkpoint import new_draft_head

    H = target.args.dim
    head = new_draft_head("block", target, num_layers=1, block_size=block_size, dep_rank=H, dtype=target.dtype,
                          device=target.device, draft_vocab_size=len(ids))
    head.set_draft_vocab(torch.tensor(ids))
    with torch.no_grad():
        head.dep_in.weight.copy_(torch.eye(H))
        head.dep_out.weight.copy_(4 * target.lm_head.weight[head.to_target_ids(torch.arange(len(ids)))])
    return head


@pytest.fixture(scope="module")
def plain(target):
    """(plain decoding's answers to engine_testing.PROMPTS, 30 tokens each; a draft vocabulary of 160 target ids:
    every token of the prompts and answers, then others, a random spread)."""
    from engine_testing import PROMPTS, ar_outputs

    answers = ar_outputs(target, PROMPTS, 30)
    used = {t for seq in PROMPTS + answers for t in seq}
    rest = [t for t in torch.randperm(target.args.vocab_size, generator=torch.Generator().manual_seed(0)).tolist()
            if t not in used]
    assert len(used) < 160
    return answers, sorted(used) + rest[:160 - len(used)]


@pytest.mark.parametrize("vocab", [False, True])
def test_propose_equals_the_python_tree_of_the_heads_logits(target, vocab):
    """The drafter's propose (the block forward over the prefilled context, its dependency tables) equals the
    pure-Python tree of the head's own block logits and dependency term; with a draft vocabulary (half the target's,
    unsorted ids) the tree's tokens are the target ids of the drafted ids."""
    from engine_testing import oracle_block

    from eaglet.engine.drafters.block import BlockDrafter
    from eaglet.engine.requests import Request
    from eaglet.engine.speculative import SpeculativeEngine, TreeSpec
    from eaglet.models.kv_cache import ForwardBatch, slots_for

    V = target.args.vocab_size
    ids = torch.randperm(V, generator=torch.Generator().manual_seed(3))[:V // 2].tolist() if vocab else None
    head = oracle_block(target, block_size=5) if ids is None else oracle_block_vocab(target, ids)
    to_target = None if ids is None else head.to_target_ids(torch.arange(len(ids))).tolist()  # sorted ids
    with torch.no_grad():
        head.dep_out.weight.mul_(0.3)  # the term and the forward both decide
    spec = TreeSpec(4, 3, 10)
    drafter = BlockDrafter(head)
    eng = SpeculativeEngine(target, drafter, spec, max_batch=2, max_context=64, page_size=8)
    reqs = [Request(p, 8, rid=i) for i, p in enumerate([[5, 17, 33, 2, 9], [100, 3]])]
    for r in reqs:
        r.row = eng.kv_t.alloc_request()
        drafter.alloc_request(r.row)
        eng.kv_t.reserve(r.row, 40)
        drafter.reserve([(r.row, 40)])
    with torch.inference_mode():
        roots, seq_lens, _ = eng._prefill(reqs)
        rows = torch.tensor([r.row for r in reqs])
        tree = drafter.propose(seq_lens, roots, rows)
        bias = head.dep_bias(torch.arange(V))  # [V, Vd]
        for b in range(2):
            pt = drafter.kv.req_to_page[rows[b:b + 1]]
            pos = seq_lens[b].long() + torch.arange(5)[None]  # [1, K]
            batch = ForwardBatch(pt, seq_lens[b:b + 1], slots_for(pt, pos, 8), torch.ones(1, 5, 5, dtype=torch.bool),
                                 drafter.max_context)
            base = head.block_logits(head.forward_block(roots[b:b + 1], pos, batch, drafter.kv)[:, 1:])[0]  # [4, Vd]
            want, _ = python_tree(base.tolist(), bias.tolist(), int(roots[b]), 3, 10, to_target)
            assert tree.tokens[b].tolist() == want
            if ids is not None:
                assert set(want[1:]) <= set(ids)


@pytest.mark.parametrize("tree, batch, folded, k1", [("chain", 1, False, None), ("eagle2", 2, False, None),
                                                    ("chain", 1, True, None), ("eagle2", 2, False, 12)])
def test_greedy_is_lossless_with_a_draft_vocabulary(target, plain, tree, batch, folded, k1):
    """tests/engine/test_drafters.py's lossless check for a block drafter over 160 of the 256 tokens: speculative
    greedy == plain greedy, and its proposals are taken (chain at B=1 and a tree at B=2: ~1 min each on 2 CPUs).
    folded: its norm weights (away from ones) folded into its projections, on the invariant path, as serving's
    fold_norms=true runs it (tests/models/test_block_head.py checks the function is the unfolded one). k1: the root's
    children (tree.root_children), more than the tree's topk."""
    from engine_testing import PROMPTS, TREES

    from eaglet.engine.drafters.block import BlockDrafter
    from eaglet.engine.requests import Request
    from eaglet.engine.speculative import SpeculativeEngine

    want, ids = plain
    head = oracle_block_vocab(target, ids)
    if folded:
        with torch.no_grad():
            for n in [head.hidden_norm, head.norm] + [la.input_layernorm for la in head.layers]:
                n.weight.uniform_(0.8, 1.2, generator=torch.Generator().manual_seed(1))
        head.fold_norm_weights().set_invariant(True)
    drafter = BlockDrafter(head)
    assert drafter.head.draft_vocab_size == 160
    spec = dataclasses.replace(TREES[tree], root_children=k1)
    eng = SpeculativeEngine(target, drafter, spec, max_batch=batch, max_context=256, page_size=8)
    reqs = [Request(p, 30, rid=i) for i, p in enumerate(PROMPTS)]
    stats = eng.generate(reqs)
    assert [r.output_ids for r in reqs] == want
    assert stats.summary(TREES[tree].steps)["tau"] > 1.0


@pytest.mark.parametrize("fold", [False, True])
def test_from_config_folds_the_norms_as_asked(target, fold):
    """run_spec's fold_norms reaches the block drafter's head (BlockHead.fold_norm_weights), as the EAGLE heads'."""
    from omegaconf import OmegaConf

    from eaglet.engine.drafters.block import BlockDrafter

    draft = OmegaConf.create(dict(name="block", path=None, random_init=True, num_layers=1, block_size=5, dep_rank=8,
                                  draft_vocab_size=None))
    drafter = BlockDrafter.from_config(draft, OmegaConf.create(dict(name="oracle")), target, invariant=True,
                                       fold_norms=fold)
    assert drafter.head.norms_folded == fold and drafter.head.invariant
    assert all(la.norms_folded == fold for la in drafter.head.layers) and hasattr(drafter.head, "context_kv") == fold


def test_the_draft_benchmark_runs():
    """benchmarks/bench_draft.py (a GPU benchmark) in its CPU smoke mode: its drafters build, prefill, propose and
    update as the engine would have them."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-m", "benchmarks.bench_draft", "--smoke", "--batches", "1,2", "--trees",
                          "5/4/8", "--block-layers", "2"], cwd=repo, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("Smoke run")[1].count("| tiny (smoke) |") == 4  # the final table: 2 drafters x B 1, 2
