"""Training checkpoints: written whole or not at all, verified before a resume trusts them.

    checkpoints/step_<n>/   config.json + model.safetensors (the head in the public layout, fp32),
                            train_state.pt (optimiser, scheduler, RNG states, data position: plain tensors and
                            dicts, read back with torch.load(weights_only=True)), and manifest.json (each file's
                            size and sha256, written last)

A checkpoint is written under a temporary name and renamed, so a crash never leaves a half one under its real
name. A resume takes the newest checkpoint that verifies: every file of its manifest present with its size and
sha256. One that does not (a truncated copy, a full disk, a flipped byte) is renamed `corrupt_step_<n>` (kept
for a look, out of the way of later resumes and of `keep_last`) and the run says so and takes the one before.
A checkpoint without a manifest is verified by opening its files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
from pathlib import Path

import torch

from eaglet.models.head_checkpoint import load_draft_head, save_draft_head
from eaglet.runner.checks import ConfigError

log = logging.getLogger("eaglet")
_CKPT = re.compile(r"step_(\d+)")
MANIFEST = "manifest.json"


class CorruptCheckpoint(ValueError):
    """A checkpoint whose files do not match its manifest or cannot be read; the message names the file."""


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": list(random.getstate())}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def sha256(path: Path) -> str:
    """1.8 GB/s on the 2-core CPU (SHA-NI): ~0.1 s for a SmolLM2 EAGLE-3 checkpoint, a few s for an 8B head's."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def save_checkpoint(run_dir: Path, step: int, head, state: dict, keep_last: int) -> Path:
    """Write checkpoints/step_<n>/ (see the module docstring); keep the newest `keep_last` (0 = all)."""
    root = run_dir / "checkpoints"
    final = root / f"step_{step:08d}"
    tmp = root / f".tmp_step_{step:08d}"
    shutil.rmtree(tmp, ignore_errors=True)
    save_draft_head(head, tmp, dtype=torch.float32, include_embedding=False)  # fp32: resume is exact
    torch.save(state, tmp / "train_state.pt")
    files = {p.name: {"bytes": p.stat().st_size, "sha256": sha256(p)} for p in sorted(tmp.iterdir()) if p.is_file()}
    (tmp / MANIFEST).write_text(json.dumps({"step": step, "files": files}, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    for old in list_checkpoints(run_dir)[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(run_dir: Path) -> list[Path]:
    """checkpoints/step_* of a run directory, oldest first."""
    root = Path(run_dir) / "checkpoints"
    found = [p for p in root.glob("step_*") if _CKPT.fullmatch(p.name) and p.is_dir()]
    return sorted(found, key=lambda p: int(_CKPT.fullmatch(p.name)[1]))


def checkpoint_step(path: Path) -> int:
    return int(_CKPT.fullmatch(path.name)[1])


def verify(path: Path) -> None:
    """Raise CorruptCheckpoint unless the checkpoint's files are whole."""
    manifest = path / MANIFEST
    if not manifest.is_file():
        _open_files(path)
        return
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptCheckpoint(f"{manifest}: unreadable ({e})") from None
    for name, want in files.items():
        f = path / name
        if not f.is_file():
            raise CorruptCheckpoint(f"{f}: missing (the manifest lists it)")
        if f.stat().st_size != want["bytes"]:
            raise CorruptCheckpoint(f"{f}: {f.stat().st_size} bytes, the manifest records {want['bytes']} (truncated "
                                    f"or overwritten)")
        if sha256(f) != want["sha256"]:
            raise CorruptCheckpoint(f"{f}: its sha256 differs from the manifest's (the file is corrupt)")


def _open_files(path: Path) -> None:
    """A checkpoint without a manifest: its files open (a truncated zip or safetensors file does not)."""
    from safetensors import safe_open

    for name in ("config.json", "model.safetensors", "train_state.pt"):
        if not (path / name).is_file():
            raise CorruptCheckpoint(f"{path / name}: missing")
    try:
        json.loads((path / "config.json").read_text())
        with safe_open(str(path / "model.safetensors"), "pt"):
            pass
    except Exception as e:  # json, safetensors and OS errors alike mean the same here
        raise CorruptCheckpoint(f"{path}: {type(e).__name__}: {e}") from None
    read_state(path)


def read_state(path: Path) -> dict:
    """train_state.pt of a checkpoint; CorruptCheckpoint naming the file when it cannot be read."""
    f = path / "train_state.pt"
    try:
        return torch.load(f, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises OSError, RuntimeError, EOFError, UnpicklingError... by the damage
        raise CorruptCheckpoint(f"{f}: cannot be read ({type(e).__name__}: {e})") from None


def pick_checkpoint(resume, run_dir: Path) -> Path | None:
    """The checkpoint to resume from (rank 0 decides; the others are told): train.resume=auto -> the newest of
    this run directory that verifies, or None; null -> None; a run directory -> its newest that verifies; a
    checkpoint directory -> that one, which must verify."""
    if resume in (None, False, "none", "null"):
        return None
    path = Path(run_dir if resume == "auto" else str(resume)).expanduser()
    if resume != "auto" and (path / "train_state.pt").is_file():
        try:
            verify(path)
        except CorruptCheckpoint as e:
            raise ConfigError([f"train.resume={resume}: {e}; pass another checkpoint"]) from None
        return path
    found = list_checkpoints(path)
    if resume != "auto" and not found:
        raise ConfigError([f"train.resume={resume}: neither a checkpoint (step_*/ with train_state.pt) nor a run "
                           f"directory holding checkpoints/step_*"])
    for ckpt in reversed(found):
        try:
            verify(ckpt)
            return ckpt
        except CorruptCheckpoint as e:
            aside = ckpt.with_name(f"corrupt_{ckpt.name}")
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(ckpt, aside)
            log.warning(f"skipping checkpoint {ckpt.name}: {e}; moved to {aside.name}")
    if found:
        log.warning(f"no checkpoint in {path / 'checkpoints'} verifies: starting from step 0")
    return None


def load_checkpoint(path: Path, head, fsdp: bool) -> dict:
    """Load the head's weights (before any FSDP sharding) -> the saved training state (optimiser, scheduler,
    RNG, data position), restored by `restore_training_state` once the optimiser exists."""
    saved = load_draft_head(path, head.target, dtype=torch.float32, device=head.device)
    head.load_state_dict(saved.state_dict())
    state = read_state(path)
    if bool(state.get("fsdp", False)) != fsdp:
        raise ValueError(f"{path}: saved with train.fsdp={bool(state.get('fsdp', False))}, this run has "
                         f"train.fsdp={fsdp}: the optimiser states are stored differently; resume with the same "
                         f"setting")
    return state


def check_batch_settings(state: dict, path: Path, global_batch: int, grad_accum: int) -> None:
    """A resume keeps the data position only under the batch settings it was saved with."""
    if state["global_batch"] != global_batch or state["grad_accum"] != grad_accum:
        raise ValueError(f"{path}: saved with global batch {state['global_batch']} x accumulation "
                         f"{state['grad_accum']}, this run has {global_batch} x {grad_accum}: "
                         f"the data position would not mean the same; resume with the same batch settings")


def optimizer_state(model, opt, fsdp: bool) -> dict:
    """What a checkpoint stores of the optimiser: its state dict, or under FSDP the whole one with FQN keys
    (gathered: a collective every process must join)."""
    if not fsdp:
        return opt.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def clear_run_dir(run_dir: Path, best_dir: Path) -> None:
    """A fresh start: the log, metrics and exported heads another run left in this directory go."""
    for leftover in ("train_log.jsonl", "metrics.json"):
        (run_dir / leftover).unlink(missing_ok=True)
    for leftover in (best_dir, run_dir / "head"):
        shutil.rmtree(leftover, ignore_errors=True)


def truncate_log(log_path: Path, step: int) -> None:
    """Drop what was logged after the checkpoint of `step`: those steps rerun."""
    if log_path.is_file():
        kept = [line for line in log_path.read_text().splitlines() if json.loads(line)["step"] <= step]
        log_path.write_text("".join(line + "\n" for line in kept))


def restore_training_state(state: dict, model, opt, sched, fsdp: bool) -> None:
    if fsdp:  # saved whole (FQN keys): every process loads it and keeps its shard
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(model, opt, state["optimizer"], options=StateDictOptions(full_state_dict=True))
    else:
        opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
