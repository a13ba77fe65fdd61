"""training/filters.py and training/dedup.py: what each filter drops and keeps, exact and near-duplicates, and the
evaluation-set exclusion of the pool (training/synthesis.py's select_pool) and of the turns the target writes
(training/conversation.py's Checker)."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from eaglet.data.prompts import load_humaneval, load_mt_bench
from eaglet.training.conversation import Checker, Record
from eaglet.training.dedup import DedupConfig, PromptIndex, bands, eval_prompts, is_eval, normalise
from eaglet.training.filters import FilterConfig, LoopStop, reject_reason, repeat_fraction
from eaglet.training.synthesis import select_pool

CONF = Path(__file__).resolve().parents[2] / "conf"
HAWAII = ("Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences and "
          "must-see attractions.")


@pytest.mark.parametrize("text,why", [
    ("hi", "short"), ("Hello there", "short"), ("", "short"),
    ("the cat " * 60, "repetitive"),  # a loop
    ("I'm sorry, I can't help. " * 8, "repetitive"),
    ("고등교육의 필요성에 관한 영어 에세이를 1000자 이내로 작성하시오.", "language"),
    ("Напиши короткое стихотворение о зиме и снеге, please", "language"),
    ("estoy en 6to semestre de mecatronica, necesito un nombre para mi equipo, asi que quiero una lista", "language"),
    ("J'utilise angular, je voudrais un carousel automatique avec des flèches pour une liste d'images", "language"),
    ("Schreibe eine Zeile Code, die das Wetter ausgibt und mit Python läuft", "language"),
    # kept: English requests without any stopword, code, a bit of repetition, a URL ("com" is no Portuguese here)
    ("explain the metaverse", None), ("build seven day meal plan around macros", None),
    ("Write a Python function is_prime(n) that returns True if n is prime.\n```python\ndef is_prime(n):\n```", None),
    ("List three fruits: apple, banana, cherry. Then list three more fruits.", None),
    ("summarize https://quantifiedself.com/blog/personal-data-visualization/ for me", None),
])
def test_filters_drop_what_they_should(text, why):
    assert reject_reason(text, n_tokens=10, fc=FilterConfig()) == why


def test_length_and_repetition_thresholds():
    fc = FilterConfig(min_words=3, max_tokens=20, max_repeat=0.5)
    assert reject_reason("how are you today", 21, fc) == "long" and reject_reason("how are you today", 20, fc) is None
    assert repeat_fraction("a b c d a b c d".split()) == pytest.approx(1 - 4 / 5)
    assert repeat_fraction("one two three".split()) == 0.0
    with pytest.raises(ValueError, match="filters.max_repeat=2"):
        FilterConfig(max_repeat=2)


class _Req:  # what LoopStop reads of an engine Request
    def __init__(self):
        self.output_ids, self.finish_reason = [], None

    done = property(lambda self: self.finish_reason is not None)


def feed(stop: LoopStop, tokens: list[int], eos: int | None = None) -> _Req:
    """tokens emitted one by one as the engine's emit does (EOS ends the request first), until it is done."""
    r = _Req()
    for t in tokens:
        if r.done:
            break
        r.output_ids.append(t)
        if t == eos:
            r.finish_reason = "eos"
        stop(r, t)
    return r


def test_loop_stop_ends_a_verbatim_loop_at_its_run():
    prefix, cycle = list(range(100, 120)), [1, 2, 3, 4, 5]
    tokens = prefix + cycle * 20
    # the first 4-gram seen before ends at index 28 (the window 25..28 repeats 20..23); the 10th in a row at 37
    r = feed(LoopStop(run=10, n=4), tokens)
    assert r.finish_reason == "loop" and len(r.output_ids) == 38
    r = feed(LoopStop(run=10, n=4), list(range(200)))  # no repeat: never ends
    assert r.finish_reason is None and len(r.output_ids) == 200
    # a repeat broken before the run restarts the count: 9 repeated 4-grams, a new token, another loop's 9
    other = [6, 7, 8, 9, 10]
    broken = prefix + cycle * 3 + [1, 2] + [999] + other * 3 + [6, 7]
    assert feed(LoopStop(run=10, n=4), broken).finish_reason is None
    assert feed(LoopStop(run=9, n=4), broken).finish_reason == "loop"
    # an answer that ended with its end-of-turn token keeps that reason
    stop = LoopStop(run=10, n=4)
    r = feed(stop, prefix + [7], eos=7)
    assert r.finish_reason == "eos" and stop.stopped == 0 and not stop._state
    with pytest.raises(ValueError, match="run=0"):
        LoopStop(run=0)


def test_exact_and_near_duplicates():
    index = PromptIndex(DedupConfig())
    index.add("a", HAWAII)
    assert index.match("compose an engaging TRAVEL blog post about a recent trip to hawaii highlighting cultural "
                       "experiences and must see attractions") == "a"  # normalised text: an exact duplicate
    near = HAWAII.replace("Compose", "Write").replace("highlighting", "highlighting the")
    assert index.match(near) == "a"
    assert index.match(HAWAII + " Keep it under 300 words.") == "a"
    # the same frame about another place is another request (character-5-gram Jaccard 0.52 < 0.7)
    assert index.match("Compose an engaging travel blog post about a recent trip to Japan, highlighting food and "
                       "must-see temples.") is None
    assert index.match("What is the capital of France?") is None
    # signatures are a function of the text alone: another index agrees
    assert (PromptIndex(DedupConfig()).signature(near).hashvalues == index.signature(near).hashvalues).all()
    assert normalise("  Hello,   WORLD!! ") == "hello world"


