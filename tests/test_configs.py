"""Every option of every config group composes (lightning-hydra-template's config test)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from eaglet.kernels._compile_cases import TREES
from eaglet.kernels.trie_graft import BLOCK_BRANCH

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


def test_the_default_serves_the_shipped_drafter():
    """`python run_spec.py` decodes the embedded default target with the block drafter eaglet ships for it, at its
    own tree and with one n-gram branch of 15 tokens (the fastest measured at B=1: conf/draft/block.yaml)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("run_spec")
    shipped = CONF.parent / cfg.target.heads[cfg.draft.name]
    assert cfg.draft.name == "block" and cfg.draft.path is None and (shipped / "model.safetensors").is_file()
    assert (cfg.tree.steps, cfg.tree.topk, cfg.tree.num_draft_tokens, cfg.draft.ngram_branches,
            cfg.draft.ngram_depth) == (4, 4, 16, 1, 15)
    # the compile cases and benchmarks graft (and widen) at this branch shape on the block tree
    assert BLOCK_BRANCH == (cfg.draft.ngram_branches, cfg.draft.ngram_depth)
    assert (cfg.tree.steps, cfg.tree.topk, cfg.tree.num_draft_tokens, cfg.tree.root_children) == next(
        t[1:] for t in TREES if t.name == "block")


@pytest.mark.parametrize("overrides, tree", [
    (["draft=eagle3"], (5, 4, 8, None)),  # the other drafters keep the default tree
    (["tree=eagle2"], (5, 4, 8, None)),  # a tree named on the command line wins over the drafter's
    (["tree=chain", "draft=block"], (5, 1, 6, None)),  # a chain: the root's children go with the block tree
    (["tree.steps=7"], (7, 4, 16, 16)),
])
def test_a_drafter_picks_its_tree_unless_told(overrides, tree):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("run_spec", overrides=overrides)
    assert (cfg.tree.steps, cfg.tree.topk, cfg.tree.num_draft_tokens, cfg.tree.root_children) == tree


def test_every_group_has_options():
    assert {"target", "draft", "tree", "stream", "data", "logger", "hardware"} <= set(GROUPS)
    assert all(options(g) for g in GROUPS)


@pytest.mark.parametrize("experiment", sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")))
def test_experiments_compose(experiment):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("run_spec", overrides=[f"+experiment={experiment}"])
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)


@pytest.mark.parametrize("overrides, ok", [
    (["draft.ngram_branches=1", "draft.ngram_depth=15", "tree.simulate.tau=12"], True),  # branches 15 deep: up to 16
    (["draft.ngram_branches=1", "draft.ngram_depth=15", "tree.simulate.tau=16.5"], False),
    (["draft.ngram_branches=0", "draft.ngram_depth=15", "tree.simulate.tau=12"], False),  # no branches: 7 + 1
])
def test_simulated_tau_is_bounded_by_the_accept_depth(overrides, ok):
    """tree=simulate draws lengths up to the engine's depth + 1, which deeper n-gram branches raise
    (runner/config.py's accept_depth, the engine's Drafter.depth before anything loads)."""
    from eaglet.runner.checks import Checks
    from eaglet.runner.config import check_run_spec_values

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("run_spec", overrides=["tree=simulate", *overrides])
    c = Checks(cfg)
    check_run_spec_values(c)
    assert (not any("tree.simulate.tau" in e for e in c.errors)) == ok, c.errors
