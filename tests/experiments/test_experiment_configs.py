"""conf/experiment/*: every experiment composes, and every point of its sweep is a valid run configuration."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from eaglet.engine.drafters.eagle import check_eagle_tree
from eaglet.engine.speculative import TreeSpec

CONF = Path(__file__).resolve().parents[2] / "conf"
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))


def sweep_points(cfg) -> list[list[str]]:
    """The overrides of every job of the experiment's multirun sweep."""
    params = cfg.hydra.sweeper.params
    keys = list(params)
    return [[f"{k}={v}" for k, v in zip(keys, vals)]
            for vals in itertools.product(*(str(params[k]).split(",") for k in keys))]


def compose_run(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("run_spec", overrides=overrides, return_hydra_config=True)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_sweep_point_composes(name):
    base = compose_run([f"+experiment={name}"])
    assert str(base.hydra.mode).endswith("MULTIRUN") and base.logger.group == name
    points = sweep_points(base)
    assert len(points) >= 3
    for point in points:
        cfg = compose_run([f"+experiment={name}", *point])
        if cfg.draft.name != "none":  # the trees the engine would build are valid, for EAGLE heads too
            t = cfg.tree
            TreeSpec(t.steps, t.topk, t.num_draft_tokens, t.get("root_children")).validate()
            if cfg.draft.drafter == "eagle":
                check_eagle_tree(t.steps, t.topk, t.num_draft_tokens, vocab=8192)


def test_compare_heads_finds_each_kind_in_heads_dir():
    cfg = compose_run(["+experiment=compare_heads", "draft=multi_layer", "heads_dir=/h"])
    assert cfg.draft.path == "/h/smollm2_135m_multi_layer"
