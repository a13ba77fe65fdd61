"""Every registered drafter (engine/drafters/), and n-gram branches on the EAGLE drafter, behind the one interface: its
proposals are valid trees of the declared shape, deterministic, and greedy speculative decoding with it equals plain
decoding, chain and tree, B=1 and 2, on CPU; on a GPU, every drafter under CUDA graphs in bf16 too
(`scripts/gpu_session.sh tests`). The trie merge the n-gram trees use (`graft`) against its plain-Python reference
(tests/kernels/test_trie_graft.py tests the kernel itself)."""

from __future__ import annotations

import pytest
import torch
from engine_testing import PROMPTS, TREES, ar_outputs, oracle_block, oracle_like

from eaglet.engine.drafter import DraftTree, drafter_class
from eaglet.engine.drafters import drafter_modules
from eaglet.engine.drafters._trie import graft, root_tree
from eaglet.engine.drafters.block import BlockDrafter
from eaglet.engine.drafters.eagle import EagleDrafter
from eaglet.engine.drafters.ngram import NgramBranches, NgramDrafter
from eaglet.engine.requests import Request
from eaglet.engine.speculative import SpeculativeEngine, TreeSpec
from eaglet.kernels.trie_graft import graft_sequential

# one way to build each drafter module's drafter for the tests (a module missing here fails the test below), and the
# compositions ("<module>+...")
FACTORIES = {
    "block": lambda target: BlockDrafter(oracle_block(target)),
    "eagle": lambda target: EagleDrafter(oracle_like("eagle1", target)),
    "ngram": lambda target: NgramDrafter(n_max=3, n_min=1),
    "eagle+ngram": lambda target: NgramBranches(EagleDrafter(oracle_like("eagle1", target)), 2),
    "block+ngram": lambda target: NgramBranches(BlockDrafter(oracle_block(target)), 2),
    # branches deeper than the drafter's tree: accepted paths longer than tree.steps + 1
    "eagle+ngram_deep": lambda target: NgramBranches(EagleDrafter(oracle_like("eagle1", target)), 2, depth=9),
    "block+ngram_deep": lambda target: NgramBranches(BlockDrafter(oracle_block(target)), 2, depth=9),
}
# prompts whose greedy continuations the random target repeats, so the n-gram drafter finds matches
LOOPY = PROMPTS + [[9, 8, 7, 9, 8, 7, 9, 8, 7, 9, 8], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 3, 1, 4, 1, 5]]


def test_every_drafter_module_is_registered_and_tested():
    assert drafter_modules() == sorted(k for k in FACTORIES if "+" not in k)
    for module in drafter_modules():
        assert drafter_class(module).name == module


def check_tree(tree: DraftTree, seq_lens: torch.Tensor, roots: torch.Tensor, N: int, S: int) -> None:
    """The verify's contract: node 0 is the root; the mask is ancestor-or-self of a tree whose parents come first;
    positions are seq_len + depth (depth <= S); the child / sibling links reach each real node once, children of
    one parent with distinct tokens, and only nodes whose mask row is their ancestors'."""
    B = seq_lens.shape[0]
    assert tree.tokens.shape == tree.positions.shape == tree.next_token.shape == tree.next_sibling.shape == (B, N)
    assert tree.mask.shape == (B, N, N) and tree.mask.dtype == torch.bool
    for b in range(B):
        mask, tok = tree.mask[b].tolist(), tree.tokens[b].tolist()
        assert tok[0] == roots[b] and tree.positions[b, 0] == seq_lens[b]
        for i in range(N):
            anc = [j for j in range(N) if mask[i][j]]
            assert anc[-1] == i and all(mask[i][k] for j in anc for k in range(N) if mask[j][k])  # closed
            assert mask[i][0]  # every node hangs under the root
            depth = len(anc) - 1
            assert depth <= S and tree.positions[b, i] == seq_lens[b] + depth
        seen, stack = [], [0]
        while stack:  # walk the links as the greedy verify does
            i = stack.pop()
            seen.append(i)
            kids, c = [], tree.next_token[b, i].item()
            while c != -1:
                assert c > i and mask[c][i] and sum(mask[c]) == sum(mask[i]) + 1  # a child of i
                kids.append(c)
                c = tree.next_sibling[b, c].item()
            assert len({tok[k] for k in kids}) == len(kids)  # distinct tokens among siblings
            stack += kids
        assert len(seen) == len(set(seen))


