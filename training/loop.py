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
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf
from torch import nn
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from eaglet.models.eagle import KINDS, DraftHead, load_draft_head, new_draft_head
from eaglet.models.llama import Transformer
from eaglet.engine.entry import console_logging, rerun_hint
from eaglet.engine.signals import Interrupts
from eaglet.engine.tracking import Tracker, environment
from eaglet.training.chain_replay import step_hits
from eaglet.training.checkpoints import (load_checkpoint, pick_checkpoint, restore_training_state, rng_state,
                                         save_checkpoint)
from eaglet.training.config import validate_train_draft
from eaglet.training.data import BatchSchedule, Sample, collate, draft_vocab, load_samples
from eaglet.training.features import OfflineFeatures, OnlineFeatures, build_offline_cache, cache_bytes
from eaglet.training.losses import STATS, draft_loss, step_counts

EXPORT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
log = logging.getLogger("eaglet")


# ---------------------------------------------------------------------------------------------------
# Distributed


class Dist:
    """This process's place in a torchrun job (rank 0 of 1 without torchrun)."""

    def __init__(self):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.owned = False  # whether this module created the process group (and so destroys it)

    @property
    def main(self) -> bool:
        return self.rank == 0

    def init(self, device_type: str) -> None:
        """Join the torchrun job from its environment variables (env://): NCCL on GPU, gloo on CPU."""
        if self.world > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
            self.owned = True

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            dist.all_reduce(t)
        return t

    def broadcast(self, obj):
        if self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def any_stop(self, signum: int, time_up: bool, device) -> tuple[int, bool]:
        """(the largest signal number any process received, whether any process is past its time limit): the
        processes stop at the same step. One all-reduce of two numbers per step with several processes."""
        if self.world == 1:
            return signum, time_up
        t = torch.tensor([signum, int(time_up)], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t[0]), bool(t[1])

    def close(self) -> None:
        """Ranks leave together: a gloo group torn down while a peer is still busy can abort the
        process ("terminate called without an active exception", seen in the CPU DDP test)."""
        if self.world > 1 and dist.is_initialized():
            dist.barrier()
        if self.owned:
            dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------------
# The objective as a module (what DDP wraps)


class DraftObjective(nn.Module):
    """The head's training forward + loss for one micro-batch; its parameters are the head's (the target is
    a plain attribute of the head, so DDP neither broadcasts nor all-reduces it)."""

    def __init__(self, head: DraftHead, hc: DictConfig):
        super().__init__()
        self.head = head
        steps = int(hc.ttt_length)
        if head.KIND == "multi_layer" and steps < head.num_kv_layers:
            # layer i runs from unrolled step i on: a shorter unroll leaves layers untrained (and DDP without
            # find_unused_parameters stops on their missing gradients)
            raise ValueError(f"train.head.ttt_length={steps} < {head.num_kv_layers} layers of the multi-layer head: "
                             f"unrolled step i trains layer i, so unroll at least as many steps as layers")
        # EAGLE-1 and multi-layer heads output target features (the target's lm_head reads them): regress them
        regress = head.KIND in ("eagle1", "multi_layer")
        self.kw = dict(steps=steps, step_weight=float(hc.step_weight),
                       p_weight=float(hc.p_weight) if regress else 1.0, v_weight=float(hc.v_weight) if regress else 0.0)

    @property
    def steps(self) -> int:
        return self.kw["steps"]

    def forward(self, tokens, loss_mask, feature, final_hidden, norm):
        return draft_loss(self.head, tokens, loss_mask, feature, final_hidden, norm, **self.kw)


