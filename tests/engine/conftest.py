"""Fixtures of the engine tests."""

from __future__ import annotations

import pytest
from engine_testing import oracle_target


@pytest.fixture(scope="module")
def target():
    """engine_testing.oracle_target(): a random target an oracle-like head accepts deep paths of."""
    return oracle_target()
