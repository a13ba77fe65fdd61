"""Autoregressive baseline: batched ragged prefill + decode over the paged KV pool.

Continuous batching: requests join when a row frees up and leave when they hit EOS or their
token budget. The host learns tokens one step late: after launching step t it waits on the copy
of step t-1's tokens (a non-blocking D2H copy behind an event), so the GPU always has a step
queued. A request that finished at t-1 therefore runs one extra step whose token is dropped.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from eaglet.engine.cuda_graph import GraphRunner
from eaglet.engine.requests import (
    PendingTokens,
    Request,
    admit,
    check_request,
    default_min_admit,
    emit,
    pad_prompts,
    synchronizer,
)
from eaglet.engine.sampling import SamplingParams, sample
from eaglet.kernels.kv_ops import step_slots
from eaglet.models.kv_cache import ForwardBatch, KVCache, slots_for, to_device
from eaglet.models.llama import Transformer


@dataclass
class GenStats:
    new_tokens: int = 0
    prefill_s: float = 0.0
    total_s: float = 0.0
    decode_steps: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.total_s if self.total_s else 0.0


class AREngine:
    def __init__(self, model: Transformer, kv: KVCache, max_batch: int, sampling: SamplingParams = SamplingParams(),
                 eos_ids: Sequence[int] = (), use_cuda_graph: bool | None = None, seed: int = 0,
                 min_admit: int | None = None):
        self.model, self.kv, self.max_batch = model, kv, max_batch
        self.min_admit = default_min_admit(max_batch) if min_admit is None else min_admit  # see `admit`
        self.sampling = sampling
        self.eos_ids = set(eos_ids)
        self.device = model.device
        self.reseed(seed)
        if use_cuda_graph is None:
            use_cuda_graph = self.device.type == "cuda"
        self._decode = GraphRunner(
            self._decode_fn,
            lambda B: dict(tokens=torch.zeros(B, dtype=torch.long, device=self.device),  # [B]
                           positions=torch.zeros(B, dtype=torch.int32, device=self.device),  # [B]
                           rows=torch.zeros(B, dtype=torch.long, device=self.device)),  # [B]
            max_batch=max_batch, enabled=use_cuda_graph)

    def reseed(self, seed: int) -> None:
        """Restart sampling from `seed`. CUDA graphs replay the default generator's philox offsets correctly (it
        is registered with every capture); a private generator would not be, so on a GPU the seed goes to the
        default one."""
        if self.device.type == "cpu":
            self.generator = torch.Generator().manual_seed(seed)
        else:
            self.generator = None
            torch.manual_seed(seed)

    def warmup(self) -> None:
        """Capture the decode graphs of every batch bucket before anything is timed."""
        self._decode.warmup()

    # ---- device work --------------------------------------------------------------------
    @torch.inference_mode()
    def _decode_fn(self, tokens: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor):
        """One decode step: tokens [B], positions [B] int32 (each token's, its request's cached length), rows [B]
        (the requests' KV rows) -> (next tokens [B], their positions [B] int32). The page table and the slot come
        from one `step_slots` launch inside the graph; the outputs are the graph's own buffers, read (staged, copied
        to the host) before the next replay, so the loop does not clone them (as engine/speculative.py)."""
        page_table, pos, slots = step_slots(self.kv.req_to_page, rows, positions, 1,
                                            self.kv.page_size)  # [B, P], [B, 1], [B, 1]
        batch = ForwardBatch(page_table, positions, slots, None, self.kv.max_context - 1)
        hidden, _ = self.model(tokens[:, None], pos, batch, self.kv)  # [B, 1, dim]
        logits = self.model.logits(hidden[:, -1], float32=not self.sampling.greedy)  # [B, V]: fp32 to sample from
        return sample(logits, self.sampling, self.generator), positions + 1  # [B] x2

    @torch.inference_mode()
    def _prefill(self, reqs: list[Request]) -> torch.Tensor:
        """Ragged prompts, right-padded to the longest -> first new token of each [n]."""
        dev = self.device
        tokens, positions, valid, lens_t = pad_prompts(reqs, dev)  # [n, T] x3, [n]
        page_table = self.kv.req_to_page[to_device([r.row for r in reqs], dev)]  # [n, P]
        # padded positions write the dummy slot 0; causal masking keeps them out of real rows
        out_slots = slots_for(page_table, positions, self.kv.page_size, valid)  # [n, T]
        batch = ForwardBatch(page_table, torch.zeros_like(lens_t, dtype=torch.int32), out_slots, None, 0)
        hidden, _ = self.model(tokens, positions, batch, self.kv)  # [n, T, dim]
        last = hidden[torch.arange(len(reqs), device=dev), lens_t - 1]  # [n, dim]
        return sample(self.model.logits(last, float32=not self.sampling.greedy), self.sampling, self.generator)  # [n]

    # ---- host loop ----------------------------------------------------------------------
    def _record(self, copy: PendingTokens, on_token: Callable[[Request, int], None] | None) -> None:
        for r, tok in zip(copy.reqs, copy.get()):
            emit(r, [tok], self.eos_ids, on_token)  # a request done one step earlier drops its extra token

    def _retire(self, active: list[Request], tokens: torch.Tensor, positions: torch.Tensor):
        """Drop requests that saw EOS or whose whole token budget is launched; free their KV rows."""
        keep = [i for i, r in enumerate(active) if not r.done and r.launched < r.max_new_tokens]
        if len(keep) == len(active):
            return active, tokens, positions
        kept = set(keep)  # on the list, `i not in keep` cost 0.93 ms a step at B=512 (0.02 as a set; a 2-core CPU)
        for i, r in enumerate(active):
            if i not in kept:
                self.kv.free_request(r.row)
        idx = to_device(keep, self.device)
        return [active[i] for i in keep], tokens[idx], positions[idx]

    def generate(self, requests: list[Request], on_token: Callable[[Request, int], None] | None = None,
                 on_step: Callable[[], None] | None = None, stats: GenStats | None = None) -> GenStats:
        """Decode `requests` to the end -> their stats. `stats`: filled in place, its totals also when an
        exception (an interrupt) stops the loop, so the caller keeps the numbers of the part that ran."""
        for r in requests:
            check_request(r, self.kv.max_context)
        stats = GenStats() if stats is None else stats
        sync = synchronizer(self.device)
        sync()
        t0 = time.perf_counter()
        try:
            self._loop(requests, stats, sync, on_token, on_step)
        finally:
            sync()
            stats.total_s = time.perf_counter() - t0
            stats.new_tokens = sum(len(r.output_ids) for r in requests)
        return stats

    def _loop(self, requests: list[Request], stats: GenStats, sync, on_token, on_step) -> None:
        waiting = deque(requests)
        active: list[Request] = []
        tokens = torch.empty(0, dtype=torch.long, device=self.device)  # [B] next input token
        positions = torch.empty(0, dtype=torch.int32, device=self.device)  # [B] its position
        rows, rows_key = None, None  # the active requests' rows on the device [B], and on the host
        inflight: deque[PendingTokens] = deque()
        while waiting or active or inflight:
            new = admit(waiting, len(active), self.max_batch, self.min_admit)
            if new:
                for r in new:
                    r.row = self.kv.alloc_request()
                    r.launched = 1
                self.kv.reserve_many([(r.row, len(r.prompt_ids) + 1) for r in new])
                tp = time.perf_counter()
                first = self._prefill(new)  # [n]
                inflight.append(PendingTokens(first, new))
                active += new
                tokens = torch.cat([tokens, first])
                positions = torch.cat([positions, to_device([len(r.prompt_ids) for r in new], self.device,
                                                            torch.int32)])
                sync()
                stats.prefill_s += time.perf_counter() - tp
            active, tokens, positions = self._retire(active, tokens, positions)
            if active:
                self.kv.reserve_many([(r.row, len(r.prompt_ids) + r.launched + 1) for r in active])
                for r in active:
                    r.launched += 1
                key = tuple(r.row for r in active)
                if key != rows_key:  # a host-to-device copy only when the batch changed, not every step
                    rows, rows_key = to_device(list(key), self.device), key  # [B]
                nxt, nxt_positions = self._decode(tokens, positions, rows)  # [B] x2
                stats.decode_steps += 1
                if on_step is not None:
                    on_step()
                inflight.append(PendingTokens(nxt, list(active)))
                tokens, positions = nxt, nxt_positions
            # read the older copies (lag 1 keeps a step queued on the GPU); all of them when idle
            while len(inflight) > (1 if active else 0):
                self._record(inflight.popleft(), on_token)
            active, tokens, positions = self._retire(active, tokens, positions)