def accumulate_gradients(model: nn.Module, dd: Dist, batches, features, steps: int, autocast) -> tuple:
    """Forward and backward of one optimiser step's micro-batches [(tokens [B, T], loss mask [B, T], sequence
    indices)], on the model's device, gradients summed into .grad (DDP all-reduces them at the last one).
    -> (the step's loss summed over micro-batches, statistics [steps, len(STATS)] summed; this process's)."""
    device = next(model.parameters()).device
    # rows of each unrolled step over the whole step (every micro-batch of every process): dividing each
    # micro-batch's sum by it makes accumulation and DDP's average exact (x world: DDP divides by world)
    norm = dd.all_sum(sum(step_counts(m, steps) for _, m, _ in batches).to(device)) / dd.world  # [steps]
    loss_sum = torch.zeros((), device=device)
    stats_sum = torch.zeros(steps, len(STATS), dtype=torch.float64, device=device)
    for j, (tokens, mask, idx) in enumerate(batches):
        tokens, mask = tokens.to(device), mask.to(device)
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


def window_metrics(w: torch.Tensor, with_vloss: bool) -> dict[str, float]:
    """Summed statistics [steps, len(STATS)] of a logging window -> train/acc_k, ploss_k, expected_accept_k
    (and vloss_k) as means over the counted rows; train/expected_accept is step 0's."""
    rows = w[:, STATS.index("rows")].clamp(min=1)  # [steps]
    out = {}
    for k in range(w.shape[0]):
        mean = {name: float(w[k, STATS.index(name)] / rows[k]) for name in STATS}
        out |= {f"train/acc_{k}": mean["correct"], f"train/ploss_{k}": mean["ploss"],
                f"train/expected_accept_{k}": mean["accept"]}
        if with_vloss:
            out[f"train/vloss_{k}"] = mean["vloss"]
    out["train/expected_accept"] = out["train/expected_accept_0"]
    return out


# ---------------------------------------------------------------------------------------------------
# Optimiser, schedule, checkpoints


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