def prefilled(target, drafter, spec, prompts):
    """An engine's rows taken and prefilled for `prompts`, as its first step finds them -> seq_lens, roots, rows
    and the drafter's state."""
    eng = SpeculativeEngine(target, drafter, spec, max_batch=len(prompts), max_context=128, page_size=8)
    reqs = [Request(p, 8, rid=i) for i, p in enumerate(prompts)]
    for r in reqs:
        r.row = eng.kv_t.alloc_request()
        drafter.alloc_request(r.row)
    first = [(r.row, len(r.prompt_ids) + 1) for r in reqs]
    eng.kv_t.reserve_many(first)
    drafter.reserve([(row, n + eng.lookahead) for row, n in first])
    roots, seq_lens, state = eng._prefill(reqs)
    return seq_lens, roots, torch.tensor([r.row for r in reqs]), state


@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("module", sorted(FACTORIES))
def test_conformance(target, module, tree):
    """propose after a real prefill: a valid tree of the spec's N nodes, twice the same."""
    spec = TREES[tree]
    drafter = FACTORIES[module](target)
    seq_lens, roots, rows, state = prefilled(target, drafter, spec, LOOPY[-3:])
    with torch.inference_mode():
        a = drafter.propose(seq_lens, roots, rows, **state)
        b = drafter.propose(seq_lens, roots, rows, **state)
    check_tree(a, seq_lens, roots.tolist(), drafter.num_nodes(spec), spec.steps)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("module", sorted(FACTORIES))
def test_greedy_is_lossless(target, module, tree, batch):
    want = ar_outputs(target, LOOPY, 30)
    eng = SpeculativeEngine(target, FACTORIES[module](target), TREES[tree], max_batch=batch, max_context=256,
                            page_size=8)
    reqs = [Request(p, 30, rid=i) for i, p in enumerate(LOOPY)]
    stats = eng.generate(reqs)
    assert [r.output_ids for r in reqs] == want
    assert stats.summary(eng.depth)["tau"] > 1.0  # the drafter's proposals are taken, not only the bonus


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("module", sorted(FACTORIES))
def test_greedy_is_lossless_gpu_cuda_graphs(target, module, tree, dtype):
    """Every drafter on the GPU, its draft and update captured as CUDA graphs, B=2: speculative == plain greedy
    (bf16 with the invariant numerics, as runner/run.py runs it; a drafter with a model runs the target's kernels)."""
    from eaglet.models.llama import Transformer

    gpu = Transformer.from_state_dict(target.args, target.state_dict(), dtype, "cuda")
    gpu.set_invariant(dtype == torch.bfloat16)
    drafter = FACTORIES[module](gpu)
    model = getattr(getattr(drafter, "base", drafter), "head", None)  # a composition's model is its base's
    if model is not None:
        model.set_invariant(gpu.invariant)
    want = ar_outputs(gpu, LOOPY, 40)
    eng = SpeculativeEngine(gpu, drafter, TREES[tree], max_batch=2, max_context=256, page_size=8, use_cuda_graph=True)
    reqs = [Request(p, 40, rid=i) for i, p in enumerate(LOOPY)]
    stats = eng.generate(reqs)
    assert [r.output_ids for r in reqs] == want
    assert stats.summary(eng.depth)["tau"] > 1.0


