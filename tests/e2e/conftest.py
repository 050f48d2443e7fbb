"""Module-scoped fixtures for e2e modules whose tests share one server: ``sluice serve``, and
the object-store servers of ``tests/stores.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import server_launcher
from tests.stores import AzureServer, GcsServer, S3Server, StoreServer, StoreUnavailable


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


def _store_server(cls: type[StoreServer], tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """A started store server of ``cls`` (its own process and port for each xdist worker), or
    a skip naming what is not installed."""
    try:
        srv = cls(tmp_path_factory.mktemp(cls.scheme + "-store")).start()
    except StoreUnavailable as e:
        pytest.skip(str(e))
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """moto's S3 server on 127.0.0.1, bucket ``models``; stopped when the module ends."""
    yield from _store_server(S3Server, tmp_path_factory)


@pytest.fixture(scope="module")
def gcs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcsServer]:
    """fake-gcs-server on 127.0.0.1, bucket ``models``; stopped when the module ends."""
    yield from _store_server(GcsServer, tmp_path_factory)


@pytest.fixture(scope="module")
def azure_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzureServer]:
    """Azurite's blob service on 127.0.0.1, container ``models``; stopped when the module ends."""
    yield from _store_server(AzureServer, tmp_path_factory)
