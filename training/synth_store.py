"""Compact storage of synthesized training sequences: one safetensors file per chunk, written atomically.

A chunk holds its sequences concatenated: `ids` [tokens] uint16 when the vocabulary fits in 16 bits (SmolLM2's
49,152 does; else int32), `mask` [ceil(tokens / 8)] uint8, the loss mask bit-packed (numpy.packbits), and
`offsets` [sequences + 1] int64. Its metadata names the recipe (a hash), the chunk's number and the pool records it
holds, so a file left by another recipe or another chunk is never taken for this one. 30 M tokens take ~64 MB.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from eaglet.training.data import Sample


def chunk_path(out_dir: Path, c: int) -> Path:
    return Path(out_dir) / "chunks" / f"chunk-{c:05d}.safetensors"


def id_dtype(vocab_size: int):
    return np.uint16 if vocab_size <= 1 << 16 else np.int32


def write_json(path: Path, obj) -> None:
    """JSON written under a temporary name and renamed: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    tmp.replace(path)


def write_chunk(path: Path, samples: list[Sample], vocab_size: int, meta: dict) -> None:
    """Sequences [T_i] (ids < vocab_size, masks) -> one safetensors file; `meta` (JSON-able) goes in its header."""
    ids = np.concatenate([s.ids.numpy() for s in samples] or [np.zeros(0, np.int64)])  # [tokens]
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"{path.name}: token ids outside [0, {vocab_size})")
    mask = np.concatenate([s.mask.numpy() for s in samples] or [np.zeros(0, bool)])  # [tokens]
    offsets = np.cumsum([0] + [len(s.ids) for s in samples], dtype=np.int64)  # [n + 1]
    tensors = {"ids": ids.astype(id_dtype(vocab_size)), "mask": np.packbits(mask), "offsets": offsets}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    save_file(tensors, str(tmp), metadata={k: json.dumps(v) for k, v in meta.items()})
    tmp.replace(path)


def chunk_meta(path: Path) -> dict | None:
    """The metadata of a readable chunk file, or None (missing, cut short, not a chunk)."""
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if n > 1 << 24 or path.stat().st_size < 8 + n:
                return None
            header = json.loads(f.read(n))
        meta = {k: json.loads(v) for k, v in header.get("__metadata__", {}).items()}
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        return meta if path.stat().st_size == 8 + n + end else None  # a file cut short is not a chunk
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_chunk(path: Path) -> list[Sample]:
    try:
        t = load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{path}: not a readable chunk ({e}); delete it and rerun synthesize.py to remake it") from e
    o = t["offsets"].tolist()
    mask = np.unpackbits(t["mask"], count=o[-1]).astype(bool)  # [tokens]
    ids = torch.from_numpy(t["ids"].astype(np.int64))  # [tokens]
    return [Sample(ids[a:b], torch.from_numpy(mask[a:b])) for a, b in zip(o, o[1:])]


def load_synthesized(sc, max_len: int, vocab_size: int, target_key: dict, log=print) -> list[Sample]:
    """The training sequences of synthesize.py's output directory `sc.dir` (`data.selfgen`): its first `sc.chunks`
    chunks (null: all), each sequence cut to `max_len` tokens. Every chunk must be there and of the directory's
    recipe, so that a run's data is what its config says."""
    root = Path(str(sc.dir)).expanduser() if sc.get("dir") else None
    if root is None or not (root / "index.json").is_file():
        raise ValueError(f"data.selfgen.dir={sc.get('dir')}: no index.json there; make the data with "
                         f"`python synthesize.py out_dir=DIR` and pass that DIR")
    index = json.loads((root / "index.json").read_text())
    recipe = json.loads((root / "recipe.json").read_text())
    n = index["num_chunks"] if sc.get("chunks") is None else int(sc.chunks)
    if not 1 <= n <= index["num_chunks"]:
        raise ValueError(f"data.selfgen.chunks={sc.chunks}: {root} has {index['num_chunks']} chunks; use 1.."
                         f"{index['num_chunks']} or null (all)")
    if recipe["vocab_size"] > vocab_size:
        raise ValueError(f"data.selfgen.dir={root} holds ids of a {recipe['vocab_size']}-token vocabulary, the target "
                         f"has {vocab_size}: synthesize with this target")
    if recipe.get("target") != target_key:
        log(f"note: {root} was synthesized by target {recipe.get('target')}, this run's is {target_key}")
    bad = [c for c in range(n) if (m := chunk_meta(chunk_path(root, c))) is None or m.get("recipe") != index["recipe"]
           or m.get("chunk") != c]
    if bad:
        raise ValueError(f"data.selfgen.dir={root}: {len(bad)} of the first {n} chunks are missing or not of its "
                         f"recipe (e.g. chunk {bad[0]}); rerun synthesize.py with out_dir={root} to make them, or "
                         f"set data.selfgen.chunks to train on fewer")
    out = []
    for c in range(n):
        out += [Sample(s.ids[:max_len], s.mask[:max_len]) for s in read_chunk(chunk_path(root, c))]
    log(f"self-generated data: {len(out)} sequences from {n} of {index['num_chunks']} chunks of {root}")
    return out
