"""Set-up shared by the entry points (run_spec.py, train_draft.py, synthesize.py): the device and dtype, the
target's weights (a file or random) and the profiler. Nothing here imports torch at module
level: runner/config.py uses it while checking a config, before anything heavy loads."""

from __future__ import annotations

import contextlib
import functools
import logging
from pathlib import Path

log = logging.getLogger("eaglet")
DTYPE_NAMES = ("float32", "bfloat16", "float16")


def resolve_hardware(hw):
    """hardware.device / hardware.dtype -> (torch.device, torch.dtype): auto = a visible GPU in bf16, else the
    CPU in fp32."""
    import torch

    dev = hw.device
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(dev)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"hardware.device={dev} but no CUDA/ROCm device is visible; use hardware=cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"hardware.device={dev} but {torch.cuda.device_count()} GPU(s) are visible; use cuda:0..")
    if hw.dtype == "auto":
        return device, torch.bfloat16 if device.type == "cuda" else torch.float32
    if hw.dtype not in DTYPE_NAMES:
        raise ValueError(f"hardware.dtype={hw.dtype!r}; choose auto or one of {sorted(DTYPE_NAMES)}")
    return device, getattr(torch, hw.dtype)


def target_path(tc) -> Path:
    """target.path, or the embedded asset's file (fetched into the cache when absent)."""
    if tc.get("path"):
        return Path(tc.path).expanduser()
    if not tc.get("asset"):
        raise ValueError(f"target.path is required for target={tc.name}")
    from eaglet.data.assets import asset_path

    return asset_path(tc.asset)


@functools.lru_cache(maxsize=1)
def random_target(name: str, dtype, device):
    """A registry config with random weights, built directly on the device (no host copy of 16 GB).
    Cached: the jobs of a Hydra multirun share one process, and one 8B init is enough."""
    import torch

    from eaglet.models.llama import ModelArgs, Transformer

    with torch.device(device):
        model = Transformer(ModelArgs.from_name(name)).to(dtype)
    return model.eval()


@contextlib.contextmanager
def trace_steps(n: int, output_dir):
    """Yields a per-step callback; with n > 0, a PyTorch profiler Chrome trace of n steps (decode or
    training steps, after 2 skipped and 1 warm-up step) is written to <output_dir>/trace.json, for looking
    at the streams side by side (chrome://tracing or Perfetto), and the ops taking the most time are printed."""
    if n <= 0:
        yield None
        return
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    path = Path(output_dir) / "trace.json"
    gpu = torch.cuda.is_available()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])

    def ready(p):
        p.export_chrome_trace(str(path))
        # device time finds slow kernels; host time finds a GPU left idle (launch-bound or syncing steps)
        for key in ("self_device_time_total", "self_cpu_time_total") if gpu else ("self_cpu_time_total",):
            log.info("top ops by %s:\n%s", key, p.key_averages().table(sort_by=key, row_limit=20))

    with profile(activities=acts, schedule=schedule(wait=2, warmup=1, active=n, repeat=1),
                 on_trace_ready=ready) as prof:
        yield prof.step
    log.info(f"profiler trace: {path}")
