"""Fixtures of the training tests: a tiny 8-layer target (EAGLE-3's default capture needs >= 7 layers) and
the real train_draft config composed with CPU-sized overrides."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from eaglet.models.llama import ModelArgs, Transformer

CONF = Path(__file__).resolve().parents[2] / "conf"
TINY = dict(vocab_size=256, dim=128, n_layers=8, n_heads=2, n_kv_heads=1, head_dim=64, intermediate_size=256,
            max_seq_len=512, eos_token_ids=())


@pytest.fixture(autouse=True)
def one_thread():
    """These tests run tiny tensors: one intra-op thread is as fast, and on a loaded 2-core machine two
    OpenMP threads make them ~30x slower (measured: a 12-step run took 1.4 s with one, 50 s with two)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_target(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelArgs(**TINY)).eval()


@pytest.fixture(scope="module")
def target() -> Transformer:
    return tiny_target()


@pytest.fixture
def small_cfg(tmp_path):
    """small_cfg(kind, *overrides) -> conf/train_draft.yaml with synthetic data, CPU, no W&B, a few steps."""
    return lambda kind, *overrides: _small_cfg(tmp_path, kind, *overrides)


def _small_cfg(tmp_path: Path, kind: str, *overrides: str):
    """conf/train_draft.yaml with synthetic data, CPU, no W&B, a few steps (EAGLE-3: 64-token draft
    vocabulary, 3 unrolled steps)."""
    base = [f"train/head={kind}", "data.source=synthetic", "data.regenerate=false", "data.synthetic.num=16",
            "data.synthetic.min_len=16", "data.synthetic.max_len=40", f"data.cache_dir={tmp_path / 'cache'}",
            "train.batch_size=4", "train.steps=4", "train.log_every=1", "train.ckpt_every=0", "train.progress=false",
            "eval.every=0", "logger=none", "hardware=cpu", "train.optim.warmup_steps=2", "train.optim.lr=1e-3"]
    if kind == "eagle3":
        base += ["train.head.draft_vocab_size=64", "train.head.ttt_length=3"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("train_draft", overrides=[*base, *overrides])
