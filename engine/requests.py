"""Request bookkeeping both engines share (engine/autoregressive.py, engine/speculative.py): a request and its token
budget, which waiting requests join the batch, how emitted tokens end a request, the padded inputs of a ragged
prefill, and the host side of the decode loop (a step's tokens copied to the host without a sync, a device sync).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import torch

from eaglet.models.kv_cache import to_device


@dataclass
class Request:
    prompt_ids: list[int]
    max_new_tokens: int
    rid: int = 0
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "eos" | "length" | set by an on_token callback that ends it (e.g. "loop")
    row: int = -1  # KV request row while active
    launched: int = 0  # tokens whose computation has been launched (host bookkeeping)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


def check_request(r: Request, context: int) -> None:
    """Refuse an empty or too long prompt; cap the budget at the context."""
    if not r.prompt_ids:
        raise ValueError(f"request {r.rid} has an empty prompt")
    if len(r.prompt_ids) >= context:
        raise ValueError(f"request {r.rid}: the prompt has {len(r.prompt_ids)} tokens but the context is {context} "
                         "(model.max_seq_len / gen.max_context); shorten the prompt or raise the context")
    r.max_new_tokens = min(r.max_new_tokens, context - len(r.prompt_ids))


def admit(waiting: deque, n_active: int, max_batch: int, min_admit: int) -> list[Request]:
    """The waiting requests to prefill now: as many as fit, but while others decode only once `min_admit` rows
    are free (or all that wait fit). Admitting every freed row alone runs one eager prefill per finished request:
    in an H200 MT-bench run at B=8 those took 3.6 of 8.4 s, against ~1 ms per graph-replayed decode step."""
    free = max_batch - n_active
    if not waiting or free <= 0 or (n_active and free < min(min_admit, len(waiting))):
        return []
    return [waiting.popleft() for _ in range(min(len(waiting), free))]


def default_min_admit(max_batch: int) -> int:
    """A quarter of the batch: prefills of several prompts, decode rows idle only briefly."""
    return max(1, max_batch // 4)


def emit(r: Request, tokens: list[int], eos_ids: set[int], on_token) -> None:
    """Append tokens to a request until it finishes (EOS or budget); later ones are dropped. on_token(r, t) runs
    after r took t, so on its last token r.done is already true (callers record finished answers there)."""
    for t in tokens:
        if r.done:
            return
        r.output_ids.append(t)
        if t in eos_ids:
            r.finish_reason = "eos"
        elif len(r.output_ids) >= r.max_new_tokens:
            r.finish_reason = "length"
        if on_token is not None:
            on_token(r, t)


def pad_prompts(reqs: list[Request], device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Ragged prompts right-padded to the longest -> tokens, positions [n, T], valid [n, T] bool, lens [n]."""
    lens = [len(r.prompt_ids) for r in reqs]
    T = max(lens)
    tokens = torch.zeros(len(reqs), T, dtype=torch.long)  # [n, T]
    for i, r in enumerate(reqs):
        tokens[i, : lens[i]] = torch.tensor(r.prompt_ids)
    lens_t = to_device(lens, device)  # [n]
    positions = torch.arange(T, device=device).expand(len(reqs), T)  # [n, T]
    return tokens.to(device), positions, positions < lens_t[:, None], lens_t


class PendingTokens:
    """A step's tokens on their way to the host, for the requests that produced them: a non-blocking copy behind
    an event, so the host reads them (`get`) only when it needs them and the GPU keeps a step queued meanwhile."""

    def __init__(self, tokens: torch.Tensor, reqs: list[Request]):
        self.reqs = reqs
        # copy=True: on a CPU `to` would return the tensor itself, a graph's output buffer the next step overwrites
        self.host = tokens.to("cpu", non_blocking=True, copy=True)  # tokens' shape: [B] or [B, ...]
        self.event = None
        if tokens.device.type != "cpu":
            self.event = torch.get_device_module(tokens.device).Event()
            self.event.record()

    def get(self) -> list:
        """The tokens as host lists (one entry per request), waiting for the copy if it is still running."""
        if self.event is not None:
            self.event.synchronize()
        return self.host.tolist()


def synchronizer(device: torch.device) -> Callable[[], None]:
    """Waits for all work queued on the device (nothing to wait for on a CPU); through torch.get_device_module,
    so the same code runs on CUDA and ROCm."""
    return (lambda: None) if device.type == "cpu" else torch.get_device_module(device).synchronize
