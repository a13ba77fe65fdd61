"""`run(cfg, output_dir) -> metrics`: what `run_spec.py` does, as a plain function (tests call it too).

The config is checked before anything loads (runner/config.py), and the results of an earlier run in a reused run
directory are removed. Then, in the run directory: `outputs.jsonl` gets one line per answer as it finishes
(flushed), and `metrics.json` is written at the end. SIGINT or SIGTERM stops decoding at once; the answers
finished so far stay, and metrics.json holds the numbers of what ran, with `finished: false`.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from eaglet.data.chat import encode_turns
from eaglet.engine.autoregressive import AREngine, GenStats
from eaglet.engine.drafter import drafter_class
from eaglet.engine.drafters.ngram import NgramBranches
from eaglet.engine.requests import Request
from eaglet.engine.sampling import SamplingParams
from eaglet.engine.speculative import SimulatedAcceptance, SpeculativeEngine, StepStats, TreeSpec
from eaglet.engine.stream_plan import StreamPlan, resolve_plan
from eaglet.kernels._utils import copy_bandwidth
from eaglet.models.kv_cache import KVCache
from eaglet.models.llama import Transformer
from eaglet.runner.checks import ConfigError
from eaglet.runner.common import random_target, resolve_hardware, target_path, trace_steps
from eaglet.runner.config import validate_run_spec
from eaglet.runner.entry import console_logging
from eaglet.runner.signals import Interrupted, Interrupts
from eaglet.runner.tracking import Tracker, environment

log = logging.getLogger("eaglet")
RESULTS = ("metrics.json", "outputs.jsonl", "trace.json")  # what a run writes in its directory (W&B runs aside)
AR_PASS = "plain decoding, for speedup_vs_ar"


def clear_stale(out_dir: Path) -> None:
    """Remove an earlier run's results from a reused run directory, so that none sits beside this run's config."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stale = [name for name in RESULTS if (out_dir / name).is_file()]
    for name in stale:
        (out_dir / name).unlink()
    if stale:
        log.info(f"{out_dir} held an earlier run's {', '.join(stale)}: removed")


class AnswerLog:
    """outputs.jsonl: one line per answer, written and flushed as it finishes (so in finishing order):
    prompt_id, turn (0-based), prompt (the user turn answered), text, token_ids, finish_reason."""

    def __init__(self, path: Path, prompts: list, tokenizer, eos: set[int]):
        self.path, self.prompts, self.tokenizer, self.eos = path, prompts, tokenizer, eos
        self.records: dict[tuple[int, int], dict] = {}  # (prompt index, turn) -> its line
        self.file = open(path, "a", encoding="utf-8")

    def write(self, r: Request, turn: int) -> None:
        ids = [t for t in r.output_ids if t not in self.eos]
        text = "" if self.tokenizer is None else self.tokenizer.decode(ids, skip_special_tokens=True)
        p = self.prompts[r.rid]
        rec = {"prompt_id": p.id, "turn": turn, "prompt": p.turns[turn], "text": text, "token_ids": r.output_ids,
               "finish_reason": r.finish_reason}
        self.file.write(json.dumps(rec) + "\n")
        self.file.flush()
        self.records[(r.rid, turn)] = rec

    def close(self) -> None:
        self.file.close()


