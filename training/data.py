"""Training data for draft heads: chat-templated conversations with an assistant-only loss mask, their
regeneration by the target itself, the draft vocabulary, and the deterministic sharded batch order.

Sequences are right-padded per micro-batch (no packing): causal attention keeps padding out of real rows
without an attention mask, and every sequence starts at position 0 as at inference. With
`group_by_length`, sequences of similar length share micro-batches, so little compute goes to padding.

Regeneration (`data.regenerate=true`, the recipe that aligns a draft with its target: it learns what the
target says, not what ShareGPT's ChatGPT said): the user turns are replayed through eaglet's batched
`AREngine` turn by turn, each answer conditioning the next turn. Results are cached as JSONL (one
conversation per line: its messages as text and the generated token ids) under a name hashed from
everything that determines them, with the config beside it; generation runs in chunks appended as they
finish, so an interrupted regeneration resumes, and each process of a torchrun job regenerates its own
chunks. `data.regen.samples` > 1 (with a temperature > 0) answers every prompt that many times, each answer a
training sequence: more, and more varied, answers from the same prompts.

The held-out ShareGPT split never enters training: only `split="train"` conversations are loaded, and
every one is checked again against `sharegpt_split` of its id.

`data.source=selfgen` reads what synthesize.py made instead (training/synthesis.py: prompts the target wrote itself
and ShareGPT's, answered by the target, stored tokenized by training/synth_store.py).
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file

from eaglet.data.assets import asset_path
from eaglet.data.chat import encode_turns
from eaglet.data.prompts import Conversation, load_sharegpt_conversations, sharegpt_split
from eaglet.engine.autoregressive import AREngine
from eaglet.engine.requests import Request
from eaglet.engine.sampling import SamplingParams
from eaglet.models.kv_cache import KVCache
from eaglet.models.llama import Transformer
from eaglet.training.filters import LoopStop


@dataclass
class Sample:
    ids: torch.Tensor  # [T] int64 token ids
    mask: torch.Tensor  # [T] bool: True on assistant tokens (the ones the draft learns to predict)


# ---------------------------------------------------------------------------------------------------
# Chat rendering with an assistant-only mask


def assistant_spans(tokenizer, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """(rendered text, character spans [start, end) of every assistant turn's content and end-of-turn token).

    Found by rendering incrementally: the text up to the generation prompt before assistant turn i and the text
    through turn i are prefixes of the whole rendering (any template whose turns render independently, ChatML
    among them), so the turn is what lies between; trailing whitespace (ChatML's newline after <|im_end|>) is
    template, not something the model generates."""
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
        through = tokenizer.apply_chat_template(messages[: i + 1], tokenize=False)
        if not (through.startswith(before) and full.startswith(through)):
            raise ValueError("the chat template does not render conversations prefix-stably (turn i's text changes "
                             "with later turns), so assistant spans cannot be located; use a ChatML/Llama-style "
                             "template")
        spans.append((len(before), len(through.rstrip())))
    return full, spans


def render_conversation(tokenizer, messages: list[tuple[str, str]], max_len: int, cut: bool = False) -> Sample | None:
    """(role, text) messages -> Sample with the chat template applied, truncated to `max_len` tokens;
    None when no assistant token survives the truncation. `cut`: the last message is an answer its token budget cut
    off, so the sequence ends with its text: the end-of-turn token the template would add is one the target never
    produced there, and a head trained on it would learn to end answers mid-sentence."""
    msgs = [{"role": r, "content": t} for r, t in messages]
    text, spans = assistant_spans(tokenizer, msgs)
    if cut:
        if not msgs or msgs[-1]["role"] != "assistant":
            raise ValueError("cut=True needs an assistant message last (the answer that was cut)")
        head = tokenizer.apply_chat_template(msgs[:-1], tokenize=False, add_generation_prompt=True)
        text = head + msgs[-1]["content"]
        spans = spans[:-1] + [(len(head), len(text))]
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    if "offset_mapping" not in enc:
        raise ValueError("the tokenizer gives no offset mapping (a slow tokenizer?): load a fast tokenizer")
    ids = torch.tensor(enc["input_ids"][:max_len], dtype=torch.long)  # [T]
    starts = torch.tensor([a for a, _ in enc["offset_mapping"][:max_len]])  # [T] first character of each token
    mask = torch.zeros(len(ids), dtype=torch.bool)  # [T]
    for s, e in spans:
        mask |= (starts >= s) & (starts < e)
    return Sample(ids, mask) if mask.any() else None


# ---------------------------------------------------------------------------------------------------
# Sources


def train_conversations(path=None, limit: int | None = None, max_turns: int | None = None) -> list[Conversation]:
    """ShareGPT's training split: conversations that start with a user turn, cut to `max_turns` exchanges."""
    out = []
    for conv in load_sharegpt_conversations("train", path):
        # the held-out split is for evaluation only: re-check every id, whatever the loader did
        if conv.split != "train" or sharegpt_split(conv.id) != "train":
            raise RuntimeError(f"held-out conversation {conv.id} reached the training data")
        if not conv.messages or conv.messages[0][0] != "user":
            continue  # a continuation part (X_1, ...) whose question lives in another part
        if max_turns is not None:
            conv.messages = conv.messages[: 2 * max_turns]
        out.append(conv)
        if limit is not None and len(out) >= limit:
            break
    return out


def synthetic_samples(num: int, min_len: int, max_len: int, prompt_frac: float, vocab_size: int,
                      seed: int) -> list[Sample]:
    """Random token sequences; the last (1 - prompt_frac) of each is the 'assistant' part."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(num):
        L = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
        ids = torch.randint(0, vocab_size, (L,), generator=g)  # [L]
        mask = torch.arange(L) >= max(1, int(L * prompt_frac))  # [L]
        out.append(Sample(ids, mask))
    return out


# ---------------------------------------------------------------------------------------------------
# Regeneration by the target


@dataclass
class RegenConfig:
    max_new_tokens: int = 1024  # tokens per regenerated answer
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    batch_size: int = 64  # requests decoded together
    max_context: int = 2048  # prompt + answer tokens; longer conversations stop at the last turn that fits
    chunk: int = 512  # conversations per cached chunk (the resume granularity)
    samples: int = 1  # answers per prompt; > 1 needs temperature > 0 (each sampled answer is a training sequence)
    loop_stop: int = 0  # end an answer after this many consecutive repeated token 8-grams (training/filters.py's
    # LoopStop); 0 = never


class AnswerGenerator:
    """Batched generation with eaglet's AREngine: prompt ids -> output ids (EOS included when reached). One KV pool
    and one engine, its CUDA graphs captured once, serve every call of a regeneration: with a pool per call (5.6 GiB
    for SmolLM2 at 128 requests x 2048 tokens), the pools outlived their calls in the engine's reference cycle, and
    regenerating multi-turn chats (a call per turn) ran an H200 out of memory in its 6th chunk. Each call restarts
    sampling from its seed after the capture, so a chunk's answers do not depend on what the process made before."""

    def __init__(self, target: Transformer, rc: RegenConfig, eos_ids):
        self.target, self.rc, self.eos_ids = target, rc, sorted(eos_ids)
        self.engine: AREngine | None = None
        self.new_tokens, self.seconds = 0, 0.0  # generated by all calls so far, and their time (tokens/s reports)
        self.loops = 0  # answers LoopStop ended, over all calls

    def __call__(self, prompts: list[list[int]], seed: int) -> list[list[int]]:
        if self.engine is None:
            t, rc = self.target, self.rc
            context = min(rc.max_context, t.args.max_seq_len)
            kv = KVCache.for_model(t.args, max_reqs=rc.batch_size, max_context=context, dtype=t.dtype,
                                   device=t.device)
            self.engine = AREngine(t, kv, rc.batch_size, SamplingParams(rc.temperature, rc.top_p),
                                   eos_ids=self.eos_ids, use_cuda_graph=t.device.type == "cuda")
            self.engine.warmup()
        self.engine.reseed(seed)
        reqs = [Request(p, self.rc.max_new_tokens, rid=i) for i, p in enumerate(prompts)]
        stop = LoopStop(self.rc.loop_stop) if self.rc.loop_stop else None
        stats = self.engine.generate(reqs, on_token=stop)
        self.new_tokens, self.seconds = self.new_tokens + stats.new_tokens, self.seconds + stats.total_s
        self.loops += stop.stopped if stop else 0
        return [r.output_ids for r in reqs]

    def close(self) -> None:
        """Free the KV pool and the graphs for training (the engine and its graph runner form a reference cycle,
        which only the cyclic collector frees)."""
        self.engine = None
        gc.collect()


def regenerate_chats(convs: list[Conversation], generate: AnswerGenerator, tokenizer, seed: int) -> list[dict]:
    """Replay the user turns of `convs` through the target turn by turn -> one record per conversation:
    {"id", "messages": [[role, text], ...] with the target's answers, "output_ids": [[...] per answer], "cut"}.
    An answer cut by max_new_tokens ends its conversation (`cut`: true): the user's next turn answered a reply
    the target did not give, and the template's end-of-turn token after the cut text is one it never produced
    (render_conversation(cut=True) leaves it out)."""
    eos, max_context = set(generate.eos_ids), generate.rc.max_context
    users = [[t for r, t in c.messages if r == "user"] for c in convs]
    hist: list[list[dict]] = [[] for _ in convs]
    outs: list[list[list[int]]] = [[] for _ in convs]
    alive = [True] * len(convs)
    cut = [False] * len(convs)
    for turn in range(max((len(u) for u in users), default=0)):
        rows, prompts = [], []
        for i, u in enumerate(users):
            if alive[i] and turn < len(u):
                ids = encode_turns(tokenizer, hist[i] + [{"role": "user", "content": u[turn]}], True)
                if len(ids) >= max_context - 1:  # no room left to answer: the conversation ends here
                    alive[i] = False
                    continue
                rows.append(i)
                prompts.append(ids)
        for i, out in zip(rows, generate(prompts, seed + turn)):
            text = tokenizer.decode([t for t in out if t not in eos], skip_special_tokens=True)
            hist[i] += [{"role": "user", "content": users[i][turn]}, {"role": "assistant", "content": text}]
            outs[i].append(out)
            if not out or out[-1] not in eos:
                alive[i], cut[i] = False, True
    return [{"id": c.id, "messages": [[m["role"], m["content"]] for m in h], "output_ids": o, "cut": x}
            for c, h, o, x in zip(convs, hist, outs, cut)]


def regenerate_synthetic(prompts: list[tuple[str, list[int]]], generate: AnswerGenerator, seed: int) -> list[dict]:
    """Token-level regeneration (no tokenizer): {"id", "prompt_ids", "output_ids"} per prompt."""
    outs = generate([p for _, p in prompts], seed)
    return [{"id": pid, "prompt_ids": p, "output_ids": o} for (pid, p), o in zip(prompts, outs)]


def cached_records(stem: Path, key: dict, ids: list[str], make: Callable[[list[int], int], list[dict]], chunk: int,
                   rank: int = 0, world: int = 1, barrier: Callable[[], None] = lambda: None,
                   log: Callable[[str], None] = print) -> list[dict]:
    """Records for `ids` from `<stem>.part*.jsonl`, making the missing ones chunk by chunk: chunk c (items
    [c*chunk, (c+1)*chunk)) is made by process c % world with make(item indices, c) and appended to that
    process's part file as soon as it is done. `key` (what determines the records) is written beside them."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    meta = stem.with_suffix(".json")
    if rank == 0 and not meta.is_file():
        meta.write_text(json.dumps(key, indent=2, default=str))
    done = {r["id"] for r in _read_parts(stem)}
    n_chunks = (len(ids) + chunk - 1) // chunk
    part = Path(f"{stem}.part{rank}-of-{world}.jsonl")
    for c in range(rank, n_chunks, world):
        todo = [i for i in range(c * chunk, min(len(ids), (c + 1) * chunk)) if ids[i] not in done]
        if not todo:
            continue
        log(f"regenerating chunk {c + 1}/{n_chunks} ({len(todo)} items) -> {part.name}")
        lines = "".join(json.dumps(r) + "\n" for r in make(todo, c))
        with open(part, "a", encoding="utf-8") as f:  # one write per chunk: a crash loses at most this chunk
            f.write(lines)
    barrier()
    by_id = {r["id"]: r for r in _read_parts(stem)}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise RuntimeError(f"{stem}: {len(missing)} records missing after regeneration, e.g. {missing[:3]}")
    return [by_id[i] for i in ids]


def _read_parts(stem: Path) -> list[dict]:
    out = []
    for p in sorted(stem.parent.glob(stem.name + ".part*.jsonl")):
        for line in p.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut by a crash mid-write: its chunk is made again
    return out


def file_digest(path: Path) -> str:
    """sha256 of a file's bytes, hex (0.3 s for the 125 MB ShareGPT file)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def config_hash(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:12]


def save_samples(path: Path, samples: list[Sample]) -> None:
    """All sequences in one safetensors file (concatenated ids and masks + offsets), written atomically."""
    lens = torch.tensor([0] + [len(s.ids) for s in samples])
    tensors = {"ids": torch.cat([s.ids for s in samples]).int(), "mask": torch.cat([s.mask for s in samples]),
               "offsets": lens.cumsum(0)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")  # two jobs rendering the same data must not share one
    save_file(tensors, str(tmp))
    tmp.replace(path)


def read_samples(path: Path) -> list[Sample]:
    t = load_file(str(path))
    o = t["offsets"].tolist()
    return [Sample(t["ids"][a:b].long(), t["mask"][a:b]) for a, b in zip(o, o[1:])]


# ---------------------------------------------------------------------------------------------------
# Draft vocabulary


def draft_vocab(samples: list[Sample], vocab_size: int, n: int) -> torch.Tensor:
    """The n most frequent assistant tokens of the training data (ties and unseen tokens by ascending id),
    sorted [n] target ids: EAGLE-3's / SpecForge's frequency-based draft vocabulary."""
    if not 0 < n <= vocab_size:
        raise ValueError(f"train.head.draft_vocab_size={n} must be in [1, {vocab_size}] (the target's vocabulary)")
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for s in samples:
        counts += torch.bincount(s.ids[s.mask], minlength=vocab_size)
    order = torch.sort(counts, descending=True, stable=True).indices  # [V] stable: ties by ascending id
    return order[:n].sort().values  # [n]


# ---------------------------------------------------------------------------------------------------
# Batching


class BatchSchedule:
    """Deterministic micro-batch order, DistributedSampler-like: epoch e shuffles all sequences with seed + e;
    global micro-batch g holds world * batch_size sequences and process r takes its r-th slice, so the order
    of the data is the same for any number of processes with the same global batch. The position is one
    integer (global micro-batches consumed), which checkpoints store for resume."""

    def __init__(self, lengths: list[int], batch_size: int, world: int, rank: int, seed: int,
                 group_by_length: bool = True, group_factor: int = 64):
        self.lengths, self.batch, self.world, self.rank = lengths, batch_size, world, rank
        self.seed, self.group_by_length, self.group_factor = seed, group_by_length, group_factor
        self.per_epoch = len(lengths) // (batch_size * world)
        if self.per_epoch == 0:
            raise ValueError(f"{len(lengths)} training sequences are fewer than one global micro-batch "
                             f"(train.batch_size={batch_size} x {world} processes); use more data or a smaller batch")
        self._epoch, self._batches = None, None

    def _epoch_batches(self, epoch: int) -> list[list[int]]:
        g = torch.Generator().manual_seed(self.seed + epoch)
        perm = torch.randperm(len(self.lengths), generator=g).tolist()
        size = self.batch * self.world
        perm = perm[: self.per_epoch * size]
        if self.group_by_length:  # sort within windows of group_factor micro-batches, then shuffle the batches
            win = size * self.group_factor
            perm = [i for s in range(0, len(perm), win)
                    for i in sorted(perm[s:s + win], key=lambda i: -self.lengths[i])]
        batches = [perm[s:s + size] for s in range(0, len(perm), size)]
        if self.group_by_length:
            order = torch.randperm(len(batches), generator=g).tolist()
            batches = [batches[i] for i in order]
        return batches

    def global_batch(self, position: int) -> list[int]:
        """All processes' sequence indices of global micro-batch `position`."""
        epoch, i = divmod(position, self.per_epoch)
        if epoch != self._epoch:
            self._epoch, self._batches = epoch, self._epoch_batches(epoch)
        return self._batches[i]

    def local_batch(self, position: int) -> list[int]:
        """This process's slice of global micro-batch `position`."""
        return self.global_batch(position)[self.rank * self.batch:(self.rank + 1) * self.batch]


def collate(samples: list[Sample], indices: list[int], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """-> tokens [B, T] int64, loss mask [B, T] bool, right-padded to the longest."""
    T = max(len(samples[i].ids) for i in indices)
    tokens = torch.full((len(indices), T), pad_id, dtype=torch.long)  # [B, T]
    mask = torch.zeros(len(indices), T, dtype=torch.bool)  # [B, T]
    for row, i in enumerate(indices):
        s = samples[i]
        tokens[row, : len(s.ids)] = s.ids
        mask[row, : len(s.ids)] = s.mask
    return tokens, mask


# ---------------------------------------------------------------------------------------------------
# Putting it together


def load_samples(dc, target: Transformer, tokenizer, cache_dir: Path, target_key: dict, eos_ids, seed: int,
                 rank: int = 0, world: int = 1, barrier: Callable[[], None] = lambda: None,
                 log: Callable[[str], None] = print) -> list[Sample]:
    """The training sequences described by the `data` config block (conf/train_draft.yaml)."""
    if dc.source == "selfgen":  # synthesize.py's output: already the target's own answers, tokenized
        from eaglet.training.synth_store import load_synthesized

        return load_synthesized(dc.selfgen, dc.max_len, target.args.vocab_size, target_key, log)
    rc = RegenConfig(**dc.regen)
    if rc.samples < 1 or (rc.samples > 1 and (rc.temperature == 0 or not dc.regenerate)):
        raise ValueError(f"data.regen.samples={rc.samples}: use 1, or more with data.regenerate=true and "
                         "data.regen.temperature > 0 (greedy answers to one prompt are all the same)")
    # not `limit` / `num`: records are per conversation, so a larger run reuses a smaller one's; not `samples`:
    # sample 0 is a one-answer run's records, each further sample has its own key (`regenerated`)
    generate = AnswerGenerator(target, rc, eos_ids)  # its KV pool and graphs are made at its first call
    key = {"target": target_key, "source": dc.source, "path": dc.get("path"), "max_turns": dc.get("max_turns"),
           "regen": {k: v for k, v in dc.regen.items() if k not in ("chunk", "samples")}, "seed": seed,
           "records": "cut-answers-end"}  # records of conversations that went on past a cut answer are not reused

    def regenerated(kind: str, ids: list[str], make: Callable[[list[int], int], list[dict]]) -> list[dict]:
        """Every sample's records for `ids`, sample after sample; make(item indices, seed) makes one chunk's."""
        out = []
        for s in range(rc.samples):
            k = key if s == 0 else {**key, "sample": s}
            out += cached_records(cache_dir / f"regen-{kind}-{config_hash(k)}", k, ids,
                                  lambda idx, c, s=s: make(idx, seed + 1_000_000 * s + 1000 * c),
                                  rc.chunk, rank, world, barrier, log)
        generate.close()
        return out

    if dc.source == "synthetic":
        sc = dc.synthetic
        key["synthetic"] = {k: v for k, v in sc.items() if k != "num"}
        base = synthetic_samples(sc.num, sc.min_len, sc.max_len, sc.prompt_frac, target.args.vocab_size, seed)
        if not dc.regenerate:
            return [Sample(s.ids[: dc.max_len], s.mask[: dc.max_len]) for s in base]
        prompts = [(f"synthetic-{i}", s.ids[~s.mask].tolist()) for i, s in enumerate(base)]
        recs = regenerated("synthetic", [p for p, _ in prompts],
                           lambda idx, sd: regenerate_synthetic([prompts[i] for i in idx], generate, sd))
        out = []
        for r in recs:
            ids = torch.tensor(r["prompt_ids"] + r["output_ids"], dtype=torch.long)[: dc.max_len]  # [T]
            out.append(Sample(ids, torch.arange(len(ids)) >= len(r["prompt_ids"])))
        return out
    if dc.source != "sharegpt":
        raise ValueError(f"data.source={dc.source!r}; choose sharegpt, selfgen or synthetic")
    if tokenizer is None:
        raise ValueError("data.source=sharegpt needs the target's tokenizer (a random-weight target has none: use "
                         "data.source=synthetic)")
    # rendering 17k conversations takes ~50 s on a 2-core CPU: the result is cached too, keyed by the data file's
    # bytes (another file at the same path must not reuse it; regenerated records are per conversation id)
    skey = {**key, "regenerate": dc.regenerate, "limit": dc.get("limit"), "max_len": dc.max_len,
            "tokenizer": getattr(tokenizer, "name_or_path", None), "template": tokenizer.chat_template,
            "data_sha256": file_digest(Path(dc.path) if dc.get("path") else asset_path("sharegpt")),
            **({"samples": rc.samples} if rc.samples > 1 else {})}
    rendered = cache_dir / f"samples-sharegpt-{config_hash(skey)}.safetensors"
    if rendered.is_file():
        return read_samples(rendered)
    convs = train_conversations(dc.get("path"), dc.get("limit"), dc.get("max_turns"))
    if dc.regenerate:
        recs = regenerated("sharegpt", [c.id for c in convs],  # the seed + the turn inside
                           lambda idx, sd: regenerate_chats([convs[i] for i in idx], generate, tokenizer, sd))
        messages = [(r["messages"], r["cut"]) for r in recs]
    else:
        messages = [(c.messages, False) for c in convs]
    if rank == 0:
        samples = [render_conversation(tokenizer, m, dc.max_len, cut=x) for m, x in messages if m]
        save_samples(rendered, [s for s in samples if s is not None])
    barrier()
    return read_samples(rendered)