def test_lsh_bands_find_pairs_at_the_threshold():
    assert bands(0.7, 128) == (32, 4) and bands(0.5, 128) == (64, 2)
    for t in (0.5, 0.7, 0.9):
        b, r = bands(t, 128)
        assert 1 - (1 - t ** r) ** b >= 0.999 and b * r <= 128


def test_an_evaluation_prompt_wins_over_a_training_duplicate():
    index = PromptIndex(DedupConfig())
    index.add("train:x", HAWAII + " Please.")
    index.add("eval:mt_bench:81:0", HAWAII)
    assert is_eval(index.match(HAWAII + " Thanks."))


def test_eval_prompts_cover_every_set(tmp_path):
    import json

    from eaglet.data.prompts import sharegpt_split

    held = next(f"h{k}" for k in range(10_000) if sharegpt_split(f"h{k}") == "heldout")
    path = tmp_path / "sg.json"
    path.write_text(json.dumps([{"id": held, "conversations": [
        {"from": "human", "value": "first question"}, {"from": "gpt", "value": "ok"},
        {"from": "human", "value": "second question"}]}, {"id": "train-one", "conversations": [
            {"from": "human", "value": "a training question"}]}]))
    got = eval_prompts(["mt_bench", "humaneval", "sharegpt_heldout"], path)
    keys = [k for k, _ in got]
    assert sum(k.startswith("eval:mt_bench:") for k in keys) == 160  # 80 questions x 2 turns
    assert sum(k.startswith("eval:humaneval:") for k in keys) == 164
    assert [t for k, t in got if k.startswith("eval:sharegpt:")] == ["first question", "second question"]
    with pytest.raises(ValueError, match="unknown \\['gsm8k'\\]"):
        eval_prompts(["gsm8k"])


def test_the_pool_drops_planted_eval_prompts_and_near_duplicates():
    """An MT-bench question and a near-duplicate of it planted among the Magpie candidates, a HumanEval prompt,
    and a conversation whose second user turn is MT-bench's: all dropped as evaluation prompts."""
    mt, he = load_mt_bench(), load_humaneval()
    index = PromptIndex(DedupConfig())
    for key, text in eval_prompts(["mt_bench", "humaneval"]):
        index.add(key, text)
    q = mt[0].turns[0]
    near = q.replace("Compose", "Write").replace("highlighting", "highlighting the") + " Thanks!"
    assert near != q and index.match(near) is not None and index.exact.get(q) is None  # not an exact copy
    cands = [(Record("magpie:0:0", "magpie", ["How do I bake sourdough bread at home?"]), True),
             (Record("magpie:0:1", "magpie", [q]), True),
             (Record("magpie:0:2", "magpie", [near]), True),
             (Record("magpie:0:3", "magpie", [he[3].turns[0]]), True),
             (Record("sharegpt:x", "sharegpt", ["Tell me about rivers in Europe.", mt[5].turns[1]]), True),
             (Record("magpie:0:4", "magpie", ["how do i bake sourdough bread at home"]), True),  # duplicate
             (Record("magpie:0:5", "magpie", ["Why is the sky blue? Explain"]), False),  # cut by the budget
             (Record("magpie:0:6", "magpie", ["Why is the sky blue during the day?"]), True)]
    stats = collections.Counter()
    pool = select_pool(cands, index, FilterConfig(), lambda t: len(t.split()), stats)
    assert [r.id for r in pool] == ["magpie:0:0", "magpie:0:6"]
    assert stats["magpie/dropped/eval"] == 3 and stats["sharegpt/dropped/eval"] == 1
    assert stats["magpie/dropped/duplicate"] == 1 and stats["magpie/dropped/unfinished"] == 1


def test_a_later_turn_is_cut_not_the_conversation():
    stats = collections.Counter()
    pool = select_pool([(Record("sharegpt:y", "sharegpt", ["How do rivers form?", "ok", "And lakes?"]), True)],
                       PromptIndex(DedupConfig()), FilterConfig(), lambda t: 3, stats)
    assert pool[0].turns == ["How do rivers form?"]  # "ok" is too short: the conversation ends before it


def test_a_written_follow_up_must_be_a_new_request():
    class Words:  # a tokenizer's call: one token per word
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": text.split()}

    index = PromptIndex(DedupConfig())
    for key, text in eval_prompts(["mt_bench"]):
        index.add(key, text)
    check = Checker(index, FilterConfig(), Words())
    hist = [("user", "How do rivers form in the mountains?"),
            ("assistant", "Rivers form when rain and melting snow collect and flow downhill.")]
    assert check("And how do lakes form?", True, hist) is None
    assert check("And how do lakes form?", False, hist) == "unfinished"
    assert check("How do rivers form in the mountains??", True, hist) == "echo"
    assert check("Rivers form when rain and melting snow collect and flow downhill", True, hist) == "echo"
    assert check(load_mt_bench()[7].turns[1], True, hist) == "eval"
    assert check("ok", True, hist) == "short"


def test_the_config_defaults_are_the_documented_ones():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("synthesize")
    assert FilterConfig(**cfg.filters) == FilterConfig() and DedupConfig(**cfg.dedup) == DedupConfig()
    assert list(cfg.exclude) == ["mt_bench", "humaneval", "sharegpt_heldout"]
