"""The EAGLE drafter's config (conf/draft/eagle1.yaml, eagle3.yaml, multi_layer.yaml) checked before anything loads:
torch-free, so a bad value fails within the interpreter's start-up (runner/config.py runs `check_values` as the
first layer of the draft group's checks; the head's own checks, which read it, are `EagleDrafter.check_config`)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the checkout (eaglet installs editable): shipped heads live here
HEAD_KINDS = ("eagle1", "eagle3", "multi_layer")  # models.eagle.KINDS, named here without importing torch


def head_dir(draft, target_cfg) -> Path | None:
    """The head a run loads: draft.path, else the target's shipped one (None: a random head)."""
    if draft.get("path"):
        return Path(draft.path).expanduser()
    shipped = (target_cfg.get("heads") or {}).get(draft.name)
    return REPO / shipped if shipped and not draft.get("random_init") else None


def no_head(draft: str, target: str) -> str:
    return (f"draft={draft} needs draft.path=<head directory>, or draft.random_init=true for a random head "
            f"(losslessness and latency checks only: it accepts almost nothing); eaglet ships no {draft} head for "
            f"target={target}. draft=none decodes without one")


def check_values(c) -> None:
    """Layer 1 (runner/checks.py's Checks `c`): the head kind, the random head's shape, where its weights are."""
    name = c.choice("draft.name", HEAD_KINDS)
    c.integer("draft.num_layers", lo=1)
    c.integer("draft.draft_vocab_size", lo=1, null=True)
    if name is not None:
        check_head_source(c, name)


def check_head_source(c, name: str) -> None:
    """draft.path holds a head, or the target ships one for draft `name`, or draft.random_init is set."""
    path = c.path("draft.path", "dir", null=True, what="a head directory (config.json + model.safetensors)")
    random_init = c.flag("draft.random_init")
    if path is not None:
        has_config = (path / "config.json").is_file()
        weights = any(path.glob("*.safetensors")) or (path / "pytorch_model.bin").is_file()
        if not (has_config and weights):
            lacks = " or ".join(w for w, ok in (("config.json", has_config), ("weights", weights)) if not ok)
            c.bad("draft.path", str(path), f"holds no {lacks}: a head folder holds config.json and model.safetensors "
                                           f"(the EAGLE / EAGLE-3 layout train_draft.py writes; or EAGLE's "
                                           f"pytorch_model.bin)")
    elif c.value("draft.path") is None and random_init is False:
        shipped = (c.value("target.heads") or {}).get(name)
        if not shipped:
            c.bad("draft.path", None, no_head(name, c.value("target.name")))
        elif not (REPO / shipped / "config.json").is_file():
            c.bad(f"target.heads.{name}", shipped, f"the shipped head is not in {REPO}; pass "
                                                   f"draft.path=<head directory>")
