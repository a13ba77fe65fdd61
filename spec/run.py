"""`run(cfg, output_dir) -> metrics`: what `run_spec.py` does, as a plain function (tests call it too)."""

from __future__ import annotations

import contextlib
import functools
import json
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from eaglet.kernels._utils import copy_bandwidth
from eaglet.models.kv_cache import KVCache
from eaglet.models.llama import Transformer
from eaglet.spec.autoregressive import AREngine, Request
from eaglet.spec.eagle import EagleEngine, SimulatedAcceptance, TreeSpec
from eaglet.spec.sampling import SamplingParams
from eaglet.spec.stream_plan import StreamPlan, resolve_plan
from eaglet.spec.tracking import Tracker, environment

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


REPO = Path(__file__).resolve().parents[1]  # the checkout (eaglet installs editable): shipped heads live here


def resolve_hardware(hw) -> tuple[torch.device, torch.dtype]:
    dev = hw.device
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(dev)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"hardware.device={dev} but no CUDA/ROCm device is visible; use hardware=cpu")
    if hw.dtype == "auto":
        return device, torch.bfloat16 if device.type == "cuda" else torch.float32
    if hw.dtype not in DTYPES:
        raise ValueError(f"hardware.dtype={hw.dtype!r}; choose auto or one of {sorted(DTYPES)}")
    return device, DTYPES[hw.dtype]


def target_path(target) -> Path:
    if target.get("path"):
        return Path(target.path).expanduser()
    if not target.get("asset"):
        raise ValueError(f"target.path is required for target={target.name}")
    from eaglet.data.assets import asset_path

    return asset_path(target.asset)


