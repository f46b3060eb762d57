"""Fixtures of the Windows end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rbroker.demo.coordinator import LocalCoordinator


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCoordinator]:
    """A coordinator set up in a fresh data dir (SQLite), serving on a free 127.0.0.1 port,
    for the tests of one module."""
    c = LocalCoordinator.setup(tmp_path_factory.mktemp("coord") / "data")
    c.start(timeout_s=120)
    yield c
    c.stop()
