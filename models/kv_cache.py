"""Paged KV pool with a per-request page table (SGLang's req_to_token, with pages).

Layout: `kv [num_layers, 2, num_pages, page_size, Hkv, D]` (one tensor so that `kernels.kv_ops`
moves every layer's K and V in one launch). Request r's position p lives in slot
`req_to_page[r, p // page_size] * page_size + p % page_size` of the flattened pool.
Page 0 is never handed out: padded rows of a batch (CUDA-graph buckets, ragged prefill) point
there, so their writes land in a dummy page instead of another request's cache. Likewise request
row 0 (PAD_ROW) is never handed out and its page-table row stays zero: a graph's padded entries
carry row 0 (cuda_graph.py zero-fills them), and a step that finds its page table and slots from
rows inside the graph (kernels/kv_ops.step_slots) then writes the dummy page too. Requests take
rows 1..max_reqs.
Pages are assigned on the host, which knows every request's length without reading the GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from eaglet.kernels.kv_ops import pool_slots


class KVPoolExhausted(RuntimeError):
    pass


@dataclass
class ForwardBatch:
    """Attention metadata of one forward over T new tokens per request."""

    page_table: torch.Tensor  # [B, P] int32 pages of each request
    prefix_lens: torch.Tensor  # [B] int32 cached tokens before the new ones
    out_slots: torch.Tensor  # [B, T] int64 flat pool slot of each new token's K/V
    attn_mask: torch.Tensor | None = None  # [B, T, T] bool among new tokens; None = causal
    max_prefix_len: int | None = None  # host-side bound on prefix_lens (sizes split-KV grids)


def to_device(values: list[int], device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """A host list as a device tensor without a stream sync. `torch.tensor(values, device=cuda)` is a blocking
    copy, which synchronises the stream: once per decode step it would make the host wait for the GPU to drain,
    so the host's launch work for the next step could not overlap the GPU's work on this one. Staged in
    pinned memory, the copy is queued in stream order and the host returns at once."""
    t = torch.tensor(values, dtype=dtype)  # [n] on the host
    if torch.device(device).type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def slots_for(page_table: torch.Tensor, positions: torch.Tensor, page_size: int,
              valid: torch.Tensor | None = None) -> torch.Tensor:
    """page_table [B, P], positions [B, T] (valid [B, T] bool: 0 where False) -> flat pool slots [B, T] int64, in one
    launch (kernels/kv_ops.pool_slots; no host sync)."""
    return pool_slots(page_table, positions, page_size, valid)


PAD_ROW = 0  # the request row padded batch entries carry (module doc); never a request's


class KVCache:
    def __init__(self, num_layers: int, n_kv_heads: int, head_dim: int, *, max_reqs: int, max_context: int,
                 page_size: int = 16, num_pages: int | None = None, dtype=torch.float32, device="cpu"):
        if page_size < 1:
            raise ValueError(f"kv.page_size={page_size} must be >= 1")
        self.page_size = page_size
        self.max_context = max_context
        self.pages_per_req = math.ceil(max_context / page_size)
        if num_pages is None:  # enough for every request at full context, plus the dummy page
            num_pages = max_reqs * self.pages_per_req + 1
        if num_pages < 2:
            raise ValueError(f"kv.num_pages={num_pages} must be >= 2 (page 0 is the dummy page)")
        self.num_pages = num_pages
        # Zero-initialised: padded rows read the dummy page, and zeros keep their garbage finite.
        self.kv = torch.zeros(num_layers, 2, num_pages, page_size, n_kv_heads, head_dim, dtype=dtype, device=device)
        self.max_reqs = max_reqs
        # row PAD_ROW (0) first: a padded entry's row, all zeros (the dummy page); requests take 1..max_reqs
        self.req_to_page = torch.zeros(max_reqs + 1, self.pages_per_req, dtype=torch.int32, device=device)  # [R+1, P]
        self._free_pages = list(range(num_pages - 1, 0, -1))
        self._free_reqs = list(range(max_reqs, PAD_ROW, -1))
        self._pages: dict[int, list[int]] = {}

    @classmethod
    def for_model(cls, args, **kw) -> "KVCache":
        return cls(args.n_layers, args.n_kv_heads, args.head_dim, **kw)

    @property
    def device(self) -> torch.device:
        return self.kv.device

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.kv[i, 0], self.kv[i, 1]  # [pages, page_size, Hkv, D] each

    def write(self, i: int, out_slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k/v [B, T, Hkv, D] at out_slots [B, T]."""
        Hkv, D = k.shape[-2:]
        idx = out_slots.reshape(-1)  # [B*T]
        self.kv[i, 0].view(-1, Hkv, D).index_copy_(0, idx, k.reshape(-1, Hkv, D).to(self.kv.dtype))
        self.kv[i, 1].view(-1, Hkv, D).index_copy_(0, idx, v.reshape(-1, Hkv, D).to(self.kv.dtype))

    # ---- host-side allocation -------------------------------------------------------------
    def alloc_request(self) -> int:
        if not self._free_reqs:
            raise KVPoolExhausted(f"no free request row: all {self.max_reqs} are in use; "
                                  "raise gen.batch_size / kv.max_reqs or finish requests first")
        r = self._free_reqs.pop()
        self._pages[r] = []
        return r

    def reserve(self, r: int, length: int) -> None:
        """Make request row r hold pages for positions [0, length)."""
        self.reserve_many([(r, length)])

    def reserve_many(self, wants: list[tuple[int, int]]) -> None:
        """reserve(r, length) for every (r, length), with one host-to-device copy and one scatter into the page
        table for all of them. A decode step reserves for every request: at B=32, tau ~2 and 16-token pages, about
        4 requests cross a page per step, and a copy and a scatter each put ~8 small ops per cache on the GPU's
        timeline between two steps."""
        rows: list[int] = []
        cols: list[int] = []
        new: list[int] = []
        try:
            for r, length in wants:
                if length > self.max_context:
                    raise ValueError(f"request needs {length} positions but the KV cache context is "
                                     f"{self.max_context}; shorten the prompt or lower gen.max_new_tokens")
                pages = self._pages[r]
                need = math.ceil(length / self.page_size) - len(pages)
                if need <= 0:
                    continue
                if need > len(self._free_pages):
                    raise KVPoolExhausted(
                        f"KV pool exhausted: a request needs {need} more pages of {self.page_size} tokens but only "
                        f"{len(self._free_pages)} of {self.num_pages - 1} are free; raise kv.num_pages (or leave it "
                        "null to size the pool for the batch), or lower gen.batch_size / gen.max_new_tokens")
                got = [self._free_pages.pop() for _ in range(need)]
                rows += [r] * need
                cols += range(len(pages), len(pages) + need)
                new += got
                pages.extend(got)
        finally:  # the pages handed out before an error are in the page table too
            if new:
                # in stream order; no device value is read back
                rc = to_device(rows + cols, self.device).view(2, -1)  # [2, n]
                self.req_to_page[rc[0], rc[1]] = to_device(new, self.device, torch.int32)

    def free_request(self, r: int) -> None:
        self._free_pages.extend(reversed(self._pages.pop(r)))
        self.req_to_page[r].zero_()
        self._free_reqs.append(r)

    def num_free_pages(self) -> int:
        return len(self._free_pages)
