"""Synthesize training data for a draft head: `python synthesize.py [overrides]` (see conf/synthesize.yaml and
training/synthesis.py). Several GPUs: `torchrun --standalone --nproc-per-node N synthesize.py out_dir=DIR ...`."""

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="synthesize")
def main(cfg: DictConfig) -> dict:
    from eaglet.training.synthesis import synthesize

    return synthesize(cfg)


if __name__ == "__main__":
    main()
