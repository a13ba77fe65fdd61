"""Serve prompts through eaglet and measure: `python run_spec.py [overrides]` (see conf/run_spec.yaml)."""

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="run_spec")
def main(cfg: DictConfig) -> dict:
    from eaglet.spec.run import run

    return run(cfg, HydraConfig.get().runtime.output_dir)


if __name__ == "__main__":
    main()
