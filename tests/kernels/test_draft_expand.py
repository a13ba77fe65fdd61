"""expand_step (kernels/draft_expand.py) against its torch reference: every output exactly equal.

On CPU run with TRITON_INTERPRET=1 (CI does) so the Triton kernel itself is tested; on a GPU the same tests run
there, plus a bf16 hidden state and a CUDA graph.
"""

from __future__ import annotations

import pytest
import torch
from kernel_testing import DEVICE, gpu_only, needs_kernel

from eaglet.kernels.build_tree import num_candidates
from eaglet.kernels.draft_expand import expand_step, expand_step_ref


def make(B, K, S, i, H, vd=50, d2t=True, seed=0, dtype=torch.float32, tie=False):
    """Inputs of draft step i (1 <= i < S) with a random mask of the i*K draft KV columns seen so far."""
    gen = torch.Generator().manual_seed(seed)
    base = K + (i - 1) * K * K
    lp = -torch.rand(B, K, K, generator=gen)  # [B, K, K]
    if tie:  # every candidate of a node equal, nodes equal too: only the index decides
        lp = torch.full((B, K, K), -1.0)
    args = dict(
        cur_lp=torch.zeros(B, K) if tie else torch.randn(B, K, generator=gen),  # [B, K]
        lp=lp,
        ids=torch.randint(0, vd, (B, K, K), generator=gen),  # [B, K, K]
        cur_flat=torch.randint(0, max(base, 1), (B, K), generator=gen),  # [B, K]
        mask=torch.rand(B, K, i * K, generator=gen) > 0.5,  # [B, K, i*K]
        h=torch.randn(B, K, H, generator=gen).to(dtype),  # [B, K, H]
    )
    args = {k: v.to(DEVICE) for k, v in args.items()}
    d2t = torch.randint(0, 1000, (vd,), generator=gen).to(DEVICE) if d2t else None  # [Vd]
    return args, d2t, base, num_candidates(K, S)


def run_both(args, d2t, base, C, keep=True):
    outs = []
    for fn in (expand_step, expand_step_ref):
        B = args["cur_lp"].shape[0]
        cand = dict(scores=torch.full((B, C), 7.0, device=DEVICE), tokens=torch.full((B, C), -5, device=DEVICE),
                    parents=torch.full((B, C), -5, device=DEVICE))
        outs.append((fn(**args, **cand, base=base, d2t=d2t, keep_ancestors=keep), cand))
    (got, got_c), (want, want_c) = outs
    for name, a, b in zip(("cur_lp", "cur_tok", "cur_flat", "h_next", "mask_next"), got, want):
        assert a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b), name
    for name in ("scores", "tokens", "parents"):
        assert torch.equal(got_c[name], want_c[name]), name
    return got, got_c


@needs_kernel
@pytest.mark.parametrize(
    "B, K, S, i, H, d2t, keep",
    [
        pytest.param(2, 4, 5, 1, 64, True, True, id="eagle2-5/4-step1-d2t"),
        pytest.param(3, 3, 4, 3, 100, False, True, id="last-step-odd-H"),
        pytest.param(1, 1, 7, 5, 32, True, True, id="chain"),
        pytest.param(2, 10, 6, 3, 48, False, True, id="top10"),
        pytest.param(2, 4, 5, 2, 64, True, False, id="multi-layer-no-ancestors"),
        pytest.param(2, 4, 7, 4, 0, False, False, id="block-no-hidden-no-mask"),
        pytest.param(1, 1, 7, 6, 0, False, False, id="block-chain"),
    ],
)
def test_matches_reference(B, K, S, i, H, d2t, keep):
    args, d2t_t, base, C = make(B, K, S, i, H, d2t=d2t)
    if H == 0:  # the block drafter's tree (engine/drafters/block.py): no hidden state and no draft mask
        args["mask"] = args["mask"][:, :, :0]
    (_, _, flat, _, mask_next), cand = run_both(args, d2t_t, base, C, keep)
    assert ((flat >= base) & (flat < base + K * K)).all()
    assert (cand["scores"][:, base + K * K:] == 7.0).all() and (cand["tokens"][:, :base] == -5).all()  # untouched
    eye = torch.eye(K, dtype=torch.bool, device=DEVICE).expand(B, K, K)
    assert torch.equal(mask_next[:, :, -K:], eye)
    if not keep:
        assert not mask_next[:, :, :-K].any()


