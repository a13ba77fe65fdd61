"""train_draft.py's config checked before anything loads: runner/config.py's layers (values, inputs, device)
for conf/train_draft.yaml's groups and keys. A bad value is one line, `key=value: what is allowed`."""

from __future__ import annotations

import json
import os
from pathlib import Path

from omegaconf import DictConfig

from eaglet.engine.drafters.eagle_config import HEAD_KINDS
from eaglet.runner.checks import Checks
from eaglet.runner.config import (
    DTYPE_NAMES,
    check_hardware,
    check_logger,
    check_memory,
    check_target,
    check_tree,
    kv_pool_bytes,
    parameter_count,
    resolve_hardware,
    target_args,
    target_key,
)

TRAIN_KINDS = HEAD_KINDS + ("block",)  # EAGLE heads and block drafters (models.head_checkpoint.KINDS, torch-free)
VOCAB_KINDS = ("eagle3", "block")  # the kinds with a draft vocabulary (models/eagle.py's DraftVocab), torch-free


def check_head(c: Checks) -> None:
    """train/head/*.yaml."""
    kind = c.choice("train.head.kind", TRAIN_KINDS)
    c.choice("train.head.export_dtype", DTYPE_NAMES)
    c.path("train.head.init_from", "dir", null=True, what="a head directory (config.json + model.safetensors)")
    if kind == "block":
        check_block_head(c)
        check_resize_vocab(c, kind)
        return
    steps = c.integer("train.head.ttt_length", lo=1)
    c.number("train.head.step_weight", lo=0, lo_open=True)
    c.number("train.head.accept_weight", lo=0)
    if kind in ("eagle1", "multi_layer"):
        c.number("train.head.v_weight", lo=0)
        c.number("train.head.p_weight", lo=0)
    if kind == "eagle3":
        c.integer("train.head.draft_vocab_size", lo=1)
        aux = c.value("train.head.aux_layers")
        if aux is not None and not (len(aux) == 3 and all(isinstance(a, int) and a >= 0 for a in aux)):
            c.bad("train.head.aux_layers", aux, "must be null or three target layer indices, e.g. [1,14,26]")
    if c.has("train.head.num_layers"):
        layers = c.integer("train.head.num_layers", lo=1)
        if kind == "multi_layer" and layers is not None and steps is not None and steps < layers:
            c.bad("train.head.ttt_length", steps, f"must be >= train.head.num_layers={layers}: unrolled step i trains "
                                                   f"layer i, so unroll at least as many steps as layers")
    check_resize_vocab(c, kind)


def check_resize_vocab(c: Checks, kind: str | None) -> None:
    """train.head.resize_vocab: a warm start's new draft vocabulary, for the kinds that have one."""
    if c.value("train.head.resize_vocab"):
        if kind not in VOCAB_KINDS:
            c.bad("train.head.resize_vocab", True, f"{kind} heads have no draft vocabulary (EAGLE-3 and block)")
        elif c.value("train.head.init_from") is None:
            c.bad("train.head.resize_vocab", True, "resizes a warm-started head's vocabulary: set train.head.init_from")
    elif c.has("train.head.resize_vocab"):
        c.flag("train.head.resize_vocab")


def check_block_head(c: Checks) -> None:
    """train/head/block.yaml."""
    layers = c.integer("train.head.num_layers", lo=1)
    start = c.value("train.head.init_from")
    if start is not None and layers is not None and (Path(start).expanduser() / "config.json").is_file():
        # a warm start grows to num_layers (BlockHead.with_layers) and never drops a layer
        have = json.loads((Path(start).expanduser() / "config.json").read_text()).get("num_hidden_layers")
        if isinstance(have, int) and layers < have:
            c.bad("train.head.num_layers", layers, f"must be >= {have}, the layers of train.head.init_from's drafter "
                                                   f"(a warm start adds layers, it does not drop them)")
    block = c.integer("train.head.block_size", lo=2)
    c.integer("train.head.dep_rank", lo=1)
    if c.has("train.head.draft_vocab_size"):  # absent: configs written before the key (the full vocabulary)
        c.integer("train.head.draft_vocab_size", lo=1, null=True)
    c.integer("train.head.anchors", lo=1)
    c.number("train.head.decay", lo=0, lo_open=True)
    c.number("train.head.ce_weight", lo=0)
    c.number("train.head.kl_weight", lo=0)
    steps = c.value("tree.steps")
    if block is not None and isinstance(steps, int) and c.value("eval.every") and steps > block - 1:
        c.bad("tree.steps", steps, f"the evaluation's tree drafts at most train.head.block_size - 1 = {block - 1} "
                                   f"depths; lower tree.steps or raise train.head.block_size")
    ids = c.value("train.head.target_layer_ids")
    if ids is not None and not (len(ids) and all(isinstance(i, int) and i >= 0 for i in ids)
                                and list(ids) == sorted(set(ids))):
        c.bad("train.head.target_layer_ids", ids, "must be null or increasing target layer indices, e.g. "
                                                  "[1,8,14,21,27]")


