"""The engine accepts what the training forward predicts: greedy chain decoding's accept lengths equal the replay of
the unrolled training forward's hits over the same answers (training/chain_replay.py). So a head's acceptance in
serving is its teacher-forced accuracy, and a gap between `train/acc_k` and serving is the head's, not the engine's."""

from __future__ import annotations

import pytest
from engine_testing import PROMPTS, TREES, ar_outputs, oracle_like

from eaglet.engine.drafters.eagle import EagleDrafter
from eaglet.engine.requests import Request
from eaglet.engine.speculative import SpeculativeEngine
from eaglet.training.chain_replay import chain_rates, replay_chain, step_hits
from eaglet.training.features import OnlineFeatures


@pytest.mark.parametrize("kind", ["eagle1", "multi_layer"])
def test_engine_accepts_what_training_predicts(target, kind):
    tree = TREES["chain"]
    head = oracle_like(kind, target, num_layers=tree.steps if kind == "multi_layer" else None)
    answers = ar_outputs(target, PROMPTS, 30)
    feats = OnlineFeatures(target, head)
    lens = []
    for prompt, answer in zip(PROMPTS, answers):
        req = Request(prompt, 30)
        stats = SpeculativeEngine(target, EagleDrafter(head), tree, max_batch=1, max_context=256,
                                  page_size=8).generate([req])
        assert req.output_ids == answer
        hits = step_hits(target, head, feats, prompt + answer, len(prompt), tree.steps)  # [rows, steps]
        replayed = replay_chain(hits)
        # the last step may stop at max_new_tokens before its accepted run ends
        assert stats.accept_lens[:-1] == [n for _, n in replayed][: len(stats.accept_lens) - 1]
        lens += stats.accept_lens[:-1]
        rates, tau = chain_rates(hits, [p for p, _ in replayed])
        assert rates.shape == (tree.steps,) and tau == pytest.approx(sum(n for _, n in replayed) / len(replayed))
    assert max(lens) >= 3 and min(lens) == 1  # deep runs and misses both happened: the comparison is not trivial