@needs_kernel
def test_ties_keep_the_lower_candidate():
    """All K*K scores equal: the K kept are candidates 0..K-1 (the first node's children), in order."""
    args, d2t, base, C = make(2, 4, 5, 2, 16, tie=True)
    (cur_lp, _, flat, _, _), _ = run_both(args, d2t, base, C)
    assert flat.tolist() == [[base + j for j in range(4)]] * 2 and (cur_lp == -1.0).all()


@needs_kernel
def test_step_one_broadcast_inputs():
    """Step 1's inputs are broadcasts (stride 0): the root's hidden state for every node, the identity mask."""
    B, K, H = 3, 4, 40
    args, d2t, base, C = make(B, K, 5, 1, H, seed=2)
    args["h"] = torch.randn(B, H, device=DEVICE)[:, None].expand(B, K, H)
    args["mask"] = torch.eye(K, dtype=torch.bool, device=DEVICE).expand(B, K, K)
    args["cur_flat"] = torch.arange(K, device=DEVICE).expand(B, K)
    run_both(args, d2t, base, C)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(lp=torch.zeros(2, 4, 3)), r"lp and ids must be \[B=2, K=4, K\]"),
        (dict(cur_flat=torch.zeros(2, 3, dtype=torch.long)), r"cur_flat must be \[B=2, K=4\]"),
        (dict(mask=torch.zeros(2, 4, 4)), "mask must be bool"),
        (dict(base=30), r"base=30: the step's K\*K=16 candidates must fit"),
        (dict(scores=torch.zeros(2, 36, dtype=torch.float64)), "must be float32"),
    ],
)
def test_bad_input(change, match):
    args, d2t, base, C = make(2, 4, 3, 1, 8)
    kw = dict(**{k: v.cpu() for k, v in args.items()}, scores=torch.zeros(2, C), tokens=torch.zeros(2, C).long(),
              parents=torch.zeros(2, C).long(), base=base, d2t=None)
    kw.update(change)
    with pytest.raises(ValueError, match=match):
        expand_step(**kw)


@gpu_only
def test_bf16_hidden_and_cuda_graph():
    args, d2t, base, C = make(4, 4, 6, 2, 576, dtype=torch.bfloat16, seed=3)
    run_both(args, d2t, base, C)
    cand = dict(scores=torch.zeros(4, C, device=DEVICE), tokens=torch.zeros(4, C, dtype=torch.long, device=DEVICE),
                parents=torch.zeros(4, C, dtype=torch.long, device=DEVICE))
    expand_step(**args, **cand, base=base, d2t=d2t)  # compile before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = expand_step(**args, **cand, base=base, d2t=d2t)
    new, _, _, _ = make(4, 4, 6, 2, 576, dtype=torch.bfloat16, seed=4)
    for k, v in new.items():
        args[k].copy_(v)
    graph.replay()
    want = expand_step_ref(**args, **{k: v.clone() for k, v in cand.items()}, base=base, d2t=d2t)
    assert all(torch.equal(a, b) for a, b in zip(out, want))


