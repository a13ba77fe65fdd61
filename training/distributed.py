"""The training job's processes: joining a torchrun job (DDP: NCCL on GPU, gloo on CPU), the collectives the
loop needs, FSDP2 sharding and the whole head gathered back on rank 0."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from eaglet.models.eagle import DraftHead


class Dist:
    """This process's place in a torchrun job (rank 0 of 1 without torchrun)."""

    def __init__(self):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.owned = False  # whether this module created the process group (and so destroys it)

    @property
    def main(self) -> bool:
        return self.rank == 0

    def init(self, device_type: str) -> None:
        """Join the torchrun job from its environment variables (env://): NCCL on GPU, gloo on CPU."""
        if self.world > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
            self.owned = True

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            dist.all_reduce(t)
        return t

    def broadcast(self, obj):
        if self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def any_stop(self, signum: int, time_up: bool, device) -> tuple[int, bool]:
        """(the largest signal number any process received, whether any process is past its time limit): the
        processes stop at the same step. One all-reduce of two numbers per step with several processes."""
        if self.world == 1:
            return signum, time_up
        t = torch.tensor([signum, int(time_up)], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t[0]), bool(t[1])

    def close(self) -> None:
        """Ranks leave together: a gloo group torn down while a peer is still busy can abort the
        process ("terminate called without an active exception", seen in the CPU DDP test)."""
        if self.world > 1 and dist.is_initialized():
            dist.barrier()
        if self.owned:
            dist.destroy_process_group()


def join(hardware, output_dir) -> tuple[Dist, torch.device, torch.dtype, Path]:
    """Join the job on the device `hardware` (conf/hardware) resolves to, one GPU per local rank ->
    (Dist, device, dtype, the run directory every process writes to)."""
    from eaglet.runner.common import resolve_hardware

    dd = Dist()
    device, dtype = resolve_hardware(hardware)
    if device.type == "cuda" and dd.world > 1:
        device = torch.device("cuda", dd.local_rank)
        torch.cuda.set_device(device)
    dd.init(device.type)
    # every process must write to one run directory: rank 0's (Hydra's ${now:...} may differ per process)
    return dd, device, dtype, Path(dd.broadcast(str(output_dir)))


def wrap(objective: nn.Module, device: torch.device, dd: Dist, fsdp: bool) -> nn.Module:
    """What the loop runs: the objective itself (one process), under DDP, or sharded by FSDP2."""
    if fsdp:
        return shard(objective, device)
    if dd.world > 1:
        # the buffers (a draft vocabulary's d2t/t2d) are equal on every process (same data, same vocabulary)
        return nn.parallel.DistributedDataParallel(objective, device_ids=[device.index] if device.type == "cuda"
                                                   else None)
    return objective


def shard(objective: nn.Module, device: torch.device) -> nn.Module:
    """FSDP2 over the head's parameters (ZeRO-3: weights, gradients and AdamW states split across the
    processes; whole only inside the forward and backward). The target is a plain attribute of the head,
    so it stays whole and unsharded on every process."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    return fully_shard(objective, mesh=init_device_mesh(device.type, (dist.get_world_size(),)))


def gathered(model: nn.Module, head: DraftHead, fsdp: bool, main: bool) -> DraftHead | None:
    """The head with whole weights on rank 0 (None elsewhere): the head itself, or under FSDP a twin filled
    from the gathered state (a collective every process must join)."""
    if not fsdp:
        return head if main else None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not main:
        return None
    with torch.device(head.target.device):
        twin = type(head)(head.config, head.target)
    twin.load_state_dict({k.removeprefix("head."): v for k, v in sd.items()})
    return twin
