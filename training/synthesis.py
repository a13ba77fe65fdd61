"""Self-generated training data for draft heads: prompts the target writes itself, mixed with ShareGPT's train
split, answered by the target (`python synthesize.py`, conf/synthesize.yaml; the trainer reads the result with
`data.source=selfgen data.selfgen.dir=<out_dir>`).

Stages, each resumable (a file per finished piece, written atomically, skipped when present and valid):

1. Magpie prompts (`magpie/cand-<c>.json`, `magpie.chunk` each): the target is given only its chat template's
   opening of a user turn and samples what follows (temperature `magpie.temperature`) until its end-of-turn token:
   an instruct model then writes a request as its users do (Xu et al. 2024, "Magpie"). A prompt the token budget
   cuts off is dropped.
2. The pool (`pool.json`, rebuilt from the files above in seconds): ShareGPT's train conversations (their first
   `sharegpt.max_turns` user turns) then the Magpie prompts, in that fixed order, through the filters
   (training/filters.py: length, degenerate repetition, language), the evaluation-set exclusion and the
   deduplication (training/dedup.py: one MinHash LSH index). A candidate whose user turn equals or nearly
   duplicates a prompt of MT-bench, HumanEval or ShareGPT's held-out split is dropped (by content: ShareGPT holds
   the same question under different ids); one whose first turn duplicates an accepted one, too. The pool is
   shuffled with the seed, so every chunk mixes both sources and a partial run is a sample of the whole.
3. Conversations (`chunks/chunk-<c>.safetensors`, `chunk` records each, stored by training/synth_store.py; held by
   training/conversation.py): each record's user turns answered by the target at temperature 0 through eaglet's
   batched AREngine (training/data.py's AnswerGenerator, the regeneration path of the ShareGPT source), turn by
   turn, each answer conditioning the next turn. A Magpie conversation goes on for up to `magpie.turns` user turns:
   after each answer the target writes the next user turn the same way, kept while it stays a coherent new request
   (ended by the end-of-turn token, through the filters, no evaluation prompt, not a near-duplicate of an earlier
   turn or an echo of the answer before it).
   A conversation ends at an answer cut by `answers.max_new_tokens`, at one caught in a verbatim loop
   (`answers.loop_stop`, training/filters.py's LoopStop: without it most of the budget goes to loops), or when the
   context is full. With `answers.sampled` = k, every conversation's user turns are also answered k more times at
   `answers.temperature`, each a training sequence. Stored as token ids (uint16) with the assistant-only mask.

`recipe.json` beside the data holds everything that determines it (seed, counts, temperatures, model, tokenizer,
filters, the ShareGPT file's SHA-256, the batch sizes and dtype: batching changes a GPU's rounding); a directory
made with another recipe is refused. `index.json` lists the chunks, their token counts and generation times (what
regenerating them costs) and the answers' tokens/s. The data is never committed: it is regenerated from its recipe
or carried as files (benchmarks/gpu_session.sh synth).

Several GPUs: `torchrun --nproc-per-node N synthesize.py ...`: process r makes the Magpie files and chunks c with
c % N == r; process 0 builds the pool and the index. A GPU session (bash benchmarks/gpu_session.sh synth):

    torchrun --standalone --nproc-per-node 2 synthesize.py target.path=$KEEP/smollm2_hf \\
        sharegpt.path=$SHAREGPT out_dir=/tmp/synth time_limit_s=480
    python train_draft.py data.source=selfgen data.selfgen.dir=/tmp/synth ...
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import random
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from eaglet.training.conversation import (
    Checker,
    Generators,
    Record,
    converse,
    derived_seed,
    user_turn_prefix,
    written_turn,
)
from eaglet.training.data import (
    AnswerGenerator,
    RegenConfig,
    config_hash,
    file_digest,
    render_conversation,
    train_conversations,
)
from eaglet.training.dedup import EVAL_SETS, DedupConfig, PromptIndex, eval_prompts, is_eval
from eaglet.training.filters import FilterConfig, reject_reason, repeat_fraction
from eaglet.training.synth_store import chunk_meta, chunk_path, write_chunk, write_json

# keys of conf/synthesize.yaml that do not change the data (the rest is the recipe)
RUN_KEYS = ("out_dir", "time_limit_s", "progress")


# ---------------------------------------------------------------------------------------------------
# Configuration


def check_config(cfg: DictConfig) -> None:
    """Refuse a bad configuration before anything loads: one line per problem, naming the key and the fix."""
    m, s, a = cfg.magpie, cfg.sharegpt, cfg.answers
    errors = []

    def need(ok: bool, msg: str) -> None:
        if not ok:
            errors.append(msg)

    need(m.num >= 0 and m.chunk >= 1, f"magpie.num={m.num}, magpie.chunk={m.chunk}: use num >= 0 and chunk >= 1")
    need(m.temperature > 0, f"magpie.temperature={m.temperature}: Magpie samples its prompts; at 0 every prompt is "
                            f"the same greedy one (use e.g. 1.0)")
    need(m.turns >= 1, f"magpie.turns={m.turns} must be >= 1 (user turns per Magpie conversation)")
    need(1 <= m.max_tokens < a.max_context, f"magpie.max_tokens={m.max_tokens} must be in [1, answers.max_context)")
    need(s.limit is None or s.limit >= 0, f"sharegpt.limit={s.limit} must be null (all) or >= 0")
    need(s.max_turns >= 1, f"sharegpt.max_turns={s.max_turns} must be >= 1")
    need(m.num > 0 or s.limit != 0, "magpie.num=0 and sharegpt.limit=0: nothing to synthesize")
    need(a.max_new_tokens >= 1 and a.batch_size >= 1 and a.max_context >= 2,
         f"answers.max_new_tokens={a.max_new_tokens}, answers.batch_size={a.batch_size}, "
         f"answers.max_context={a.max_context}: use positive values (max_context >= 2)")
    need(a.loop_stop >= 0, f"answers.loop_stop={a.loop_stop} must be >= 0 (repeated 8-grams in a row that end an "
                           f"answer; 0 = never)")
    need(a.sampled >= 0, f"answers.sampled={a.sampled} must be >= 0 (extra sampled answers per conversation)")
    need(a.sampled == 0 or a.temperature > 0, f"answers.sampled={a.sampled} with answers.temperature="
                                              f"{a.temperature}: sampled answers need a temperature > 0")
    for key, p in (("magpie.top_p", m.top_p), ("answers.top_p", a.top_p)):
        need(0 < p <= 1, f"{key}={p} must be in (0, 1]")
    need(cfg.chunk >= 1, f"chunk={cfg.chunk} must be >= 1 (conversations per output file)")
    need(cfg.time_limit_s is None or cfg.time_limit_s > 0, f"time_limit_s={cfg.time_limit_s}: null or > 0 seconds")
    need(set(cfg.exclude) <= set(EVAL_SETS), f"exclude={list(cfg.exclude)}: choose among {', '.join(EVAL_SETS)}")
    need(not cfg.target.get("random"), f"target={cfg.target.name} has random weights and no tokenizer: synthesis "
                                       f"needs the target's chat template (use a real target)")
    for key, make in (("filters", FilterConfig), ("dedup", DedupConfig)):
        try:
            make(**cfg[key])
        except (ValueError, TypeError) as e:
            errors.append(str(e))
    if errors:
        raise ValueError("\n".join(errors))


def make_recipe(cfg: DictConfig, target_key: dict, tokenizer, sharegpt_file: Path, device, dtype) -> dict:
    """What determines the data: the config less RUN_KEYS, the model, the tokenizer, the ShareGPT file by its bytes
    (not its path, so a copy elsewhere resumes), and the device type and dtype."""
    body = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items()
            if k not in RUN_KEYS and k not in ("target", "hardware")}
    body["sharegpt"] = {k: v for k, v in body["sharegpt"].items() if k != "path"}
    return {**body, "target": target_key, "vocab_size": len(tokenizer),
            "tokenizer": {"name": getattr(tokenizer, "name_or_path", None),
                          "chat_template_sha1": hashlib.sha1(str(tokenizer.chat_template).encode()).hexdigest()},
            "sharegpt_sha256": file_digest(sharegpt_file), "device": device.type, "dtype": str(dtype)}


def claim_dir(out_dir: Path, recipe: dict) -> str:
    """Write recipe.json into out_dir, or check the one there; -> the recipe's hash."""
    path = out_dir / "recipe.json"
    if path.is_file():
        old = json.loads(path.read_text())
        diff = sorted(k for k in set(old) | set(recipe) if json.dumps(old.get(k), sort_keys=True, default=str)
                      != json.dumps(recipe.get(k), sort_keys=True, default=str))
        if diff:
            raise ValueError(f"out_dir={out_dir} holds data of another recipe (differs in {', '.join(diff)}); use "
                             f"another out_dir (null: one named by the recipe) or delete that directory")
    else:
        write_json(path, recipe)
    return config_hash(recipe)