def encode_turns(tokenizer, history: list[dict], chat_template: bool) -> list[int]:
    if chat_template:
        text = tokenizer.apply_chat_template(history, add_generation_prompt=True, tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(history[-1]["content"])["input_ids"]


def run(cfg: DictConfig, output_dir: str | Path) -> dict:
    from eaglet.data.prompts import Prompt, load_prompts
    from eaglet.models.checkpoint import load_tokenizer

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
        print(f"[eaglet] fold_norms: {model.args.family} keeps its norm weights (qkv bias / q-k norms): the "
              f"projections apply them", flush=True)
    elif cfg.fold_norms:
        model.fold_norm_weights()
    model.set_invariant(cfg.invariant)
    max_context = min(cfg.gen.max_context, model.args.max_seq_len)
    batch_size = cfg.gen.batch_size
    eos = set(model.args.eos_token_ids)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    if tokenizer is None:
        if cfg.data.name != "synthetic":
            raise ValueError(f"target={cfg.target.name} has random weights and no tokenizer: use data=synthetic")
        eos = set()  # random weights: every request decodes its whole budget
    sampling = SamplingParams(cfg.gen.temperature, cfg.gen.top_p)
    graphs = cfg.gen.cuda_graph and device.type == "cuda"
    plan = resolve_plan(cfg.stream, device)
    print(f"[eaglet] {plan.describe()}", flush=True)
    ar_engine = None  # built only when it runs: its KV pool is as large as the speculative one
    if cfg.draft.name == "none" or cfg.gen.compare_ar:
        kv = KVCache.for_model(model.args, max_reqs=batch_size, max_context=max_context,
                               page_size=cfg.kv.page_size, num_pages=cfg.kv.num_pages, dtype=dtype, device=device)
        ar_engine = AREngine(model, kv, batch_size, sampling, eos_ids=sorted(eos), use_cuda_graph=graphs,
                             seed=cfg.seed)
    engine = ar_engine
    if cfg.draft.name != "none":
        head = build_head(cfg.draft, cfg.target, model, dtype, device)
        if cfg.fold_norms:
            head.fold_norm_weights()
        tree = TreeSpec(cfg.tree.steps, cfg.tree.topk, cfg.tree.num_draft_tokens)
        sim = cfg.tree.get("simulate")
        engine = EagleEngine(model, head, tree, max_batch=batch_size, max_context=max_context,
                             page_size=cfg.kv.page_size, num_pages=cfg.kv.num_pages, sampling=sampling,
                             eos_ids=sorted(eos), use_cuda_graph=graphs,
                             simulate=SimulatedAcceptance.from_tau(sim.tau, tree.steps) if sim else None,
                             stream_plan=StreamPlan(plan, device, cfg.stream.stress_sleep_cycles))
    if cfg.data.name == "synthetic":
        g = torch.Generator().manual_seed(cfg.seed)
        prompts = [Prompt(f"synthetic-{i}", [""], {"token_ids": torch.randint(0, model.args.vocab_size,
                                                                                (cfg.data.prompt_len,), generator=g).tolist()})
                   for i in range(cfg.data.limit)]
    else:
        prompts = load_prompts(cfg.data.name, limit=cfg.data.limit, path=cfg.data.path,
                               max_turns=cfg.data.max_turns, split=cfg.data.split)
        if cfg.data.get("skip_too_long"):
            prompts = fitting_prompts(prompts, tokenizer, cfg.gen.chat_template, max_context - cfg.gen.max_new_tokens)
    config = OmegaConf.to_container(cfg, resolve=True)
    env = environment(device)
    resolved = {"stream_plan": plan.name, "stream_plan_reason": plan.reason}
    tracker = Tracker(cfg.logger, {**config, "env": env, **resolved}, output_dir)
    print(f"[eaglet] target={cfg.target.name} ({model.args.family}, {model.args.n_layers} layers) draft={cfg.draft.name} "
          f"device={env['device_name']} dtype={str(dtype).removeprefix('torch.')} prompts={len(prompts)} "
          f"batch={batch_size} loaded in {load_s:.1f}s", flush=True)

    engine.warmup()  # graph capture and autotuning stay out of the timings
    if engine is not ar_engine and ar_engine is not None:
        ar_engine.warmup()
    histories = [[] for _ in prompts]
    outputs = [[] for _ in prompts]
    turns_ids: list[list[list[int]]] = []  # prompt ids of every turn, replayed by the AR comparison
    runs = []
    for turn in range(max(len(p.turns) for p in prompts)):
        reqs = []
        for i, p in enumerate(prompts):
            if turn < len(p.turns):
                histories[i].append({"role": "user", "content": p.turns[turn]})
                ids = p.meta["token_ids"] if tokenizer is None else encode_turns(tokenizer, histories[i],
                                                                                 cfg.gen.chat_template)
                reqs.append(Request(ids, cfg.gen.max_new_tokens, rid=i))
        turns_ids.append([r.prompt_ids for r in reqs])
        with trace_steps(cfg.profile_steps if turn == 0 else 0, output_dir) as on_step:
            stats = engine.generate(reqs, on_step=on_step)
        runs.append(stats)
        tracker.log({"gen/tokens_per_s": stats.new_tokens / stats.total_s, "gen/turn": turn}, step=turn)
        for r in reqs:
            ids = [t for t in r.output_ids if t not in eos]
            text = "" if tokenizer is None else tokenizer.decode(ids, skip_special_tokens=True)
            histories[r.rid].append({"role": "assistant", "content": text})
            outputs[r.rid].append({"turn": turn, "text": text, "token_ids": r.output_ids,
                                   "finish_reason": r.finish_reason})
    new_tokens = sum(r.new_tokens for r in runs)
    gen_s, prefill_s = sum(r.total_s for r in runs), sum(r.prefill_s for r in runs)
    answers = sum(len(o) for o in outputs)  # each answer's first token comes from its prefill
    metrics = {
        "tokens_per_s": new_tokens / gen_s if gen_s else 0.0,
        "decode_tokens_per_s": (new_tokens - answers) / max(gen_s - prefill_s, 1e-9),
        "new_tokens": new_tokens,
        "generate_s": gen_s,
        "prefill_s": prefill_s,
    }
    if engine is not ar_engine:
        metrics.update(combine_spec_stats(runs, tree.steps))
        if ar_engine is not None:
            metrics.update(compare_with_ar(ar_engine, turns_ids, outputs, cfg.gen.max_new_tokens, metrics,
                                           sampling.greedy))

    out_dir = Path(output_dir)
    with open(out_dir / "outputs.jsonl", "w") as f:
        for p, outs in zip(prompts, outputs):
            f.write(json.dumps({"prompt_id": p.id, "turns": p.turns, "text": outs[0]["text"],
                                "token_ids": outs[0]["token_ids"], "answers": outs}) + "\n")
    for p, outs in list(zip(prompts, outputs))[: cfg.print_answers if tokenizer is not None else 0]:
        print(f"--- [{p.id}] {p.turns[0][:200]!r}\n>>> {outs[0]['text'][:600]}", flush=True)
    metrics.update({
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
    extra = (f", tau {metrics['tau']:.2f}" + (f", {metrics['speedup_vs_ar']:.2f}x over AR" if "speedup_vs_ar" in metrics
             else "")) if "tau" in metrics else ""
    print(f"[eaglet] {new_tokens} tokens in {gen_s:.2f}s: {metrics['tokens_per_s']:.1f} tokens/s "
          f"(decode {metrics['decode_tokens_per_s']:.1f} tokens/s{extra})", flush=True)
    tracker.finish(metrics)
    return metrics


@contextlib.contextmanager
def trace_steps(n: int, output_dir):
    """Yields a per-step callback; with n > 0, a PyTorch profiler Chrome trace of n steps (decode or
    training steps, after 2 skipped and 1 warm-up step) is written to <output_dir>/trace.json, for looking
    at the streams side by side (chrome://tracing or Perfetto), and the ops taking the most time are printed."""
    if n <= 0:
        yield None
        return
    from torch.profiler import ProfilerActivity, profile, schedule

    path = Path(output_dir) / "trace.json"
    gpu = torch.cuda.is_available()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])

    def ready(p):
        p.export_chrome_trace(str(path))
        # device time finds slow kernels; host time finds a GPU left idle (launch-bound or syncing steps)
        for key in ("self_device_time_total", "self_cpu_time_total") if gpu else ("self_cpu_time_total",):
            print(p.key_averages().table(sort_by=key, row_limit=20), flush=True)

    with profile(activities=acts, schedule=schedule(wait=2, warmup=1, active=n, repeat=1),
                 on_trace_ready=ready) as prof:
        yield prof.step
    print(f"[eaglet] profiler trace: {path}", flush=True)


def fitting_prompts(prompts: list, tokenizer, chat_template: bool, budget: int) -> list:
    """The prompts whose first turn leaves room for the answer (`budget` = context - max_new_tokens tokens);
    says how many were skipped. Datasets of real conversations (ShareGPT) hold prompts of tens of thousands of
    tokens, and a prompt longer than the context is otherwise an error."""
    kept = [p for p in prompts
            if len(encode_turns(tokenizer, [{"role": "user", "content": p.turns[0]}], chat_template)) <= budget]
    if len(kept) < len(prompts):
        print(f"[eaglet] data.skip_too_long: skipped {len(prompts) - len(kept)} of {len(prompts)} prompts whose "
              f"first turn exceeds {budget} tokens (gen.max_context - gen.max_new_tokens)", flush=True)
    return kept


@functools.lru_cache(maxsize=1)
def random_target(name: str, dtype, device) -> Transformer:
    """A registry config with random weights, built directly on the device (no host copy of 16 GB).
    Cached: the jobs of a Hydra multirun share one process, and one 8B init is enough."""
    from eaglet.models.llama import ModelArgs

    with torch.device(device):
        model = Transformer(ModelArgs.from_name(name)).to(dtype)
    return model.eval()


def build_head(draft, target_cfg, target: Transformer, dtype, device):
    """draft.path's head; else a random one (draft.random_init); else the head eaglet ships for this target
    (target.heads, repo-relative paths)."""
    from eaglet.models.eagle import load_draft_head, new_draft_head

    path = draft.get("path")
    if not path and not draft.get("random_init"):
        shipped = (target_cfg.get("heads") or {}).get(draft.name)
        path = REPO / shipped if shipped else None
    if path:
        head = load_draft_head(Path(path).expanduser(), target, dtype, device)
        if head.KIND != draft.name:
            raise ValueError(f"draft={draft.name} but {path} holds a {head.KIND} head; use draft={head.KIND}")
        return head
    if not draft.get("random_init"):
        raise ValueError(f"draft={draft.name} needs draft.path=<head directory>, or draft.random_init=true for a "
                         f"random head (losslessness and latency checks only: it accepts almost nothing); eaglet "
                         f"ships no {draft.name} head for target={target_cfg.name}. draft=none decodes without one")
    return new_draft_head(draft.name, target, num_layers=draft.num_layers if draft.name == "multi_layer" else None,
                          draft_vocab_size=draft.get("draft_vocab_size"), dtype=dtype, device=device)


def combine_spec_stats(runs, steps: int) -> dict:
    from eaglet.spec.eagle import StepStats

    total = StepStats()
    for r in runs:
        total.accept_lens += r.accept_lens
        total.steps += r.steps
        total.total_s += r.total_s
        total.prefill_s += r.prefill_s
        for k, v in r.phase_ms.items():
            total.phase_ms[k] += v
        total.step_periods_ms += r.step_periods_ms
    return total.summary(steps)


def compare_with_ar(ar_engine: AREngine, turns_ids, outputs, max_new: int, metrics: dict, greedy: bool) -> dict:
    """Plain decoding of the same prompts in the same run: the speedup's baseline, and (greedy) a
    token-for-token losslessness check."""
    new_tokens, total_s, prefill_s, same, n, margins = 0, 0.0, 0.0, 0, 0, []
    for turn, ids in enumerate(turns_ids):
        reqs = [Request(p, max_new, rid=i) for i, p in enumerate(ids)]
        st = ar_engine.generate(reqs)
        new_tokens, total_s, prefill_s = new_tokens + st.new_tokens, total_s + st.total_s, prefill_s + st.prefill_s
        spec = [o[turn]["token_ids"] for o in outputs if len(o) > turn]
        for r, s in zip(reqs, spec):
            if r.output_ids == s:
                same += 1
            elif greedy and len(margins) < 20:
                margins.append(divergence_margin(ar_engine.model, r.prompt_ids, r.output_ids, s))
        n += len(reqs)
    ar_tps = (new_tokens - n) / max(total_s - prefill_s, 1e-9)
    out = {"ar_decode_tokens_per_s": ar_tps, "speedup_vs_ar": metrics["decode_tokens_per_s"] / ar_tps}
    if greedy:
        out["ar_identical_fraction"] = same / n
        # where greedy outputs differ: the target's own top-2 logit gap at the first differing token.
        # A gap at the level of the dtype's rounding says numerics (bf16 GEMMs of another shape), not a bug.
        out["ar_divergence_top2_gaps"] = margins
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
