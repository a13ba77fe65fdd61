"""training/data.py: the sharded batch order, padding, regeneration by the target (cached, resumable), and
(slow) the assistant-only mask on real chat-templated ShareGPT conversations."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from eaglet.engine.autoregressive import AREngine
from eaglet.engine.requests import Request
from eaglet.models.kv_cache import KVCache
from eaglet.training.data import (
    AnswerGenerator,
    BatchSchedule,
    RegenConfig,
    Sample,
    cached_records,
    collate,
    load_samples,
    regenerate_chats,
    render_conversation,
    train_conversations,
)


@pytest.mark.parametrize("group", [False, True])
@pytest.mark.parametrize("world,batch", [(1, 4), (2, 2), (4, 1), (3, 2)])
def test_batch_schedule_shards_one_global_order(world, batch, group):
    lengths = [int(x) for x in torch.randint(1, 100, (50,), generator=torch.Generator().manual_seed(0))]
    ranks = [BatchSchedule(lengths, batch, world, r, seed=5, group_by_length=group, group_factor=2)
             for r in range(world)]
    per_epoch = 50 // (batch * world)
    for pos in range(2 * per_epoch):
        glob = ranks[0].global_batch(pos)
        assert sum((s.local_batch(pos) for s in ranks), []) == glob  # the ranks' slices tile the global batch
    for epoch in range(2):  # an epoch visits each sequence at most once
        seen = sum((ranks[0].global_batch(epoch * per_epoch + i) for i in range(per_epoch)), [])
        assert len(seen) == len(set(seen)) == per_epoch * batch * world
    # the same global batch size gives the same order whatever the number of processes
    one = BatchSchedule(lengths, batch * world, 1, 0, seed=5, group_by_length=group, group_factor=2)
    assert [one.global_batch(i) for i in range(per_epoch)] == [ranks[0].global_batch(i) for i in range(per_epoch)]
    assert ranks[0].global_batch(0) != ranks[0].global_batch(per_epoch)  # epochs reshuffle
    with pytest.raises(ValueError, match="fewer than one global micro-batch"):
        BatchSchedule(lengths[:3], batch * world + 3, 1, 0, seed=0)


def test_collate_right_pads():
    samples = [Sample(torch.tensor([5, 6, 7]), torch.tensor([False, True, True])), Sample(torch.tensor([9]),
                                                                                        torch.tensor([True]))]
    tokens, mask = collate(samples, [1, 0])
    assert tokens.tolist() == [[9, 0, 0], [5, 6, 7]]
    assert mask.tolist() == [[True, False, False], [False, True, True]]


def regen_cfg(tmp_path, **kw):
    return OmegaConf.create({
        "source": "synthetic", "path": None, "limit": None, "max_turns": None, "max_len": 64, "regenerate": True,
        "regen": {"max_new_tokens": 6, "temperature": 0.0, "top_p": 1.0, "batch_size": 3, "max_context": 64,
                  "chunk": 4},
        "cache_dir": str(tmp_path), "synthetic": {"num": 6, "min_len": 8, "max_len": 12, "prompt_frac": 0.5}, **kw})


def test_synthetic_regeneration_is_the_targets_greedy_answer_and_is_cached(target, tmp_path):
    dc = regen_cfg(tmp_path)
    logs = []
    samples = load_samples(dc, target, None, tmp_path, {"t": 1}, [], seed=0, log=logs.append)
    assert len(samples) == 6 and len(logs) == 2  # two chunks of 4 and 2 prompts
    for s in samples[:2]:
        prompt = s.ids[~s.mask].tolist()
        assert (~s.mask[: len(prompt)]).all() and s.mask[len(prompt):].all()
        kv = KVCache.for_model(target.args, max_reqs=1, max_context=64)
        req = Request(prompt, 6)
        AREngine(target, kv, 1).generate([req])
        assert s.ids[len(prompt):].tolist() == req.output_ids  # the target's own greedy continuation
    meta = list(tmp_path.glob("regen-synthetic-*.json"))
    assert len(meta) == 1 and json.loads(meta[0].read_text())["regen"]["max_new_tokens"] == 6
    again = load_samples(dc, target, None, tmp_path, {"t": 1}, [], seed=0, log=logs.append)
    assert len(logs) == 2  # read back from the cache: nothing regenerated
    assert all(torch.equal(a.ids, b.ids) and torch.equal(a.mask, b.mask) for a, b in zip(samples, again))
    other = regen_cfg(tmp_path)
    other.regen.max_new_tokens = 5  # another config: another cache file
    load_samples(other, target, None, tmp_path, {"t": 1}, [], seed=0, log=logs.append)
    assert len(logs) == 4


def test_several_sampled_answers_per_prompt(target, tmp_path):
    """data.regen.samples: each prompt answered that many times at temperature > 0, each answer its own training
    sequence and cache; sample 0 is a one-answer run's (same key and seed), so a larger run reuses it."""
    one = regen_cfg(tmp_path, regen={**regen_cfg(tmp_path).regen, "temperature": 1.0})
    logs = []
    first = load_samples(one, target, None, tmp_path, {"t": 1}, [], seed=0, log=logs.append)
    two = regen_cfg(tmp_path, regen={**one.regen, "samples": 2})
    both = load_samples(two, target, None, tmp_path, {"t": 1}, [], seed=0, log=logs.append)
    assert len(first) == 6 and len(both) == 12 and len(logs) == 4  # sample 1's two chunks only: sample 0 was cached
    metas = [json.loads(p.read_text()) for p in tmp_path.glob("regen-synthetic-*.json")]
    assert sorted(m.get("sample", 0) for m in metas) == [0, 1] and all("samples" not in m["regen"] for m in metas)
    assert all(torch.equal(a.ids, b.ids) for a, b in zip(first, both[:6]))
    prompts = [s.ids[~s.mask].tolist() for s in both]
    assert prompts[:6] == prompts[6:]  # the same prompts, answered again
    assert any(not torch.equal(a.ids, b.ids) for a, b in zip(both[:6], both[6:]))  # with other sampled answers
    for bad in (regen_cfg(tmp_path, regen={**regen_cfg(tmp_path).regen, "samples": 2}),  # greedy
                regen_cfg(tmp_path, regenerate=False, regen={**two.regen}),  # nothing regenerated
                regen_cfg(tmp_path, regen={**one.regen, "samples": 0})):
        with pytest.raises(ValueError, match=f"data.regen.samples={bad.regen.samples}: use 1"):
            load_samples(bad, target, None, tmp_path, {"t": 1}, [], seed=0)