# ---------------------------------------------------------------------------------------------------
# Prompts the target writes


def magpie_candidates(c: int, n: int, writer: AnswerGenerator, tokenizer, seed: int) -> dict:
    """Candidate chunk c: n first user turns the target writes from its template's opening alone."""
    prefix = user_turn_prefix(tokenizer, [])
    t0, tok0 = time.perf_counter(), writer.new_tokens
    outs = writer([prefix] * n, derived_seed(seed, "magpie", c))
    turns = [written_turn(o, writer, tokenizer) for o in outs]
    return {"chunk": c, "texts": [t for t, _ in turns], "finished": [f for _, f in turns],
            "tokens": writer.new_tokens - tok0, "seconds": time.perf_counter() - t0}


def candidate_path(out_dir: Path, c: int) -> Path:
    return out_dir / "magpie" / f"cand-{c:05d}.json"


def read_candidates(path: Path, recipe_hash: str, c: int, n: int) -> dict | None:
    """A valid candidate file of this recipe and chunk, or None."""
    try:
        d = json.loads(path.read_text())
        ok = d["recipe"] == recipe_hash and d["chunk"] == c and len(d["texts"]) == len(d["finished"]) == n
        return d if ok else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


# ---------------------------------------------------------------------------------------------------
# The pool


def select_pool(candidates, index: PromptIndex, fc: FilterConfig, n_tokens, stats: collections.Counter) \
        -> list[Record]:
    """Candidates [(Record, finished)] in order -> the accepted records. A user turn past the first that fails a
    filter ends the conversation before it; a conversation with an evaluation prompt among its turns is dropped."""
    out = []
    for rec, finished in candidates:
        src = rec.source
        stats[f"{src}/candidates"] += 1
        if not finished:
            stats[f"{src}/dropped/unfinished"] += 1
            continue
        turns, why = [], "short"
        for t in rec.turns:
            if (why := reject_reason(t, n_tokens(t), fc)) is not None:
                break
            turns.append(t)
        if not turns:
            stats[f"{src}/dropped/{why}"] += 1
            continue
        sig = index.signature(turns[0])
        first = index.match(turns[0], sig)
        if is_eval(first) or any(is_eval(index.match(t)) for t in turns[1:]):
            stats[f"{src}/dropped/eval"] += 1
            continue
        if first is not None:
            stats[f"{src}/dropped/duplicate"] += 1
            continue
        index.add(rec.id, turns[0], sig)
        out.append(Record(rec.id, src, turns))
        stats[f"{src}/kept"] += 1
    return out


