"""Module-scoped variant of ``start_server`` for e2e modules whose tests share one server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ServerProcess


@pytest.fixture(scope="module")
def module_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """``start(repo, *flags, ready=True)`` like ``start_server``, stopped when the module ends."""
    started: list[ServerProcess] = []

    def start(repo: Path, *flags: str, ready: bool = True, **kw: object) -> ServerProcess:
        srv = ServerProcess(repo, *flags, **kw)  # type: ignore[arg-type]
        started.append(srv)
        if ready:
            srv.wait_ready()
        else:
            srv.wait_live()
        return srv

    yield start
    for srv in started:
        srv.stop()
        for child in srv.leftover_children():
            child.kill()


@pytest.fixture(scope="module")
def module_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("e2e")
    repo = base / "repo"
    repo.mkdir()
    return repo