def test_ngram_tree_merges_shared_prefixes():
    """Matches whose continuations share a prefix share its nodes; the rest pad the tree."""
    d = NgramDrafter(n_max=1)

    class Target:
        device, dtype = torch.device("cpu"), torch.float32

    spec = TreeSpec(steps=3, topk=3, num_draft_tokens=8)
    d.setup(target=Target(), tree=spec, depth=spec.steps, max_batch=1, max_context=32, page_size=8, num_pages=None,
            device=torch.device("cpu"))
    # history: 5 1 2 3 | 5 1 2 4 | 5 7 | 5  -> the suffix "5" occurred at 0, 4, 8: continuations
    # (most recent first) 7 5 7 (the loop "5 7" goes on past the history's end), 1 2 4, 1 2 3 -> a trie of
    # 7, 5, 7 / 1, 2, 4 / 3 under the root
    h = [5, 1, 2, 3, 5, 1, 2, 4, 5, 7, 5]
    d.history[0, :len(h)] = torch.tensor(h)
    seq_lens = torch.tensor([len(h) - 1], dtype=torch.int32)
    t = d.propose(seq_lens, torch.tensor([5]), torch.tensor([0]))
    check_tree(t, seq_lens, [5], 8, 3)
    assert t.tokens[0].tolist() == [5, 7, 5, 7, 1, 2, 4, 3]
    assert t.positions[0].tolist() == [10, 11, 12, 13, 11, 12, 13, 13]
    assert t.next_token[0].tolist() == [1, 2, 3, -1, 5, 6, -1, -1]
    assert t.next_sibling[0].tolist() == [-1, 4, -1, -1, -1, -1, 7, -1]


def tree_of(tokens, parents, seq_len=10):
    """A hand-built one-request tree: node tokens and parents (the root's: -1) -> DraftTree, links in ascending node
    order."""
    N = len(tokens)
    depth = [0] * N
    mask = torch.eye(N, dtype=torch.bool)
    for i in range(1, N):
        depth[i] = depth[parents[i]] + 1
        mask[i] |= mask[parents[i]]
    nt = [next((j for j in range(1, N) if parents[j] == i), -1) for i in range(N)]
    ns = [next((j for j in range(i + 1, N) if i and parents[j] == parents[i]), -1) for i in range(N)]
    t = lambda x: torch.tensor([x])  # noqa: E731
    return DraftTree(t(tokens), t([seq_len + d for d in depth]), t(nt), t(ns), mask[None])


def check_graft(tree: DraftTree, paths: list[list[int]], extra: int) -> DraftTree:
    """graft equals the plain-Python insertion (kernels/trie_graft.py's graft_sequential), is a valid tree and keeps
    the tree's nodes where they were."""
    got = graft(tree, torch.tensor([paths]), extra)
    want = graft_sequential(tree, torch.tensor([paths]), extra)
    N, S = tree.tokens.shape[1], len(paths[0])
    check_tree(got, tree.positions[:, 0], tree.tokens[:, 0].tolist(), N + extra, S)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert torch.equal(got.tokens[:, :N], tree.tokens) and torch.equal(got.mask[:, :N, :N], tree.mask)
    return got


def test_graft_golden():
    """A hand-built EAGLE tree and n-gram continuations -> the exact merged tree: a shared prefix is walked, not
    copied; where a path departs it grows new nodes; two paths with a common new prefix share it; the unused slots
    are padding."""
    #        root 5
    #       /      \
    #     1(1)     7(2)
    #     /  \       \
    #   2(3) 3(4)    8(5)
    eagle = tree_of([5, 1, 7, 2, 3, 8], [-1, 0, 0, 1, 1, 2])
    paths = [[1, 2, 9], [7, 8, 6], [1, 2, 9], [4, 4, 4], [-1, -1, -1]]  # K=5 matches, S=3
    t = graft(eagle, torch.tensor([paths]), 5 * 3)
    # new: 9 under 2(3) -> 6; 6 under 8(5) -> 7; the repeat of 1 2 9 adds nothing; 4 4 4 -> 8, 9, 10; 11..20 pad
    assert t.tokens[0].tolist() == [5, 1, 7, 2, 3, 8, 9, 6, 4, 4, 4] + [0] * 10
    assert t.positions[0].tolist() == [10, 11, 11, 12, 12, 12, 13, 13, 11, 12, 13] + [11] * 10
    assert t.next_token[0].tolist() == [1, 3, 5, 6, -1, 7, -1, -1, 9, 10, -1] + [-1] * 10
    assert t.next_sibling[0].tolist() == [-1, 2, 8, 4, -1, -1, -1, -1, -1, -1, -1] + [-1] * 10
    assert t.mask[0, 7].nonzero()[:, 0].tolist() == [0, 2, 5, 7]  # 6 under 8 under 7
    assert t.mask[0, 20].nonzero()[:, 0].tolist() == [0, 20]  # padding: a leaf under the root
    check_tree(t, torch.tensor([10]), [5], 21, 3)
    check_graft(eagle, paths, 15)
    check_graft(eagle, paths, 3)  # a budget cuts the last path: 9, 6, then only the first 4
    # no paths: the tree itself, then padding
    none = graft(eagle, torch.full((1, 2, 3), -1), 6)
    assert all(torch.equal(a[:, :6], b) for a, b in zip(none[:4], eagle[:4]))


