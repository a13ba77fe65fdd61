"""DDP and FSDP on CPU (gloo, two processes started like torchrun: RANK/WORLD_SIZE/MASTER_* environment
variables): the averaged gradients equal one process's on the concatenated batch (accumulation included), a
whole `train()` run matches a one-process run with the same global batch while only rank 0 writes, an FSDP
run interrupted and resumed ends where an uninterrupted one does, and a SIGTERM to one process stops every
process at the same step."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from eaglet.training.block_loss import BlockObjective
from eaglet.training.data import collate, synthetic_samples
from eaglet.training.distributed import Dist
from eaglet.training.features import OnlineFeatures
from eaglet.training.loop import accumulate_gradients, build_head, train
from eaglet.training.losses import DraftObjective

CONF = Path(__file__).resolve().parents[2] / "conf"
B_LOCAL, ACCUM = 2, 2  # per process; the one-process reference takes 2 * B_LOCAL


def _cfg(run_cache: Path, batch: int, *extra: str):
    from hydra import compose, initialize_config_dir

    over = ["train/head=eagle3", "train.head.draft_vocab_size=64", "train.head.ttt_length=2", "data.source=synthetic",
            "data.regenerate=false", "data.synthetic.num=16", "data.synthetic.min_len=12", "data.synthetic.max_len=30",
            f"data.cache_dir={run_cache}", f"train.batch_size={batch}", f"train.grad_accum={ACCUM}", "train.steps=2",
            "train.log_every=1", "train.ckpt_every=0", "train.progress=false", "eval.every=0", "logger=none",
            "hardware=cpu", "train.optim.warmup_steps=1", "train.optim.lr=1e-3"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        merged = dict(o.split("=", 1) for o in [*over, *extra])  # extra overrides replace the defaults above
        return compose("train_draft", overrides=[f"{k}={v}" for k, v in merged.items()])


# the heads whose DDP gradients are checked: EAGLE-3 (TTT over one layer) and multi-layer (one layer per step,
# every layer reached by the unroll, as DDP without find_unused_parameters needs)
HEADS = {"eagle3": {"kind": "eagle3", "draft_vocab_size": 64, "ttt_length": 3, "step_weight": 0.8},
         "multi_layer": {"kind": "multi_layer", "num_layers": 2, "ttt_length": 2, "step_weight": 0.8,
                         "p_weight": 0.1, "v_weight": 1.0},
         # more anchors than positions: every answer position anchors a block, whichever process draws them
         "block": {"kind": "block", "num_layers": 1, "block_size": 4, "dep_rank": 8, "target_layer_ids": None,
                   "anchors": 64, "decay": 2.0, "ce_weight": 1.0, "kl_weight": 1.0}}


def _gradients(dd: Dist, batch: int, kind: str = "eagle3") -> tuple[dict[str, torch.Tensor], float]:
    """One optimiser step (ACCUM micro-batches of 2 * B_LOCAL sequences in all) -> (head gradients, loss)."""
    from omegaconf import OmegaConf

    target = _tiny().requires_grad_(False)
    samples = synthetic_samples(ACCUM * 2 * B_LOCAL, 10, 30, 0.5, 256, seed=1)
    hc = OmegaConf.create(HEADS[kind])
    torch.manual_seed(0)
    head = build_head(hc, target, samples, "cpu")
    objective = model = (BlockObjective if kind == "block" else DraftObjective)(head, hc)
    if dd.world > 1:
        model = torch.nn.parallel.DistributedDataParallel(objective)
    online = OnlineFeatures(target, head)
    glob = [list(range(j * 2 * B_LOCAL, (j + 1) * 2 * B_LOCAL)) for j in range(ACCUM)]  # global micro-batches
    local = [g[dd.rank * batch:(dd.rank + 1) * batch] for g in glob]
    batches = [(*collate(samples, idx), idx) for idx in local]
    loss, _ = accumulate_gradients(model, dd, batches, lambda t, i: online(t), objective,
                                   contextlib.nullcontext())
    return {n: p.grad.clone() for n, p in head.named_parameters()}, float(dd.all_sum(loss) / dd.world)


def _join(rank: int, port: int) -> Dist:
    """This process as rank `rank` of a 2-process gloo job, from torchrun's environment variables."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE="2")
    torch.set_num_threads(1)
    dd = Dist()
    dd.init("cpu")
    return dd


def _leave(dd: Dist) -> None:
    """Tear the group down, then end the worker without interpreter finalisation: there gloo's worker threads can
    still hold tensors, and freeing them aborts the process (SIGABRT, "terminate called without an active
    exception", pytorch/pytorch#179291) after all the work and its files are done. Seen once in CI's FSDP run."""
    dd.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _spawn(worker, tmp: Path) -> None:
    for attempt in range(3):  # another process on this machine may take the free port before rank 0 binds it
        try:
            mp.spawn(worker, args=(_free_port(), str(tmp)), nprocs=2, join=True)
            return
        except mp.ProcessRaisedException as e:
            if "address already in use" not in str(e).lower() or attempt == 2:
                raise


def _worker(rank: int, port: int, tmp: str) -> None:
    dd, tmp = _join(rank, port), Path(tmp)
    for kind in HEADS:
        grads, loss = _gradients(dd, B_LOCAL, kind)
        torch.save({"grads": grads, "loss": loss}, tmp / f"grads_{kind}{rank}.pt")
    # a whole run; rank 1 is handed another output dir, as Hydra's ${now:} can do under torchrun
    train(_cfg(tmp / "cache", B_LOCAL), tmp / ("ddp" if rank == 0 else "ddp_rank1"), target=_tiny())
    _leave(dd)


