"""`train(cfg, output_dir) -> metrics`: what `train_draft.py` does, as a plain function (tests call it too).

One optimiser step = `train.grad_accum` micro-batches per process. Before its micro-batches run, the step
counts the rows every unrolled step will be scored on, over all of them and every process (one all-reduce of
a few numbers), and each micro-batch's loss is its SUM over rows divided by that count: accumulation and DDP
then give exactly the gradient of one large batch (tests/training/test_ddp.py checks it with two processes).

Run directory (Hydra's, `hydra.run.dir`):

    checkpoints/step_<n>/   the head (fp32), the training state and a manifest (training/checkpoints.py)
    head/                   the final head in the public layout (train.head.export_dtype): load_draft_head reads it
    head_best/              with evaluations: the head of the evaluation with the best held-out eval/acc_0 so far
                            (its eval.json says which), the same layout: heads memorise their training answers
    train_log.jsonl         every logged step's metrics
    metrics.json            the run's summary (also mirrored to W&B, offline by default)

Resume (`train.resume=auto`, the default) continues from the newest checkpoint of the run directory that
verifies, so re-running the same command with the same `hydra.run.dir` continues an interrupted run; on CPU the
result is bitwise that of an uninterrupted run. SIGTERM or SIGINT stops the run at the next step boundary,
every process at the same step: a checkpoint, the head exported, metrics.json with `finished: false`, exit
status 143 / 130. Multi-GPU: `torchrun --nproc-per-node N train_draft.py ...` (DDP; NCCL on GPU, gloo on CPU);
rank 0 logs, evaluates and writes checkpoints.

Here: one optimiser step's gradients, the optimiser, the set-up and the loop (`_Run` holds its state). The
objective is training/losses.py's (EAGLE heads) or training/block_loss.py's (block drafters), the processes and
their collectives training/distributed.py's, checkpoints and resume training/checkpoints.py's, the evaluations
training/evaluation.py's.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from eaglet.models.eagle import DraftHead, DraftVocab
from eaglet.models.head_checkpoint import HEAD_CLASSES, KINDS, load_draft_head, new_draft_head, save_draft_head
from eaglet.models.llama import Transformer
from eaglet.runner.entry import console_logging, rerun_hint
from eaglet.runner.signals import Interrupts
from eaglet.runner.tracking import Tracker, environment
from eaglet.training.block_loss import BlockObjective
from eaglet.training.checkpoints import (
    check_batch_settings,
    clear_run_dir,
    load_checkpoint,
    optimizer_state,
    pick_checkpoint,
    restore_training_state,
    rng_state,
    save_checkpoint,
    truncate_log,
)
from eaglet.training.config import validate_train_draft
from eaglet.training.data import BatchSchedule, Sample, collate, draft_vocab, load_samples
from eaglet.training.distributed import Dist, gathered, join, wrap
from eaglet.training.evaluation import Evaluations, eval_prompt_ids
from eaglet.training.features import OfflineFeatures, OnlineFeatures, build_offline_cache, cache_bytes
from eaglet.training.losses import STATS, DraftObjective, window_metrics

EXPORT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
log = logging.getLogger("eaglet")


# ---------------------------------------------------------------------------------------------------
# One optimiser step's gradients


def accumulate_gradients(model: nn.Module, dd: Dist, batches, features, objective, autocast) -> tuple:
    """Forward and backward of one optimiser step's micro-batches [(tokens [B, T], loss mask [B, T], sequence
    indices)], on the model's device, gradients summed into .grad (DDP all-reduces them at the last one);
    `objective` is the model's unwrapped objective (its `prepare` and `counts`).
    -> (the step's loss summed over micro-batches, statistics [steps, len(STATS)] summed; this process's)."""
    device = next(model.parameters()).device
    steps = objective.steps
    batches = [(tokens.to(device), objective.prepare(mask.to(device)), idx) for tokens, mask, idx in batches]
    # rows of each unrolled step over the whole step (every micro-batch of every process): dividing each
    # micro-batch's sum by it makes accumulation and DDP's average exact (x world: DDP divides by world)
    norm = dd.all_sum(sum(objective.counts(m) for _, m, _ in batches).to(device)) / dd.world  # [steps]
    loss_sum = torch.zeros((), device=device)
    stats_sum = torch.zeros(steps, len(STATS), dtype=torch.float64, device=device)
    for j, (tokens, mask, idx) in enumerate(batches):
        feature, final_hidden = features(tokens, idx)  # [B, T, F], [B, T, H]
        last = j == len(batches) - 1
        ddp = isinstance(model, nn.parallel.DistributedDataParallel)
        if hasattr(model, "set_requires_gradient_sync"):  # FSDP: reduce-scatter once, at the last micro-batch
            model.set_requires_gradient_sync(last)
        with (model.no_sync() if ddp and not last else contextlib.nullcontext()), autocast:
            loss, stats = model(tokens, mask, feature, final_hidden, norm)
        loss.backward()
        loss_sum += loss.detach()
        stats_sum += stats.double()
    return loss_sum, stats_sum


# ---------------------------------------------------------------------------------------------------
# Optimiser and schedule


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warmup over `warmup` steps, then cosine decay to `min_ratio` of the peak at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def make_optimizer(head: nn.Module, oc: DictConfig, total_steps: int):
    if oc.name != "adamw":
        raise ValueError(f"train.optim.name={oc.name!r}: only adamw is implemented")
    params = [p for p in head.parameters() if p.requires_grad]
    # no weight decay on norms and biases (1-D), as usual for transformers
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": oc.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=oc.lr, betas=tuple(oc.betas), eps=oc.eps)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, oc.warmup_steps, total_steps, oc.min_lr_ratio))
    return opt, sched


# ---------------------------------------------------------------------------------------------------
# Set-up


def load_target(tc: DictConfig, dtype, device, seed: int):
    """(target, tokenizer or None, cache key) from a conf/target/*.yaml block."""
    from eaglet.runner.common import random_target, target_path

    if tc.get("random"):
        torch.manual_seed(seed)  # every process builds the same random weights
        return random_target(tc.random, dtype, device), None, {"random": tc.random, "seed": seed}
    from eaglet.models.checkpoint import load_tokenizer

    path = target_path(tc)
    return (Transformer.from_pretrained(path, dtype=dtype, device=device), load_tokenizer(path),
            {"path": str(path.resolve()), "size": path.stat().st_size if path.is_file() else None})


def build_head(hc: DictConfig, target: Transformer, samples: list[Sample], device) -> DraftHead:
    """A fp32 head (the optimiser's master weights; bf16 only inside autocast) for `target`."""
    if hc.kind not in KINDS:
        raise ValueError(f"train.head.kind={hc.kind!r}; eaglet trains {', '.join(KINDS)} heads")
    if hc.get("resize_vocab") and not issubclass(HEAD_CLASSES[hc.kind], DraftVocab):
        raise ValueError(f"train.head.resize_vocab: {hc.kind} heads have no draft vocabulary (EAGLE-3 and block)")
    if hc.get("init_from"):
        head = load_draft_head(Path(hc.init_from).expanduser(), target, dtype=torch.float32, device=device)
        if head.KIND != hc.kind:
            raise ValueError(f"train.head.init_from holds a {head.KIND} head but train.head.kind={hc.kind}")
        if hc.get("resize_vocab"):
            head = head.with_draft_vocab(draft_vocab(samples, target.args.vocab_size, hc.draft_vocab_size).to(device))
        if hc.kind == "block":  # num_layers above the warm start's: new layers appended, adding nothing yet
            head = head.with_layers(hc.num_layers)
        return head.train()
    extra = {}
    if hc.kind == "block":
        extra = {"block_size": hc.block_size, "dep_rank": hc.dep_rank, "target_layer_ids": hc.target_layer_ids}
    if hc.kind == "eagle3" and hc.get("aux_layers"):
        extra["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(hc.aux_layers)}
    head = new_draft_head(hc.kind, target, num_layers=hc.get("num_layers"), draft_vocab_size=hc.get("draft_vocab_size"),
                          dtype=torch.float32, device=device, **extra)
    # a head with a draft vocabulary smaller than the target's (EAGLE-3, block): its tokens from this data
    if head.draft_vocab_size < target.args.vocab_size:
        head.set_draft_vocab(draft_vocab(samples, target.args.vocab_size, head.draft_vocab_size).to(device))
    return head.train()


def _features(cfg: DictConfig, target: Transformer, head: DraftHead, samples: list[Sample], run_dir: Path,
              dd: Dist, device, say):
    """features(tokens [B, T], sequence indices) -> (feature [B, T, F], final hidden [B, T, H]): computed by the
    target at each step (online) or read from a cache built once before training (offline)."""
    online = OnlineFeatures(target, head)
    if cfg.features.mode == "offline":
        fdir = Path(cfg.features.dir or run_dir / "features")
        size = cache_bytes([len(s.ids) for s in samples], head.feature_size, target.args.dim, target.dtype)
        say(f"offline feature cache: {size / 2**30:.2f} GiB for {len(samples)} sequences -> {fdir}")
        build_offline_cache(fdir, [s.ids for s in samples], list(range(dd.rank, len(samples), dd.world)), online,
                            batch_size=cfg.features.batch_size, shard_mb=cfg.features.shard_mb, tag=f"r{dd.rank}")
        dd.barrier()
        offline = OfflineFeatures(fdir, device)
        return lambda tokens, idx: offline(idx, tokens.shape[1])
    if cfg.features.mode == "online":
        return lambda tokens, idx: online(tokens)
    raise ValueError(f"features.mode={cfg.features.mode!r}; choose online or offline")


# ---------------------------------------------------------------------------------------------------
# The run's state


@dataclass
class _Window:
    """What the loop sums between two log lines, and the time in it spent checkpointing and evaluating."""

    stats: torch.Tensor  # [steps, len(STATS)] fp64, this process's
    loss: torch.Tensor  # () fp64: summed step losses
    tokens: int = 0
    steps: int = 0
    t0: float = field(default_factory=time.perf_counter)
    pause: float = 0.0

    @classmethod
    def empty(cls, steps: int, device) -> "_Window":
        return cls(torch.zeros(steps, len(STATS), dtype=torch.float64, device=device),
                   torch.zeros((), dtype=torch.float64, device=device))

    def reset(self) -> None:
        self.stats.zero_()
        self.loss.zero_()
        self.tokens, self.steps, self.t0, self.pause = 0, 0, time.perf_counter(), 0.0

    @contextlib.contextmanager
    def paused(self, device):
        """Time kept out of train/tokens_per_s (the device drained first)."""
        if device.type != "cpu":
            torch.get_device_module(device).synchronize(device)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.pause += time.perf_counter() - t0


@dataclass
class _Run:
    """One training run once set up: what the step, the log, checkpoints and evaluations read and advance."""

    cfg: DictConfig
    dd: Dist
    device: torch.device
    run_dir: Path
    head: DraftHead
    objective: DraftObjective
    model: nn.Module  # the objective, or its DDP / FSDP wrapper
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LRScheduler
    samples: list[Sample]
    features: Callable  # (tokens, idx) -> (feature, final hidden): `_features`
    schedule: BatchSchedule
    evaluations: Evaluations
    tracker: Tracker | None  # rank 0's
    env: dict
    config: dict  # the resolved config
    say: Callable  # rank 0's log.info, a no-op elsewhere
    t_start: float
    window: _Window
    step: int = 0
    position: int = 0  # global micro-batches consumed (the data position)
    tokens_seen: int = 0
    last_saved: int = -1
    last_log: dict = field(default_factory=dict)

    @property
    def fsdp(self) -> bool:
        return bool(self.cfg.train.get("fsdp"))


# ---------------------------------------------------------------------------------------------------
# The loop


def train(cfg: DictConfig, output_dir: str | Path, target: Transformer | None = None, tokenizer=None) -> dict:
    """Train a draft head as `cfg` (conf/train_draft.yaml) says; returns the metrics written to metrics.json.
    `target`/`tokenizer` replace cfg.target (an already loaded model; tests pass tiny ones)."""
    with Interrupts() as interrupts:  # SIGINT / SIGTERM: at once while setting up, then at a step boundary
        console_logging()
        validate_train_draft(cfg, run_dir=output_dir, given_target=target is not None)
        run = _set_up(cfg, output_dir, target, tokenizer)
        stopped, signum = _loop(run, interrupts)
        interrupts.note = "writing the checkpoint and the head first (Ctrl-C again stops at once, without them)"
        if run.step != run.last_saved:
            _checkpoint(run)
        return _finish(run, stopped, signum)


def _set_up(cfg: DictConfig, output_dir, target: Transformer | None, tokenizer) -> _Run:
    """Join the job, load the target and the data, build (or resume) the head, its optimiser and features."""
    tc, hc = cfg.train, cfg.train.head
    fsdp = bool(tc.get("fsdp"))
    dd, device, dtype, run_dir = join(cfg.hardware, output_dir)
    best_dir = run_dir / "head_best"
    say = log.info if dd.main else (lambda *a, **k: None)
    t_start = time.perf_counter()

    target_name = cfg.target.name
    if target is None:
        target, tokenizer, target_key = load_target(cfg.target, dtype, device, cfg.seed)
    else:
        target_name, target_key = "(given)", {"object": f"{target.args}"}
    target.requires_grad_(False).eval()
    eos = set(target.args.eos_token_ids)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    cache_dir = Path(cfg.data.cache_dir or Path(os.environ.get("EAGLET_CACHE", "~/.cache/eaglet")) / "train")
    samples = load_samples(cfg.data, target, tokenizer, cache_dir.expanduser(), target_key, eos, cfg.seed, dd.rank,
                           dd.world, dd.barrier, say)
    if not samples:
        raise ValueError("no training sequence has an assistant token; check data.* (limit, max_len)")
    torch.manual_seed(cfg.seed)
    head = build_head(hc, target, samples, device)
    objective = BlockObjective(head, hc) if hc.kind == "block" else DraftObjective(head, hc)
    if tc.get("compile"):
        # one compiled graph for the unrolled head and its loss, dynamic over batch lengths: eagerly a step issues
        # thousands of ATen ops, and on an H200 it is host-bound on them (benchmarks/NOTES.md). The method, not
        # the module, so DDP's and FSDP's hooks stay outside the graph.
        objective.forward = torch.compile(objective.forward, dynamic=True)

    # resume: the weights before sharding, the optimiser's state once it exists
    ckpt = dd.broadcast(pick_checkpoint(tc.resume, run_dir) if dd.main else None)  # the newest that verifies
    if ckpt is None and dd.main:
        clear_run_dir(run_dir, best_dir)
    state = load_checkpoint(ckpt, head, fsdp) if ckpt is not None else None
    model = wrap(objective, device, dd, fsdp)
    opt, sched = make_optimizer(head, cfg.train.optim, tc.steps)
    start_step, position = 0, 0
    if state is not None:
        restore_training_state(state, model, opt, sched, fsdp)
        start_step, position = int(state["step"]), int(state["micro_position"])
        check_batch_settings(state, ckpt, tc.batch_size * dd.world, tc.grad_accum)
        if dd.main:
            truncate_log(run_dir / "train_log.jsonl", start_step)
        say(f"resumed from {ckpt} at step {start_step}")

    features = _features(cfg, target, head, samples, run_dir, dd, device, say)
    schedule = BatchSchedule([len(s.ids) for s in samples], tc.batch_size, dd.world, dd.rank, cfg.seed,
                             tc.group_by_length)
    prompts = eval_prompt_ids(cfg.eval, cfg.data, tokenizer, target.args.vocab_size, cfg.seed) if dd.main else []
    config = OmegaConf.to_container(cfg, resolve=True)
    env = environment(device)
    tracker = Tracker(cfg.logger, {**config, "env": env}, run_dir) if dd.main else None
    evaluations = Evaluations(target, cfg, prompts, eos, best_dir, EXPORT_DTYPES[hc.export_dtype], tracker, say)
    n_tok, n_asst = sum(len(s.ids) for s in samples), sum(int(s.mask.sum()) for s in samples)
    say(f"train {hc.kind} head ({sum(p.numel() for p in head.parameters()) / 1e6:.1f}M params, draft vocab "
        f"{head.draft_vocab_size}) for {target_name} on {len(samples)} sequences ({n_tok} tokens, {n_asst} "
        f"assistant); {dd.world} process(es) x batch {tc.batch_size} x accumulation {tc.grad_accum}, "
        f"{tc.steps} steps, TTT length {objective.steps}, device {env['device_name']}")
    return _Run(cfg, dd, device, run_dir, head, objective, model, opt, sched, samples, features, schedule,
                evaluations, tracker, env, config, say, t_start, _Window.empty(objective.steps, device),
                step=start_step, position=position,
                tokens_seen=int(state["tokens_seen"]) if state is not None else 0,
                last_saved=start_step if ckpt is not None else -1)


def _loop(run: _Run, interrupts: Interrupts) -> tuple[str | None, int]:
    """Optimiser steps until train.steps (or stop_at_step, time_limit_s, a signal) -> (the name of the signal
    that stopped the run or None, its number or 0); every process stops at the same step."""
    from eaglet.runner.common import trace_steps

    tc, ec, dd = run.cfg.train, run.cfg.eval, run.dd
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if run.device.type == "cuda" and tc.bf16
                else contextlib.nullcontext())
    stop_at = tc.stop_at_step if tc.get("stop_at_step") is not None else tc.steps
    time_limit = tc.get("time_limit_s")
    bar = tqdm(total=tc.steps, initial=run.step, disable=not (dd.main and tc.progress), dynamic_ncols=True)
    scope = contextlib.ExitStack()  # what the loop runs inside, closed after it
    on_step = scope.enter_context(trace_steps((tc.get("profile_steps") or 0) if dd.main else 0, run.run_dir))
    scope.enter_context(logging_redirect_tqdm())  # log lines printed around the progress bar
    interrupts.defer("stopping after this step, with a checkpoint (Ctrl-C again stops at once, without one)")
    run.window.t0 = time.perf_counter()
    try:
        while run.step < min(tc.steps, stop_at):
            grad_norm = _optimiser_step(run, autocast)
            bar.update(1)
            if on_step is not None:
                on_step()
            if run.step % tc.log_every == 0 or run.step == tc.steps:
                _log(run, grad_norm, bar)
            if tc.ckpt_every > 0 and run.step % tc.ckpt_every == 0:
                _checkpoint(run)
            # every process stops at the same step, whichever received the signal or ran out of time
            signum, time_up = dd.any_stop(interrupts.signum, time_limit is not None and
                                          time.perf_counter() - run.t_start > time_limit, run.device)
            if signum:
                return signal.Signals(signum).name, signum
            if time_up:
                run.say(f"train.time_limit_s={time_limit} reached at step {run.step}: stopping (resumable)")
                break
            if ec.every > 0 and run.step % ec.every == 0 and run.step < tc.steps:
                _evaluate(run)
    finally:  # a second Ctrl-C (KeyboardInterrupt) leaves from here: at once, without a checkpoint
        scope.close()
        bar.close()
    return None, 0


def _optimiser_step(run: _Run, autocast) -> torch.Tensor:
    """One optimiser step over train.grad_accum micro-batches -> the gradient norm before clipping."""
    tc = run.cfg.train
    local = [run.schedule.local_batch(run.position + j) for j in range(tc.grad_accum)]
    batches = [(*collate(run.samples, idx), idx) for idx in local]
    loss_sum, stats = accumulate_gradients(run.model, run.dd, batches, run.features, run.objective, autocast)
    grad_norm = torch.nn.utils.clip_grad_norm_(run.head.parameters(), run.cfg.train.optim.grad_clip or math.inf)
    if hasattr(grad_norm, "full_tensor"):  # FSDP: a DTensor over the shards
        grad_norm = grad_norm.full_tensor()
    run.opt.step()
    run.sched.step()
    run.opt.zero_grad(set_to_none=True)
    run.step, run.position = run.step + 1, run.position + tc.grad_accum
    w = run.window
    w.stats += stats
    w.loss += loss_sum
    w.tokens += sum(len(run.samples[i].ids) for idx in local for i in idx)
    w.steps += 1
    return grad_norm


def _log(run: _Run, grad_norm: torch.Tensor, bar) -> None:
    """The window's metrics over every process -> the tracker, train_log.jsonl and the progress bar."""
    dd, w = run.dd, run.window
    stats = dd.all_sum(w.stats.clone())
    toks = int(dd.all_sum(torch.tensor(float(w.tokens), device=run.device)))
    loss_avg = float(dd.all_sum(w.loss.clone())) / dd.world / w.steps
    run.tokens_seen += toks
    dt = time.perf_counter() - w.t0 - w.pause
    run.last_log = {"train/loss": loss_avg, "train/lr": run.sched.get_last_lr()[0],
                    "train/grad_norm": float(grad_norm), "train/tokens_per_s": toks / dt,
                    **window_metrics(stats, run.objective.with_vloss)}
    if dd.main:
        run.tracker.log(run.last_log, step=run.step)
        with open(run.run_dir / "train_log.jsonl", "a") as f:
            f.write(json.dumps({"step": run.step, **run.last_log}) + "\n")
        bar.set_postfix(loss=f"{run.last_log['train/loss']:.3f}", acc_0=f"{run.last_log['train/acc_0']:.3f}",
                        lr=f"{run.last_log['train/lr']:.2e}")
    w.reset()


def _checkpoint(run: _Run) -> None:
    """checkpoints/step_<n>/ of this step (every process joins: under FSDP the gathers are collectives)."""
    tc, dd = run.cfg.train, run.dd
    with run.window.paused(run.device):
        whole, opt_state = gathered(run.model, run.head, run.fsdp, dd.main), optimizer_state(run.model, run.opt,
                                                                                              run.fsdp)
        if dd.main:
            save_checkpoint(run.run_dir, run.step, whole, {
                "step": run.step, "micro_position": run.position, "optimizer": opt_state, "fsdp": run.fsdp,
                "scheduler": run.sched.state_dict(), "rng": rng_state(), "global_batch": tc.batch_size * dd.world,
                "grad_accum": tc.grad_accum, "tokens_seen": run.tokens_seen}, tc.keep_last)
        run.last_saved = run.step
        dd.barrier()


def _evaluate(run: _Run) -> None:
    """The evaluation of this step on rank 0 (every process joins the gather)."""
    with run.window.paused(run.device):
        whole = gathered(run.model, run.head, run.fsdp, run.dd.main)
        if run.dd.main:
            run.evaluations(whole, run.step)
        run.dd.barrier()


def _finish(run: _Run, stopped: str | None, signum: int) -> dict:
    """Export the head, the final evaluation, metrics.json and the summary -> the metrics."""
    tc, dd = run.cfg.train, run.dd
    # an unfinished run (stop_at_step, time_limit_s, a signal) exports too, so that its head can be evaluated;
    # metrics.json says finished=false, and a resumed run exports again at its end
    finished = run.step >= tc.steps
    stopped = None if finished else stopped  # a signal during the last step: the run is whole all the same
    whole = gathered(run.model, run.head, run.fsdp, dd.main)
    export = EXPORT_DTYPES[tc.head.export_dtype]
    head_dir = save_draft_head(whole, run.run_dir / "head", dtype=export) if dd.main else None
    if run.cfg.eval.every > 0 and not signum:  # a signalled job has seconds left (SLURM, Kubernetes): no evaluation
        _evaluate(run)
    train_s = time.perf_counter() - run.t_start
    samples, device = run.samples, run.device
    metrics = {
        "steps": run.step, "finished": finished, **({"interrupted": stopped} if stopped else {}),
        "head_dir": None if head_dir is None else str(head_dir),
        "head_kind": tc.head.kind, "draft_vocab_size": run.head.draft_vocab_size, "ttt_length": run.objective.steps,
        "num_sequences": len(samples), "num_tokens": sum(len(s.ids) for s in samples),
        "assistant_tokens": sum(int(s.mask.sum()) for s in samples),
        "world_size": dd.world, "train_s": train_s, "tokens_seen": run.tokens_seen,
        "peak_memory_gb": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        **run.last_log, **run.evaluations.summary(), **run.env, "config": run.config,
    }
    if dd.main:
        run.say(f"{'stopped by ' + stopped + ' after' if stopped else 'done:'} {run.step} of {tc.steps} steps in "
                f"{train_s:.1f}s; " + ", ".join(f"{k} {metrics[k]:.4g}" for k in ("train/loss", "train/acc_0",
                                                                                "eval/acc_0", "eval/tau")
                                              if metrics.get(k) is not None))
        if not finished:
            run.say(f"checkpoint at step {run.step} in {run.run_dir}: {rerun_hint(run.run_dir)}")
        where = run.tracker.location()
        run.say(f"metrics: {run.tracker.finish(metrics)}")
        run.say(f"head: {head_dir}")
        if where:
            run.say(where)
    dd.close()
    return metrics
