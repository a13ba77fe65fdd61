"""The autoregressive baseline: stopping, sampling helpers, bad input, SmolLM2's answer, a graph bucket's padding."""

from __future__ import annotations

import pytest
import torch

from eaglet.engine.autoregressive import AREngine
from eaglet.engine.requests import Request
from eaglet.engine.sampling import SamplingParams, probs_from_logits, sample
from eaglet.models.kv_cache import KVCache, KVPoolExhausted
from eaglet.models.llama import ModelArgs, Transformer


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return Transformer(ModelArgs.from_name("tiny_llama")).eval()


def generate(model, prompts, max_new, eos=(), batch=4, context=96, sampling=SamplingParams(), seed=0):
    kv = KVCache.for_model(model.args, max_reqs=batch, max_context=context, page_size=8)
    reqs = [Request(p, max_new, rid=i) for i, p in enumerate(prompts)]
    AREngine(model, kv, batch, sampling, eos_ids=eos, seed=seed).generate(reqs)
    return reqs


def test_requests_stop_at_eos_at_different_times(tiny):
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10], [11, 12]]
    free = generate(tiny, prompts, 24)
    eos = free[0].output_ids[3]  # a token request 0 emits early
    stopped = generate(tiny, prompts, 24, eos=(eos,), batch=2)  # batch 2: later requests join as rows free up
    for f, s in zip(free, stopped):
        cut = f.output_ids.index(eos) + 1 if eos in f.output_ids else len(f.output_ids)
        assert s.output_ids == f.output_ids[:cut]
        assert s.finish_reason == ("eos" if eos in f.output_ids else "length")
    assert stopped[0].finish_reason == "eos" and len(stopped[0].output_ids) == 4


def test_prompt_longer_than_context_is_refused(tiny):
    with pytest.raises(ValueError, match="prompt has 100 tokens but the context is 96"):
        generate(tiny, [[1] * 100], 4)


def test_exhausted_kv_pool_is_named(tiny):
    kv = KVCache.for_model(tiny.args, max_reqs=2, max_context=64, page_size=8, num_pages=4)
    eng = AREngine(tiny, kv, 2)
    with pytest.raises(KVPoolExhausted, match="kv.num_pages"):
        eng.generate([Request([1] * 20, 30), Request([2] * 20, 30)])