def _tiny():
    from eaglet.models.llama import ModelArgs, Transformer

    torch.manual_seed(0)
    return Transformer(ModelArgs(vocab_size=256, dim=128, n_layers=8, n_heads=2, n_kv_heads=1, head_dim=64,
                                 intermediate_size=256, max_seq_len=512)).eval()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_two_processes_equal_one_process_on_the_concatenated_batch(tmp_path):
    _spawn(_worker, tmp_path)
    for kind in HEADS:
        g0, g1 = (torch.load(tmp_path / f"grads_{kind}{r}.pt", weights_only=True) for r in range(2))
        ref, ref_loss = _gradients(Dist(), 2 * B_LOCAL, kind)
        assert g0["grads"].keys() == ref.keys()
        for name, g in ref.items():
            assert torch.equal(g0["grads"][name], g1["grads"][name]), (kind, name)  # every rank: the same gradient
            assert torch.allclose(g0["grads"][name], g, rtol=1e-4, atol=1e-7), (kind, name)
        assert g0["loss"] == pytest.approx(ref_loss, rel=1e-5)

    # the whole loop: 2 processes x batch 2 == 1 process x batch 4 (same global order), rank 0 writes alone
    one = train(_cfg(tmp_path / "cache", 2 * B_LOCAL), tmp_path / "one", target=_tiny())
    ddp = json.loads((tmp_path / "ddp" / "metrics.json").read_text())
    assert ddp["world_size"] == 2 and ddp["finished"]
    assert not (tmp_path / "ddp_rank1").exists()
    assert ddp["train/loss"] == pytest.approx(one["train/loss"], rel=1e-4)
    assert ddp["num_tokens"] == one["num_tokens"]
    a = load_file(tmp_path / "ddp" / "checkpoints" / "step_00000002" / "model.safetensors")
    b = load_file(tmp_path / "one" / "checkpoints" / "step_00000002" / "model.safetensors")
    assert all(torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-6) for k in a)


def _fsdp_worker(rank: int, port: int, tmp: str) -> None:
    dd, tmp = _join(rank, port), Path(tmp)
    fsdp = ("train.fsdp=true", "train.steps=3", "train.ckpt_every=1", "train.keep_last=0", "eval.every=0")
    train(_cfg(tmp / "cache", B_LOCAL, *fsdp), tmp / "full", target=_tiny())
    train(_cfg(tmp / "cache", B_LOCAL, *fsdp, "train.stop_at_step=2"), tmp / "split", target=_tiny())
    train(_cfg(tmp / "cache", B_LOCAL, *fsdp), tmp / "split", target=_tiny())  # resume=auto from step 2
    _leave(dd)


def test_fsdp_run_resumes_exactly_and_matches_one_process(tmp_path):
    _spawn(_fsdp_worker, tmp_path)
    full, split = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("full", "split"))
    assert full["finished"] and split["finished"] and full["world_size"] == 2
    last = "checkpoints/step_00000003/model.safetensors"
    a, b = load_file(tmp_path / "full" / last), load_file(tmp_path / "split" / last)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # sharded optimiser state resumed
    # the exported head loads as a plain one, and sharded training took the same steps as one process
    one = train(_cfg(tmp_path / "cache", 2 * B_LOCAL, "train.steps=3"), tmp_path / "one", target=_tiny())
    c = load_file(tmp_path / "one" / "checkpoints" / "step_00000003" / "model.safetensors")
    assert all(torch.allclose(a[k], c[k], rtol=1e-4, atol=1e-6) for k in a)
    assert full["train/loss"] == pytest.approx(one["train/loss"], rel=1e-4)
    from eaglet.models.head_checkpoint import load_draft_head

    assert load_draft_head(tmp_path / "full" / "head", _tiny()).KIND == "eagle3"
    exported = load_file(tmp_path / "full" / "head" / "model.safetensors")  # bf16, the public layout
    assert exported.keys() == a.keys()
    assert all(torch.allclose(exported[k].float(), a[k].float(), rtol=1e-2, atol=1e-2) for k in a)


def _sigterm_worker(rank: int, port: int, tmp: str) -> None:
    import eaglet.training.loop as loop

    dd, tmp = _join(rank, port), Path(tmp)
    over = ("train.steps=4", "train.keep_last=0")
    train(_cfg(tmp / "cache", B_LOCAL, *over), tmp / "full", target=_tiny())
    real, calls = loop.accumulate_gradients, []

    def signalling(*args, **kw):  # only rank 1 is told to stop, during step 2
        calls.append(1)
        if rank == 1 and len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kw)

    loop.accumulate_gradients = signalling
    stopped = train(_cfg(tmp / "cache", B_LOCAL, *over), tmp / "split", target=_tiny())
    loop.accumulate_gradients = real
    (tmp / f"stopped{rank}.json").write_text(json.dumps({k: stopped.get(k) for k in ("steps", "interrupted")}))
    train(_cfg(tmp / "cache", B_LOCAL, *over), tmp / "split", target=_tiny())  # the same command again
    _leave(dd)


def test_sigterm_to_one_process_stops_every_process_at_the_same_step(tmp_path):
    _spawn(_sigterm_worker, tmp_path)
    for rank in range(2):  # both stopped after step 2, told by the per-step all-reduce
        assert json.loads((tmp_path / f"stopped{rank}.json").read_text()) == {"steps": 2, "interrupted": "SIGTERM"}
    last = "checkpoints/step_00000004/model.safetensors"
    a, b = load_file(tmp_path / "full" / last), load_file(tmp_path / "split" / last)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (tmp_path / "split" / "checkpoints" / "step_00000002").is_dir()