class DecodePass:
    """One decode pass over the prompts' turns: a tqdm bar named after it (answers done, tokens, tokens/s, ETA),
    the stats of each generate call (an interrupted call's included), and the finished answers' tokens."""

    def __init__(self, name: str, total: int, on_answer=None):
        self.name, self.on_answer = name, on_answer
        self.bar = tqdm(total=total, desc=name, unit="answer", dynamic_ncols=True)
        self.runs: list = []  # GenStats or StepStats, one per generate call
        self.outputs: dict[tuple[int, int], list[int]] = {}  # (prompt index, turn) -> output ids, finished answers
        self.prompt_ids: dict[tuple[int, int], list[int]] = {}
        self.tokens = self.started = 0  # tokens emitted; requests with a first token (each from its prefill)
        self.t0 = self._shown = None

    def generate(self, engine, reqs: list[Request], stats, turn: int, on_step=None):
        self.runs.append(stats)
        self.t0 = self.t0 or time.perf_counter()
        self._shown = self._shown or self.t0
        for r in reqs:
            self.prompt_ids[(r.rid, turn)] = r.prompt_ids

        def token(r: Request, t: int) -> None:
            self.tokens += 1
            self.started += len(r.output_ids) == 1
            if r.done:
                self.outputs[(r.rid, turn)] = r.output_ids
                self.bar.update(1)
                if self.on_answer is not None:
                    self.on_answer(r, turn)

        def step() -> None:
            if on_step is not None:
                on_step()
            if time.perf_counter() - self._shown > 0.5:  # the bar moves per answer; its tokens/s twice a second
                self._show()

        return engine.generate(reqs, on_token=token, on_step=step, stats=stats)

    def _show(self) -> None:
        self._shown = now = time.perf_counter()
        self.bar.set_postfix_str(f"{self.tokens} tokens, {self.tokens / max(now - self.t0, 1e-9):.1f} tokens/s")

    def close(self) -> None:
        if self.t0 is not None and not self.bar.disable:  # once: a closed bar is disabled
            self._show()
        self.bar.close()


def run(cfg: DictConfig, output_dir: str | Path) -> dict:
    with Interrupts() as interrupts:  # SIGINT / SIGTERM: decoding stops at once, the results are written whole
        return _run(cfg, Path(output_dir), interrupts)


