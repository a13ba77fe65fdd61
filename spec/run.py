"""`run(cfg, output_dir) -> metrics`: what `run_spec.py` does, as a plain function (tests call it too)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from eaglet.models.kv_cache import KVCache
from eaglet.models.llama import Transformer
from eaglet.spec.autoregressive import AREngine, Request
from eaglet.spec.sampling import SamplingParams
from eaglet.spec.tracking import Tracker, environment

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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
    from eaglet.data.prompts import load_prompts
    from eaglet.models.checkpoint import load_tokenizer

    if cfg.draft.name != "none":
        raise ValueError(f"draft={cfg.draft.name} is not available yet; use draft=none")
    torch.manual_seed(cfg.seed)
    device, dtype = resolve_hardware(cfg.hardware)
    path = target_path(cfg.target)
    t0 = time.perf_counter()
    model = Transformer.from_pretrained(path, dtype=dtype, device=device)
    tokenizer = load_tokenizer(path)
    load_s = time.perf_counter() - t0
    max_context = min(cfg.gen.max_context, model.args.max_seq_len)
    batch_size = cfg.gen.batch_size
    kv = KVCache.for_model(model.args, max_reqs=batch_size, max_context=max_context, page_size=cfg.kv.page_size,
                           num_pages=cfg.kv.num_pages, dtype=dtype, device=device)
    eos = set(model.args.eos_token_ids) | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())
    sampling = SamplingParams(cfg.gen.temperature, cfg.gen.top_p)
    engine = AREngine(model, kv, batch_size, sampling, eos_ids=sorted(eos),
                      use_cuda_graph=cfg.gen.cuda_graph and device.type == "cuda", seed=cfg.seed)
    prompts = load_prompts(cfg.data.name, limit=cfg.data.limit, path=cfg.data.path,
                           max_turns=cfg.data.max_turns, split=cfg.data.split)
    config = OmegaConf.to_container(cfg, resolve=True)
    env = environment(device)
    tracker = Tracker(cfg.logger, {**config, "env": env}, output_dir)
    print(f"[eaglet] target={cfg.target.name} ({model.args.family}, {model.args.n_layers} layers) draft={cfg.draft.name} "
          f"device={env['device_name']} dtype={str(dtype).removeprefix('torch.')} prompts={len(prompts)} "
          f"batch={batch_size} loaded in {load_s:.1f}s", flush=True)

    histories = [[] for _ in prompts]
    outputs = [[] for _ in prompts]
    new_tokens, gen_s, prefill_s, steps = 0, 0.0, 0.0, 0
    for turn in range(max(len(p.turns) for p in prompts)):
        reqs = []
        for i, p in enumerate(prompts):
            if turn < len(p.turns):
                histories[i].append({"role": "user", "content": p.turns[turn]})
                ids = encode_turns(tokenizer, histories[i], cfg.gen.chat_template)
                reqs.append(Request(ids, cfg.gen.max_new_tokens, rid=i))
        stats = engine.generate(reqs)
        new_tokens, gen_s, prefill_s, steps = (new_tokens + stats.new_tokens, gen_s + stats.total_s,
                                               prefill_s + stats.prefill_s, steps + stats.decode_steps)
        tracker.log({"gen/tokens_per_s": stats.tokens_per_s, "gen/turn": turn}, step=turn)
        for r in reqs:
            ids = [t for t in r.output_ids if t not in eos]
            text = tokenizer.decode(ids, skip_special_tokens=True)
            histories[r.rid].append({"role": "assistant", "content": text})
            outputs[r.rid].append({"turn": turn, "text": text, "token_ids": r.output_ids,
                                   "finish_reason": r.finish_reason})

    out_dir = Path(output_dir)
    with open(out_dir / "outputs.jsonl", "w") as f:
        for p, outs in zip(prompts, outputs):
            f.write(json.dumps({"prompt_id": p.id, "turns": p.turns, "text": outs[0]["text"],
                                "token_ids": outs[0]["token_ids"], "answers": outs}) + "\n")
    for p, outs in list(zip(prompts, outputs))[: cfg.print_answers]:
        print(f"--- [{p.id}] {p.turns[0][:200]!r}\n>>> {outs[0]['text'][:600]}", flush=True)
    metrics = {
        "tokens_per_s": new_tokens / gen_s if gen_s else 0.0,
        "decode_tokens_per_s": (new_tokens - sum(len(o) for o in outputs)) / max(gen_s - prefill_s, 1e-9),
        "new_tokens": new_tokens,
        "generate_s": gen_s,
        "prefill_s": prefill_s,
        "decode_steps": steps,
        "num_prompts": len(prompts),
        "load_s": load_s,
        "target": cfg.target.name,
        "target_path": str(path),
        "draft": cfg.draft.name,
        "data": cfg.data.name,
        "batch_size": batch_size,
        "max_new_tokens": cfg.gen.max_new_tokens,
        "temperature": cfg.gen.temperature,
        "dtype": str(dtype).removeprefix("torch."),
        "cuda_graph": bool(engine._decode.enabled),
        **env,
        "config": config,
    }
    print(f"[eaglet] {new_tokens} tokens in {gen_s:.2f}s: {metrics['tokens_per_s']:.1f} tokens/s "
          f"(decode {metrics['decode_tokens_per_s']:.1f} tokens/s)", flush=True)
    tracker.finish(metrics)
    return metrics
