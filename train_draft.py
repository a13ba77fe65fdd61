"""Train an EAGLE draft head: `python train_draft.py [overrides]` (see conf/train_draft.yaml).

Multi-GPU: `torchrun --nproc-per-node N train_draft.py hydra.run.dir=DIR ...` (DDP, rank 0 logs and saves)."""

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="train_draft")
def main(cfg: DictConfig) -> dict:
    from eaglet.training.loop import train

    return train(cfg, HydraConfig.get().runtime.output_dir)


if __name__ == "__main__":
    main()