def _run(cfg: DictConfig, out_dir: Path, interrupts: Interrupts) -> dict:
    from eaglet.data.prompts import Prompt, load_prompts
    from eaglet.models.checkpoint import load_tokenizer

    console_logging()
    validate_run_spec(cfg)
    clear_stale(out_dir)
    torch.manual_seed(cfg.seed)
    device, dtype = resolve_hardware(cfg.hardware)
    t0 = time.perf_counter()
    if cfg.target.get("random"):
        path, tokenizer = None, None
        model = random_target(cfg.target.random, dtype, device)
    else:
        path = target_path(cfg.target)
        model = Transformer.from_pretrained(path, dtype=dtype, device=device)
        tokenizer = load_tokenizer(path)
    load_s = time.perf_counter() - t0
    if cfg.fold_norms and (model.args.attention_bias or model.args.qk_norm):
        log.info(f"fold_norms: {model.args.family} keeps its norm weights (qkv bias / q-k norms): the projections "
                 f"apply them")
    elif cfg.fold_norms:
        model.fold_norm_weights()
    model.set_invariant(cfg.invariant)
    max_context = min(cfg.gen.max_context, model.args.max_seq_len)
    batch_size = cfg.gen.batch_size
    eos = set(model.args.eos_token_ids)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    if tokenizer is None:
        eos = set()  # random weights (data=synthetic, validated): every request decodes its whole budget
    sampling = SamplingParams(cfg.gen.temperature, cfg.gen.top_p)
    graphs = cfg.gen.cuda_graph and device.type == "cuda"
    plan = resolve_plan(cfg.stream, device)
    log.info(plan.describe())
    ar_engine = None  # built only when it runs: its KV pool is as large as the speculative one
    if cfg.draft.name == "none" or cfg.gen.compare_ar:
        kv = KVCache.for_model(model.args, max_reqs=batch_size, max_context=max_context,
                               page_size=cfg.kv.page_size, num_pages=cfg.kv.num_pages, dtype=dtype, device=device)
        ar_engine = AREngine(model, kv, batch_size, sampling, eos_ids=sorted(eos), use_cuda_graph=graphs,
                             seed=cfg.seed)
    engine = ar_engine
    if cfg.draft.name != "none":
        drafter = drafter_class(cfg.draft.drafter).from_config(cfg.draft, cfg.target, model, invariant=cfg.invariant,
                                                               fold_norms=cfg.fold_norms)
        if cfg.draft.get("ngram_branches"):  # K n-gram branches grafted onto any drafter's tree
            drafter = NgramBranches(drafter, cfg.draft.ngram_branches, depth=cfg.draft.get("ngram_depth"))
        tree = TreeSpec(cfg.tree.steps, cfg.tree.topk, cfg.tree.num_draft_tokens, cfg.tree.get("root_children"))
        sim = cfg.tree.get("simulate")
        engine = SpeculativeEngine(model, drafter, tree, max_batch=batch_size, max_context=max_context,
                             page_size=cfg.kv.page_size, num_pages=cfg.kv.num_pages, sampling=sampling,
                             eos_ids=sorted(eos), use_cuda_graph=graphs,
                             simulate=SimulatedAcceptance.from_tau(sim.tau, drafter.depth(tree)) if sim else None,
                             stream_plan=StreamPlan(plan, device, cfg.stream.stress_sleep_cycles))
    if cfg.data.name == "synthetic":
        g = torch.Generator().manual_seed(cfg.seed)
        prompts = [Prompt(f"synthetic-{i}", [""],
                          {"token_ids": torch.randint(0, model.args.vocab_size, (cfg.data.prompt_len,),
                                                      generator=g).tolist()})
                   for i in range(cfg.data.limit)]
    else:
        prompts = load_prompts(cfg.data.name, limit=cfg.data.limit, path=cfg.data.path,
                               max_turns=cfg.data.max_turns, split=cfg.data.split)
        if cfg.data.get("skip_too_long"):
            budget = max_context - cfg.gen.max_new_tokens
            prompts = fitting_prompts(prompts, tokenizer, cfg.gen.chat_template, budget)
            if not prompts:
                raise ConfigError([f"data.skip_too_long=true: no prompt's first turn fits {budget} tokens "
                                   f"(gen.max_context - gen.max_new_tokens); raise gen.max_context or lower "
                                   f"gen.max_new_tokens"])
    config = OmegaConf.to_container(cfg, resolve=True)
    env = environment(device)
    resolved = {"stream_plan": plan.name, "stream_plan_reason": plan.reason}
    tracker = Tracker(cfg.logger, {**config, "env": env, **resolved}, out_dir)
    log.info(f"target={cfg.target.name} ({model.args.family}, {model.args.n_layers} layers) draft={cfg.draft.name} "
             f"device={env['device_name']} dtype={str(dtype).removeprefix('torch.')} prompts={len(prompts)} "
             f"batch={batch_size} loaded in {load_s:.1f}s")

    engine.warmup()  # graph capture and autotuning stay out of the timings
    if engine is not ar_engine and ar_engine is not None:
        ar_engine.warmup()
    total = sum(len(p.turns) for p in prompts)
    answers = AnswerLog(out_dir / "outputs.jsonl", prompts, tokenizer, eos)
    speculative = engine is not ar_engine
    main = DecodePass("speculative" if speculative else "plain decoding", total, on_answer=answers.write)
    plain, stopped = None, None
    with logging_redirect_tqdm():
        try:
            turns_ids = decode_turns(engine, main, prompts, tokenizer, answers, cfg, tracker, out_dir)
            main.close()
            if speculative and ar_engine is not None:
                plain = DecodePass(AR_PASS, total)
                for turn, ids in enumerate(turns_ids):
                    plain.generate(ar_engine, [Request(p, cfg.gen.max_new_tokens, rid=i) for i, p in ids], GenStats(),
                                   turn)
        except Interrupted as e:
            stopped = e.signame
        finally:
            answers.close()
            main.close()
            if plain is not None:
                plain.close()
    interrupts.defer("writing the results of what ran first (Ctrl-C again stops at once, without them)")

    metrics = pass_metrics(main)
    if speculative:
        metrics.update(combine_spec_stats(main.runs, engine.depth))
        if plain is not None and plain.runs:
            metrics.update(compare_with_ar(main, plain, metrics, sampling.greedy, None if stopped else ar_engine.model))
    for i, p in enumerate(prompts[: cfg.print_answers if tokenizer is not None else 0]):
        if (i, 0) in answers.records:
            log.info(f"--- [{p.id}] {p.turns[0][:200]!r}\n>>> {answers.records[(i, 0)]['text'][:600]}")
    metrics.update({
        "finished": stopped is None,
        **({"interrupted": stopped} if stopped else {}),
        "answers": len(answers.records),
        "answers_total": total,
        "num_prompts": len(prompts),
        "load_s": load_s,
        "target": cfg.target.name,
        "target_path": None if path is None else str(path),
        "draft": cfg.draft.name,
        "data": cfg.data.name,
        "batch_size": batch_size,
        "max_new_tokens": cfg.gen.max_new_tokens,
        "temperature": cfg.gen.temperature,
        "dtype": str(dtype).removeprefix("torch."),
        "cuda_graph": graphs,
        "invariant": model.invariant,
        # what a step's verify cannot beat: the target's weights read once (bytes / measured copy bandwidth)
        "weight_read_floor_ms": 1e3 * model.weight_read_bytes() / copy_bandwidth(device) if device.type == "cuda"
        else None,
        **resolved,
        "tree": OmegaConf.to_container(cfg.tree) if cfg.draft.name != "none" else None,
        **env,
        "config": config,
    })
    where = tracker.location()
    metrics_path = tracker.finish(metrics)
    summarise(metrics, metrics_path, answers.path, where)
    return metrics