def test_top_p_keeps_the_smallest_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    p = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=0.8))
    assert torch.allclose(p, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    assert sample(logits, SamplingParams()).item() == 0
    with pytest.raises(ValueError, match="gen.top_p"):
        SamplingParams(temperature=1.0, top_p=0.0)


def test_sampling_draws_from_the_distribution():
    from scipy.stats import chisquare

    target = torch.tensor([0.4, 0.3, 0.2, 0.1])
    logits = target.log().expand(20000, 4)
    g = torch.Generator().manual_seed(0)
    counts = torch.bincount(sample(logits, SamplingParams(temperature=1.0), g), minlength=4)
    assert chisquare(counts.numpy(), (target * 20000).numpy()).pvalue > 1e-3


def test_seeded_sampling_is_reproducible(tiny):
    s = SamplingParams(temperature=1.0, top_p=0.9)
    a = generate(tiny, [[1, 2, 3]], 10, sampling=s, seed=7)
    b = generate(tiny, [[1, 2, 3]], 10, sampling=s, seed=7)
    assert a[0].output_ids == b[0].output_ids


@pytest.mark.slow
def test_smollm2_knows_the_capital_of_france(smollm2, tokenizer):
    from eaglet.data.chat import encode_turns

    ids = encode_turns(tokenizer, [{"role": "user", "content": "What is the capital of France?"}], True)
    eos = (tokenizer.eos_token_id,)
    [r] = generate(smollm2, [ids], 16, eos=eos, batch=1, context=256)
    text = tokenizer.decode(r.output_ids, skip_special_tokens=True)
    assert "Paris" in text, text
    assert r.finish_reason == "eos"


def test_batched_admission_prefills_less_and_decodes_the_same(tiny, monkeypatch):
    prompts = [[3 + i, 7, 11 + i][: 1 + i % 3] for i in range(12)]
    free = generate(tiny, prompts, 12, batch=1)  # one request at a time: the reference
    eos = free[0].output_ids[2]  # requests end at different steps, so rows free up one by one
    calls = []
    real = AREngine._prefill

    def counting(self, reqs):
        calls[-1].append(len(reqs))
        return real(self, reqs)

    monkeypatch.setattr(AREngine, "_prefill", counting)
    for min_admit in (1, 4):  # every freed row alone (plain continuous batching), then groups of 4
        calls.append([])
        kv = KVCache.for_model(tiny.args, max_reqs=8, max_context=96, page_size=8)
        reqs = [Request(p, 12, rid=i) for i, p in enumerate(prompts)]
        AREngine(tiny, kv, 8, eos_ids=(eos,), min_admit=min_admit).generate(reqs)
        for f, r in zip(free, reqs):
            cut = f.output_ids.index(eos) + 1 if eos in f.output_ids else len(f.output_ids)
            assert r.output_ids == f.output_ids[:cut]
    one_by_one, grouped = calls
    assert sum(one_by_one) == sum(grouped) == 12 and one_by_one[0] == grouped[0] == 8
    assert grouped == [8, 4] and len(one_by_one) > 2



def test_between_its_graph_a_step_clones_gathers_and_adds_nothing(tiny, monkeypatch):
    """The host loop's launches between two decode graphs, where no request joins or leaves: the copy of the tokens
    to the host and the page table's growth, no more. The page table and the slot are gathered inside the graph,
    the outputs are not cloned and the next positions come from the graph. Counted on the CPU, where the graph's
    function runs eagerly (its ops, the prefill's and the runner's CPU-only buffers left out)."""
    from engine_testing import LaunchCount

    from eaglet.engine.cuda_graph import GraphRunner

    count = LaunchCount()
    for method in ("_static", "_to_static"):
        monkeypatch.setattr(GraphRunner, method, count.hidden(getattr(GraphRunner, method)))
    kv = KVCache.for_model(tiny.args, max_reqs=2, max_context=96, page_size=8)
    eng = AREngine(tiny, kv, max_batch=2, use_cuda_graph=False)
    eng._decode.fn = count.hidden(eng._decode.fn, new_window=True)  # a window from one decode to the next
    monkeypatch.setattr(eng, "_prefill", count.hidden(eng._prefill))
    with count:
        eng.generate([Request([1, 2, 3], 20), Request([4, 5, 6], 20)])
    middle = count.windows[2:-2]  # steps with the same two requests before and after
    assert len(middle) > 10
    allowed = {"_to_copy", "copy_", "index_put_", "_foreach_copy_"}  # to the host; a new page's id into the table
    assert all(set(o) <= allowed for o in middle), middle


def test_a_graph_buckets_padding_leaves_every_request_alone(tiny, monkeypatch):
    """Three requests in buckets of 4, 2 and 1 as they finish (padded entries in most steps), decoded as a graph runs
    them (engine_testing.as_graph): each answer equals the request decoded alone. When request row 0 was a request's,
    every padded entry wrote that request's position 0 (4 of 80 MT-bench answers at B=8 on the GPU)."""
    from engine_testing import as_graph

    prompts, budgets = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10, 11]], [12, 20, 6]
    alone = [generate(tiny, [p], n, batch=1)[0].output_ids for p, n in zip(prompts, budgets)]
    as_graph(monkeypatch)
    kv = KVCache.for_model(tiny.args, max_reqs=4, max_context=96, page_size=8)
    reqs = [Request(p, n, rid=i) for i, (p, n) in enumerate(zip(prompts, budgets))]
    AREngine(tiny, kv, 4).generate(reqs)
    assert [r.output_ids for r in reqs] == alone