def build_pool(cfg: DictConfig, out_dir: Path, recipe_hash: str, tokenizer, log) -> list[Record]:
    """pool.json from the ShareGPT file and the Magpie files (made again when missing or of another recipe)."""
    path = out_dir / "pool.json"
    try:
        d = json.loads(path.read_text())
        if d["recipe"] == recipe_hash:
            return [Record(**r) for r in d["records"]]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    t0 = time.perf_counter()
    index = PromptIndex(DedupConfig(**cfg.dedup))
    for key, text in eval_prompts(list(cfg.exclude), cfg.sharegpt.path):
        index.add(key, text)
    n_eval = len(index.sigs)

    def candidates():
        if cfg.sharegpt.limit != 0:
            for conv in train_conversations(cfg.sharegpt.path, cfg.sharegpt.limit, cfg.sharegpt.max_turns):
                yield Record(f"sharegpt:{conv.id}", "sharegpt", [t for r, t in conv.messages if r == "user"]), True
        m = cfg.magpie
        for c in range(n_magpie_chunks(m)):
            d = json.loads(candidate_path(out_dir, c).read_text())
            for i, (text, fin) in enumerate(zip(d["texts"], d["finished"])):
                yield Record(f"magpie:{c}:{i}", "magpie", [text]), fin

    stats = collections.Counter()
    n_tokens = lambda t: len(tokenizer(t, add_special_tokens=False)["input_ids"])  # noqa: E731
    bar = tqdm(candidates(), desc="pool", disable=not cfg.progress, dynamic_ncols=True)
    pool = select_pool(bar, index, FilterConfig(**cfg.filters), n_tokens, stats)
    random.Random(derived_seed(cfg.seed, "pool")).shuffle(pool)
    write_json(path, {"recipe": recipe_hash, "stats": dict(sorted(stats.items())), "eval_prompts": n_eval,
                      "records": [r.__dict__ for r in pool]})
    log(f"[eaglet] pool: {len(pool)} conversations ({stats['sharegpt/kept']} ShareGPT, {stats['magpie/kept']} "
        f"Magpie) in {time.perf_counter() - t0:.1f}s; dropped: " + ", ".join(
            f"{k} {v}" for k, v in sorted(stats.items()) if "/dropped/" in k))
    return pool


