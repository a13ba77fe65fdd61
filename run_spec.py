"""Serve prompts through eaglet and measure: `python run_spec.py [overrides]` (see conf/run_spec.yaml)."""

import hydra
from omegaconf import DictConfig

from eaglet.runner.entry import register_help, run_task

register_help()  # --help lists this script's groups and keys with conf/'s comments


@hydra.main(version_base="1.3", config_path="conf", config_name="run_spec")
def main(cfg: DictConfig) -> dict:
    from eaglet.runner.run import run

    return run_task(run, cfg)  # config errors: one line each, exit 2; interrupted: 130 / 143


if __name__ == "__main__":
    main()