def decode_turns(engine, dp: DecodePass, prompts: list, tokenizer, answers: AnswerLog, cfg, tracker,
                 out_dir) -> list[list[tuple[int, list[int]]]]:
    """Answer every prompt's user turns, turn by turn (each answer conditions the next turn) -> the (prompt
    index, prompt ids) of every turn's requests, which the plain-decoding pass replays."""
    histories: list[list[dict]] = [[] for _ in prompts]
    turns_ids = []
    for turn in range(max(len(p.turns) for p in prompts)):
        reqs = []
        for i, p in enumerate(prompts):
            if turn < len(p.turns):
                histories[i].append({"role": "user", "content": p.turns[turn]})
                ids = p.meta["token_ids"] if tokenizer is None else encode_turns(tokenizer, histories[i],
                                                                                 cfg.gen.chat_template)
                reqs.append(Request(ids, cfg.gen.max_new_tokens, rid=i))
        turns_ids.append([(r.rid, r.prompt_ids) for r in reqs])
        stats = StepStats() if isinstance(engine, SpeculativeEngine) else GenStats()
        with trace_steps(cfg.profile_steps if turn == 0 else 0, out_dir) as on_step:
            dp.generate(engine, reqs, stats, turn, on_step)
        tracker.log({"gen/tokens_per_s": stats.new_tokens / stats.total_s, "gen/turn": turn}, step=turn)
        for r in reqs:
            histories[r.rid].append({"role": "assistant", "content": answers.records[(r.rid, turn)]["text"]})
    return turns_ids


def pass_metrics(dp: DecodePass) -> dict:
    """Tokens and times of a pass (of the part that ran, when interrupted)."""
    new_tokens = sum(r.new_tokens for r in dp.runs)
    gen_s, prefill_s = sum(r.total_s for r in dp.runs), sum(r.prefill_s for r in dp.runs)
    return {
        "tokens_per_s": new_tokens / gen_s if gen_s else 0.0,
        # each answer's first token comes from its prefill
        "decode_tokens_per_s": (new_tokens - dp.started) / max(gen_s - prefill_s, 1e-9),
        "new_tokens": new_tokens,
        "generate_s": gen_s,
        "prefill_s": prefill_s,
    }


def summarise(metrics: dict, metrics_path: Path, outputs_path: Path, wandb_where: str | None) -> None:
    """The run's last lines: what it measured, and where everything went."""
    m = metrics
    head = (f"interrupted by {m['interrupted']}: the numbers of what ran (finished: false)" if not m["finished"]
            else "done")
    parts = [f"{m['answers']} of {m['answers_total']} answers", f"{m['new_tokens']} tokens in {m['generate_s']:.1f}s",
             f"{m['tokens_per_s']:.1f} tokens/s (decode {m['decode_tokens_per_s']:.1f})"]
    if "tau" in m:
        parts.append(f"tau {m['tau']:.2f}")
    if "speedup_vs_ar" in m:
        parts.append(f"{m['speedup_vs_ar']:.2f}x plain decoding")
    if m.get("ar_identical_fraction") is not None:
        parts.append(f"{100 * m['ar_identical_fraction']:.0f}% of answers identical to plain decoding")
    log.info(f"{head}: " + ", ".join(parts))
    log.info(f"metrics: {metrics_path}")
    log.info(f"outputs: {outputs_path}")
    if wandb_where:
        log.info(wandb_where)