def n_magpie_chunks(m) -> int:
    return (m.num + m.chunk - 1) // m.chunk


# ---------------------------------------------------------------------------------------------------
# Conversations


def make_chunk(c: int, records: list[Record], gens: Generators, tokenizer, cfg: DictConfig, check: Checker) \
        -> tuple[list, dict]:
    """Chunk c's training sequences (greedy conversations, then the sampled replays) and its metadata."""
    stats = collections.Counter()
    t0 = time.perf_counter()
    before = {g: (g.new_tokens, g.seconds, g.loops) for g in gens.all()}
    convs, cut = converse(records, gens.answer, tokenizer, derived_seed(cfg.seed, "chunk", c), stats, gens.writer,
                          check, cfg.magpie.turns)
    seqs = [(r.id, m, x) for r, m, x in zip(records, convs, cut) if m]  # (sequence id, messages, last answer cut)
    greedy = list(seqs)
    for k in range(cfg.answers.sampled):  # the greedy conversations' user turns, answered again by sampling
        replay = [Record(rid, "replay", [t for role, t in m if role == "user"]) for rid, m, _ in greedy]
        again, cut = converse(replay, gens.sampler, tokenizer, derived_seed(cfg.seed, "sampled", c, k), stats)
        seqs += [(f"{r.id}#{k + 1}", m, x) for r, m, x in zip(replay, again, cut) if m]
    # loops are counted, not dropped: the head must predict the target as it is, and it loops at temperature 0 too
    # (answers.loop_stop keeps a loop's first repeats and ends the answer there)
    stats["turns/degenerate_answer"] = sum(repeat_fraction(t.lower().split()) > check.fc.max_repeat
                                           for _, m, _ in seqs for r, t in m if r == "assistant")
    samples, ids = [], []
    for rid, m, x in seqs:
        s = render_conversation(tokenizer, m, cfg.answers.max_context, cut=x)
        if s is not None:
            samples.append(s)
            ids.append(rid)
    for name, g in (("answer", gens.answer), ("sampled", gens.sampler), ("writer", gens.writer)):
        if g is not None:
            stats[f"{name}_tokens"] = g.new_tokens - before[g][0]
            stats[f"{name}_seconds"] = round(g.seconds - before[g][1], 3)
            stats[f"{name}_loops"] = g.loops - before[g][2]  # ended by answers.loop_stop
    stats |= {"sequences": len(samples), "tokens": sum(len(s.ids) for s in samples),
              "assistant_tokens": sum(int(s.mask.sum()) for s in samples),
              "seconds": round(time.perf_counter() - t0, 3)}
    return samples, {"records": [r.id for r in records], "sequences": ids, "stats": dict(sorted(stats.items()))}


# ---------------------------------------------------------------------------------------------------
# Putting it together