def test_cached_records_resume_after_a_crash_and_shard_by_rank(tmp_path):
    ids = [f"c{i}" for i in range(10)]
    made, crash = [], [True]

    def make(idx, chunk):
        if chunk == 1 and crash[0]:
            raise RuntimeError("boom")
        made.append(chunk)
        return [{"id": ids[i], "chunk": chunk} for i in idx]

    quiet = dict(log=lambda s: None)
    stem = tmp_path / "regen-x"
    with pytest.raises(RuntimeError, match="boom"):
        cached_records(stem, {"k": 1}, ids, make, chunk=3, **quiet)
    assert made == [0]
    crash[0] = False  # the rerun keeps chunk 0 and makes only chunks 1..3
    out = cached_records(stem, {"k": 1}, ids, make, chunk=3, **quiet)
    assert [r["id"] for r in out] == ids and made == [0, 1, 2, 3]
    assert json.loads(stem.with_suffix(".json").read_text()) == {"k": 1}

    # process r of w makes the chunks c with c % w == r into its own part file; together they cover all
    def make2(idx, c):
        return [{"id": ids[i], "c": c} for i in idx]

    stem2 = tmp_path / "regen-y"
    with pytest.raises(RuntimeError, match="missing"):  # rank 1 alone: rank 0's chunks are still missing
        cached_records(stem2, {}, ids, make2, 3, rank=1, world=2, **quiet)
    out = cached_records(stem2, {}, ids, make2, 3, rank=0, world=2, **quiet)
    assert [r["c"] for r in out] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
    assert sorted(p.name for p in tmp_path.glob("regen-y.part*")) == ["regen-y.part0-of-2.jsonl",
                                                                      "regen-y.part1-of-2.jsonl"]


