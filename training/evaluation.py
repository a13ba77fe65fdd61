"""Evaluation during training: the real SpeculativeEngine's tau on held-out prompts with the head as it is, each
draft step's teacher-forced accuracy on the same answers, and head_best/ (the head of the best eval/acc_0 so far)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from omegaconf import DictConfig

from eaglet.models.eagle import DraftHead
from eaglet.models.head_checkpoint import save_draft_head
from eaglet.models.llama import Transformer
from eaglet.training.block_loss import block_hits
from eaglet.training.chain_replay import step_hits
from eaglet.training.features import OnlineFeatures


def copy_head(head: DraftHead, dtype) -> DraftHead:
    """An inference copy of the head in the target's dtype (the engine's pools and kernels use one dtype)."""
    with torch.device(head.device):
        twin = type(head)(head.config, head.target)
    twin.load_state_dict(head.state_dict())
    return twin.to(dtype).eval()


def eval_prompt_ids(ec: DictConfig, dc: DictConfig, tokenizer, vocab_size: int, seed: int) -> list[list[int]]:
    """Prompt token ids for the tau evaluation: held-out ShareGPT (never trained on), another benchmark, or
    (synthetic data) fresh random prompts."""
    from eaglet.data.chat import encode_turns
    from eaglet.data.prompts import load_prompts

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
    """Greedy decoding of `prompts` with the real engine and this head -> {"tau", "accept_rate_depth", "acc"}.
    acc [steps]: each draft step's teacher-forced accuracy on the same answers (the target's own), which is what
    train/acc_k measures on training batches: side by side they show the generalisation gap (the engine accepts
    exactly what this forward predicts: training/chain_replay.py).

    The decoding runs with the target's invariant numerics, as `run_spec.py` does by default: the answers are then
    the target's plain greedy answers whatever the head. With the fastest kernels per shape, a bf16 speculative
    answer depends on the head's accept pattern (the verify's shapes), so two evaluations one optimiser step apart
    could score different texts (an H200 run logged eval/acc_0 0.482 and 0.464 at steps 1,526 and 1,527; how much
    of that was the texts was not measured)."""
    from eaglet.engine.drafter import drafter_class
    from eaglet.engine.requests import Request
    from eaglet.engine.speculative import SpeculativeEngine, TreeSpec

    tree = TreeSpec(tree_cfg.steps, tree_cfg.topk, tree_cfg.num_draft_tokens, tree_cfg.get("root_children"))
    ctx = min(max(len(p) for p in prompts) + max_new_tokens + 1, target.args.max_seq_len)
    draft = copy_head(head, target.dtype)
    block = head.KIND == "block"  # a block drafter (engine/drafters/block.py), else an EAGLE head
    drafter = drafter_class("block" if block else "eagle")(draft)
    engine = SpeculativeEngine(target, drafter, tree, max_batch=min(batch_size, len(prompts)), max_context=ctx,
                               eos_ids=sorted(eos_ids), use_cuda_graph=False)
    reqs = [Request(list(p), max_new_tokens, rid=i) for i, p in enumerate(prompts)]
    numerics = target.invariant
    try:
        target.set_invariant(True)
        s = engine.generate(reqs).summary(tree.steps)
    finally:
        target.set_invariant(numerics)  # the teacher-forced pass below: the training's numerics
    feats = OnlineFeatures(target, draft)
    hits_of = block_hits if block else step_hits
    hits = torch.cat([hits_of(target, draft, feats, r.prompt_ids + r.output_ids, len(r.prompt_ids), tree.steps)
                      for r in reqs])  # [rows, steps]
    acc = (hits.float().sum(0) / max(len(hits), 1)).tolist()
    return {"tau": s["tau"], "accept_rate_depth": s["accept_rate_depth"], "acc": acc}


class Evaluations:
    """A run's evaluations on `prompts` (rank 0 only): their history, the tracker's eval/* keys, and head_best/
    with its eval.json, which survives a resume, so a resumed run keeps the best so far."""

    def __init__(self, target: Transformer, cfg: DictConfig, prompts: list[list[int]], eos_ids, best_dir: Path,
                 export_dtype: torch.dtype, tracker, say):
        self.target, self.tree, self.ec, self.prompts, self.eos = target, cfg.tree, cfg.eval, prompts, eos_ids
        self.best_file = best_dir / "eval.json"
        self.export_dtype, self.tracker, self.say = export_dtype, tracker, say
        self.history: list[dict] = []

    def __call__(self, head: DraftHead, step: int) -> None:
        """Evaluate the (whole) head at `step`; a new best held-out eval/acc_0 replaces head_best/."""
        if not self.prompts:
            return
        ec = self.ec
        r = evaluate_tau(self.target, head, self.tree, self.prompts, ec.max_new_tokens, ec.batch_size, self.eos)
        self.history.append({"step": step, **r})
        if self.best() is None or r["acc"][0] > self.best()["acc"][0]:
            save_draft_head(head, self.best_file.parent, dtype=self.export_dtype)
            self.best_file.write_text(json.dumps({"step": step, **r}))
        self.tracker.log({"eval/tau": r["tau"], **{f"eval/acc_{k}": a for k, a in enumerate(r["acc"])}}, step=step)
        self.say(f"step {step}: eval/tau {r['tau']:.3f}, eval/acc_0 {r['acc'][0]:.3f} on "
                 f"{len(self.prompts)} held-out prompts")

    def best(self) -> dict | None:
        """head_best/eval.json: the step and results of the best evaluation so far, this run's or a resumed one's."""
        return json.loads(self.best_file.read_text()) if self.best_file.is_file() else None

    def summary(self) -> dict:
        """The metrics.json keys: the last evaluation's eval/tau and eval/acc_0, the history, the best."""
        last = self.history[-1] if self.history else None
        return {"eval/tau": last["tau"] if last else None, "eval/acc_0": last["acc"][0] if last else None,
                "eval_history": self.history, "head_best": self.best()}
