"""Triton's model-repository URL forms (s3, gs, as) and the refusals of malformed ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.errors import InvalidArgument
from sluice.repository.remote.url import StoreUrl, is_remote, parse_url


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("s3://bucket/path/to/models", StoreUrl("s3", "bucket", "path/to/models/")),
        ("s3://bucket", StoreUrl("s3", "bucket", "")),
        ("s3://bucket/", StoreUrl("s3", "bucket", "")),
        ("s3://bucket//a///b/", StoreUrl("s3", "bucket", "a/b/")),
        (
            "s3://127.0.0.1:9000/bucket/models",
            StoreUrl("s3", "bucket", "models/", endpoint="http://127.0.0.1:9000"),
        ),
        (
            "s3://http://minio.local:9000/bucket/models",
            StoreUrl("s3", "bucket", "models/", endpoint="http://minio.local:9000"),
        ),
        (
            "s3://https://minio.local:9443/bucket/a/b",
            StoreUrl("s3", "bucket", "a/b/", endpoint="https://minio.local:9443"),
        ),
        ("s3://host:9000/bucket", StoreUrl("s3", "bucket", "", endpoint="http://host:9000")),
        ("gs://bucket/models", StoreUrl("gs", "bucket", "models/")),
        ("gs://bucket", StoreUrl("gs", "bucket", "")),
        ("as://acct/container/models", StoreUrl("as", "container", "models/", account="acct")),
        (
            "as://acct.blob.core.windows.net/container",
            StoreUrl("as", "container", "", account="acct"),
        ),
    ],
)
def test_forms(given: str, expected: StoreUrl) -> None:
    assert parse_url(given) == expected


def test_url_for_messages_is_the_cleaned_form() -> None:
    assert parse_url("s3://bucket//models/").url == "s3://bucket/models"
    assert parse_url("s3://127.0.0.1:9000/b/m").url == "s3://127.0.0.1:9000/b/m"
    assert parse_url("s3://https://h:1/b/m").url == "s3://https://h:1/b/m"
    assert parse_url("as://a/c/m").object_url("m/x/config.pbtxt") == "as://a/c/m/x/config.pbtxt"


@pytest.mark.parametrize(
    "bad",
    [
        "s3://",
        "s3:///",
        "gs://",
        "as://account",
        "s3://https://host/bucket",  # an endpoint needs a port
        "s3://host:9000/Bucket_Upper/models",  # Triton's endpoint form: lower-case buckets
        "ftp://bucket/models",
    ],
)
def test_malformed_urls_are_refused_naming_them(bad: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_url(bad)
    assert bad in str(info.value)


def test_is_remote() -> None:
    assert is_remote("s3://b/m") and is_remote("gs://b") and is_remote("as://a/c")
    assert not is_remote("/models") and not is_remote("models/s3://x") and not is_remote("hdfs://x")


def test_cli_places_mirrors_among_local_paths_and_refuses_a_bad_url(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from sluice.cli import parse_serve_args

    cfg = parse_serve_args(
        [
            "--model-repository=/a",
            "--model-repository=s3://bucket/models",
            "--model-repository=/b",
            f"--repository-cache-dir={tmp_path}",
            "--repository-cache-size=1G",
        ]
    )
    ((url, mirror),) = cfg.remote_repositories
    assert url == "s3://bucket/models" and mirror.parent == tmp_path / "mirrors"
    assert cfg.model_repositories == (Path("/a"), mirror, Path("/b"))
    assert cfg.repository_cache_size == 1 << 30
    with pytest.raises(SystemExit) as info:
        parse_serve_args(["--model-repository=s3://https://host/bucket"])
    assert info.value.code == 2
