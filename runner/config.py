"""A run's resolved config checked before anything loads (a bad value costs no model load and no GPU time), and
the hardware it names.

Every bad value is one line, `key=value: what is allowed`; a config's bad values are reported together
(`ConfigError.lines`). The checks come in three layers, each run only when the ones before it passed:

1. values: the type and range of every key, one function per config group. Pure Python (no torch import),
   so a mistyped override fails within the interpreter's start-up;
2. inputs: the files and directories named exist, the prompts load and there is at least one;
3. the device: the hardware, the stream plan, the tree's shape (the engine's own checks), and the memory the
   target's weights and KV pools need against what the device has free, the target sized from its
   config.json or GGUF header, or its registry entry.

`validate_run_spec` is run_spec.py's; training/config.py builds train_draft.py's from the same parts (runner/checks.py
holds the machinery). Keys a check does not know are left alone.
"""

from __future__ import annotations

import math
import os

from omegaconf import DictConfig, ListConfig

from eaglet.runner.checks import Checks
from eaglet.runner.common import DTYPE_NAMES, resolve_hardware, target_path

# engine.stream_plan.PLANS, named here without importing torch
STREAM_PLANS = ("serial", "overlap_wait_stream", "overlap_event", "overlap_split", "unsafe_no_sync")


# ---------------------------------------------------------------------------------------------------
# Layer 1: one function per config group (shared by both scripts where the group is)


def check_target(c: Checks) -> None:
    name = c.text("target.name")
    if c.value("target.random") is not None:
        c.text("target.random")  # a registry name: checked against the registry in layer 3
        return
    what = f"target={name}'s checkpoint: a model directory (config.json + *.safetensors) or a .gguf file"
    if c._get("target.path") is not None:  # a path, or ??? (a target without a default checkpoint)
        c.path("target.path", what=what)
        return
    from eaglet.data.assets import ASSETS

    if c.choice("target.asset", sorted(ASSETS), null=True) is None and c.value("target.asset") is None:
        c.bad("target.path", None, f"pass {what} (target={name} names no embedded asset)")


def check_hardware(c: Checks) -> None:
    c.matching("hardware.device", r"auto|cpu|cuda(:\d+)?", "must be auto, cpu, cuda or cuda:N")
    c.choice("hardware.dtype", ("auto", *DTYPE_NAMES))


def check_logger(c: Checks) -> None:
    if c.choice("logger.name", ("wandb", "none")) != "wandb":
        return
    c.text("logger.project")
    c.choice("logger.mode", ("offline", "online", "disabled"))
    c.text("logger.group", null=True)
    tags = c.value("logger.tags")
    if not (tags is None or isinstance(tags, ListConfig) and all(isinstance(t, str) for t in tags)):
        c.bad("logger.tags", tags, "must be a list of strings, e.g. logger.tags=[a,b]")


def accept_depth(steps: int, draft) -> int:
    """The deepest accepted path of a run (the engine's `depth`, which the drafter reports once built): tree.steps,
    or draft.ngram_depth where n-gram branches reach deeper (engine/drafters/ngram.py's NgramBranches)."""
    branches, depth = draft.get("ngram_branches"), draft.get("ngram_depth")
    return max(steps, depth) if branches and isinstance(depth, int) else steps


def check_tree(c: Checks) -> None:
    steps = c.integer("tree.steps", lo=1)
    c.integer("tree.topk", lo=1)
    c.integer("tree.num_draft_tokens", lo=1)
    if c.has("tree.root_children"):  # absent: configs written before the key (tree.topk)
        c.integer("tree.root_children", lo=1, null=True)  # >= tree.topk: TreeSpec.validate, in layer 3
    sim = c.value("tree.simulate")
    if sim is not None and steps is not None:
        if not isinstance(sim, DictConfig):
            c.bad("tree.simulate", sim, "must be null (real acceptance) or hold tau (tree=simulate)")
        else:
            c.number("tree.simulate.tau", lo=1, hi=accept_depth(steps, c.cfg.draft) + 1)


