"""Target features for training: online (the frozen target runs in the loop) or from an offline cache.

Online (the default) costs one target forward per micro-batch and no disk: for small targets (SmolLM2-135M)
it is a fraction of the head's step. The offline cache (safetensors shards, one file set per process) pays
off when the target is large and the data is seen for several epochs; it stores per sequence the head's
feature input (EAGLE-3: the three captured layers, 3*H wide) and the target's final hidden state (from which
the loop recomputes the target's logits with its frozen lm_head), in the target's dtype.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from eaglet.models.kv_cache import ForwardBatch, KVCache, slots_for
from eaglet.models.llama import Transformer


class OnlineFeatures:
    """Runs the frozen target over right-padded batches: tokens [B, T] -> (feature [B, T, F], final hidden
    [B, T, H]). Causal attention keeps the padding out of real rows, so no padding mask is needed."""

    def __init__(self, target: Transformer, head, page_size: int = 64):
        self.target, self.head, self.page_size = target, head, page_size
        self.capture = tuple(head.capture_layers(target.args.n_layers))
        self.kv: KVCache | None = None

    def _cache(self, B: int, T: int) -> KVCache:
        """One pool reused across batches; rebuilt (larger) only when a batch does not fit."""
        kv = self.kv
        if kv is None or kv.max_reqs < B or kv.max_context < T:
            old_B, old_T = (0, 0) if kv is None else (kv.max_reqs, kv.max_context)
            self.kv = kv = KVCache.for_model(self.target.args, max_reqs=max(B, old_B), max_context=max(T, old_T),
                                             page_size=self.page_size, dtype=self.target.dtype,
                                             device=self.target.device)
            for _ in range(kv.max_reqs):  # rows 1..max_reqs (row 0 is the padding row)
                kv.reserve(kv.alloc_request(), kv.max_context)
        return kv

    @torch.no_grad()  # not inference_mode: the outputs enter the head's autograd graph as constants
    def __call__(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, T = tokens.shape
        kv = self._cache(B, T)
        pos = torch.arange(T, device=tokens.device).expand(B, T)  # [B, T]
        page_table = kv.req_to_page[1:B + 1]  # [B, P]: the requests' rows 1..B
        batch = ForwardBatch(page_table, torch.zeros(B, dtype=torch.int32, device=tokens.device),
                             slots_for(page_table, pos, kv.page_size), None, 0)
        hidden, captured = self.target(tokens, pos, batch, kv, capture_layers=self.capture)  # [B, T, H]
        return self.head.target_feature(hidden, captured), hidden


def cache_bytes(lengths: list[int], feature_width: int, hidden_width: int, dtype: torch.dtype) -> int:
    """Disk size of an offline cache: per token the feature (unless it is the final hidden state) + the hidden."""
    width = hidden_width + (feature_width if feature_width != hidden_width else 0)
    return sum(lengths) * width * torch.empty(0, dtype=dtype).element_size()


def build_offline_cache(directory: str | Path, sequences: list[torch.Tensor], indices: list[int],
                        features: OnlineFeatures, *, batch_size: int, shard_mb: int, tag: str = "r0") -> Path:
    """Compute and write the features of `sequences[i]` for i in `indices` (this process's share) as
    `<tag>-<n>.safetensors` shards of about `shard_mb` MB plus `<tag>.index.json`; skips a finished tag."""
    directory = Path(directory)
    index_path = directory / f"{tag}.index.json"
    if index_path.is_file():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    index: dict[str, str] = {}
    shard: dict[str, torch.Tensor] = {}
    shard_bytes, n = 0, 0

    def flush():
        nonlocal shard, shard_bytes, n
        if shard:
            name = f"{tag}-{n:05d}.safetensors"
            save_file(shard, str(directory / name))
            index.update({k.split(".")[0]: name for k in shard})
            shard, shard_bytes, n = {}, 0, n + 1

    same = features.head.feature_size == features.target.args.dim
    for start in range(0, len(indices), batch_size):
        chunk = indices[start:start + batch_size]
        lens = [len(sequences[i]) for i in chunk]
        tokens = torch.zeros(len(chunk), max(lens), dtype=torch.long)  # [b, T] right-padded
        for row, i in enumerate(chunk):
            tokens[row, : lens[row]] = sequences[i]
        feat, hidden = features(tokens.to(features.target.device))  # [b, T, F], [b, T, H]
        for row, (i, L) in enumerate(zip(chunk, lens)):
            shard[f"{i}.hidden"] = hidden[row, :L].cpu().contiguous()
            if not same:
                shard[f"{i}.feature"] = feat[row, :L].cpu().contiguous()
            shard_bytes += L * (hidden.shape[-1] + (0 if same else feat.shape[-1])) * hidden.element_size()
        if shard_bytes >= shard_mb * 2**20:
            flush()
    flush()
    tmp = index_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(index))
    tmp.replace(index_path)  # the index is written last: its presence marks the tag complete
    return directory


class OfflineFeatures:
    """Reads an offline cache (every process's index) back: right-padded batches like `OnlineFeatures`."""

    def __init__(self, directory: str | Path, device):
        self.directory, self.device = Path(directory), device
        self.index: dict[str, str] = {}
        for p in sorted(self.directory.glob("*.index.json")):
            self.index.update(json.loads(p.read_text()))
        self._handles: dict[str, object] = {}

    def _get(self, name: str):
        key = name.split(".")[0]
        if key not in self.index:
            raise KeyError(f"{self.directory}: sequence {key} is not in the offline feature cache; rebuild it "
                           f"(delete the directory) after changing the data")
        f = self.index[key]
        if f not in self._handles:
            self._handles[f] = safe_open(str(self.directory / f), framework="pt")
        h = self._handles[f]
        return h.get_tensor(name) if name in h.keys() else None

    def __call__(self, indices: list[int], T: int) -> tuple[torch.Tensor, torch.Tensor]:
        hid = [self._get(f"{i}.hidden") for i in indices]
        feat = [self._get(f"{i}.feature") for i in indices]
        feat = hid if feat[0] is None else feat

        def pad(ts):  # -> [B, T, W] right-padded with zeros
            out = torch.zeros(len(ts), T, ts[0].shape[-1], dtype=ts[0].dtype)
            for row, t in enumerate(ts):
                out[row, : t.shape[0]] = t
            return out.to(self.device, non_blocking=True)

        h = pad(hid)
        return (h if feat is hid else pad(feat)), h
