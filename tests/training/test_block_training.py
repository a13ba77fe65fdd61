"""Training a block drafter (train/head=block: training/block_loss.py) on CPU: anchors and row counts, the loss
falls, an interrupted run resumes bitwise, the evaluation decodes with the block drafter and the exported drafter
loads; the same with a draft vocabulary (train.head.draft_vocab_size: the data's most frequent tokens, EAGLE-3's
map), whose terms leave out the rows whose token it lacks."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from eaglet.models.block_head import BlockHead
from eaglet.models.head_checkpoint import load_draft_head, new_draft_head
from eaglet.training.block_loss import ANCHOR, ASSISTANT, BlockObjective
from eaglet.training.features import OnlineFeatures
from eaglet.training.loop import train

BLOCK = ("train.head.block_size=4", "train.head.anchors=6", "train.head.num_layers=1", "train.head.dep_rank=8")
VOCAB = {None: (), 64: ("train.head.draft_vocab_size=64",)}  # a draft vocabulary of 64 of the 256 tokens


def log_of(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]


def objective(target, anchors=5, block_size=4, vocab=None, ce_weight=1.0, kl_weight=1.0):
    torch.manual_seed(0)
    head = new_draft_head("block", target, num_layers=1, block_size=block_size, dep_rank=8, dtype=torch.float32,
                          device="cpu", draft_vocab_size=vocab)
    if vocab is not None:
        head.set_draft_vocab(torch.arange(0, 2 * vocab, 2))  # the even tokens
    hc = OmegaConf.create({"anchors": anchors, "decay": 2.0, "ce_weight": ce_weight, "kl_weight": kl_weight})
    return BlockObjective(head, hc)


def test_anchors_are_answer_positions_and_counts_match_the_rows(target):
    obj = objective(target)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 256, (3, 30), generator=g)
    mask = torch.zeros(3, 30, dtype=torch.bool)
    mask[0, 10:] = True
    mask[1, 25:28] = True  # fewer answer positions than anchors
    prepared = obj.prepare(mask)
    anchor = (prepared & ANCHOR) > 0
    assert torch.equal((prepared & ASSISTANT) > 0, mask)
    assert anchor.sum(1).tolist() == [5, 3, 0]
    a = anchor.nonzero()
    assert bool(mask[a[:, 0], a[:, 1] + 1].all()) and bool((a[:, 1] >= 1).all())  # the next token is an answer's
    feature, final = OnlineFeatures(target, obj.head)(tokens)
    counts = obj.counts(prepared)  # [K-1]
    loss, stats = obj(tokens, prepared, feature, final, counts)
    assert stats[:, 0].tolist() == counts.tolist()  # STATS[0] = rows
    assert counts[0] == 8 and bool(torch.isfinite(loss))


def test_draft_vocabulary_terms(target):
    """With a draft vocabulary (the even tokens): logits over it, a row whose answer token is odd has no
    cross-entropy (all odd: the CE-only loss is exactly 0, no gradient), accuracy compares target ids."""
    g = torch.Generator().manual_seed(1)
    mask = torch.zeros(2, 30, dtype=torch.bool)
    mask[:, 8:] = True
    obj = objective(target, vocab=64, kl_weight=0.0)
    odd = 2 * torch.randint(0, 128, (2, 30), generator=g) + 1  # [2, 30] no answer token is a draft token
    prepared = obj.prepare(mask)
    feature, final = OnlineFeatures(target, obj.head)(odd)
    counts = obj.counts(prepared)
    loss, stats = obj(odd, prepared, feature, final, counts)
    assert loss.item() == 0.0 and stats[:, 0].tolist() == counts.tolist()  # the rows still count
    loss.backward()
    assert all(p.grad is None or not p.grad.any() for p in obj.head.parameters())
    even = odd - 1  # every answer token is one: a finite, positive CE
    loss, stats = obj(even, prepared, *OnlineFeatures(target, obj.head)(even), counts)
    assert loss.item() > 0 and bool(torch.isfinite(loss))
    # train/acc_k counts a row right when the drafted token's TARGET id is the target's greedy token
    with torch.no_grad():
        anchors = ((prepared & ANCHOR) > 0).float().topk(int(((prepared & ANCHOR) > 0).sum(1).max()), 1)
        logits = obj.head.forward_dense(even, feature, anchors.indices.clamp(min=1))  # [2, A, 3, 64]
    assert logits.shape[-1] == 64
    pred = obj.head.to_target_ids(logits.argmax(-1))
    assert bool((pred % 2 == 0).all())


@pytest.mark.parametrize("vocab", list(VOCAB))
def test_a_few_steps_reduce_the_loss(target, tmp_path, small_cfg, vocab):
    cfg = small_cfg("block", *BLOCK, *VOCAB[vocab], "data.synthetic.num=8", "train.batch_size=8", "train.steps=12",
                    "train.optim.lr=3e-3", "train.optim.warmup_steps=1")
    m = train(cfg, tmp_path / "run", target=target)
    log = log_of(tmp_path / "run")
    losses = [r["train/loss"] for r in log]
    assert m["finished"] and m["ttt_length"] == 3  # block rows 1..3
    assert m["draft_vocab_size"] == (vocab or 256)
    assert losses[-1] < 0.8 * losses[0]
    assert {f"train/{n}_{k}" for n in ("acc", "ploss", "expected_accept") for k in range(3)} <= set(log[-1])
    assert all(log[-1][f"train/ploss_{k}"] < log[0][f"train/ploss_{k}"] for k in range(3))


@pytest.mark.parametrize("vocab", list(VOCAB))
def test_interrupted_run_resumes_bitwise(target, tmp_path, small_cfg, vocab):
    over = (*BLOCK, *VOCAB[vocab], "train.steps=5", "train.grad_accum=2", "train.ckpt_every=2", "train.keep_last=0")
    train(small_cfg("block", *over), tmp_path / "full", target=target)
    m = train(small_cfg("block", *over, "train.stop_at_step=3"), tmp_path / "split", target=target)
    assert not m["finished"]
    train(small_cfg("block", *over), tmp_path / "split", target=target)  # resume=auto
    a, b = (load_file(p / "checkpoints" / "step_00000005" / "model.safetensors")
            for p in (tmp_path / "full", tmp_path / "split"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert ("d2t" in a) == (vocab is not None)
    assert [r["train/loss"] for r in log_of(tmp_path / "full")] == [r["train/loss"] for r in log_of(tmp_path / "split")]


@pytest.mark.parametrize("vocab", list(VOCAB))
def test_evaluation_decodes_with_the_block_drafter_and_the_export_loads(target, tmp_path, small_cfg, vocab):
    cfg = small_cfg("block", *BLOCK, *VOCAB[vocab], "train.steps=2", "train.head.export_dtype=float32", "eval.every=1",
                    "eval.num_prompts=2", "eval.max_new_tokens=6", "eval.prompt_len=8", "tree.steps=3",
                    "tree.topk=2", "tree.num_draft_tokens=5")
    m = train(cfg, tmp_path / "run", target=target)
    assert m["eval/tau"] >= 1.0 and len(m["eval_history"][-1]["acc"]) == 3  # one accuracy per block row
    head = load_draft_head(m["head_dir"], target)
    assert isinstance(head, BlockHead) and head.block_size == 4 and head.draft_vocab_size == (vocab or 256)
    if vocab is not None:  # the data's most frequent tokens, as an EAGLE-3 head's
        assert int(head.t2d.sum()) == vocab and not torch.equal(head.d2t, torch.zeros_like(head.d2t))
        return
    # the per-row accuracy plot of TRAINING.md reads this run
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "scripts/plot_block_accuracy.py", str(tmp_path / "run"), "--out",
                          str(tmp_path / "rows.png")], cwd=repo, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "rows.png").stat().st_size > 0


def test_compiled_objective_trains_as_eager(target, tmp_path, small_cfg):
    """train.compile=true on the block objective (its anchors are counted on the host: a graph break) ends where eager
    does."""
    over = (*BLOCK, "train.steps=2", "train.head.export_dtype=float32")
    eager = train(small_cfg("block", *over), tmp_path / "eager", target=target)
    compiled = train(small_cfg("block", *over, "train.compile=true"), tmp_path / "compiled", target=target)
    assert [r["train/loss"] for r in log_of(tmp_path / "compiled")] == \
        [pytest.approx(r["train/loss"], rel=1e-3) for r in log_of(tmp_path / "eager")]
    a, b = (load_file(Path(m["head_dir"]) / "model.safetensors") for m in (eager, compiled))
    for k in a:
        torch.testing.assert_close(b[k].float(), a[k].float(), rtol=1e-3, atol=1e-5, msg=k)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the SDPA backend choice is a GPU one")
def test_block_attention_builds_no_cudnn_plans(target):
    """The dense block forward and backward run without cuDNN attention: it builds a plan per new sequence length, 20-28
    ms of host time a call in an H100 profile of block-drafter training (models/ttt_attention.py, SDPA_BACKENDS)."""
    from torch.profiler import ProfilerActivity, profile

    target = copy.deepcopy(target).to("cuda", torch.bfloat16)
    torch.manual_seed(0)
    head = new_draft_head("block", target, num_layers=1, block_size=4, dep_rank=8, dtype=torch.bfloat16,
                          device="cuda")
    g = torch.Generator(device="cuda").manual_seed(1)
    ops = set()
    for T in (40, 72):  # two lengths: each would be a new cuDNN plan
        tokens = torch.randint(0, 256, (2, T), device="cuda", generator=g)  # [2, T]
        feature, _ = OnlineFeatures(target, head)(tokens)
        anchors = torch.randint(1, T - 4, (2, 6), device="cuda", generator=g)  # [2, 6]
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            head.forward_dense(tokens, feature, anchors).float().square().mean().backward()
        ops |= {e.key for e in prof.key_averages()}
    assert any("attention" in k for k in ops), sorted(ops)  # the profile saw the attention op
    assert not [k for k in ops if "cudnn_attention" in k]


@pytest.mark.parametrize("vocab", [None, 64])
def test_grown_drafter_drafts_as_before_and_trains_its_new_layers(target, vocab):
    """with_layers(3) on a 1-layer drafter: the same logits (new layers add nothing yet), the draft map kept, and one
    backward reaches the new layers' output projections."""
    obj = objective(target, vocab=vocab)
    head = obj.head
    with torch.no_grad():  # a trained-looking dependency term (a fresh one is zero)
        head.dep_out.weight.normal_(0, 0.1)
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 256, (2, 24), generator=g)  # [2, 24]
    anchors = torch.randint(1, 20, (2, 5), generator=g)  # [2, 5]
    feature, _ = OnlineFeatures(target, head)(tokens)
    grown = head.with_layers(3)
    assert grown.args.n_layers == 3 and len(grown.layers) == 3 and grown.config["num_hidden_layers"] == 3
    assert head.with_layers(1) is head
    with torch.no_grad():
        torch.testing.assert_close(grown.forward_dense(tokens, feature, anchors),
                                   head.forward_dense(tokens, feature, anchors), rtol=0, atol=0)
    if vocab is not None:
        assert torch.equal(grown.d2t, head.d2t) and torch.equal(grown.t2d, head.t2d)
    grown.forward_dense(tokens, feature, anchors).square().mean().backward()
    for layer in grown.layers[1:]:
        assert layer.self_attn.o_proj.weight.grad.abs().sum() > 0 and layer.mlp.down_proj.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="num_layers=0"):
        grown.with_layers(0)


def test_warm_start_grows_the_drafter_and_never_shrinks_it(target, tmp_path, small_cfg):
    """train.head.init_from with more num_layers trains a deeper drafter from the shallower one; fewer is refused
    before anything loads, naming the key."""
    from eaglet.runner.checks import ConfigError
    from eaglet.training.config import validate_train_draft

    over = (*BLOCK, "train.steps=2", "train.head.export_dtype=float32")
    first = train(small_cfg("block", *over), tmp_path / "one", target=target)
    grown = train(small_cfg("block", *over, "train.head.num_layers=2", f"train.head.init_from={first['head_dir']}"),
                  tmp_path / "two", target=target)
    assert load_draft_head(grown["head_dir"], target).args.n_layers == 2
    cfg = small_cfg("block", *over, "train.head.num_layers=1", f"train.head.init_from={grown['head_dir']}")
    with pytest.raises(ConfigError, match=r"train\.head\.num_layers.*>= 2"):
        validate_train_draft(cfg, given_target=True)
