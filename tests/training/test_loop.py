"""training/loop.py end to end on CPU: the loss falls, an interrupted run (stopped, signalled, its newest checkpoint
damaged) resumes bitwise, saved heads load (public layouts), offline features equal online ones, the config
composes and `python train_draft.py` runs and stops cleanly on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from safetensors import safe_open
from safetensors.torch import load_file

from eaglet.models.head_checkpoint import load_draft_head, public_state_dict
from eaglet.training.features import OfflineFeatures, OnlineFeatures, build_offline_cache, cache_bytes
from eaglet.training.loop import train

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"


def log_of(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("kind", ["eagle1", "eagle3", "multi_layer"])
def test_a_few_steps_reduce_the_loss(target, tmp_path, small_cfg, kind):
    # 8 sequences in one micro-batch: every step sees the same data, so the loss must fall step after step
    cfg = small_cfg(kind, "data.synthetic.num=8", "train.batch_size=8", "train.steps=12",
                    "train.optim.lr=3e-3", "train.optim.warmup_steps=1")
    m = train(cfg, tmp_path / "run", target=target)
    log = log_of(tmp_path / "run")
    losses = [r["train/loss"] for r in log]
    assert len(losses) == 12 and m["finished"]
    assert losses[-1] < 0.95 * losses[0] and all(b < a for a, b in zip(losses, losses[1:]))
    assert log[-1]["train/acc_0"] > log[0]["train/acc_0"]
    steps = 1 if kind == "eagle1" else 3  # multi_layer: one unrolled step per layer (3 by default)
    assert m["ttt_length"] == steps
    assert {f"train/{n}_{k}" for n in ("acc", "ploss", "expected_accept") for k in range(steps)} <= set(log[-1])
    assert {"train/lr", "train/tokens_per_s", "train/expected_accept", "train/grad_norm"} <= set(log[-1])
    # EAGLE-1's objective (feature regression) at every step of a multi-layer head
    assert ("train/vloss_0" in log[-1]) == (kind != "eagle3")
    assert ("train/vloss_2" in log[-1]) == (kind == "multi_layer")


def test_accept_weight_trains_the_acceptance(target, tmp_path, small_cfg):
    """train.head.accept_weight reaches the objective: the loss logged is the soft cross-entropy plus the weighted
    -log acceptance (train/aloss_k), and on repeated data the expected acceptance rises."""
    cfg = small_cfg("eagle3", "data.synthetic.num=8", "train.batch_size=8", "train.steps=12", "train.optim.lr=3e-3",
                    "train.optim.warmup_steps=1", "train.head.accept_weight=1.0")
    train(cfg, tmp_path / "run", target=target)
    log = log_of(tmp_path / "run")
    assert {f"train/aloss_{k}" for k in range(3)} <= set(log[-1])
    assert log[-1]["train/expected_accept"] > log[0]["train/expected_accept"]
    first = log[0]
    want = sum(0.8**k * (first[f"train/ploss_{k}"] + first[f"train/aloss_{k}"]) for k in range(3))
    assert first["train/loss"] == pytest.approx(want, rel=1e-4)


@pytest.mark.parametrize("accept_weight", [0.0, 0.5])
def test_compiled_objective_trains_as_eager(target, tmp_path, small_cfg, accept_weight):
    """train.compile=true (one torch.compile graph, dynamic over the batches' lengths) ends where eager does, with and
    without the acceptance loss."""
    over = ("train.steps=3", "train.head.ttt_length=2", "train.head.export_dtype=float32",
            f"train.head.accept_weight={accept_weight}")
    eager = train(small_cfg("eagle3", *over), tmp_path / "eager", target=target)
    compiled = train(small_cfg("eagle3", *over, "train.compile=true"), tmp_path / "compiled", target=target)
    a, b = (load_file(Path(m["head_dir"]) / "model.safetensors") for m in (eager, compiled))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k].float(), a[k].float(), rtol=1e-3, atol=1e-5, msg=k)
    assert [r["train/loss"] for r in log_of(tmp_path / "compiled")] == pytest.approx(
        [r["train/loss"] for r in log_of(tmp_path / "eager")], rel=1e-4)


def test_interrupted_run_resumes_bitwise(target, tmp_path, small_cfg):
    over = ("train.steps=5", "train.grad_accum=2", "train.ckpt_every=2", "train.keep_last=0")
    full = small_cfg("eagle3", *over)
    train(full, tmp_path / "full", target=target)
    first = small_cfg("eagle3", *over, "train.stop_at_step=3")  # "killed" after step 3
    m = train(first, tmp_path / "split", target=target)
    assert not m["finished"] and m["steps"] == 3 and Path(m["head_dir"]).is_dir()  # exported for evaluation
    assert sorted(p.name for p in (tmp_path / "split" / "checkpoints").iterdir()) == ["step_00000002",
                                                                                     "step_00000003"]
    train(small_cfg("eagle3", *over), tmp_path / "split", target=target)  # resume=auto
    a = load_file(tmp_path / "full" / "checkpoints" / "step_00000005" / "model.safetensors")
    b = load_file(tmp_path / "split" / "checkpoints" / "step_00000005" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    sa, sb = (torch.load(p / "checkpoints" / "step_00000005" / "train_state.pt", weights_only=True)
              for p in (tmp_path / "full", tmp_path / "split"))
    for pid, st in sa["optimizer"]["state"].items():
        assert all(torch.equal(st[n], sb["optimizer"]["state"][pid][n]) for n in st)
    assert sa["scheduler"] == sb["scheduler"]
    # the logs of the resumed part equal the uninterrupted run's
    full_log, split_log = log_of(tmp_path / "full"), log_of(tmp_path / "split")
    assert [r["train/loss"] for r in full_log] == [r["train/loss"] for r in split_log]


@pytest.mark.parametrize("kind", ["eagle1", "eagle3", "multi_layer"])
def test_saved_head_loads_in_the_public_layout(target, tmp_path, small_cfg, kind, monkeypatch):
    cfg = small_cfg(kind, "train.steps=2", "train.head.export_dtype=float32", "eval.every=1",
                    "eval.num_prompts=2", "eval.max_new_tokens=6", "eval.prompt_len=8")
    from eaglet.engine.speculative import SpeculativeEngine
    decode, numerics = SpeculativeEngine.generate, []

    def recording(self, *args, **kw):  # the evaluation decodes with invariant numerics (the target's own answers)
        numerics.append(self.target.invariant)
        return decode(self, *args, **kw)

    monkeypatch.setattr(SpeculativeEngine, "generate", recording)
    stale = tmp_path / "run" / "head_best" / "eval.json"  # another run's best in this folder: not this run's
    stale.parent.mkdir(parents=True)
    stale.write_text(json.dumps({"step": 9, "acc": [2.0]}))
    m = train(cfg, tmp_path / "run", target=target)
    assert numerics == [True, True] and target.invariant is False  # both evaluations; the training's numerics after
    # the head of the best held-out evaluation, first of equals
    accs = [e["acc"][0] for e in m["eval_history"]]
    best = json.loads(stale.read_text())
    assert best["step"] == m["eval_history"][accs.index(max(accs))]["step"] and best == m["head_best"]
    assert load_draft_head(stale.parent, target).KIND == kind
    head_dir = Path(m["head_dir"])
    head = load_draft_head(head_dir, target)
    assert head.KIND == kind
    names = set(safe_open(str(head_dir / "model.safetensors"), "pt").keys())
    ck = load_file(tmp_path / "run" / "checkpoints" / "step_00000002" / "model.safetensors")
    if kind == "eagle3":
        assert {"fc.weight", "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight",
                "midlayer.self_attn.v_proj.weight", "midlayer.self_attn.o_proj.weight", "midlayer.mlp.gate_proj.weight",
                "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight", "midlayer.input_layernorm.weight",
                "midlayer.hidden_norm.weight", "midlayer.post_attention_layernorm.weight", "norm.weight",
                "lm_head.weight", "d2t", "t2d"} == names
        assert head.draft_vocab_size == 64 and int(head.t2d.sum()) == 64
        cfg_json = json.loads((head_dir / "config.json").read_text())
        assert cfg_json["architectures"] == ["LlamaForCausalLMEagle3"] and cfg_json["draft_vocab_size"] == 64
    elif kind == "multi_layer":
        assert {f"layers.{i}.{n}" for i in range(3) for n in (
            "fc.weight", "fc.bias", "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
            "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
            "post_attention_layernorm.weight")} == names
        assert head.num_kv_layers == 3
        cfg_json = json.loads((head_dir / "config.json").read_text())
        assert cfg_json["architectures"] == ["EagletMultiLayerEagle"] and cfg_json["num_hidden_layers"] == 3
    else:
        assert {"fc.weight", "fc.bias", "layers.0.self_attn.q_proj.weight", "layers.0.mlp.gate_proj.weight",
                "layers.0.post_attention_layernorm.weight", "embed_tokens.weight"} <= names
    # the export equals the last checkpoint (same weights, public names), and the loaded head holds them
    exported = load_file(head_dir / "model.safetensors")
    assert all(torch.equal(exported[k], v) for k, v in ck.items())
    loaded = public_state_dict(head)
    assert loaded.keys() == ck.keys() and all(torch.equal(loaded[k], v) for k, v in ck.items())
    assert len(m["eval_history"]) == 2 and m["eval/tau"] >= 1.0  # step 1 and the end
    # held-out teacher-forced accuracy per draft step, beside the engine's tau
    assert all(len(e["acc"]) == cfg.tree.steps and all(0.0 <= a <= 1.0 for a in e["acc"]) for e in m["eval_history"])
    assert m["eval/acc_0"] == m["eval_history"][-1]["acc"][0]
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["steps"] == 2


def test_offline_features_equal_online(target, tmp_path):
    from eaglet.models.head_checkpoint import new_draft_head

    head = new_draft_head("eagle3", target)
    online = OnlineFeatures(target, head)
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 256, (int(n),), generator=g) for n in torch.randint(5, 30, (7,), generator=g)]
    for r in range(2):  # two processes' shares (4 and 3 sequences); shard_mb=0: one shard per batch of 2
        build_offline_cache(tmp_path, seqs, list(range(r, 7, 2)), online, batch_size=2, shard_mb=0, tag=f"r{r}")
    assert len(list(tmp_path.glob("*.safetensors"))) == 4 and len(list(tmp_path.glob("*.index.json"))) == 2
    size = sum(p.stat().st_size for p in tmp_path.glob("*.safetensors"))
    est = cache_bytes([len(s) for s in seqs], head.feature_size, 128, torch.float32)
    assert est <= size < est + 4 * 4096  # the printed estimate is the payload (headers aside)
    idx = [5, 0, 3]
    T = max(len(seqs[i]) for i in idx)
    tokens = torch.zeros(3, T, dtype=torch.long)
    for row, i in enumerate(idx):
        tokens[row, : len(seqs[i])] = seqs[i]
    f_on, h_on = online(tokens)
    f_off, h_off = OfflineFeatures(tmp_path, "cpu")(idx, T)
    for row, i in enumerate(idx):
        L = len(seqs[i])
        # equal up to rounding: the cache was computed in batches of other lengths (other GEMM shapes)
        assert torch.allclose(f_off[row, :L], f_on[row, :L], rtol=1e-5, atol=1e-5)
        assert torch.allclose(h_off[row, :L], h_on[row, :L], rtol=1e-5, atol=1e-5)
        assert (f_off[row, L:] == 0).all()


def test_offline_mode_trains_like_online(target, tmp_path, small_cfg):
    on = train(small_cfg("eagle1", "train.steps=2"), tmp_path / "on", target=target)
    off = train(small_cfg("eagle1", "train.steps=2", "features.mode=offline", "features.shard_mb=0"),
                tmp_path / "off", target=target)
    assert (tmp_path / "off" / "features" / "r0.index.json").is_file()
    assert on["train/loss"] == pytest.approx(off["train/loss"], rel=1e-5)


def test_config_composes_every_train_option():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for group in ("train/head", "train/optim"):
            for opt in sorted(p.stem for p in (CONF / group).glob("*.yaml")):
                cfg = compose("train_draft", overrides=[f"{group}={opt}"])
                OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
        cfg = compose("train_draft", overrides=["train/head=eagle1", "logger=none", "target=llama3_8b",
                                                "target.path=/models/x"])
        assert cfg.train.head.kind == "eagle1" and cfg.train.optim.name == "adamw" and cfg.tree.name == "eagle2"
        assert cfg.data.source == "sharegpt" and cfg.features.mode == "online"


def test_fsdp_needs_several_processes(target, tmp_path, small_cfg):
    with pytest.raises(ValueError, match="torchrun --nproc-per-node"):
        train(small_cfg("eagle1", "train.fsdp=true"), tmp_path / "run", target=target)


def test_train_draft_cli_three_steps(tmp_path):
    """`python train_draft.py` on a random tiny registry target: a checkpoint and metrics.json."""
    run = tmp_path / "run"
    cmd = [sys.executable, str(REPO / "train_draft.py"), "target=random_llama3_8b", "target.random=tiny_llama",
           "target.name=tiny", "train/head=eagle1", "data.source=synthetic", "data.regenerate=false",
           "data.synthetic.num=8", "train.batch_size=2", "train.steps=3", "train.log_every=1", "eval.every=0",
           "logger=none", "hardware=cpu", f"data.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={run}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # as torchrun sets it; tiny tensors gain nothing from more
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (run / "checkpoints" / "step_00000003" / "train_state.pt").is_file()
    m = json.loads((run / "metrics.json").read_text())
    assert m["steps"] == 3 and m["finished"] and m["config"]["train"]["head"]["kind"] == "eagle1"
    assert load_draft_head(run / "head", _tiny_llama()).KIND == "eagle1"


def _tiny_llama():
    from eaglet.runner.common import random_target

    torch.manual_seed(0)  # train() seeds the random target with cfg.seed
    return random_target("tiny_llama", torch.float32, "cpu")


def test_resume_refuses_another_batch_setting(target, tmp_path, small_cfg):
    train(small_cfg("eagle1", "train.steps=2"), tmp_path / "run", target=target)
    with pytest.raises(ValueError, match="same batch settings"):
        train(small_cfg("eagle1", "train.steps=4", "train.batch_size=2"), tmp_path / "run", target=target)


def test_multi_layer_unroll_must_reach_every_layer(target, tmp_path, small_cfg):
    # layer i runs from unrolled step i: 2 steps would leave layer 2 of 3 untrained
    with pytest.raises(ValueError, match="ttt_length=2: must be >= train.head.num_layers=3"):
        train(small_cfg("multi_layer", "train.head.ttt_length=2"), tmp_path / "run", target=target)


def test_time_limit_stops_resumably(target, tmp_path, small_cfg):
    # a limit already spent when the first step ends: the run stops after it, checkpointed, head exported
    m = train(small_cfg("eagle3", "train.steps=5", "train.time_limit_s=0"), tmp_path / "run", target=target)
    assert m["steps"] == 1 and not m["finished"] and Path(m["head_dir"]).is_dir()
    assert [p.name for p in (tmp_path / "run" / "checkpoints").iterdir()] == ["step_00000001"]
    m = train(small_cfg("eagle3", "train.steps=5"), tmp_path / "run", target=target)  # resume=auto
    assert m["steps"] == 5 and m["finished"]


def test_profile_steps_write_a_trace(target, tmp_path, small_cfg, caplog):
    train(small_cfg("eagle3", "train.steps=5", "train.profile_steps=1"), tmp_path / "run", target=target)
    trace = json.loads((tmp_path / "run" / "trace.json").read_text())
    assert any(e.get("name", "").startswith("aten::") for e in trace["traceEvents"])
    assert "Self CPU" in caplog.text  # the top-ops table, a line of the run's log


def test_warm_start_keeps_the_head_or_grows_its_vocabulary(target, tmp_path, small_cfg):
    """train.head.init_from starts from a saved head, its weights and its draft vocabulary; with resize_vocab the
    vocabulary is rebuilt from the data at draft_vocab_size and the LM-head rows of the shared tokens carry over
    (one step at lr 0, so the exported head is the one the run started from)."""
    first = train(small_cfg("eagle3", "train.steps=2", "train.head.export_dtype=float32"), tmp_path / "a",
                  target=target)
    start = load_draft_head(Path(first["head_dir"]), target)
    over = ("train.steps=1", "train.optim.lr=0", "train.head.export_dtype=float32",
            f"train.head.init_from={first['head_dir']}")
    kept = load_draft_head(Path(train(small_cfg("eagle3", *over), tmp_path / "b", target=target)["head_dir"]), target)
    a, b = public_state_dict(start), public_state_dict(kept)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    grown = train(small_cfg("eagle3", *over, "train.head.resize_vocab=true", "train.head.draft_vocab_size=96"),
                  tmp_path / "c", target=target)
    grown = load_draft_head(Path(grown["head_dir"]), target)
    assert grown.draft_vocab_size == 96
    old = {int(t): i for i, t in enumerate(start.to_target_ids(torch.arange(64)))}
    new = grown.to_target_ids(torch.arange(96)).tolist()
    shared = [(old[t], j) for j, t in enumerate(new) if t in old]
    assert len(shared) > 32  # the frequent tokens of the same data are mostly the same
    assert all(torch.equal(grown.lm_head.weight[j], start.lm_head.weight[i]) for i, j in shared)
    assert torch.equal(grown.fc.weight, start.fc.weight)
    with pytest.raises(ValueError, match="resize_vocab=true: eagle1 heads have no draft vocabulary"):
        train(small_cfg("eagle1", "train.steps=1", f"train.head.init_from={tmp_path / 'e1'}",
                        "+train.head.resize_vocab=true"), tmp_path / "d", target=target)


def _signal_during_step(monkeypatch, step: int, *signals):
    """This process receives `signals` while optimiser step `step` (1-based) computes its gradients."""
    import eaglet.training.loop as loop

    real, calls = loop.accumulate_gradients, []

    def signalling(*args, **kw):
        calls.append(1)
        if len(calls) == step:
            for sig in signals:
                os.kill(os.getpid(), sig)
        return real(*args, **kw)

    monkeypatch.setattr(loop, "accumulate_gradients", signalling)


def _assert_same_checkpoint(a: Path, b: Path) -> None:
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    sa, sb = (torch.load(p / "train_state.pt", weights_only=True) for p in (a, b))
    for pid, st in sa["optimizer"]["state"].items():
        assert all(torch.equal(st[n], sb["optimizer"]["state"][pid][n]) for n in st)
    assert sa["scheduler"] == sb["scheduler"] and sa["micro_position"] == sb["micro_position"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_at_the_step_boundary_with_a_checkpoint_and_resumes_bitwise(target, tmp_path, small_cfg,
                                                                                  monkeypatch, caplog, sig,
                                                                                  sigint_default):
    over = ("train.steps=5", "train.grad_accum=2", "train.ckpt_every=0", "train.keep_last=0")
    before = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)]
    train(small_cfg("eagle3", *over), tmp_path / "full", target=target)
    with monkeypatch.context() as m:
        _signal_during_step(m, 3, sig)
        stopped = train(small_cfg("eagle3", *over), tmp_path / "split", target=target)
    assert stopped["steps"] == 3 and not stopped["finished"] and stopped["interrupted"] == sig.name
    assert json.loads((tmp_path / "split" / "metrics.json").read_text())["interrupted"] == sig.name
    assert [p.name for p in (tmp_path / "split" / "checkpoints").iterdir()] == ["step_00000003"]
    assert Path(stopped["head_dir"]).is_dir()  # exported, for a look at the head so far
    assert f"checkpoint at step 3 in {tmp_path / 'split'}: rerun the same command to resume" in caplog.text
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)] == before  # the handlers as they were
    done = train(small_cfg("eagle3", *over), tmp_path / "split", target=target)  # the same command again
    assert done["finished"] and f"resumed from {tmp_path / 'split' / 'checkpoints' / 'step_00000003'} at step 3" in (
        caplog.text)
    _assert_same_checkpoint(tmp_path / "full" / "checkpoints" / "step_00000005",
                            tmp_path / "split" / "checkpoints" / "step_00000005")
    assert [r["train/loss"] for r in log_of(tmp_path / "full")] == [r["train/loss"] for r in log_of(tmp_path / "split")]


def test_a_second_ctrl_c_stops_at_once_without_a_checkpoint(target, tmp_path, small_cfg, monkeypatch, sigint_default):
    with monkeypatch.context() as m:
        _signal_during_step(m, 2, signal.SIGINT, signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            train(small_cfg("eagle1", "train.steps=5"), tmp_path / "run", target=target)
    assert not (tmp_path / "run" / "checkpoints").exists()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":  # a copy cut short, a full disk
        path.write_bytes(data[: len(data) // 2])
    else:  # the same size, bytes changed in the middle of the tensors
        mid = len(data) // 2
        path.write_bytes(data[:mid] + bytes(b ^ 0xFF for b in data[mid:mid + 64]) + data[mid + 64:])


@pytest.mark.parametrize("file,how", [("train_state.pt", "truncated"), ("model.safetensors", "flipped"),
                                      ("train_state.pt", "flipped")])
def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(target, tmp_path, small_cfg, caplog, file, how):
    over = ("train.steps=6", "train.ckpt_every=2", "train.keep_last=2")
    train(small_cfg("eagle3", *over), tmp_path / "full", target=target)
    train(small_cfg("eagle3", *over, "train.stop_at_step=4"), tmp_path / "split", target=target)
    ckpts = tmp_path / "split" / "checkpoints"
    _damage(ckpts / "step_00000004" / file, how)
    m = train(small_cfg("eagle3", *over), tmp_path / "split", target=target)
    why = "bytes, the manifest records" if how == "truncated" else "sha256 differs from the manifest's"
    assert f"skipping checkpoint step_00000004: {ckpts / 'step_00000004' / file}: " in caplog.text
    assert why in caplog.text
    assert f"resumed from {ckpts / 'step_00000002'} at step 2" in caplog.text
    assert m["finished"] and sorted(p.name for p in ckpts.iterdir()) == ["corrupt_step_00000004", "step_00000004",
                                                                        "step_00000006"]
    _assert_same_checkpoint(tmp_path / "full" / "checkpoints" / "step_00000006", ckpts / "step_00000006")


def test_a_damaged_checkpoint_named_by_train_resume_is_refused_naming_the_file(target, tmp_path, small_cfg):
    """Also a checkpoint without a manifest: its truncated training state is named, not `OSError: [Errno 22]`."""
    from eaglet.runner.checks import ConfigError

    train(small_cfg("eagle1", "train.steps=2"), tmp_path / "run", target=target)
    ck = tmp_path / "run" / "checkpoints" / "step_00000002"
    (ck / "manifest.json").unlink()
    _damage(ck / "train_state.pt", "truncated")
    with pytest.raises(ConfigError, match=f"^train.resume={ck}: {ck / 'train_state.pt'}: cannot be read"):
        train(small_cfg("eagle1", "train.steps=4", f"train.resume={ck}"), tmp_path / "other", target=target)


def _cli_train(run: Path, cache: Path, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, str(REPO / "train_draft.py"), "target=random_llama3_8b", "target.random=tiny_llama",
           "target.name=tiny", "train/head=eagle1", "data.source=synthetic", "data.regenerate=false",
           "data.synthetic.num=8", "train.batch_size=2", "train.steps=40", "train.log_every=1", "train.ckpt_every=0",
           "eval.every=0", "logger=none", "hardware=cpu", f"data.cache_dir={cache}", f"hydra.run.dir={run}", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=run.parent,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, preexec_fn=_signals_delivered)


def _signals_delivered() -> None:
    """In the child: SIGINT and SIGTERM at their defaults, not ignored as a background job's may be."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def test_train_draft_cli_sigterm_checkpoints_and_the_rerun_ends_bitwise(tmp_path):
    """What SLURM and Kubernetes do before they kill a job: SIGTERM mid-run -> a checkpoint at the step it stopped,
    exit status 143; the same command again resumes there and ends where an uninterrupted run ends."""
    full = _cli_train(tmp_path / "full", tmp_path / "cache")
    assert full.wait(timeout=300) == 0, full.communicate()[1][-3000:]
    run = tmp_path / "split"
    proc = _cli_train(run, tmp_path / "cache")
    deadline = time.time() + 240
    while not (run / "train_log.jsonl").is_file() or len((run / "train_log.jsonl").read_text().splitlines()) < 3:
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    stopped = json.loads((run / "metrics.json").read_text())
    n = stopped["steps"]
    assert not stopped["finished"] and stopped["interrupted"] == "SIGTERM" and 3 <= n < 40
    assert f"checkpoint at step {n} in {run}: rerun the same command to resume" in out
    again = _cli_train(run, tmp_path / "cache")
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-3000:]
    assert f"resumed from {run / 'checkpoints' / f'step_{n:08d}'} at step {n}" in out
    assert json.loads((run / "metrics.json").read_text())["finished"]
    _assert_same_checkpoint(tmp_path / "full" / "checkpoints" / "step_00000040", run / "checkpoints" / "step_00000040")
