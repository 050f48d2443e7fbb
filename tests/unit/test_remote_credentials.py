"""Where credentials come from (Triton's order) and the longest-prefix rule of
TRITON_CLOUD_CREDENTIAL_PATH; secrets never in a repr."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluice.errors import InvalidArgument
from sluice.repository.remote.credentials import credentials_for, longest_prefix, secrets_of


def test_longest_prefix_wins() -> None:
    prefixes = ["", "s3://bucket", "s3://bucket/models", "s3://other"]
    assert longest_prefix(prefixes, "s3://bucket/models/a") == "s3://bucket/models"
    assert longest_prefix(prefixes, "s3://bucket/x") == "s3://bucket"
    assert longest_prefix(prefixes, "s3://third") == ""
    assert longest_prefix(["s3://a"], "s3://b") is None


def test_s3_from_the_environment() -> None:
    env = {
        "AWS_ACCESS_KEY_ID": "AKID",
        "AWS_SECRET_ACCESS_KEY": "Sec-123",
        "AWS_SESSION_TOKEN": "Tok-456",
        "AWS_DEFAULT_REGION": "eu-west-1",
    }
    c = credentials_for("s3", "s3://b/m", env)
    assert (c.key_id, c.secret_key, c.session_token, c.region) == (
        "AKID",
        "Sec-123",
        "Tok-456",
        "eu-west-1",
    )
    assert "Sec-123" not in repr(c) and "Tok-456" not in repr(c)
    assert secrets_of(c) == ["Sec-123", "Tok-456"]


def test_s3_profile_from_the_aws_files(tmp_path: Path) -> None:
    aws = tmp_path / ".aws"
    aws.mkdir()
    (aws / "credentials").write_text(
        "[default]\naws_access_key_id = D\naws_secret_access_key = d\n"
        "[prod]\naws_access_key_id = P\naws_secret_access_key = p\n"
    )
    (aws / "config").write_text("[profile prod]\nregion = ap-south-1\n")
    c = credentials_for("s3", "s3://b", {"HOME": str(tmp_path), "AWS_PROFILE": "prod"})
    assert (c.key_id, c.secret_key, c.region) == ("P", "p", "ap-south-1")
    c = credentials_for("s3", "s3://b", {"HOME": str(tmp_path)})
    assert (c.key_id, c.secret_key) == ("D", "d")
    c = credentials_for("s3", "s3://b", {"HOME": str(tmp_path / "nowhere")})
    assert not c.key_id and c.source.startswith("none")


def test_gcs_and_azure_from_the_environment() -> None:
    g = credentials_for("gs", "gs://b", {"GOOGLE_APPLICATION_CREDENTIALS": "/k.json"})
    assert g.gcs_key_file == "/k.json"
    assert credentials_for("gs", "gs://b", {}).gcs_key_file == ""
    a = credentials_for(
        "as", "as://a/c", {"AZURE_STORAGE_ACCOUNT": "acct", "AZURE_STORAGE_KEY": "k3y"}
    )
    assert (a.account, a.account_key) == ("acct", "k3y") and "k3y" not in repr(a)


def test_credential_file_longest_prefix_per_scheme(tmp_path: Path) -> None:
    file = tmp_path / "creds.json"
    file.write_text(
        json.dumps(
            {
                "s3": {
                    "": {"secret_key": "s0", "key_id": "k0", "region": "r0"},
                    "s3://bucket/models": {"secret_key": "s1", "key_id": "k1", "region": "r1"},
                },
                "gs": {"gs://bucket": "/path/to/key.json"},
                "as": {"as://acct/c": {"account_str": "acct", "account_key": "ak"}},
            }
        )
    )
    env = {"TRITON_CLOUD_CREDENTIAL_PATH": str(file), "AWS_ACCESS_KEY_ID": "ignored"}
    assert credentials_for("s3", "s3://bucket/models/x", env).key_id == "k1"
    assert credentials_for("s3", "s3://elsewhere", env).key_id == "k0"
    assert credentials_for("gs", "gs://bucket/m", env).gcs_key_file == "/path/to/key.json"
    assert credentials_for("as", "as://acct/c/m", env).account_key == "ak"
    with pytest.raises(InvalidArgument, match="Cannot match credential for path gs://other"):
        credentials_for("gs", "gs://other", env)


def test_unreadable_credential_file_names_it_without_content(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"s3": {"": {"secret_key": "leak"')
    with pytest.raises(InvalidArgument) as info:
        credentials_for("s3", "s3://b", {"TRITON_CLOUD_CREDENTIAL_PATH": str(bad)})
    assert str(bad) in str(info.value) and "leak" not in str(info.value)