def test_graft_keeps_siblings_distinct_on_random_trees():
    """Random EAGLE-2 trees (kernels/build_tree.py) over a 5-token vocabulary and paths that follow them and
    depart: graft equals its reference (also onto the bare root), and no parent ever gets two children of one
    token."""
    from eaglet.kernels.build_tree import build_tree, random_candidates

    g = torch.Generator().manual_seed(0)
    K, S, N = 3, 4, 10
    for _ in range(20):
        scores, tokens, parents = random_candidates(1, K, S, vocab=5, generator=g)
        bt = build_tree(scores, tokens, parents, torch.tensor([4]), torch.tensor([7], dtype=torch.int32), N, K, S)
        tree = DraftTree(bt.draft_tokens, bt.positions, bt.retrieve_next_token, bt.retrieve_next_sibling,
                         bt.tree_mask)
        paths = []
        for _ in range(4):  # down a random node's path, then random tokens, cut at a random length
            i = int(torch.randint(N, (1,), generator=g))
            anc = tree.mask[0, i].nonzero()[:, 0].tolist()[1:]
            p = [tree.tokens[0, a].item() for a in anc] + torch.randint(5, (S,), generator=g).tolist()
            cut = int(torch.randint(S + 1, (1,), generator=g))
            paths.append(p[:cut] + [-1] * (S - cut))
        check_graft(root_tree(torch.tensor([4]), torch.tensor([7])), paths, N - 1)  # the n-gram drafter's trie
        for extra in (K * S, 3):
            t = check_graft(tree, paths, extra)
            for i in range(N + extra):
                kids, c = [], t.next_token[0, i].item()
                while c != -1:
                    kids.append(t.tokens[0, c].item())
                    c = t.next_sibling[0, c].item()
                assert len(kids) == len(set(kids)), f"duplicate siblings under node {i}: {kids}"


def test_ngram_branches_propose_a_loop_the_head_misses(target):
    """A random EAGLE head accepts almost nothing; with n-gram branches the loops of LOOPY are accepted."""
    from eaglet.models.head_checkpoint import new_draft_head

    taus = []
    for branches in (0, 2):
        torch.manual_seed(1)
        head = new_draft_head("eagle1", target, dtype=target.dtype, device=target.device)
        d = EagleDrafter(head) if branches == 0 else NgramBranches(EagleDrafter(head), branches)
        eng = SpeculativeEngine(target, d, TREES["eagle2"], max_batch=2, max_context=256, page_size=8)
        reqs = [Request(p, 30, rid=i) for i, p in enumerate(LOOPY[-2:])]
        taus.append(eng.generate(reqs).summary(4)["tau"])
        assert [r.output_ids for r in reqs] == ar_outputs(target, LOOPY[-2:], 30)
    assert taus[1] > taus[0] + 0.3, taus  # 1.0 and 1.90 here


def test_deeper_ngram_branches_accept_past_the_heads_depth(target):
    """Branches of draft.ngram_depth tokens under a tree of tree.steps: on LOOPY's loops (periods 5 and 6, ~25 tokens)
    the verify accepts paths longer than tree.steps + 1 (the engine's depth is the branches'), so the same output,
    plain decoding's, takes fewer steps than with branches as deep as the tree."""
    from eaglet.models.head_checkpoint import new_draft_head

    tree, runs = TREES["eagle2"], []
    for depth in (None, tree.steps + 4):
        torch.manual_seed(1)
        head = new_draft_head("eagle1", target, dtype=target.dtype, device=target.device)
        d = NgramBranches(EagleDrafter(head), 2, depth=depth)
        eng = SpeculativeEngine(target, d, tree, max_batch=2, max_context=256, page_size=8)
        assert eng.depth == (depth or tree.steps) and eng.num_nodes == tree.num_draft_tokens + 2 * eng.depth
        reqs = [Request(p, 40, rid=i) for i, p in enumerate(LOOPY[-2:])]
        runs.append(eng.generate(reqs))
        assert [r.output_ids for r in reqs] == ar_outputs(target, LOOPY[-2:], 40)
    shallow, deep = runs  # the random head accepts nothing: every accepted draft is a branch's
    assert max(shallow.accept_lens) == tree.steps + 1 and max(deep.accept_lens) == tree.steps + 5, deep.accept_lens
    assert len(deep.accept_lens) < len(shallow.accept_lens)  # the same tokens in fewer steps (40 against 44 here)


