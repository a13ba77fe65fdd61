"""Every option of every config group composes (lightning-hydra-template's config test)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

CONF = Path(__file__).resolve().parent.parent / "conf"
# the groups run_spec.yaml's defaults list selects (train_draft.yaml's are composed by tests/training)
GROUPS = sorted(next(iter(d)) for d in OmegaConf.load(CONF / "run_spec.yaml").defaults if not isinstance(d, str))
# values the user must supply for some options (a local checkpoint or prompt file)
REQUIRED = {"target.path": "/models/x", "data.path": "/tmp/prompts.jsonl"}


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in options(g)])
def test_compose(group, option):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("run_spec", overrides=[f"{group}={option}"])
        for key in OmegaConf.missing_keys(cfg):
            assert key in REQUIRED, f"{group}={option} leaves {key} unset"
            OmegaConf.update(cfg, key, REQUIRED[key])
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
        assert cfg[group] is not None


def test_the_default_serves_the_shipped_head():
    """`python run_spec.py` decodes the embedded default target with the EAGLE-3 head eaglet ships for it."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("run_spec")
    shipped = CONF.parent / cfg.target.heads[cfg.draft.name]
    assert cfg.draft.name == "eagle3" and cfg.draft.path is None and (shipped / "model.safetensors").is_file()


def test_every_group_has_options():
    assert {"target", "draft", "tree", "stream", "data", "logger", "hardware"} <= set(GROUPS)
    assert all(options(g) for g in GROUPS)


@pytest.mark.parametrize("experiment", sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")))
def test_experiments_compose(experiment):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("run_spec", overrides=[f"+experiment={experiment}"])
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
