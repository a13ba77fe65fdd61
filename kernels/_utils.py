"""Helpers shared by the Triton kernels."""

from __future__ import annotations

import functools
import os

import torch

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # the activations' dtypes every float kernel takes


def use_triton(*tensors: torch.Tensor) -> bool:
    """Run the Triton kernel (GPU tensors, or CPU under TRITON_INTERPRET=1) instead of the torch reference.
    The kernels have no backward: when autograd needs one, the (differentiable) reference runs.
    EAGLET_KERNELS=torch runs the references everywhere: PyTorch's CUDA sanitizer sees only ATen ops, so a
    race through a Triton kernel's reads or writes (the draft's tree tokens, which a stream plan copies) is
    invisible to it."""
    if os.environ.get("EAGLET_KERNELS") == "torch":
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return False
    return all(t.is_cuda for t in tensors) or os.environ.get("TRITON_INTERPRET") == "1"


def is_hip() -> bool:
    """True on ROCm builds of torch (there `torch.cuda` drives the AMD GPU)."""
    return torch.version.hip is not None


def is_interpret() -> bool:
    """True when Triton kernels run in the CPU interpreter (CI)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    """SMs (CUs on ROCm) of a CUDA device: what the launch planners fill. Cached: launchers ask on every call."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def check_like(name: str, t: torch.Tensor, shape: tuple, x: torch.Tensor) -> None:
    """Raise ValueError unless t has `shape` and x's dtype and device."""
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(t.shape)}")
    if t.dtype != x.dtype:
        raise ValueError(f"{name} dtype {t.dtype} != input dtype {x.dtype}: cast {name} to {x.dtype}")
    if t.device != x.device:
        raise ValueError(f"{name} is on {t.device}, the input on {x.device}: move it to {x.device}")


def check_weight(weight: torch.Tensor, K: int, x: torch.Tensor, bias: torch.Tensor | None) -> None:
    """Raise ValueError unless weight is a row-major [N >= 1, K] nn.Linear weight (and bias [N]) like x."""
    if weight.dim() != 2 or weight.shape[0] == 0 or weight.shape[1] != K:
        raise ValueError(f"weight must be [N, {K}] with N >= 1 (nn.Linear layout), got shape {list(weight.shape)}")
    check_like("weight", weight, tuple(weight.shape), x)
    if weight.stride(1) != 1:
        raise ValueError(f"weight must be row-major (stride 1 along K), got strides {weight.stride()}: "
                         "call .contiguous() once at load time, not per call")
    if bias is not None:
        check_like("bias", bias, (weight.shape[0],), x)


def autotune_configs(configs: list) -> list:
    """Configs for `@triton.autotune`: all of them, or only the first (the default) in the
    interpreter (one config skips benchmarking) or when EAGLET_AUTOTUNE=0 (tests on a GPU,
    where tuning every shape would cost minutes of compilation)."""
    if is_interpret() or os.environ.get("EAGLET_AUTOTUNE") == "0":
        return configs[:1]
    return configs


def copy_bandwidth(device="cuda") -> float:
    """Measured device-to-device copy bandwidth in bytes/s, counting read + write (1 GiB buffers): the
    divisor of the HBM floors the benchmarks and run metrics report."""
    import triton

    src = torch.empty(2**30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=100, return_mode="median")
    return 2 * src.numel() / (ms * 1e-3)