def check_draft(c: Checks) -> str | None:
    """The draft group: its drafter module, and that module's own value checks (engine/drafters/<module>_config.py,
    torch-free); what needs the drafter's code is its `check_config`, in layer 3."""
    from eaglet.engine.drafters import drafter_modules, value_checks  # listed, not imported: no torch

    name = c.text("draft.name")
    if name in (None, "none"):
        return name
    module = c.choice("draft.drafter", drafter_modules())
    if module is not None and (check := value_checks(module)) is not None:
        check(c)
    if c.has("draft.ngram_branches"):  # any drafter's tree may get n-gram branches (runner/run.py); absent: none
        from eaglet.engine.drafters.ngram_config import MAX_M

        branches = c.integer("draft.ngram_branches", lo=0, hi=MAX_M)
        if branches and module == "ngram":
            c.bad("draft.ngram_branches", branches, "must be 0 with draft=ngram: its tree is n-gram matches already")
        if c.has("draft.ngram_depth"):  # tokens a branch (null: tree.steps); the trie merge's kernel holds 64 nodes
            c.integer("draft.ngram_depth", lo=1, hi=64, null=True)
    return name


def check_data_prompts(c: Checks) -> str | None:
    """data/*.yaml of run_spec.py."""
    from eaglet.data.prompts import DATASETS, SPLITS

    name = c.choice("data.name", (*DATASETS, "synthetic"))
    c.integer("data.limit", lo=1, null=name != "synthetic")
    c.integer("data.max_turns", lo=1, null=True)
    if name == "synthetic":
        c.integer("data.prompt_len", lo=1)
    elif name == "jsonl":
        c.path("data.path", "file", what="a prompt file (one JSON object per line)")
    elif name is not None:
        c.path("data.path", "file", null=True, what=f"a {name} file of the embedded one's format")
    if name == "sharegpt":
        c.choice("data.split", SPLITS)
    elif name is not None and c.value("data.split") is not None:
        c.bad("data.split", c.value("data.split"), f"applies to data=sharegpt only; set it to null for data={name}")
    if c.has("data.skip_too_long"):
        c.flag("data.skip_too_long")
    return name


def check_gen(c: Checks) -> None:
    new = c.integer("gen.max_new_tokens", lo=1)
    c.integer("gen.batch_size", lo=1)
    c.number("gen.temperature", lo=0)
    c.number("gen.top_p", lo=0, hi=1, lo_open=True)
    context = c.integer("gen.max_context", lo=2)
    for key in ("gen.cuda_graph", "gen.chat_template", "gen.compare_ar"):
        c.flag(key)
    if new is not None and context is not None and new >= context:
        c.bad("gen.max_new_tokens", new, f"must be below gen.max_context={context} (the prompt needs room too)")


def check_run_spec_values(c: Checks) -> None:
    """Layer 1 of run_spec.py: every group's values, and the few rules across groups."""
    c.integer("seed")
    check_target(c)
    check_hardware(c)
    check_logger(c)
    draft = check_draft(c)
    if draft not in (None, "none"):
        check_tree(c)
    data = check_data_prompts(c)
    check_gen(c)
    c.flag("stream.allow_unsafe")
    c.choice("stream.name", STREAM_PLANS)
    c.choice("stream.forced_overlap", STREAM_PLANS[1:4])  # an overlap plan, not the unsafe one
    c.integer("stream.stress_sleep_cycles", lo=0)
    c.integer("profile_steps", lo=0)
    c.integer("kv.page_size", lo=1)
    c.integer("kv.num_pages", lo=2, null=True)
    c.integer("print_answers", lo=0)
    if c.value("target.random") and data not in (None, "synthetic"):
        c.bad("data", data, f"target={c.value('target.name')} has random weights and no tokenizer: use data=synthetic")