@pytest.mark.parametrize("module", ["eagle+ngram", "block+ngram"])
def test_ngram_branches_without_a_match_verify_the_drafters_widened_tree(target, module):
    """Where the branches find no match, the request's N + K*depth slots hold the drafter's own tree widened from the
    same candidates (its `propose_widened`), not padding; where they match, the drafter's N nodes plus the branches'."""
    spec = TREES["eagle2"]
    drafter = FACTORIES[module](target)
    seq_lens, roots, rows, state = prefilled(target, drafter, spec, LOOPY[-2:])
    # request 0's history made of tokens that occur once (no suffix repeats); request 1's the same but for its root
    # once before, followed by tokens no tree holds (an oracle drafter's tree already holds the loop's continuation)
    for b in range(2):
        n = int(seq_lens[b]) + 1  # the root at seq_len
        drafter.ngram.history[rows[b], :n] = torch.arange(10**6 * (b + 1), 10**6 * (b + 1) + n)
    drafter.ngram.history[rows[1], 2] = drafter.ngram.history[rows[1], int(seq_lens[1])] = roots[1]
    extra = drafter.num_nodes(spec) - spec.num_draft_tokens
    with torch.inference_mode():
        got = drafter.propose(seq_lens, roots, rows, **state)
        tree, wide = drafter.base.propose_widened(seq_lens, roots, rows, extra, **state)
    assert wide is not None and wide.tokens.shape[1] == drafter.num_nodes(spec)
    check_tree(got, seq_lens, roots.tolist(), drafter.num_nodes(spec), spec.steps)
    assert all(torch.equal(g[0], w[0]) for g, w in zip(got, wide))  # no match: the widened tree
    N = spec.num_draft_tokens  # the drafter's N nodes keep their slots (their links gain the branch's)
    assert torch.equal(got.tokens[1, :N], tree.tokens[1]) and torch.equal(got.mask[1, :N, :N], tree.mask[1])
    assert not torch.equal(got.tokens[1], wide.tokens[1])  # and the branch


def test_ngram_depth_is_checked():
    with pytest.raises(ValueError, match="draft.ngram_depth=0"):
        NgramBranches(NgramDrafter(), 2, depth=0)


@pytest.mark.parametrize("module", sorted(FACTORIES))
def test_sampling_runs_every_drafter(target, module):
    """Tree speculative sampling over each drafter's trees (whose siblings carry distinct tokens): every request
    decodes its whole budget of in-vocabulary tokens (that the sampled distribution is the target's is
    test_speculative.py's, on the verify every drafter shares)."""
    from eaglet.engine.sampling import SamplingParams

    torch.manual_seed(0)
    eng = SpeculativeEngine(target, FACTORIES[module](target), TREES["eagle2"], max_batch=2, max_context=256,
                            page_size=8, sampling=SamplingParams(temperature=1.0))
    reqs = [Request(p, 12, rid=i) for i, p in enumerate(LOOPY[-3:])]
    eng.generate(reqs)
    assert all(len(r.output_ids) == 12 and all(0 <= t < target.args.vocab_size for t in r.output_ids) for r in reqs)


def test_ngram_config_names_the_kernels_limit():
    from eaglet.engine.drafters.ngram_config import MAX_M, MAX_N
    from eaglet.kernels import ngram_match

    assert MAX_N == ngram_match.MAX_N and MAX_M == ngram_match.MAX_M
