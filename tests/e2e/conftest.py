"""Module-scoped variant of ``start_server`` for e2e modules whose tests share one server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import server_launcher


@pytest.fixture(scope="module")
def module_server() -> Iterator:
    """``start(repo, *flags, ready=True)`` like ``start_server``, stopped when the module ends."""
    with server_launcher() as start:
        yield start


@pytest.fixture(scope="module")
def module_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("e2e")
    repo = base / "repo"
    repo.mkdir()
    return repo