# ---------------------------------------------------------------------------------------------------
# Layer 2: inputs


def check_prompts(c: Checks) -> None:
    """The prompts load, and at least one is left after data.limit / data.max_turns."""
    from eaglet.data.prompts import load_prompts

    d = c.cfg.data
    if d.name == "synthetic":
        return
    where = ("data.path", d.path) if d.get("path") else ("data", d.name)
    try:
        prompts = load_prompts(d.name, limit=d.limit, path=d.path, max_turns=d.max_turns, split=d.split)
    except (ValueError, OSError) as e:
        c.bad(*where, f"cannot be read: {e}")
        return
    if not prompts:
        c.bad(*where, "holds no prompts; " + ('each line a JSON object with "prompt" or "turns"' if d.name == "jsonl"
                                               else "use another data.path"))


# ---------------------------------------------------------------------------------------------------
# Layer 3: the device, the engine's own checks, memory


def target_args(tc):
    """ModelArgs of the target block without loading its weights (registry entry, config.json or GGUF header)."""
    from eaglet.models.llama import ModelArgs

    if tc.get("random"):
        return ModelArgs.from_name(tc.random)
    from eaglet.models.checkpoint import read_config

    return ModelArgs.from_hf_config(read_config(target_path(tc)))


def target_key(tc) -> tuple[str, str]:
    """The key (and its value) that decides which weights a target block loads, for error lines."""
    for key in ("random", "path"):
        if tc.get(key):
            return f"target.{key}", tc[key]
    return "target", tc.name


def meta_model(args):
    """The target built on the meta device (no memory): a random head's own checks run against it."""
    import torch

    from eaglet.models.llama import Transformer

    with torch.device("meta"):
        return Transformer(args)


def parameter_count(args) -> int:
    """The parameters of models/llama.py's Transformer for `args`, from its shapes (equal to the module's count,
    tests/test_entry_points.py; building the module even on the meta device costs 2-3 s the first time)."""
    D, hd, H, Hkv = args.dim, args.head_dim, args.n_heads, args.n_kv_heads
    attention = D * (H + 2 * Hkv) * hd + H * hd * D  # qkv_proj, o_proj
    if args.attention_bias:
        attention += (H + 2 * Hkv) * hd + (D if args.family != "qwen2" else 0)
    layer = attention + 3 * D * args.intermediate_size + 2 * D + (2 * hd if args.qk_norm else 0)
    return args.vocab_size * D * (1 if args.tie_embeddings else 2) + args.n_layers * layer + D


def kv_pool_bytes(args, layers: int, max_reqs: int, max_context: int, page_size: int, num_pages: int | None,
                  itemsize: int) -> int:
    """Bytes of a KVCache pool as models/kv_cache.py allocates it (the dummy page included)."""
    pages = num_pages if num_pages is not None else max_reqs * math.ceil(max_context / page_size) + 1
    return layers * 2 * pages * page_size * args.n_kv_heads * args.head_dim * itemsize


def free_memory(device) -> tuple[int, str] | None:
    """(bytes free, the device in words): a GPU's free memory, or the machine's available RAM (Linux)."""
    import torch

    if device.type == "cuda":
        # under torchrun each process has its own GPU: look at that one, not at GPU 0
        index = device.index if device.index is not None else int(os.environ.get("LOCAL_RANK", "0"))
        free, _ = torch.cuda.mem_get_info(index)
        return free, f"{torch.cuda.get_device_name(index)} (cuda:{index}) has {gib(free)} free"
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        free = int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None
    return free, f"this machine has {gib(free)} of memory available"


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_memory(c: Checks, parts: dict[str, int], device, key: str, value, fixes: str) -> None:
    """Refuse, with the numbers, a run whose weights and pools alone exceed what the device has free."""
    have = free_memory(device)
    need = sum(parts.values())
    if have is not None and need > have[0]:
        items = " + ".join(f"{what} {gib(n)}" for what, n in parts.items())
        c.bad(key, value, f"needs at least {gib(need)} ({items}) but {have[1]}; {fixes}")