@pytest.mark.slow
def test_assistant_mask_and_regeneration_on_real_sharegpt(tokenizer, tmp_path):
    """The SmolLM2 chat template on real ShareGPT training conversations: the masked tokens are exactly each
    assistant turn's content and its <|im_end|>; the held-out split never appears; text regeneration replays
    the user turns through the target (a random one with SmolLM2's vocabulary, for speed)."""
    from eaglet.data.prompts import sharegpt_split
    from eaglet.models.llama import ModelArgs, Transformer

    convs = train_conversations(limit=40, max_turns=2)
    assert len(convs) == 40 and all(sharegpt_split(c.id) == "train" for c in convs)
    multi = [c for c in convs if sum(r == "assistant" for r, _ in c.messages) == 2][:3]
    assert multi
    for c in multi:
        s = render_conversation(tokenizer, c.messages, max_len=100_000)
        ids, mask = s.ids.tolist(), s.mask.tolist()
        runs, cur = [], []
        for t, m in zip(ids, mask):  # maximal runs of masked tokens
            if m:
                cur.append(t)
            elif cur:
                runs.append(cur)
                cur = []
        runs += [cur] if cur else []
        answers = [t for r, t in c.messages if r == "assistant"]
        assert len(runs) == len(answers)
        for run, text in zip(runs, answers):
            assert run[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
            assert tokenizer.decode(run[:-1]) == text
        unmasked = tokenizer.decode([t for t, m in zip(ids, mask) if not m])
        assert "<|im_start|>assistant\n" in unmasked and c.messages[0][1][:50] in unmasked
        cut = render_conversation(tokenizer, c.messages, max_len=len(ids) // 2)
        assert cut.ids.tolist() == ids[: len(ids) // 2] and cut.mask.tolist() == mask[: len(ids) // 2]

    dc = OmegaConf.create({"source": "sharegpt", "path": None, "limit": 6, "max_turns": 2, "max_len": 256,
                           "regenerate": False, "regen": {}})
    samples = load_samples(dc, None, tokenizer, tmp_path, {"t": 0}, [2], seed=0)
    assert [f.name.split("-")[0] for f in tmp_path.iterdir()] == ["samples"]  # the rendered data is cached
    want = [w for c in convs[:6] if (w := render_conversation(tokenizer, c.messages, 256)) is not None]
    assert len(samples) == len(want) >= 3  # those with no assistant token in 256 tokens are dropped
    again = load_samples(dc, None, tokenizer, tmp_path, {"t": 0}, [2], seed=0)
    for a, b, w in zip(samples, again, want):
        assert torch.equal(a.ids, w.ids) and torch.equal(a.mask, w.mask)
        assert torch.equal(b.ids, w.ids) and torch.equal(b.mask, w.mask)

    torch.manual_seed(0)
    tgt = Transformer(ModelArgs(vocab_size=len(tokenizer), dim=64, n_layers=2, n_heads=1, n_kv_heads=1, head_dim=64,
                                intermediate_size=128, max_seq_len=4096)).eval()
    rc = RegenConfig(max_new_tokens=5, batch_size=2, max_context=4096)
    recs = regenerate_chats(multi[:2], AnswerGenerator(tgt, rc, eos_ids=[2]), tokenizer, seed=0)
    for rec, c in zip(recs, multi):
        turns = len(rec["messages"]) // 2
        assert [r for r, _ in rec["messages"]] == ["user", "assistant"] * turns
        assert [t for r, t in rec["messages"] if r == "user"] == [t for r, t in c.messages if r == "user"][:turns]
        assert all(1 <= len(o) <= 5 for o in rec["output_ids"])
        # a random target rarely ends an answer within 5 tokens: an answer without EOS ends the conversation
        ended = [bool(o) and o[-1] == 2 for o in rec["output_ids"]]
        assert ended[:-1] == [True] * (turns - 1) and rec["cut"] == (not ended[-1])
        assert turns == 2 or rec["cut"]
        s = render_conversation(tokenizer, rec["messages"], max_len=100_000, cut=rec["cut"])
        assert s is not None and s.mask.any()
        if rec["cut"]:  # the sequence ends with the cut answer's text, no end-of-turn token after it
            assert s.ids[-1].item() not in tokenizer.all_special_ids
    assert any(rec["cut"] for rec in recs)


def test_answer_generator_reuses_one_engine_and_restarts_sampling_from_the_seed():
    """One KV pool and engine serve every call (a pool per call leaked until an H200 ran out of memory), and a
    call's sampled answers depend on its seed only, not on the calls before it (chunks resume identically)."""
    from eaglet.models.llama import ModelArgs, Transformer

    torch.manual_seed(0)
    tgt = Transformer(ModelArgs(vocab_size=64, dim=64, n_layers=1, n_heads=1, n_kv_heads=1, head_dim=64,
                                intermediate_size=64, max_seq_len=256)).eval()
    gen = AnswerGenerator(tgt, RegenConfig(max_new_tokens=8, temperature=1.0, batch_size=2, max_context=256),
                          eos_ids=[])
    prompts = [[1, 2, 3], [4, 5]]
    first = gen(prompts, seed=7)
    engine = gen.engine
    gen([[9, 9, 9, 9]], seed=1)
    assert gen(prompts, seed=7) == first and gen.engine is engine
    assert gen(prompts, seed=8) != first  # 16 tokens sampled from 64: equal by chance ~never
    assert [len(o) for o in first] == [8, 8]
    gen.close()
    assert gen.engine is None and gen(prompts, seed=7) == first  # a closed generator makes a new engine


def test_rendered_samples_follow_the_data_file_not_its_path(tmp_path, monkeypatch):
    """A data file replaced at the same path is rendered again (its cached samples keyed by the file's bytes)."""
    import eaglet.training.data as td

    def render(_tokenizer, messages, max_len, cut=False):  # one token per character, assistant ones masked
        ids = [ord(ch) for _, t in messages for ch in t][:max_len]
        mask = [r == "assistant" for r, t in messages for _ in t][:max_len]
        return Sample(torch.tensor(ids), torch.tensor(mask))

    monkeypatch.setattr(td, "render_conversation", render)
    tokenizer = SimpleNamespace(name_or_path="chars", chat_template=None)
    data = tmp_path / "sharegpt.json"
    dc = OmegaConf.create({"source": "sharegpt", "path": str(data), "limit": None, "max_turns": 1, "max_len": 64,
                           "regenerate": False, "regen": {}})
    answers = []
    for answer in ("first", "second"):
        data.write_text(json.dumps([{"id": f"c{i}", "conversations": [{"from": "human", "value": f"q{i}"},
                                                                      {"from": "gpt", "value": answer}]}
                                    for i in range(40)]))
        s = load_samples(dc, None, tokenizer, tmp_path / "cache", {"t": 0}, [], seed=0)[0]
        answers.append("".join(chr(t) for t, m in zip(s.ids.tolist(), s.mask.tolist()) if m))
    assert answers == ["first", "second"]
