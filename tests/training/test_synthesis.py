"""training/synthesis.py end to end on a tiny target: Magpie prompts and ShareGPT conversations through the filters,
the evaluation-set exclusion and the deduplication, answered by the target, stored per chunk; deterministic for a
seed, resumable chunk by chunk, and read by the trainer (data.source=selfgen).

The tiny target is a random 2-layer model over a word-level tokenizer of English words with a ChatML template: what
it samples are word salads, which pass the language filter like the real target's prompts do (a random model over
a BPE vocabulary writes byte soup, which the filter rightly drops)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from eaglet.data.prompts import load_mt_bench, sharegpt_split
from eaglet.models.llama import ModelArgs, Transformer
from eaglet.training import synth_store
from eaglet.training.data import Sample, load_samples
from eaglet.training.synth_store import chunk_path, read_chunk
from eaglet.training.synthesis import synthesize

CONF = Path(__file__).resolve().parents[2] / "conf"
WORDS = ("the and is of to what how why you your can i my do for with this about write explain tell list water city "
         "music river code python story plan best good new old small big time day people world idea help make find "
         "give").split()
CHATML = ("{% for m in messages %}{{'<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n'}}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def word_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<unk>", "<|im_start|>", "<|im_end|>", "user", "assistant", *WORDS])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", eos_token="<|im_end|>",
                                  additional_special_tokens=["<|im_start|>"])
    tok.chat_template = CHATML
    return tok


@pytest.fixture(scope="module")
def tok():
    return word_tokenizer()


@pytest.fixture(scope="module")
def tiny(tok):
    return chat_model(tok)


def chat_model(tok) -> Transformer:
    """A random 8-layer model (an EAGLE-3 head's default captures need >= 7) whose end-of-turn logit is raised: its
    lm_head row is tilted toward the mean final hidden state. An untilted random model ends 2 of 16 greedy answers
    within 24 tokens, so no conversation would get a second turn; tilted, 10 of 16, like a chat model's."""
    from eaglet.training.features import OnlineFeatures

    torch.manual_seed(0)
    model = Transformer(ModelArgs(vocab_size=len(tok), dim=64, n_layers=8, n_heads=1, n_kv_heads=1, head_dim=64,
                                  intermediate_size=128, max_seq_len=256, eos_token_ids=(2,))).eval()

    class FinalHidden:  # what OnlineFeatures asks of a head: no captured layers, the final hidden state as feature
        capture_layers = staticmethod(lambda n: ())
        target_feature = staticmethod(lambda hidden, captured: hidden)

    tokens = torch.randint(5, len(tok), (16, 32), generator=torch.Generator().manual_seed(1))  # [16, 32]
    _, hidden = OnlineFeatures(model, FinalHidden())(tokens)  # [16, 32, 64]
    mean = hidden.reshape(-1, 64).mean(0)  # [64]
    w = model.lm_head.weight.data  # [V, 64]
    w[2] += 0.6 * w.norm(dim=1).mean() * mean / mean.norm()
    return model


def ids_of(split: str, n: int) -> list[str]:
    """The first n ids "c<k>" that ShareGPT's stable hash puts into `split`."""
    out, k = [], 0
    while len(out) < n:
        if sharegpt_split(f"c{k}") == split:
            out.append(f"c{k}")
        k += 1
    return out


def sharegpt_file(path: Path, convs: list[tuple[str, list[str]]]) -> Path:
    """A ShareGPT-format file: (id, user turns), each answered by a fixed 'gpt' turn."""
    data = [{"id": cid, "conversations": [m for u in users for m in ({"from": "human", "value": u},
                                                                       {"from": "gpt", "value": "ok"})]}
            for cid, users in convs]
    path.write_text(json.dumps(data))
    return path


HELDOUT_Q = "how do i find the best music for my small city plan about water"


@pytest.fixture
def share(tmp_path):
    """12 train conversations of English words, one of them twice (under another id), and one held-out one."""
    train, held = ids_of("train", 13), ids_of("heldout", 1)
    texts = [" ".join(WORDS[(3 * i + j) % len(WORDS)] for j in range(7 + i % 5)) for i in range(12)]
    convs = [(cid, [t, "tell me more about the " + WORDS[i + 10]]) for i, (cid, t) in enumerate(zip(train, texts))]
    convs.append((train[12], [texts[0]]))  # a duplicate of the first conversation's prompt
    convs.append((held[0], [HELDOUT_Q]))
    return sharegpt_file(tmp_path / "sharegpt.json", convs)


def synth_cfg(out_dir, share_path, *overrides):
    base = [f"out_dir={out_dir}", f"sharegpt.path={share_path}", "hardware=cpu", "progress=false", "chunk=5",
            "magpie.num=24", "magpie.chunk=10", "magpie.max_tokens=24", "answers.max_new_tokens=24",
            "answers.max_context=192", "answers.batch_size=8", "sharegpt.max_turns=2", "filters.max_tokens=64"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("synthesize", overrides=[*base, *overrides])


def chunks_of(out_dir: Path) -> dict[int, list[Sample]]:
    return {int(p.stem.split("-")[1]): read_chunk(p) for p in sorted((out_dir / "chunks").glob("chunk-*"))}


def same(a: dict[int, list[Sample]], b: dict[int, list[Sample]]) -> bool:
    return a.keys() == b.keys() and all(
        len(a[c]) == len(b[c]) and all(torch.equal(x.ids, y.ids) and torch.equal(x.mask, y.mask)
                                       for x, y in zip(a[c], b[c])) for c in a)


def run(cfg, tiny, tok):
    return synthesize(cfg, target=tiny, tokenizer=tok, log=lambda *a, **k: None)


def test_synthesis_is_deterministic_for_a_seed(tiny, tok, share, tmp_path):
    a = run(synth_cfg(tmp_path / "a", share), tiny, tok)
    run(synth_cfg(tmp_path / "b", share), tiny, tok)
    run(synth_cfg(tmp_path / "c", share, "seed=1"), tiny, tok)
    assert a["complete"] and a["num_chunks"] >= 2
    pool = json.loads((tmp_path / "a" / "pool.json").read_text())
    assert pool["stats"]["magpie/kept"] >= 3 and pool["stats"]["sharegpt/kept"] == 12  # and 1 duplicate dropped
    assert pool["stats"]["sharegpt/dropped/duplicate"] == 1
    assert pool == json.loads((tmp_path / "b" / "pool.json").read_text())
    assert same(chunks_of(tmp_path / "a"), chunks_of(tmp_path / "b"))
    assert not same(chunks_of(tmp_path / "a"), chunks_of(tmp_path / "c"))  # another seed: other prompts
    t = a["totals"]
    assert t["sequences"] == sum(len(s) for s in chunks_of(tmp_path / "a").values()) and t["answer_tokens"] > 0
    assert a["answer_tokens_per_s"] > 0 and t["turns/answered"] > t["sequences"]  # multi-turn conversations
    assert sum(v for k, v in t.items() if k.startswith("followups/")) > 0  # the target wrote later user turns
    recipe = json.loads((tmp_path / "a" / "recipe.json").read_text())
    assert recipe["magpie"]["temperature"] == 1.0 and recipe["seed"] == 0 and "sharegpt_sha256" in recipe
    # every sequence is a rendered chat: assistant tokens are learned, the template's and user's are not
    seqs = [s for ss in chunks_of(tmp_path / "a").values() for s in ss]
    for s in seqs:
        assert tok.decode(s.ids[~s.mask].tolist()).startswith("<|im_start|> user") and s.mask.any()
    # an answer cut by the token budget ends its sequence without the end-of-turn token it never produced
    open_ended = sum(int(s.ids[s.mask][-1]) != tok.eos_token_id for s in seqs)
    assert open_ended == t["turns/answer_cut"] > 0 and open_ended < len(seqs)


def test_loop_stop_ends_answers_as_prefixes_of_the_unstopped_ones(tiny, tok):
    """AnswerGenerator with loop_stop: every answer is a prefix of the same greedy answer without it; the ones it
    ended (counted in .loops) end on `loop_stop` repeated 8-grams in a row, without an end-of-turn token."""
    from eaglet.training.data import AnswerGenerator, RegenConfig

    prompts = [tok(f"<|im_start|>user\nquestion {i} about rivers<|im_end|>\n<|im_start|>assistant\n",
                   add_special_tokens=False)["input_ids"] for i in range(12)]
    rc = RegenConfig(max_new_tokens=96, batch_size=4, max_context=256)
    free = AnswerGenerator(tiny, rc, [2])(prompts, 0)
    gen = AnswerGenerator(tiny, RegenConfig(**{**rc.__dict__, "loop_stop": 4}), [2])
    stopped = gen(prompts, 0)
    short = [i for i, (a, b) in enumerate(zip(stopped, free)) if len(a) < len(b)]
    assert all(b[:len(a)] == a for a, b in zip(stopped, free))
    assert short and gen.loops == len(short)  # the random model loops within 96 tokens
    for i in short:
        out = stopped[i]
        assert out[-1] != 2 and all(tuple(out[j - 7:j + 1]) in {tuple(out[k - 7:k + 1]) for k in range(7, j)}
                                    for j in range(len(out) - 4, len(out)))


def test_a_cut_answer_is_rendered_without_an_end_of_turn(tok):
    from eaglet.training.data import render_conversation

    msgs = [("user", "how do i make water"), ("assistant", "the water is good")]
    whole, cut = render_conversation(tok, msgs, 100), render_conversation(tok, msgs, 100, cut=True)
    assert tok.convert_ids_to_tokens(whole.ids[whole.mask].tolist()) == ["the", "water", "is", "good", "<|im_end|>"]
    assert tok.convert_ids_to_tokens(cut.ids[cut.mask].tolist()) == ["the", "water", "is", "good"]
    assert torch.equal(cut.ids, whole.ids[:-1]) and not cut.mask[:-4].any()


def test_sampled_answers_replay_the_greedy_conversations(tiny, tok, share, tmp_path):
    """answers.sampled=2: each conversation's user turns answered twice more at temperature 1, each a sequence
    ("<record>#1", "#2"); a replay starts with the same user turn as its greedy conversation."""
    run(synth_cfg(tmp_path / "a", share, "answers.sampled=2"), tiny, tok)
    for p in sorted((tmp_path / "a" / "chunks").glob("chunk-*")):
        meta, seqs = synth_store.chunk_meta(p), read_chunk(p)
        ids = meta["sequences"]
        greedy = [i for i in ids if "#" not in i]
        assert sorted(ids) == sorted(greedy + [f"{g}#{k}" for g in greedy for k in (1, 2)])
        by_id = dict(zip(ids, seqs))
        first_user = lambda s: s.ids[: int(s.mask.int().argmax())].tolist()  # noqa: E731
        for g in greedy:
            assert first_user(by_id[f"{g}#1"]) == first_user(by_id[g]) == first_user(by_id[f"{g}#2"])
        assert any(not torch.equal(by_id[g].ids, by_id[f"{g}#1"].ids) for g in greedy)  # sampled: other answers


def test_a_directory_of_another_recipe_is_refused(tiny, tok, share, tmp_path):
    run(synth_cfg(tmp_path / "a", share), tiny, tok)
    with pytest.raises(ValueError, match="another recipe .*magpie"):
        run(synth_cfg(tmp_path / "a", share, "magpie.temperature=0.9"), tiny, tok)


def test_eval_prompts_and_their_near_duplicates_never_enter(tiny, tok, share, tmp_path):
    """An MT-bench question, a near-duplicate of it, the second turn of another MT-bench question and a copy of a
    held-out ShareGPT prompt are planted among ShareGPT's train conversations: all are dropped, by content."""
    mt = load_mt_bench()
    q = mt[0].turns[0]
    near = q.replace("Compose", "Write").replace("highlighting", "highlighting the") + " Thanks!"
    data = json.loads(share.read_text())
    plant = ids_of("train", 17)[13:]
    data += [{"id": cid, "conversations": [{"from": "human", "value": v}, {"from": "gpt", "value": "ok"}]}
             for cid, v in zip(plant, [q, near, HELDOUT_Q + "?"])]
    data.append({"id": plant[3], "conversations": [{"from": "human", "value": "tell me about the old river city"},
                                                   {"from": "gpt", "value": "ok"},
                                                   {"from": "human", "value": mt[5].turns[1]}]})
    share.write_text(json.dumps(data))
    run(synth_cfg(tmp_path / "a", share), tiny, tok)
    pool = json.loads((tmp_path / "a" / "pool.json").read_text())
    kept = {r["id"] for r in pool["records"]}
    assert not kept & {f"sharegpt:{c}" for c in plant}
    assert pool["stats"]["sharegpt/dropped/eval"] == 4
    # and the stored data says so too: every chunk names its records
    stored = {r for p in (tmp_path / "a" / "chunks").glob("chunk-*")
              for r in synth_store.chunk_meta(p)["records"]}
    assert stored == kept and not stored & {f"sharegpt:{c}" for c in plant}


def test_resume_after_an_interrupt_recomputes_nothing_finished(tiny, tok, share, tmp_path, monkeypatch):
    """Interrupted after chunk 1 is written, the rerun keeps chunks 0 and 1 (the same files, not made again),
    makes the rest, and ends with the data of an uninterrupted run; a chunk cut short is made again."""
    import eaglet.training.synthesis as ts

    whole = tmp_path / "whole"
    run(synth_cfg(whole, share), tiny, tok)
    made, real, die_after = [], ts.write_chunk, [2]

    def write_then_die(path, *a, **k):  # a Ctrl-C right after the second chunk is written
        real(path, *a, **k)
        made.append(path.name)
        if len(made) == die_after[0]:
            die_after[0] = None
            raise KeyboardInterrupt

    monkeypatch.setattr(ts, "write_chunk", write_then_die)
    part = tmp_path / "part"
    with pytest.raises(KeyboardInterrupt):
        run(synth_cfg(part, share), tiny, tok)
    assert made == ["chunk-00000.safetensors", "chunk-00001.safetensors"]
    stamps = {c: chunk_path(part, c).stat().st_mtime_ns for c in (0, 1)}
    made.clear()
    index = run(synth_cfg(part, share), tiny, tok)
    assert index["complete"] and made == [f"chunk-{c:05d}.safetensors" for c in range(2, index["num_chunks"])]
    assert {c: chunk_path(part, c).stat().st_mtime_ns for c in (0, 1)} == stamps
    assert same(chunks_of(part), chunks_of(whole))

    # a chunk file cut short (a copy interrupted mid-way) is not taken as done
    p = chunk_path(part, 1)
    p.write_bytes(p.read_bytes()[:-7])
    made.clear()
    run(synth_cfg(part, share), tiny, tok)
    assert made == ["chunk-00001.safetensors"] and same(chunks_of(part), chunks_of(whole))


def test_magpie_files_resume_and_a_time_limit_stops_cleanly(tiny, tok, share, tmp_path):
    out = tmp_path / "a"
    first = run(synth_cfg(out, share, "time_limit_s=1e-9"), tiny, tok)  # nothing fits: no piece starts
    assert not first["complete"] and first["magpie_files_missing"] == 3
    assert not (out / "magpie").exists() and (out / "recipe.json").is_file()
    whole = run(synth_cfg(out, share), tiny, tok)
    assert whole["complete"]
    stamps = {p.name: p.stat().st_mtime_ns for p in (out / "magpie").iterdir()}
    assert len(stamps) == 3
    run(synth_cfg(out, share), tiny, tok)  # everything done: nothing is made again
    assert {p.name: p.stat().st_mtime_ns for p in (out / "magpie").iterdir()} == stamps


@pytest.mark.parametrize("vocab,dtype", [(49_152, "uint16"), (65_536, "uint16"), (65_537, "int32")])
def test_chunks_round_trip_token_ids_and_masks(tmp_path, vocab, dtype):
    g = torch.Generator().manual_seed(0)
    samples = [Sample(torch.randint(0, vocab, (n,), generator=g), torch.rand(n, generator=g) > 0.5)
               for n in (1, 7, 8, 9, 300)]
    samples[0].ids[0] = vocab - 1  # the largest id survives
    p = tmp_path / "c.safetensors"
    synth_store.write_chunk(p, samples, vocab, {"recipe": "r", "chunk": 3, "records": ["x"]})
    from safetensors.numpy import load_file

    assert str(load_file(str(p))["ids"].dtype) == dtype
    back = read_chunk(p)
    assert all(torch.equal(a.ids, b.ids) and torch.equal(a.mask, b.mask) for a, b in zip(samples, back))
    assert synth_store.chunk_meta(p) == {"recipe": "r", "chunk": 3, "records": ["x"]}
    n = sum(len(s.ids) for s in samples)
    assert p.stat().st_size <= (2 if dtype == "uint16" else 4) * n + n // 8 + 1 + 6 * 8 + 400  # ids, mask bits, offsets
    with pytest.raises(ValueError, match="outside"):
        synth_store.write_chunk(p, [Sample(torch.tensor([vocab]), torch.tensor([True]))], vocab, {})


def test_bad_settings_fail_before_loading(tmp_path):
    from eaglet.training.synthesis import check_config

    for override, match in [("magpie.temperature=0", "magpie.temperature=0"),
                            ("answers.sampled=2", None),  # fine: sampled answers at temperature 1
                            ("answers.temperature=0", None),
                            ("exclude=[mt_bench,gsm8k]", "exclude=.*gsm8k"),
                            ("dedup.threshold=1.5", "dedup.threshold=1.5"),
                            ("target=random_llama3_8b", "random weights"),
                            ("magpie.max_tokens=4096", "magpie.max_tokens=4096")]:
        cfg = synth_cfg(tmp_path, tmp_path / "none.json", override)
        if match is None:
            check_config(cfg)
        else:
            with pytest.raises(ValueError, match=match):
                check_config(cfg)
    with pytest.raises(ValueError, match="answers.sampled=1 with answers.temperature=0"):
        check_config(synth_cfg(tmp_path, tmp_path / "none.json", "answers.sampled=1", "answers.temperature=0"))


def test_the_trainer_trains_on_synthesized_data(tiny, tok, share, tmp_path, small_cfg):
    from eaglet.training.loop import train

    out = tmp_path / "synth"
    index = run(synth_cfg(out, share), tiny, tok)
    cfg = small_cfg("eagle3", "data.source=selfgen", f"data.selfgen.dir={out}", "train.batch_size=2",
                    "train.head.draft_vocab_size=16")
    m = train(cfg, tmp_path / "run", target=tiny, tokenizer=tok)
    assert m["num_sequences"] == index["totals"]["sequences"] and m["steps"] == 4
    assert m["num_tokens"] == index["totals"]["tokens"] and m["train/loss"] > 0

    cfg.data.selfgen.chunks = 1
    samples = load_samples(cfg.data, tiny, tok, tmp_path, {}, [2], seed=0, log=lambda *a: None)
    assert len(samples) == len(read_chunk(chunk_path(out, 0)))
    chunk_path(out, 1).unlink()
    cfg.data.selfgen.chunks = None
    with pytest.raises(ValueError, match="missing or not of its recipe .*chunk 1"):
        load_samples(cfg.data, tiny, tok, tmp_path, {}, [2], seed=0, log=lambda *a: None)
    cfg.data.selfgen.dir = str(tmp_path / "nothing")
    with pytest.raises(ValueError, match="no index.json"):
        load_samples(cfg.data, tiny, tok, tmp_path, {}, [2], seed=0, log=lambda *a: None)


def _worker(rank: int, port: int, out: str, share: str) -> None:
    """Rank `rank` of a 2-process job started like torchrun (its environment variables)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE="2")
    torch.set_num_threads(1)
    tok = word_tokenizer()
    synthesize(synth_cfg(out, share), target=chat_model(tok), tokenizer=tok, log=lambda *a, **k: None)
    sys.stdout.flush()
    os._exit(0)  # past gloo's teardown: its threads can abort a finalising interpreter (see test_ddp.py)


def test_two_processes_make_the_data_of_one(tiny, tok, share, tmp_path):
    """Under torchrun, process r makes the Magpie files and chunks c with c % 2 == r: together, the data of a
    one-process run (every piece's seed depends on the piece alone)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    one = tmp_path / "one"
    run(synth_cfg(one, share), tiny, tok)
    two = tmp_path / "two"
    mp.spawn(_worker, args=(port, str(two), str(share)), nprocs=2, join=True)
    assert json.loads((two / "index.json").read_text())["complete"]
    assert same(chunks_of(one), chunks_of(two))
    assert json.loads((one / "pool.json").read_text()) == json.loads((two / "pool.json").read_text())