@needs_kernel
@pytest.mark.parametrize("kind", ["eagle3", "multi_layer"])
def test_engine_draft_calls_match_the_references(kind, monkeypatch):
    """Inside the engine's draft phase (its real arguments: broadcast step-1 inputs, d2t, a multi-layer head's
    mask), every `topk_logprobs` and `expand_step` call, run as a Triton kernel (the interpreter on CPU), equals its
    torch reference on the same inputs: ids and everything `expand_step` returns or writes exactly, the
    log-probabilities to fp32 rounding. EAGLE-3 with a reduced draft vocabulary and a multi-layer head cover both
    expansion flavours."""
    import eaglet.engine.drafters.eagle as drafting
    import eaglet.kernels.draft_expand as dx
    import eaglet.kernels.topk as tk
    from eaglet.engine.speculative import SpeculativeEngine, TreeSpec
    from eaglet.models.head_checkpoint import new_draft_head
    from eaglet.models.llama import ModelArgs, Transformer

    torch.manual_seed(0)
    args = ModelArgs(family="llama", vocab_size=300, dim=128, n_layers=8, n_heads=2, n_kv_heads=1, head_dim=64,
                     intermediate_size=128, rope_theta=10000.0, max_seq_len=256)
    target = Transformer(args).eval().to(DEVICE)
    tree = TreeSpec(4, 3, 8)
    if kind == "eagle3":
        head = new_draft_head("eagle3", target, draft_vocab_size=120, device=DEVICE)
        head.set_draft_vocab(torch.randperm(300)[:120].to(DEVICE))
    else:
        head = new_draft_head("multi_layer", target, num_layers=tree.steps, device=DEVICE)
    drafter = drafting.EagleDrafter(head)
    SpeculativeEngine(target, drafter, tree, max_batch=2, max_context=64, page_size=8, use_cuda_graph=False)
    B, K = 2, tree.topk
    gen = torch.Generator().manual_seed(1)
    seq_lens, roots, rows = torch.tensor([5, 9], dtype=torch.int32), torch.tensor([3, 4]), torch.tensor([0, 1])
    state = {"top_lp": -torch.rand(B, K, generator=gen), "top_tok": torch.randint(0, 300, (B, K), generator=gen),
             "hidden": torch.randn(B, head.hidden_size, generator=gen)}
    seq_lens, roots, rows = (t.to(DEVICE) for t in (seq_lens, roots, rows))
    state = {k: t.to(DEVICE) for k, t in state.items()}
    monkeypatch.setenv("EAGLET_KERNELS", "torch")  # the head on its references...
    for mod in (tk, dx):  # ...these two kernels on Triton
        monkeypatch.setattr(mod, "use_triton", lambda *tensors: True)
    calls = {"topk": 0, "expand": 0}

    def topk_checked(logits, k):
        calls["topk"] += 1
        lp, ids = tk.topk_logprobs(logits, k)
        want_lp, want_ids = tk.topk_logprobs_ref(logits, k)
        assert torch.equal(ids, want_ids)
        torch.testing.assert_close(lp, want_lp, rtol=1e-6, atol=2e-6)
        return lp, ids

    def expand_checked(cur_lp, lp, ids, cur_flat, mask, h, scores, tokens, parents, base, d2t, keep_ancestors):
        calls["expand"] += 1
        cand = [t.clone() for t in (scores, tokens, parents)]
        got = dx.expand_step(cur_lp, lp, ids, cur_flat, mask, h, scores, tokens, parents, base, d2t, keep_ancestors)
        want = dx.expand_step_ref(cur_lp, lp, ids, cur_flat, mask, h, *cand, base, d2t, keep_ancestors)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        # bitwise: the candidate buffers are torch.empty, and an unwritten fp32 column may hold a NaN
        assert all(torch.equal(bits(a), bits(b)) for a, b in zip((scores, tokens, parents), cand))
        return got

    def bits(t):
        return t.view(torch.int32) if t.dtype == torch.float32 else t

    monkeypatch.setattr(drafting, "topk_logprobs", topk_checked)
    monkeypatch.setattr(drafting, "expand_step", expand_checked)
    with torch.inference_mode():
        drafter.propose(seq_lens, roots, rows, **state)
    assert calls == {"topk": tree.steps - 1, "expand": tree.steps - 1}
