"""EAGLE speculative decoding is lossless: greedy output equals plain greedy decoding, token for token."""

from __future__ import annotations

import pytest
import torch
from engine_testing import PROMPTS, TREES, LaunchCount, ar_outputs, oracle_like

from eaglet.engine.autoregressive import AREngine
from eaglet.engine.drafters.eagle import EagleDrafter
from eaglet.engine.phase_timer import TIMED_EVERY
from eaglet.engine.requests import Request
from eaglet.engine.speculative import SimulatedAcceptance, SpeculativeEngine, StepStats, TreeSpec
from eaglet.models.head_checkpoint import new_draft_head
from eaglet.models.kv_cache import KVCache
from eaglet.models.llama import ModelArgs, Transformer


def spec_outputs(target, head, tree, prompts, max_new, batch):
    eng = SpeculativeEngine(target, EagleDrafter(head), tree, max_batch=batch, max_context=256, page_size=8)
    reqs = [Request(p, max_new, rid=i) for i, p in enumerate(prompts)]
    stats = eng.generate(reqs)
    return [r.output_ids for r in reqs], stats


@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("kind", ["eagle1", "multi_layer", "eagle3", "eagle1-random"])
def test_greedy_is_lossless(target, kind, tree):
    spec = TREES[tree]
    if kind == "eagle1-random":
        head = new_draft_head("eagle1", target, dtype=torch.float32, device="cpu")
    elif kind == "eagle3":
        head = new_draft_head("eagle3", target, dtype=torch.float32, device="cpu")
    else:
        head = oracle_like(kind, target, num_layers=spec.steps if kind == "multi_layer" else None)
    want = ar_outputs(target, PROMPTS, 30)
    got, stats = spec_outputs(target, head, spec, PROMPTS, 30, batch=2)
    assert got == want
    summary = stats.summary(spec.steps)
    # one step in TIMED_EVERY timed, the first among them; a period measured before each later one
    assert stats.timed_steps == -(-stats.steps // TIMED_EVERY) and summary["verify_ms"] > 0
    assert len(stats.step_periods_ms) == stats.timed_steps - 1
    assert summary["step_median_ms"] > 0 or stats.steps <= TIMED_EVERY
    if not kind.endswith("random") and kind != "eagle3":  # the oracle-like heads must exercise deep paths
        assert summary["tau"] > 1.5, summary
        assert sum(summary["accept_hist"][2:]) > 0, summary  # paths of two or more draft tokens
        if spec.topk == 1:
            assert summary["accept_hist"][-1] > 0, summary  # whole chains accepted


def test_the_median_step_ignores_a_stalled_step():
    stats = StepStats(steps=5, total_s=1.0, step_periods_ms=[2.0, 2.1, 400.0, 1.9])
    summary = stats.summary(max_depth=3)
    assert summary["step_median_ms"] == 2.05 and summary["step_ms"] == 200.0  # the mean carries the stall


def test_serial_plan_time_is_all_exposed(target):
    head = new_draft_head("eagle1", target, dtype=torch.float32, device="cpu")
    _, stats = spec_outputs(target, head, TREES["eagle2"], PROMPTS[:2], 6, batch=2)
    s = stats.summary(TREES["eagle2"].steps)
    # serial: the plan runs between the draft's end and the verify's start, all of it on the critical path
    assert s["plan_ms"] == s["plan_wait_ms"] > 0 and s["plan_beside_ms"] == 0.0 and s["plan_hidden_fraction"] == 0.0
    assert min(s[f"{p}_ms"] for p in ("draft", "verify", "extend")) > 0 and "accept_ms" not in s


def test_bad_trees_are_refused(target):
    head = new_draft_head("eagle1", target, dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match="tree.num_draft_tokens=30"):
        SpeculativeEngine(target, EagleDrafter(head), TreeSpec(2, 3, 30), max_batch=1, max_context=64)
    with pytest.raises(ValueError, match="tree.topk=300"):
        SpeculativeEngine(target, EagleDrafter(head), TreeSpec(2, 300, 8), max_batch=1, max_context=64)
    # more children of the root: the block drafter's alone (an EAGLE head grows tree.topk a node, the root's too)
    with pytest.raises(ValueError, match="tree.root_children=8: the eagle drafter"):
        SpeculativeEngine(target, EagleDrafter(head), TreeSpec(2, 3, 5, root_children=8), max_batch=1, max_context=64)
    with pytest.raises(ValueError, match="tree.root_children=2 must be at least tree.topk=3"):
        SpeculativeEngine(target, EagleDrafter(head), TreeSpec(2, 3, 5, root_children=2), max_batch=1, max_context=64)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")
@pytest.mark.parametrize("folded", [False, True], ids=["norm-weights", "folded"])
@pytest.mark.parametrize("kind", ["eagle1", "multi_layer"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tree", list(TREES))
def test_greedy_is_lossless_gpu_cuda_graphs(target, tree, dtype, kind, folded):
    """Triton kernels and CUDA graphs on the GPU: speculative == plain greedy (both graph-replayed). bf16
    needs the invariant numerics (without them it diverged at near-ties on an H200); fp32 runs the stock
    path, whose rounding differences stay below this model's logit gaps. folded: the norm weights folded into
    the projections (the default, `fold_norms: true`), the head's too. The head runs the target's kernels."""
    gpu = Transformer.from_state_dict(target.args, target.state_dict(), dtype, "cuda")
    gpu.set_invariant(dtype == torch.bfloat16)
    if folded:
        gpu.fold_norm_weights()
    head = oracle_like(kind, gpu, num_layers=TREES[tree].steps if kind == "multi_layer" else None)
    if folded:
        head.fold_norm_weights()
    head.set_invariant(gpu.invariant)  # the target's kernels, as runner/run.py sets them
    want = ar_outputs(gpu, PROMPTS, 40)
    eng = SpeculativeEngine(gpu, EagleDrafter(head), TREES[tree], max_batch=2, max_context=256, page_size=8,
                            use_cuda_graph=True)
    reqs = [Request(p, 40, rid=i) for i, p in enumerate(PROMPTS)]
    stats = eng.generate(reqs)
    assert [r.output_ids for r in reqs] == want
    assert stats.summary(TREES[tree].steps)["tau"] > 1.5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")
@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
def test_greedy_is_lossless_gpu_folded_norms(target, tree, kind):
    """fold_norm_weights (fp32, CUDA graphs) on the stock path: the rmsnorm kernel with the unit weights folding
    leaves, the verify's and plain decoding's alike; a folded EAGLE-3 head (its two input norms folded into qkv) drafts
    on it too; speculative == plain greedy."""
    gpu = Transformer.from_state_dict(target.args, target.state_dict(), torch.float32, "cuda")
    gpu.fold_norm_weights()
    # EAGLE-1: an oracle-like head (layer 0 has no input norm: nothing of it folds); EAGLE-3: a random head
    head = oracle_like(kind, gpu).fold_norm_weights()
    want = ar_outputs(gpu, PROMPTS, 40)
    eng = SpeculativeEngine(gpu, EagleDrafter(head), TREES[tree], max_batch=2, max_context=256, page_size=8,
                            use_cuda_graph=True)
    reqs = [Request(p, 40, rid=i) for i, p in enumerate(PROMPTS)]
    stats = eng.generate(reqs)
    assert [r.output_ids for r in reqs] == want
    if kind == "eagle1":
        assert stats.summary(TREES[tree].steps)["tau"] > 1.5


def test_sampling_preserves_the_target_distribution():
    """Temperature 1: the second emitted token (the first one verified by tree speculative sampling)
    follows the target's own marginal sum_t1 p(t1) p(t2 | t1), by a chi-square test."""
    from scipy.stats import chisquare

    from eaglet.engine.sampling import SamplingParams
    from eaglet.models.kv_cache import ForwardBatch, slots_for

    torch.manual_seed(1)
    args = ModelArgs(family="llama", vocab_size=12, dim=128, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=64,
                     intermediate_size=128, rope_theta=10000.0, max_seq_len=64)
    target = Transformer(args).eval()
    with torch.no_grad():  # a peaked but not degenerate distribution over 12 tokens
        target.lm_head.weight.mul_(8.0)
    head = oracle_like("eagle1", target)  # drafts are often, not always, right: both branches run
    prompt = [3, 7, 1]

    def dist(ids):
        kv = KVCache.for_model(args, max_reqs=1, max_context=16, page_size=4)
        r = kv.alloc_request()
        kv.reserve(r, len(ids))
        pos = torch.arange(len(ids))[None]
        pt = kv.req_to_page[[r]]
        with torch.no_grad():
            h, _ = target(torch.tensor([ids]), pos, ForwardBatch(pt, torch.zeros(1, dtype=torch.int32),
                                                                   slots_for(pt, pos, 4)), kv)
        return torch.softmax(target.logits(h[0, -1]).double(), -1).detach()  # [V]

    p1 = dist(prompt)
    want = sum(p1[t] * dist(prompt + [t]) for t in range(args.vocab_size)).detach()  # [V]
    n = 4000
    eng = SpeculativeEngine(target, EagleDrafter(head), TreeSpec(2, 3, 5), max_batch=200, max_context=16, page_size=4,
                            sampling=SamplingParams(temperature=1.0))
    reqs = [Request(prompt, 2, rid=i) for i in range(n)]
    eng.generate(reqs)
    counts = torch.bincount(torch.tensor([r.output_ids[1] for r in reqs]), minlength=args.vocab_size).double()
    keep = want * n >= 5  # chi-square needs expected counts of at least ~5: pool the rest
    obs = torch.cat([counts[keep], counts[~keep].sum()[None]])
    exp = torch.cat([want[keep], want[~keep].sum()[None]]) * n
    assert chisquare(obs.numpy(), exp.numpy()).pvalue > 1e-3


def test_eos_and_budgets_match_plain_decoding(target):
    """Requests stop at EOS (mid-way through an accepted path) or at their own budget, and later
    requests join as rows free up: still token for token plain decoding."""
    free = ar_outputs(target, PROMPTS, 30)
    eos = free[1][5]
    kv = KVCache.for_model(target.args, max_reqs=2, max_context=256, page_size=8)
    ar = [Request(p, 10 + 7 * i, rid=i) for i, p in enumerate(PROMPTS)]
    AREngine(target, kv, 2, eos_ids=(eos,)).generate(ar)
    eng = SpeculativeEngine(target, EagleDrafter(oracle_like("eagle1", target)), TREES["eagle2"], max_batch=2,
                            max_context=256,
                            page_size=8, eos_ids=(eos,))
    spec = [Request(p, 10 + 7 * i, rid=i) for i, p in enumerate(PROMPTS)]
    eng.generate(spec)
    assert [r.output_ids for r in spec] == [r.output_ids for r in ar]
    assert [r.finish_reason for r in spec] == [r.finish_reason for r in ar]
    assert spec[1].finish_reason == "eos"


def test_kv_pool_too_small_is_named(target):
    from eaglet.models.kv_cache import KVPoolExhausted

    eng = SpeculativeEngine(target, EagleDrafter(new_draft_head("eagle1", target, dtype=torch.float32,
                            device="cpu")), TREES["chain"],
                            max_batch=2, max_context=128, page_size=8, num_pages=6)
    with pytest.raises(KVPoolExhausted, match="kv.num_pages"):
        eng.generate([Request(list(range(1, 30)), 20), Request(list(range(1, 30)), 20)])


def test_prompt_longer_than_context_is_named(target):
    eng = SpeculativeEngine(target, EagleDrafter(new_draft_head("eagle1", target, dtype=torch.float32,
                            device="cpu")), TREES["chain"],
                            max_batch=1, max_context=32, page_size=8)
    with pytest.raises(ValueError, match="prompt has 40 tokens but the context is 32"):
        eng.generate([Request([1] * 40, 4)])


def test_simulated_acceptance_tolerates_rows_without_a_tree(target):
    """Bucket padding and a graph's warm-up run give rows whose tree mask is empty: they accept nothing and
    read node 0 (an index of -1 is a device-side assert on the GPU)."""
    head = new_draft_head("eagle1", target, dtype=torch.float32, device="cpu")
    tree = TreeSpec(3, 1, 4)
    eng = SpeculativeEngine(target, EagleDrafter(head), tree, max_batch=2, max_context=64,
                            simulate=SimulatedAcceptance.from_tau(2.5, tree.steps))
    pred = torch.arange(8).view(2, 4)  # [B, N]
    mask = torch.zeros(2, 4, 4, dtype=torch.bool)  # [B, N, N]; row 1 has no tree
    mask[0] = torch.tril(torch.ones(4, 4, dtype=torch.bool))  # row 0: a chain
    res = eng._simulated_accept(pred, mask)
    assert res.accept_len[1] == 0 and (res.accept_index[1] == -1).all() and res.bonus[1] == pred[1, 0]
    n = int(res.accept_len[0])
    assert 1 <= n <= 4 and res.accept_index[0, :n].tolist() == list(range(n)) and res.bonus[0] == pred[0, n - 1]


@pytest.mark.parametrize("engine", ["ar", "eagle"])
def test_answers_are_seen_as_they_finish_and_an_interrupt_keeps_the_numbers(target, engine):
    """on_token sees a request done on its last token (run_spec.py writes each answer then), and an exception
    from a callback (an interrupt) leaves the stats of the steps that ran in the caller's object."""
    from eaglet.engine.autoregressive import GenStats

    if engine == "ar":
        eng = AREngine(target, KVCache.for_model(target.args, max_reqs=2, max_context=256, page_size=8), 2)
        stats = GenStats()
    else:
        eng = SpeculativeEngine(target, EagleDrafter(oracle_like("eagle1", target)), TREES["eagle2"], max_batch=2,
                                max_context=256,
                                page_size=8)
        stats = StepStats()
    reqs = [Request(p, 6 + 5 * i, rid=i) for i, p in enumerate(PROMPTS)]
    finished = []
    eng.generate(reqs, on_token=lambda r, t: finished.append((r.rid, list(r.output_ids))) if r.done else None)
    assert sorted(finished) == sorted((r.rid, r.output_ids) for r in reqs)  # each once, with its whole answer

    class Stop(Exception):
        pass

    steps = []

    def stop_at_3():
        steps.append(1)
        if len(steps) == 3:
            raise Stop

    with pytest.raises(Stop):
        eng.generate([Request(p, 30, rid=i) for i, p in enumerate(PROMPTS)], on_step=stop_at_3, stats=stats)
    assert (stats.decode_steps if engine == "ar" else stats.steps) == 3
    assert stats.total_s > 0 and 0 < stats.new_tokens <= 3 * 2 * (TREES["eagle2"].steps + 1)
    if engine == "eagle":
        assert len(stats.accept_lens) >= 2 and stats.phase_ms["verify"] > 0


def test_between_its_graphs_a_step_runs_its_copies_and_the_plan_only(target, monkeypatch):
    """What a step runs eagerly between its three graphs (engine/speculative.py's module doc): the draft's, the
    verify's (in one part; overlap_split's in two: what needs only the previous step, then the tree) and the
    extend's input copies, one multi-tensor copy each, and the plan's `step_slots`; no clone, argmax or concatenation
    (each a launch of a few µs on a GPU). Counted on the CPU, where the graphs' functions run eagerly: their ops,
    `step_slots`' own (one kernel on a GPU) and the runners' CPU-only buffers are left out."""
    import eaglet.engine.speculative as speculative
    from eaglet.engine.cuda_graph import GraphRunner

    count = LaunchCount()
    monkeypatch.setattr(speculative, "step_slots", count.hidden(speculative.step_slots, "step_slots"))
    for method in ("_static", "_to_static"):
        monkeypatch.setattr(GraphRunner, method, count.hidden(getattr(GraphRunner, method)))
    head = new_draft_head("eagle3", target, dtype=torch.float32, device="cpu")
    eng = SpeculativeEngine(target, EagleDrafter(head), TREES["eagle2"], max_batch=2, max_context=256, page_size=8)
    for runner in (eng._draft, eng._verify, eng._extend):
        runner.fn = count.hidden(runner.fn)
    step = eng._step

    def counted_step(*a, **k):  # a window a step, counted within the step only
        count.windows.append([])
        with count:
            return step(*a, **k)

    eng._step = counted_step
    eng.generate([Request(p, 12, rid=i) for i, p in enumerate(PROMPTS[:2])])
    steps = count.windows[1:]
    assert len(steps) > 2
    copy = "_foreach_copy_"
    assert all(o == [copy, "step_slots", copy, copy] for o in steps), steps