def check_optim(c: Checks) -> None:
    """train/optim/*.yaml."""
    c.choice("train.optim.name", ("adamw",))
    c.number("train.optim.lr", lo=0)
    betas = c.value("train.optim.betas")
    if betas is None or len(betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas):
        c.bad("train.optim.betas", betas, "must be two numbers in [0, 1), e.g. [0.9,0.95]")
    c.number("train.optim.eps", lo=0, lo_open=True)
    c.number("train.optim.weight_decay", lo=0)
    c.integer("train.optim.warmup_steps", lo=0)
    c.number("train.optim.min_lr_ratio", lo=0, hi=1)
    c.number("train.optim.grad_clip", lo=0)


def check_train_data(c: Checks) -> None:
    """data.* of conf/train_draft.yaml (the keys this checkout knows; others are left alone)."""
    source = c.choice("data.source", ("sharegpt", "selfgen", "synthetic"))
    c.path("data.path", "file", null=True, what="a ShareGPT JSON file")
    c.integer("data.limit", lo=1, null=True)
    c.integer("data.max_turns", lo=1, null=True)
    c.integer("data.max_len", lo=2)
    regenerate = c.flag("data.regenerate")
    c.text("data.cache_dir", null=True)
    r = "data.regen"
    c.integer(f"{r}.max_new_tokens", lo=1)
    temperature = c.number(f"{r}.temperature", lo=0)
    c.number(f"{r}.top_p", lo=0, hi=1, lo_open=True)
    c.integer(f"{r}.batch_size", lo=1)
    c.integer(f"{r}.max_context", lo=2)
    c.integer(f"{r}.chunk", lo=1)
    samples = c.integer(f"{r}.samples", lo=1)
    if samples is not None and samples > 1 and (not regenerate or temperature == 0):
        c.bad(f"{r}.samples", samples, "more than 1 needs data.regenerate=true and data.regen.temperature > 0 "
                                       "(greedy answers to one prompt are all the same)")
    if source == "selfgen":
        c.path("data.selfgen.dir", "dir", what="synthesize.py's out_dir (recipe.json, index.json, chunks/)")
        c.integer("data.selfgen.chunks", lo=1, null=True)
    if source == "synthetic":
        s = "data.synthetic"
        num = c.integer(f"{s}.num", lo=1)
        lo = c.integer(f"{s}.min_len", lo=2)
        c.integer(f"{s}.max_len", lo=lo or 2)
        c.number(f"{s}.prompt_frac", lo=0, hi=1)
        batch = c.value("train.batch_size")
        if isinstance(num, int) and isinstance(batch, int) and batch >= 1 and num < batch:
            c.bad(f"{s}.num", num, f"must be >= train.batch_size={batch} (one micro-batch of sequences at least)")


