"""Shared fixtures: the embedded SmolLM2 target (fp32, CPU) and small helpers."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from eaglet.models.checkpoint import hub_kernels_first

hub_kernels_first()  # before any test imports transformers (models/checkpoint.py says why)


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


@pytest.fixture
def sigint_default():
    """SIGINT as an interactive shell leaves it (Python's KeyboardInterrupt handler), also when the test run was
    started as a background job, which inherits SIGINT ignored; the tests that send it need it delivered."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)



def pytest_runtest_logreport(report):
    """EAGLET_TEST_TIMES=<file>: each test's set-up and call seconds appended as they end (scripts/gpu_session.sh
    tests), so that a run its time limit cuts still says where the time went (pytest's --durations prints only at the
    end)."""
    path = os.environ.get("EAGLET_TEST_TIMES")
    if path and report.when in ("setup", "call"):
        with open(path, "a") as f:
            f.write(f"{report.duration:8.2f} {report.when:5} {report.nodeid}\n")
