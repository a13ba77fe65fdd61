"""Train an EAGLE draft head: `python train_draft.py [overrides]` (see conf/train_draft.yaml).

Multi-GPU: `torchrun --nproc-per-node N train_draft.py hydra.run.dir=DIR ...` (DDP, rank 0 logs and saves)."""

import hydra
from omegaconf import DictConfig

from eaglet.runner.entry import register_help, run_task

register_help()  # --help lists this script's groups and keys with conf/'s comments


@hydra.main(version_base="1.3", config_path="conf", config_name="train_draft")
def main(cfg: DictConfig) -> dict:
    from eaglet.training.loop import train

    return run_task(train, cfg)  # config errors: one line each, exit 2; interrupted: 130 / 143


if __name__ == "__main__":
    main()