def check_train(c: Checks) -> None:
    """train.*, features.*, eval.*: the loop's own keys."""
    steps = c.integer("train.steps", lo=1)
    c.integer("train.batch_size", lo=1)
    c.integer("train.grad_accum", lo=1)
    for key in ("train.group_by_length", "train.bf16", "train.progress", "train.fsdp", "train.compile"):
        c.flag(key)
    c.integer("train.log_every", lo=1)
    c.integer("train.ckpt_every", lo=0)
    c.integer("train.keep_last", lo=0)
    c.integer("train.stop_at_step", lo=1, hi=steps, null=True)
    c.number("train.time_limit_s", lo=0, null=True)
    c.integer("train.profile_steps", lo=0)
    resume = c.value("train.resume")
    if resume not in (None, False, "auto", "none", "null"):
        c.path("train.resume", "dir", what="auto, null, a checkpoint directory (step_*) or a run directory")
    c.choice("features.mode", ("online", "offline"))
    c.text("features.dir", null=True)
    c.integer("features.shard_mb", lo=0)
    c.integer("features.batch_size", lo=1)
    c.integer("eval.every", lo=0)
    c.choice("eval.data", ("heldout", "mt_bench", "humaneval"))
    for key, lo in (("eval.num_prompts", 0), ("eval.max_prompt_len", 1), ("eval.prompt_len", 1),
                    ("eval.max_new_tokens", 1), ("eval.batch_size", 1)):
        c.integer(key, lo=lo)


def check_train_draft_values(c: Checks, given_target: bool = False) -> None:
    c.integer("seed")
    if not given_target:
        check_target(c)
    check_hardware(c)
    check_logger(c)
    check_head(c)
    check_optim(c)
    check_tree(c)
    check_train_data(c)
    check_train(c)
    if c.value("train.fsdp") and int(os.environ.get("WORLD_SIZE", "1")) == 1:
        c.bad("train.fsdp", True, "shards the head across the processes of a torchrun job, and this is one process: "
                                  "start it with torchrun --nproc-per-node N (N >= 2), or set train.fsdp=false")
    if not given_target and c.value("target.random") and c.value("data.source") == "sharegpt":
        c.bad("data.source", "sharegpt", f"target={c.value('target.name')} has random weights and no tokenizer: use "
                                         f"data.source=synthetic")


def check_run_dir(c: Checks, run_dir) -> None:
    """A fresh run (train.resume=null) must not land among another run's checkpoints: a later resume would pick the
    newest step of either."""
    if run_dir is None or c.value("train.resume") not in (None, False, "none", "null"):
        return
    found = sorted(p.name for p in (Path(run_dir) / "checkpoints").glob("step_*"))
    if found:
        c.bad("train.resume", None, f"starts afresh, but {run_dir} holds another run's checkpoints ({found[-1]}, ...): "
                                    f"train.resume=auto continues that run; or choose another hydra.run.dir")


def check_train_draft_device(c: Checks, given_target: bool = False) -> None:
    """The hardware, and the target's weights plus the regeneration's KV pool against the device's free memory
    (the head and its optimiser are not counted; nor anything, when the caller passes a loaded target)."""
    import torch

    cfg = c.cfg
    with c.catching():
        device, dtype = resolve_hardware(cfg.hardware)
    if c.errors or given_target:
        return
    try:
        args = target_args(cfg.target)
    except (ValueError, OSError) as e:
        c.bad(*target_key(cfg.target), str(e).splitlines()[0])
        return
    size = torch.tensor([], dtype=dtype).element_size()
    params = parameter_count(args)
    parts = {"target weights": params * (max(size, 4) if cfg.target.get("random") else size)}
    if cfg.data.regenerate:
        rc = cfg.data.regen
        ctx = min(rc.max_context, args.max_seq_len)
        parts[f"regeneration KV pool (batch {rc.batch_size} x {ctx} tokens)"] = kv_pool_bytes(
            args, args.n_layers, rc.batch_size, ctx, 16, None, size)
    check_memory(c, parts, device, "target", cfg.target.name, "lower data.regen.batch_size or "
                 "data.regen.max_context, use hardware.dtype=bfloat16, or a larger device")


def validate_train_draft(cfg: DictConfig, run_dir=None, given_target: bool = False) -> None:
    """Raise ConfigError (every bad value, one line each) unless train_draft.py can run `cfg` in `run_dir`.
    given_target: train() got a loaded target (tests): the target block is not checked."""
    c = Checks(cfg)
    for layer in (lambda c: check_train_draft_values(c, given_target), lambda c: check_run_dir(c, run_dir),
                  lambda c: check_train_draft_device(c, given_target)):
        layer(c)
        c.raise_if_bad()