def fitting_prompts(prompts: list, tokenizer, chat_template: bool, budget: int) -> list:
    """The prompts whose first turn leaves room for the answer (`budget` = context - max_new_tokens tokens);
    says how many were skipped. Datasets of real conversations (ShareGPT) hold prompts of tens of thousands of
    tokens, and a prompt longer than the context is otherwise an error."""
    kept = [p for p in prompts
            if len(encode_turns(tokenizer, [{"role": "user", "content": p.turns[0]}], chat_template)) <= budget]
    if len(kept) < len(prompts):
        log.info(f"data.skip_too_long: skipped {len(prompts) - len(kept)} of {len(prompts)} prompts whose "
                 f"first turn exceeds {budget} tokens (gen.max_context - gen.max_new_tokens)")
    return kept


def combine_spec_stats(runs, steps: int) -> dict:
    from eaglet.engine.speculative import StepStats

    total = StepStats()
    for r in runs:
        total.accept_lens += r.accept_lens
        total.steps += r.steps
        total.timed_steps += r.timed_steps
        total.total_s += r.total_s
        total.prefill_s += r.prefill_s
        for k, v in r.phase_ms.items():
            total.phase_ms[k] += v
        total.step_periods_ms += r.step_periods_ms
    return total.summary(steps)


def compare_with_ar(spec: DecodePass, plain: DecodePass, metrics: dict, greedy: bool, model: Transformer | None
                    ) -> dict:
    """Plain decoding of the same prompts in the same run: the speedup's baseline, and (greedy) a token-for-token
    losslessness check over the answers both passes finished. `model`: the target, to measure where greedy
    answers differ (None skips that: an interrupted run)."""
    ar_tps = pass_metrics(plain)["decode_tokens_per_s"]
    both = [k for k in plain.outputs if k in spec.outputs]
    out = {"ar_decode_tokens_per_s": ar_tps, "speedup_vs_ar": metrics["decode_tokens_per_s"] / max(ar_tps, 1e-9)}
    if greedy:
        differ = [k for k in both if plain.outputs[k] != spec.outputs[k]]
        out["ar_identical_fraction"] = (len(both) - len(differ)) / len(both) if both else None
        # where greedy outputs differ: the target's own top-2 logit gap at the first differing token.
        # A gap at the level of the dtype's rounding says numerics (bf16 GEMMs of another shape), not a bug.
        out["ar_divergence_top2_gaps"] = [] if model is None else [
            divergence_margin(model, plain.prompt_ids[k], plain.outputs[k], spec.outputs[k]) for k in differ[:20]]
    return out


@torch.inference_mode()
def divergence_margin(model: Transformer, prompt: list[int], a: list[int], b: list[int]) -> dict:
    """First index where outputs a and b differ, and the target's top-2 logit gap there, from one
    plain forward over prompt + the common prefix (fp32 logits of the model's dtype)."""
    from eaglet.models.kv_cache import ForwardBatch, slots_for

    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    ids = prompt + a[:i]
    kv = KVCache.for_model(model.args, max_reqs=1, max_context=len(ids), page_size=16, dtype=model.dtype,
                           device=model.device)
    row = kv.alloc_request()
    kv.reserve(row, len(ids))
    pos = torch.arange(len(ids), device=model.device)[None]  # [1, T]
    pt = kv.req_to_page[[row]]  # [1, P]
    batch = ForwardBatch(pt, torch.zeros(1, dtype=torch.int32, device=model.device), slots_for(pt, pos, 16))
    hidden, _ = model(torch.tensor([ids], device=model.device), pos, batch, kv)
    top = model.logits(hidden[0, -1]).topk(2).values  # [2]
    return {"index": i, "top2_gap": float(top[0] - top[1])}
