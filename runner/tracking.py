"""Run bookkeeping: environment facts, the metrics JSON, and W&B (offline by default)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent


def git_commit() -> str | None:
    """HEAD, with "-dirty" where tracked files differ from it (a copy of a working tree, as the GPU machine runs,
    keeps the .git of an older commit: its HEAD alone would name code that did not run)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=5)
        if not head.stdout.strip():
            return None
    except (OSError, subprocess.SubprocessError):
        return None
    try:
        clean = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=REPO, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):  # a slow or failed check leaves HEAD as it is
        return head.stdout.strip()
    return head.stdout.strip() + ("-dirty" if clean.returncode == 1 else "")


def environment(device: torch.device) -> dict:
    import triton

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"device_name": name, "torch": torch.__version__, "triton": triton.__version__,
            "hip": torch.version.hip, "git_commit": git_commit()}


class Tracker:
    """Writes metrics.json in the run directory; mirrors scalars to W&B when logger.name=wandb."""

    def __init__(self, logger_cfg, config: dict, output_dir: str | Path):
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.run = None
        if logger_cfg.name == "wandb":
            import wandb

            os.environ.setdefault("WANDB_SILENT", "true")
            self.run = wandb.init(project=logger_cfg.project, mode=logger_cfg.mode, group=logger_cfg.group,
                                  tags=list(logger_cfg.tags or []), config=config, dir=str(self.output_dir),
                                  reinit="finish_previous")

    def location(self) -> str | None:
        """Where the W&B run is, in words: its offline folder and the command that uploads it, or its URL."""
        if self.run is None or self.run.disabled:
            return None
        if self.run.offline:
            sync_dir = self.run.settings.sync_dir
            return f"W&B run (offline): {sync_dir}; upload it: wandb sync {sync_dir}"
        return f"W&B run: {self.run.url}"

    def log(self, metrics: dict, step: int | None = None) -> None:
        if self.run is not None:
            self.run.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=step)

    def finish(self, metrics: dict) -> Path:
        path = self.output_dir / "metrics.json"
        path.write_text(json.dumps(metrics, indent=2, default=str))
        if self.run is not None:
            self.run.summary.update({k: v for k, v in metrics.items() if isinstance(v, (int, float, str))})
            self.run.finish()
        return path
