"""Shared fixtures: the embedded SmolLM2 target (fp32, CPU) and small helpers."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def smollm2_path():
    from eaglet.data.assets import asset_path

    return asset_path("smollm2_gguf")


@pytest.fixture(scope="session")
def smollm2(smollm2_path):
    from eaglet.models.llama import Transformer

    return Transformer.from_pretrained(smollm2_path, dtype=torch.float32, device="cpu")


@pytest.fixture(scope="session")
def tokenizer(smollm2_path):
    from eaglet.models.checkpoint import load_tokenizer

    return load_tokenizer(smollm2_path)