def run_spec_memory(cfg: DictConfig, args, dtype) -> dict[str, int]:
    """Bytes of what run() allocates up front: the target's weights and every KV pool of the engines it builds
    (the plain-decoding engine's, and the speculative engine's target and draft pools). The draft head's own
    weights are not counted."""
    import torch

    size = torch.tensor([], dtype=dtype).element_size()
    g, kv = cfg.gen, cfg.kv
    ctx = min(g.max_context, args.max_seq_len)
    params = parameter_count(args)
    # random weights are initialised in float32 and then cast (runner.common.random_target)
    parts = {"target weights": params * (max(size, 4) if cfg.target.get("random") else size)}
    pool = 0
    if cfg.draft.name == "none" or g.compare_ar:
        pool += kv_pool_bytes(args, args.n_layers, g.batch_size, ctx, kv.page_size, kv.num_pages, size)
    if cfg.draft.name != "none":
        from eaglet.engine.drafter import drafter_class

        S, K, N = cfg.tree.steps, cfg.tree.topk, cfg.tree.num_draft_tokens
        # SpeculativeEngine: room for one step's drafts, and one step in flight
        ctx_s = ctx + max(N, (S - 1) * K, S + 1) + S + 1
        draft_layers = drafter_class(cfg.draft.drafter).kv_layers(cfg.draft)  # a pool of the target's KV shape
        for layers in (args.n_layers, draft_layers):
            pool += kv_pool_bytes(args, layers, g.batch_size, ctx_s, kv.page_size, kv.num_pages, size)
    parts[f"KV pools (batch {g.batch_size} x {ctx} tokens)"] = pool
    return parts


def check_run_spec_device(c: Checks) -> None:
    """Layer 3 of run_spec.py."""
    from eaglet.engine.stream_plan import resolve_plan

    cfg = c.cfg
    with c.catching():
        device, dtype = resolve_hardware(cfg.hardware)
    if c.errors:
        return
    with c.catching():
        resolve_plan(cfg.stream, device)
    if cfg.draft.name != "none":
        from eaglet.engine.speculative import SimulatedAcceptance, TreeSpec

        t = cfg.tree
        with c.catching():
            TreeSpec(t.steps, t.topk, t.num_draft_tokens, t.get("root_children")).validate()
        if t.get("simulate"):
            with c.catching():
                SimulatedAcceptance.from_tau(t.simulate.tau, accept_depth(t.steps, cfg.draft))
        if c.errors:  # the drafter's own tree checks would say it again
            return
    try:
        args = target_args(cfg.target)
    except (ValueError, OSError) as e:  # CheckpointError is a ValueError; an unknown registry name too
        c.bad(*target_key(cfg.target), str(e).splitlines()[0])
        return
    if cfg.draft.name != "none":
        from eaglet.engine.drafter import check_root_children, drafter_class

        cls = drafter_class(cfg.draft.drafter)
        with c.catching():
            check_root_children(cfg.tree.get("root_children"), cls)
        cls.check_config(c, cfg, meta_model(args))
        if c.errors:
            return
    check_memory(c, run_spec_memory(cfg, args, dtype), device, "target", cfg.target.name, "lower gen.batch_size, "
                 "gen.max_context or kv.num_pages, use hardware.dtype=bfloat16, or a larger device")


def validate_run_spec(cfg: DictConfig, run_dir=None) -> None:
    """Raise ConfigError (every bad value, one line each) unless run_spec.py can run `cfg`. Takes a few ms for a
    bad value (layer 1); a good config also reads the target's header and asks the device for its free memory.
    run_dir: not needed (run() clears an earlier run's results itself); the callback's signature."""
    c = Checks(cfg)
    for layer in (check_run_spec_values, check_prompts, check_run_spec_device):
        layer(c)
        c.raise_if_bad()