class _Ranks:
    """This process's share of the chunks (torchrun's RANK / WORLD_SIZE) and a barrier between the processes
    (gloo, so waiting on a slower GPU's chunk cannot hit NCCL's timeout)."""

    def __init__(self):
        self.rank, self.world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        self.local = int(os.environ.get("LOCAL_RANK", "0"))
        if self.world > 1:
            import datetime

            import torch.distributed as dist

            dist.init_process_group("gloo", timeout=datetime.timedelta(hours=6))

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def close(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()
            dist.destroy_process_group()


def write_index(out_dir: Path, recipe_hash: str, num_chunks: int, vocab_size: int, pool_stats: dict) -> dict:
    """index.json: the chunks present and valid, their sizes and generation times, the totals."""
    chunks = {}
    for c in range(num_chunks):
        meta = chunk_meta(chunk_path(out_dir, c))
        if meta is not None and meta.get("recipe") == recipe_hash and meta.get("chunk") == c:
            chunks[c] = meta["stats"]
    tot = collections.Counter()
    for s in chunks.values():
        tot.update(s)
    index = {"recipe": recipe_hash, "num_chunks": num_chunks, "vocab_size": vocab_size,
             "complete": len(chunks) == num_chunks, "chunks_done": len(chunks), "totals": dict(sorted(tot.items())),
             # the engine's rate on the greedy answers (decode and prefill; not the Python around it)
             "answer_tokens_per_s": tot["answer_tokens"] / tot["answer_seconds"] if tot["answer_seconds"] else None,
             "pool": pool_stats, "chunks": chunks}
    write_json(out_dir / "index.json", index)
    return index


def synthesize(cfg: DictConfig, target=None, tokenizer=None, log=print) -> dict:
    """Make (or finish) the data `cfg` (conf/synthesize.yaml) describes; -> index.json's contents. `target` /
    `tokenizer` replace cfg.target (tests pass tiny ones)."""
    from eaglet.data.assets import asset_path
    from eaglet.runner.common import resolve_hardware

    check_config(cfg)
    t_start = time.perf_counter()
    ranks = _Ranks()
    say = log if ranks.rank == 0 else (lambda *a, **k: None)
    device, dtype = resolve_hardware(cfg.hardware)
    if device.type == "cuda" and ranks.world > 1:
        device = torch.device("cuda", ranks.local)
        torch.cuda.set_device(device)
    if target is None:
        from eaglet.training.loop import load_target

        target, tokenizer, target_key = load_target(cfg.target, dtype, device, cfg.seed)
    else:
        weights = float(sum(p.detach().double().sum() for p in target.parameters()))  # tells two tiny targets apart
        target_key = {"object": f"{target.args}", "weights": weights}
    if len(tokenizer) > target.args.vocab_size:
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens, the target's vocabulary {target.args.vocab_size}")
    sharegpt_file = Path(cfg.sharegpt.path).expanduser() if cfg.sharegpt.path else asset_path("sharegpt")
    recipe = make_recipe(cfg, target_key, tokenizer, sharegpt_file, target.device, target.dtype)
    out_dir = Path(cfg.out_dir or Path(os.environ.get("EAGLET_CACHE", "~/.cache/eaglet")) / "synth"
                   / f"{cfg.target.name}-{config_hash(recipe)}").expanduser()
    if ranks.rank == 0:
        recipe_hash = claim_dir(out_dir, recipe)
    ranks.barrier()
    recipe_hash = claim_dir(out_dir, recipe)
    say(f"[eaglet] synthesizing into {out_dir} (recipe {recipe_hash}, {ranks.world} process(es), device {device})")

    eos = sorted(set(target.args.eos_token_ids) | ({tokenizer.eos_token_id} - {None}))
    m, a = cfg.magpie, cfg.answers
    ctx = min(a.max_context, target.args.max_seq_len)
    gen = lambda n, temp, top_p: AnswerGenerator(  # noqa: E731
        target, RegenConfig(max_new_tokens=n, temperature=temp, top_p=top_p, batch_size=a.batch_size,
                            max_context=ctx, loop_stop=a.loop_stop), eos)
    gens = Generators(writer=gen(m.max_tokens, m.temperature, m.top_p), answer=gen(a.max_new_tokens, 0.0, 1.0),
                      sampler=gen(a.max_new_tokens, a.temperature, a.top_p) if a.sampled else None)
    limit = cfg.time_limit_s
    last = 0.0  # the longest piece of work so far: one more must fit in the time left

    def time_left() -> bool:
        return limit is None or time.perf_counter() - t_start + last < limit

    def progress(total: int, desc: str):
        return tqdm(total=total, desc=desc, disable=not (cfg.progress and ranks.rank == 0), dynamic_ncols=True)

    # ---- 1. Magpie prompts ------------------------------------------------------------------------------
    n_cand = n_magpie_chunks(m)
    mine = [c for c in range(ranks.rank, n_cand, ranks.world)
            if read_candidates(candidate_path(out_dir, c), recipe_hash, c, min(m.chunk, m.num - c * m.chunk)) is None]
    with progress(len(mine), "magpie prompts") as bar:
        for c in mine:
            if not time_left():
                break
            d = magpie_candidates(c, min(m.chunk, m.num - c * m.chunk), gens.writer, tokenizer, cfg.seed)
            write_json(candidate_path(out_dir, c), {"recipe": recipe_hash, **d})
            last = max(last, d["seconds"])
            bar.update(1)
            bar.set_postfix(tok_s=f"{d['tokens'] / max(d['seconds'], 1e-9):.0f}")
    ranks.barrier()
    missing = [c for c in range(n_cand) if read_candidates(candidate_path(out_dir, c), recipe_hash, c,
                                                           min(m.chunk, m.num - c * m.chunk)) is None]
    result = {"out_dir": str(out_dir), "complete": False, "magpie_files_missing": len(missing)}
    if missing:
        say(f"[eaglet] time_limit_s={limit} reached with {len(missing)} of {n_cand} Magpie files to make: rerun the "
            f"same command to continue")
        ranks.close()
        return result

    # ---- 2. the pool --------------------------------------------------------------------------------------
    if ranks.rank == 0:
        build_pool(cfg, out_dir, recipe_hash, tokenizer, say)
    ranks.barrier()
    pool = build_pool(cfg, out_dir, recipe_hash, tokenizer, say)
    pool_stats = json.loads((out_dir / "pool.json").read_text())["stats"]
    num_chunks = (len(pool) + cfg.chunk - 1) // cfg.chunk
    if ranks.rank == 0:
        write_index(out_dir, recipe_hash, num_chunks, len(tokenizer), pool_stats)

    # ---- 3. conversations ---------------------------------------------------------------------------------
    index = PromptIndex(DedupConfig(**cfg.dedup))
    for key, text in eval_prompts(list(cfg.exclude), cfg.sharegpt.path):
        index.add(key, text)
    check = Checker(index, FilterConfig(**cfg.filters), tokenizer)
    todo = []
    for c in range(ranks.rank, num_chunks, ranks.world):
        meta = chunk_meta(chunk_path(out_dir, c))
        if meta is None or meta.get("recipe") != recipe_hash or meta.get("chunk") != c:
            todo.append(c)
    made_tokens, made_s = 0, 0.0
    with progress(len(todo), "conversations") as bar:
        for c in todo:
            if not time_left():
                break
            records = pool[c * cfg.chunk:(c + 1) * cfg.chunk]
            samples, meta = make_chunk(c, records, gens, tokenizer, cfg, check)
            write_chunk(chunk_path(out_dir, c), samples, len(tokenizer), {"recipe": recipe_hash, "chunk": c, **meta})
            s = meta["stats"]
            last = max(last, s["seconds"])
            made_tokens, made_s = made_tokens + s["answer_tokens"], made_s + s["answer_seconds"]
            bar.update(1)
            bar.set_postfix(tok_s=f"{s['answer_tokens'] / max(s['answer_seconds'], 1e-9):.0f}")
    for g in gens.all():
        g.close()
    ranks.barrier()
    if ranks.rank == 0:
        result = write_index(out_dir, recipe_hash, num_chunks, len(tokenizer), pool_stats)
        t = result["totals"]
        say(f"[eaglet] {result['chunks_done']} of {num_chunks} chunks: {t.get('sequences', 0)} sequences, "
            f"{t.get('tokens', 0)} tokens ({t.get('assistant_tokens', 0)} assistant); this process answered at "
            f"{made_tokens / made_s if made_s else 0:.0f} tokens/s over {len(todo)} chunks ({made_s:.1f}s)")
        say(f"[eaglet] wrote {out_dir / 'index.json'}; train with: python train_draft.py data.source=selfgen "
            f"data.selfgen.dir={out_dir}" + ("" if result["complete"] else " (incomplete: rerun to finish)"))
    ranks.close()
    return {**result, "out_dir": str(out_dir)}
