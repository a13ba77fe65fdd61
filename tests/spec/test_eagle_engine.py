"""EAGLE speculative decoding is lossless: greedy output equals plain greedy decoding, token for token."""

from __future__ import annotations

import pytest
import torch

from eaglet.models.eagle import new_draft_head
from eaglet.models.kv_cache import KVCache
from eaglet.models.llama import ModelArgs, Transformer
from eaglet.spec.autoregressive import AREngine, Request
from eaglet.spec.eagle import EagleEngine, TreeSpec

TREES = {"chain": TreeSpec(4, 1, 5), "eagle2": TreeSpec(4, 3, 8)}
ARGS = ModelArgs(family="llama", vocab_size=256, dim=128, n_layers=8, n_heads=2, n_kv_heads=1, head_dim=64,
                 intermediate_size=256, rope_theta=10000.0, max_seq_len=512)


@pytest.fixture(scope="module")
def target():
    """A random target whose greedy next token is mostly a fixed function of the current token
    (attention and MLP scaled down), with enough context dependence that attention still decides
    some tokens: an oracle-like head then accepts deep paths, and a wrong verify shows."""
    torch.manual_seed(0)
    model = Transformer(ARGS).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(0.5)
            layer.mlp.down_proj.weight.mul_(0.2)
    return model


def oracle_like(kind, target, num_layers=None):
    """A head that predicts 'the target's next token after the token it is given': fc passes the
    embedding through, the layer adds a small perturbation (so it is sometimes wrong)."""
    head = new_draft_head(kind, target, num_layers=num_layers, dtype=target.dtype, device=target.device)
    H = target.args.dim
    with torch.no_grad():
        for layer in getattr(head, "layers", []):
            fc = layer.fc if hasattr(layer, "fc") else head.fc
            fc.weight.zero_()
            fc.weight[:, :H] = torch.eye(H)
            if fc.bias is not None:
                fc.bias.zero_()
            for p in (layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight):
                p.mul_(0.3)
    return head


def ar_outputs(target, prompts, max_new):
    kv = KVCache.for_model(target.args, max_reqs=len(prompts), max_context=256, page_size=8, dtype=target.dtype,
                           device=target.device)
    reqs = [Request(p, max_new, rid=i) for i, p in enumerate(prompts)]
    AREngine(target, kv, len(prompts)).generate(reqs)
    return [r.output_ids for r in reqs]


def spec_outputs(target, head, tree, prompts, max_new, batch):
    eng = EagleEngine(target, head, tree, max_batch=batch, max_context=256, page_size=8)
    reqs = [Request(p, max_new, rid=i) for i, p in enumerate(prompts)]
    stats = eng.generate(reqs)
    return [r.output_ids for r in reqs], stats


PROMPTS = [[5, 17, 33, 2, 9], list(range(40, 63)), [100], [7, 7, 7, 8, 8, 8, 200, 1, 3]]


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
    if not kind.endswith("random") and kind != "eagle3":  # the oracle-like heads must exercise deep paths
        assert summary["tau"] > 1.5, summary
        assert sum(summary["accept_hist"][2:]) > 0, summary  # paths of two or more draft tokens
        if spec.topk == 1:
            assert summary["accept_hist"][-1] > 0, summary  # whole chains accepted


def test_bad_trees_are_refused(target):
    head = new_draft_head("eagle1", target, dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match="tree.num_draft_tokens=30"):
        EagleEngine(target, head, TreeSpec(2, 3, 30), max_batch=1, max_context=64)
    with pytest.raises(ValueError, match="tree.topk=300"):
        EagleEngine(target, head, TreeSpec(2, 300, 8), max_batch=1, max_context=64)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tree", list(TREES))
def test_greedy_is_lossless_gpu_cuda_graphs(target, tree, dtype):
    """Triton kernels and CUDA graphs on the GPU: speculative == plain greedy (both graph-replayed)."""
    gpu = Transformer.from_state_dict(target.args, target.state_dict(), dtype, "cuda")
    head = oracle_like("eagle1", gpu)
    want = ar_outputs(gpu, PROMPTS, 40)
    eng = EagleEngine(gpu, head, TREES[tree], max_batch=2, max_context=256, page_size=8, use_cuda_graph=True)
    reqs = [Request(p, 40, rid=i) for i, p in enumerate(PROMPTS)]
    stats = eng.generate(reqs)
    assert [r.output_ids for r in reqs] == want
    assert stats.summary(TREES[tree].steps)["tau"] > 1.5