def shard(objective: nn.Module, device: torch.device) -> nn.Module:
    """FSDP2 over the head's parameters (ZeRO-3: weights, gradients and AdamW states split across the
    processes; whole only inside the forward and backward). The target is a plain attribute of the head,
    so it stays whole and unsharded on every process."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    return fully_shard(objective, mesh=init_device_mesh(device.type, (dist.get_world_size(),)))


def gathered(model: nn.Module, head: DraftHead, fsdp: bool, main: bool) -> DraftHead | None:
    """The head with whole weights on rank 0 (None elsewhere): the head itself, or under FSDP a twin filled
    from the gathered state (a collective every process must join)."""
    if not fsdp:
        return head if main else None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not main:
        return None
    with torch.device(head.target.device):
        twin = type(head)(head.config, head.target)
    twin.load_state_dict({k.removeprefix("head."): v for k, v in sd.items()})
    return twin


def optimizer_state(model: nn.Module, opt, fsdp: bool) -> dict:
    """What a checkpoint stores of the optimiser: its state dict, or under FSDP the whole one with FQN keys
    (gathered: a collective every process must join)."""
    if not fsdp:
        return opt.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


# ---------------------------------------------------------------------------------------------------
# Set-up helpers


def load_target(tc: DictConfig, dtype, device, seed: int):
    """(target, tokenizer or None, cache key) from a conf/target/*.yaml block."""
    from eaglet.engine.common import random_target, target_path

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
    if hc.get("resize_vocab") and hc.kind != "eagle3":
        raise ValueError(f"train.head.resize_vocab: {hc.kind} heads have no draft vocabulary (EAGLE-3 only)")
    if hc.get("init_from"):
        head = load_draft_head(Path(hc.init_from).expanduser(), target, dtype=torch.float32, device=device)
        if head.KIND != hc.kind:
            raise ValueError(f"train.head.init_from holds a {head.KIND} head but train.head.kind={hc.kind}")
        if hc.get("resize_vocab"):
            head = head.with_draft_vocab(draft_vocab(samples, target.args.vocab_size, hc.draft_vocab_size).to(device))
        return head.train()
    extra = {}
    if hc.kind == "eagle3" and hc.get("aux_layers"):
        extra["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(hc.aux_layers)}
    vocab = hc.get("draft_vocab_size") if hc.kind == "eagle3" else None
    head = new_draft_head(hc.kind, target, num_layers=hc.get("num_layers"), draft_vocab_size=vocab,
                          dtype=torch.float32, device=device, **extra)
    if hc.kind == "eagle3" and head.draft_vocab_size < target.args.vocab_size:
        head.set_draft_vocab(draft_vocab(samples, target.args.vocab_size, head.draft_vocab_size).to(device))
    return head.train()


def copy_head(head: DraftHead, dtype) -> DraftHead:
    """An inference copy of the head in the target's dtype (the engine's pools and kernels use one dtype)."""
    with torch.device(head.device):
        twin = type(head)(head.config, head.target)
    twin.load_state_dict(head.state_dict())
    return twin.to(dtype).eval()


def eval_prompts(ec: DictConfig, dc: DictConfig, tokenizer, vocab_size: int, seed: int) -> list[list[int]]:
    """Prompt token ids for the tau evaluation: held-out ShareGPT (never trained on), another benchmark, or
    (synthetic data) fresh random prompts."""
    from eaglet.data.prompts import load_prompts
    from eaglet.engine.common import encode_turns

    if ec.num_prompts <= 0:
        return []
    if dc.source == "synthetic":
        g = torch.Generator().manual_seed(seed + 1_000_003)
        return [torch.randint(0, vocab_size, (ec.prompt_len,), generator=g).tolist() for _ in range(ec.num_prompts)]
    name = "sharegpt" if ec.data == "heldout" else ec.data
    prompts = load_prompts(name, limit=ec.num_prompts, split="heldout" if name == "sharegpt" else None,
                           path=dc.get("path") if name == "sharegpt" else None)
    ids = [encode_turns(tokenizer, [{"role": "user", "content": p.turns[0]}], True) for p in prompts]
    return [p for p in ids if len(p) <= ec.max_prompt_len]


def evaluate_tau(target: Transformer, head: DraftHead, tree_cfg, prompts: list[list[int]], max_new_tokens: int,
                 batch_size: int, eos_ids) -> dict:
    """Greedy decoding of `prompts` with the real EagleEngine and this head -> {"tau", "accept_rate_depth", "acc"}.
    acc [steps]: each draft step's teacher-forced accuracy on the same answers (the target's own), which is what
    train/acc_k measures on training batches: side by side they show the generalisation gap (the engine accepts
    exactly what this forward predicts: training/chain_replay.py).

    The decoding runs with the target's invariant numerics, as `run_spec.py` does by default: the answers are then
    the target's plain greedy answers whatever the head. With the fastest kernels per shape, a bf16 speculative
    answer depends on the head's accept pattern (the verify's shapes), so two evaluations one optimiser step apart
    could score different texts (an H200 run logged eval/acc_0 0.482 and 0.464 at steps 1,526 and 1,527; how much
    of that was the texts was not measured)."""
    from eaglet.engine.requests import Request
    from eaglet.engine.eagle import EagleEngine, TreeSpec

    tree = TreeSpec(tree_cfg.steps, tree_cfg.topk, tree_cfg.num_draft_tokens)
    ctx = min(max(len(p) for p in prompts) + max_new_tokens + 1, target.args.max_seq_len)
    draft = copy_head(head, target.dtype)
    engine = EagleEngine(target, draft, tree, max_batch=min(batch_size, len(prompts)), max_context=ctx,
                         eos_ids=sorted(eos_ids), use_cuda_graph=False)
    reqs = [Request(list(p), max_new_tokens, rid=i) for i, p in enumerate(prompts)]
    numerics = target.invariant
    try:
        target.set_invariant(True)
        s = engine.generate(reqs).summary(tree.steps)
    finally:
        target.set_invariant(numerics)  # the teacher-forced pass below: the training's numerics
    feats = OnlineFeatures(target, draft)
    hits = torch.cat([step_hits(target, draft, feats, r.prompt_ids + r.output_ids, len(r.prompt_ids), tree.steps)
                      for r in reqs])  # [rows, steps]
    acc = (hits.float().sum(0) / max(len(hits), 1)).tolist()
    return {"tau": s["tau"], "accept_rate_depth": s["accept_rate_depth"], "acc": acc}


# ---------------------------------------------------------------------------------------------------
# The loop


def train(cfg: DictConfig, output_dir: str | Path, target: Transformer | None = None, tokenizer=None) -> dict:
    """Train a draft head as `cfg` (conf/train_draft.yaml) says; returns the metrics written to metrics.json.
    `target`/`tokenizer` replace cfg.target (an already loaded model; tests pass tiny ones)."""
    with Interrupts() as interrupts:  # SIGINT / SIGTERM: at once while setting up, then at a step boundary
        return _train(cfg, output_dir, target, tokenizer, interrupts)


def _train(cfg: DictConfig, output_dir, target: Transformer | None, tokenizer, interrupts: Interrupts) -> dict:
    from eaglet.engine.common import resolve_hardware, trace_steps

    console_logging()
    validate_train_draft(cfg, run_dir=output_dir, given_target=target is not None)
    tc, hc, oc, ec = cfg.train, cfg.train.head, cfg.train.optim, cfg.eval
    fsdp = bool(tc.get("fsdp"))
    dd = Dist()
    device, dtype = resolve_hardware(cfg.hardware)
    if device.type == "cuda" and dd.world > 1:
        device = torch.device("cuda", dd.local_rank)
        torch.cuda.set_device(device)
    dd.init(device.type)
    # every process must write to one run directory: rank 0's (Hydra's ${now:...} may differ per process)
    run_dir = Path(dd.broadcast(str(output_dir)))
    best_file = run_dir / "head_best" / "eval.json"  # survives a resume, so a resumed run keeps the best so far
    say = log.info if dd.main else (lambda *a, **k: None)
    t_start = time.perf_counter()

    # ---- target, data, head -------------------------------------------------------------------------
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
    cache_dir = cache_dir.expanduser()
    samples = load_samples(cfg.data, target, tokenizer, cache_dir, target_key, eos, cfg.seed, dd.rank, dd.world,
                           dd.barrier, say)
    if not samples:
        raise ValueError("no training sequence has an assistant token; check data.* (limit, max_len)")
    torch.manual_seed(cfg.seed)
    head = build_head(hc, target, samples, device)
    objective = DraftObjective(head, hc)
    if tc.get("compile"):
        # one compiled graph for the unrolled head and its loss, dynamic over batch lengths: eagerly a step issues
        # thousands of ATen ops, and on an H200 it was host-bound on them (benchmarks/NOTES.md). The method, not
        # the module, so DDP's and FSDP's hooks stay outside the graph.
        objective.forward = torch.compile(objective.forward, dynamic=True)

    # ---- resume (the weights before sharding, the optimiser's state once it exists) ---------------------
    start_step, position, state = 0, 0, None  # position: global micro-batches consumed (the data position)
    ckpt = dd.broadcast(pick_checkpoint(tc.resume, run_dir) if dd.main else None)  # the newest that verifies
    if ckpt is None and dd.main:  # a fresh start: what another run left in this directory goes
        for leftover in ("train_log.jsonl", "metrics.json"):
            (run_dir / leftover).unlink(missing_ok=True)
        for leftover in (best_file.parent, run_dir / "head"):
            shutil.rmtree(leftover, ignore_errors=True)
    if ckpt is not None:
        state = load_checkpoint(ckpt, head)
        if bool(state.get("fsdp", False)) != fsdp:
            raise ValueError(f"{ckpt}: saved with train.fsdp={bool(state.get('fsdp', False))}, this run has "
                             f"train.fsdp={fsdp}: the optimiser states are stored differently; resume with the same "
                             f"setting")
    model: nn.Module = objective
    if fsdp:
        model = shard(objective, device)
    elif dd.world > 1:
        # the buffers (EAGLE-3's d2t/t2d) are equal on every process (same data, same vocabulary)
        model = nn.parallel.DistributedDataParallel(objective, device_ids=[device.index] if device.type == "cuda"
                                                    else None)
    opt, sched = make_optimizer(head, oc, tc.steps)
    if state is not None:
        restore_training_state(state, model, opt, sched, fsdp)
        start_step, position = int(state["step"]), int(state["micro_position"])
        if state["global_batch"] != tc.batch_size * dd.world or state["grad_accum"] != tc.grad_accum:
            raise ValueError(f"{ckpt}: saved with global batch {state['global_batch']} x accumulation "
                             f"{state['grad_accum']}, this run has {tc.batch_size * dd.world} x {tc.grad_accum}: "
                             f"the data position would not mean the same; resume with the same batch settings")
        log_path = run_dir / "train_log.jsonl"
        if dd.main and log_path.is_file():  # drop what was logged after the checkpoint: those steps rerun
            kept = [line for line in log_path.read_text().splitlines() if json.loads(line)["step"] <= start_step]
            log_path.write_text("".join(line + "\n" for line in kept))
        say(f"resumed from {ckpt} at step {start_step}")

    # ---- features ---------------------------------------------------------------------------------------
    online = OnlineFeatures(target, head)
    if cfg.features.mode == "offline":
        fdir = Path(cfg.features.dir or run_dir / "features")
        size = cache_bytes([len(s.ids) for s in samples], head.feature_size, target.args.dim, target.dtype)
        say(f"offline feature cache: {size / 2**30:.2f} GiB for {len(samples)} sequences -> {fdir}")
        build_offline_cache(fdir, [s.ids for s in samples], list(range(dd.rank, len(samples), dd.world)), online,
                            batch_size=cfg.features.batch_size, shard_mb=cfg.features.shard_mb, tag=f"r{dd.rank}")
        dd.barrier()
        offline = OfflineFeatures(fdir, device)
        features = lambda tokens, idx: offline(idx, tokens.shape[1])  # noqa: E731
    elif cfg.features.mode == "online":
        features = lambda tokens, idx: online(tokens)  # noqa: E731
    else:
        raise ValueError(f"features.mode={cfg.features.mode!r}; choose online or offline")

    schedule = BatchSchedule([len(s.ids) for s in samples], tc.batch_size, dd.world, dd.rank, cfg.seed,
                             tc.group_by_length)
    prompts = eval_prompts(ec, cfg.data, tokenizer, target.args.vocab_size, cfg.seed) if dd.main else []
    config = OmegaConf.to_container(cfg, resolve=True)
    env = environment(device)
    tracker = Tracker(cfg.logger, {**config, "env": env}, run_dir) if dd.main else None
    n_tok = sum(len(s.ids) for s in samples)
    n_asst = sum(int(s.mask.sum()) for s in samples)
    say(f"train {hc.kind} head ({sum(p.numel() for p in head.parameters()) / 1e6:.1f}M params, draft vocab "
        f"{head.draft_vocab_size}) for {target_name} on {len(samples)} sequences ({n_tok} tokens, {n_asst} "
        f"assistant); {dd.world} process(es) x batch {tc.batch_size} x accumulation {tc.grad_accum}, "
        f"{tc.steps} steps, TTT length {objective.steps}, device {env['device_name']}")

    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" and tc.bf16
                else contextlib.nullcontext())
    steps = objective.steps
    window = torch.zeros(steps, len(STATS), dtype=torch.float64, device=device)  # stats since the last log
    win_loss = torch.zeros((), dtype=torch.float64, device=device)  # summed step losses since the last log
    win_tokens, win_steps, win_t0, win_pause = 0, 0, time.perf_counter(), 0.0
    last_log: dict = {}
    evals: list[dict] = []
    tokens_total = int(state["tokens_seen"]) if state is not None else 0
    step, last_saved = start_step, start_step if ckpt is not None else -1
    stop_at = tc.stop_at_step if tc.get("stop_at_step") is not None else tc.steps
    time_limit = tc.get("time_limit_s")
    bar = tqdm(total=tc.steps, initial=start_step, disable=not (dd.main and tc.progress), dynamic_ncols=True)
    scope = contextlib.ExitStack()  # what the loop runs inside, closed after it
    on_step = scope.enter_context(trace_steps((tc.get("profile_steps") or 0) if dd.main else 0, run_dir))  # trace
    scope.enter_context(logging_redirect_tqdm())  # log lines printed around the progress bar
    interrupts.defer("stopping after this step, with a checkpoint (Ctrl-C again stops at once, without one)")

    def paused(fn):
        """Run fn with its time kept out of train/tokens_per_s (the device drained first)."""
        def run(*args, **kw):
            nonlocal win_pause
            if device.type != "cpu":
                torch.get_device_module(device).synchronize(device)
            t0 = time.perf_counter()
            fn(*args, **kw)
            win_pause += time.perf_counter() - t0
        return run

    @paused
    def checkpoint(at: int) -> None:
        nonlocal last_saved
        whole, opt_state = gathered(model, head, fsdp, dd.main), optimizer_state(model, opt, fsdp)
        if dd.main:
            save_checkpoint(run_dir, at, whole, {
                "step": at, "micro_position": position, "optimizer": opt_state, "fsdp": fsdp,
                "scheduler": sched.state_dict(), "rng": rng_state(), "global_batch": tc.batch_size * dd.world,
                "grad_accum": tc.grad_accum, "tokens_seen": tokens_total}, tc.keep_last)
        last_saved = at
        dd.barrier()

    @paused
    def run_eval(at: int) -> None:
        whole = gathered(model, head, fsdp, dd.main)
        if dd.main and prompts:
            r = evaluate_tau(target, whole, cfg.tree, prompts, ec.max_new_tokens, ec.batch_size, eos)
            evals.append({"step": at, **r})
            if not best_file.is_file() or r["acc"][0] > json.loads(best_file.read_text())["acc"][0]:
                whole.save_pretrained(best_file.parent, dtype=EXPORT_DTYPES[hc.export_dtype])
                best_file.write_text(json.dumps({"step": at, **r}))
            tracker.log({"eval/tau": r["tau"], **{f"eval/acc_{k}": a for k, a in enumerate(r["acc"])}}, step=at)
            say(f"step {at}: eval/tau {r['tau']:.3f}, eval/acc_0 {r['acc'][0]:.3f} on "
                f"{len(prompts)} held-out prompts")
        dd.barrier()

    stopped, signum = None, 0  # the signal that stopped the run; any signal, as every process agreed
    try:
        while step < min(tc.steps, stop_at):
            # ---- one optimiser step -------------------------------------------------------------------
            local = [schedule.local_batch(position + j) for j in range(tc.grad_accum)]
            batches = [(*collate(samples, idx), idx) for idx in local]
            loss_sum, stats = accumulate_gradients(model, dd, batches, features, steps, autocast)
            window += stats
            win_tokens += sum(len(samples[i].ids) for idx in local for i in idx)
            grad_norm = torch.nn.utils.clip_grad_norm_(head.parameters(), oc.grad_clip or math.inf)  # pre-clip norm
            if hasattr(grad_norm, "full_tensor"):  # FSDP: a DTensor over the shards
                grad_norm = grad_norm.full_tensor()
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step, position = step + 1, position + tc.grad_accum
            win_loss += loss_sum
            win_steps += 1
            bar.update(1)
            if on_step is not None:
                on_step()

            if step % tc.log_every == 0 or step == tc.steps:
                w = dd.all_sum(window.clone())
                toks = int(dd.all_sum(torch.tensor(float(win_tokens), device=device)))
                loss_avg = float(dd.all_sum(win_loss.clone())) / dd.world / win_steps
                tokens_total += toks
                dt = time.perf_counter() - win_t0 - win_pause
                last_log = {"train/loss": loss_avg, "train/lr": sched.get_last_lr()[0],
                            "train/grad_norm": float(grad_norm), "train/tokens_per_s": toks / dt,
                            **window_metrics(w, bool(objective.kw["v_weight"]))}
                if dd.main:
                    tracker.log(last_log, step=step)
                    with open(run_dir / "train_log.jsonl", "a") as f:
                        f.write(json.dumps({"step": step, **last_log}) + "\n")
                    bar.set_postfix(loss=f"{last_log['train/loss']:.3f}", acc_0=f"{last_log['train/acc_0']:.3f}",
                                    lr=f"{last_log['train/lr']:.2e}")
                window.zero_()
                win_loss.zero_()
                win_tokens, win_steps, win_t0, win_pause = 0, 0, time.perf_counter(), 0.0
            if tc.ckpt_every > 0 and step % tc.ckpt_every == 0:
                checkpoint(step)
            # every process stops at the same step, whichever received the signal or ran out of time
            signum, time_up = dd.any_stop(interrupts.signum, time_limit is not None and
                                          time.perf_counter() - t_start > time_limit, device)
            if signum:
                stopped = signal.Signals(signum).name
                break
            if time_up:
                say(f"train.time_limit_s={time_limit} reached at step {step}: stopping (resumable)")
                break
            if ec.every > 0 and step % ec.every == 0 and step < tc.steps:
                run_eval(step)
    finally:  # a second Ctrl-C (KeyboardInterrupt) leaves from here: at once, without a checkpoint
        scope.close()
        bar.close()
    interrupts.note = "writing the checkpoint and the head first (Ctrl-C again stops at once, without them)"
    if step != last_saved:
        checkpoint(step)

    # ---- the end: export, final evaluation, metrics ----------------------------------------------------
    # an unfinished run (stop_at_step, time_limit_s, a signal) exports too, so that its head can be evaluated;
    # metrics.json says finished=false, and a resumed run exports again at its end
    finished = step >= tc.steps
    stopped = None if finished else stopped  # a signal during the last step: the run is whole all the same
    whole = gathered(model, head, fsdp, dd.main)
    head_dir = whole.save_pretrained(run_dir / "head", dtype=EXPORT_DTYPES[hc.export_dtype]) if dd.main else None
    if ec.every > 0 and not signum:  # a signalled job has seconds left (SLURM, Kubernetes): no evaluation
        run_eval(step)
    train_s = time.perf_counter() - t_start
    metrics = {
        "steps": step, "finished": finished, **({"interrupted": stopped} if stopped else {}),
        "head_dir": None if head_dir is None else str(head_dir),
        "head_kind": hc.kind, "draft_vocab_size": head.draft_vocab_size, "ttt_length": steps,
        "num_sequences": len(samples), "num_tokens": n_tok, "assistant_tokens": n_asst,
        "world_size": dd.world, "train_s": train_s, "tokens_seen": tokens_total,
        "peak_memory_gb": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        **last_log,
        "eval/tau": evals[-1]["tau"] if evals else None, "eval/acc_0": evals[-1]["acc"][0] if evals else None,
        "eval_history": evals,
        "head_best": json.loads(best_file.read_text()) if best_file.is_file() else None,
        **env, "config": config,
    }
    if dd.main:
        say(f"{'stopped by ' + stopped + ' after' if stopped else 'done:'} {step} of {tc.steps} steps in "
            f"{train_s:.1f}s; " + ", ".join(f"{k} {metrics[k]:.4g}" for k in ("train/loss", "train/acc_0",
                                                                            "eval/acc_0", "eval/tau")
                                          if metrics.get(k) is not None))
        if not finished:
            say(f"checkpoint at step {step} in {run_dir}: {rerun_hint(run_dir)}")
        where = tracker.location()
        say(f"metrics: {tracker.finish(metrics)}")
        say(f"head: {head_dir}")
        if where:
            say(where)
    dd.close()
    return metrics
