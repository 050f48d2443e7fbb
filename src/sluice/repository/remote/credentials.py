"""Credentials for an object-store repository, found where Triton finds them.

Rules of this file:
- ``TRITON_CLOUD_CREDENTIAL_PATH`` set: that JSON file alone decides. Its ``"s3"``, ``"gs"``
  and ``"as"`` objects map a path prefix to credentials; the longest prefix the repository
  path (as given on the command line) starts with wins; "" matches every path. No match is
  an error naming the path (Triton: "Cannot match credential for path").
- Otherwise the environment: S3 ``AWS_ACCESS_KEY_ID`` + ``AWS_SECRET_ACCESS_KEY`` (+
  ``AWS_SESSION_TOKEN``, ``AWS_DEFAULT_REGION``), else the profile ``AWS_PROFILE`` (default
  "default") of ``~/.aws/credentials`` and ``~/.aws/config``; GCS
  ``GOOGLE_APPLICATION_CREDENTIALS`` (a key file; none = anonymous); Azure
  ``AZURE_STORAGE_ACCOUNT`` + ``AZURE_STORAGE_KEY``.
- A ``Credentials`` never prints its secrets: its ``repr`` names only which fields are set.
- Reads only the files named here; everything arrives through ``env`` so tests pass their own.
"""

from __future__ import annotations

import configparser
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

from ...errors import InvalidArgument

__all__ = ["Credentials", "credentials_for", "longest_prefix", "secrets_of"]


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a store client needs; "" = not given. ``source`` says where they came from (for
    logs: never the values)."""

    source: str = "none"
    key_id: str = field(default="", repr=False)
    secret_key: str = field(default="", repr=False)
    session_token: str = field(default="", repr=False)
    region: str = ""
    gcs_key_file: str = ""  # a path: not a secret itself
    account: str = ""
    account_key: str = field(default="", repr=False)

    def __repr__(self) -> str:
        given = [f.name for f in fields(self) if f.name != "source" and getattr(self, f.name)]
        return f"Credentials(source={self.source!r}, given={given})"


def secrets_of(creds: Credentials) -> list[str]:
    """The secret values in ``creds`` (to scrub from any text shown to a user)."""
    return [s for s in (creds.secret_key, creds.session_token, creds.account_key) if s]


def longest_prefix(prefixes: list[str], path: str) -> str | None:
    """The longest of ``prefixes`` that ``path`` starts with, or None (Triton's rule)."""
    matching = [p for p in prefixes if path.startswith(p)]
    return max(matching, key=len) if matching else None


def _from_file(scheme: str, url: str, file: str) -> Credentials:
    try:
        doc = json.loads(Path(file).read_text())
    except (OSError, ValueError) as exc:
        raise InvalidArgument(
            f"TRITON_CLOUD_CREDENTIAL_PATH {file}: cannot read the credential file: "
            f"{type(exc).__name__}"
        ) from None
    table = doc.get(scheme, {}) if isinstance(doc, dict) else {}
    if not isinstance(table, dict):
        table = {}
    chosen = longest_prefix(list(table), url)
    if chosen is None:
        raise InvalidArgument(
            f"Cannot match credential for path {url} in TRITON_CLOUD_CREDENTIAL_PATH {file} "
            f"(no '{scheme}' entry is a prefix of it)"
        )
    entry = table[chosen]
    source = f"TRITON_CLOUD_CREDENTIAL_PATH[{scheme}][{chosen!r}]"
    if scheme == "gs":  # the value is the key file's path
        return Credentials(source, gcs_key_file=str(entry))
    if not isinstance(entry, dict):
        entry = {}
    get = lambda k: str(entry.get(k, "") or "")  # noqa: E731
    if scheme == "s3":
        creds = Credentials(
            source, get("key_id"), get("secret_key"), get("session_token"), get("region")
        )
        if not (creds.key_id and creds.secret_key) and get("profile"):
            return _aws_profile(get("profile"), source, {})
        return creds
    return Credentials(source, account=get("account_str"), account_key=get("account_key"))


def _aws_profile(profile: str, source: str, env: Mapping[str, str]) -> Credentials:
    """``profile`` from the AWS shared files (credentials, then config for the region)."""
    home = Path(env.get("HOME") or Path.home())
    cred_file = Path(env.get("AWS_SHARED_CREDENTIALS_FILE") or home / ".aws" / "credentials")
    conf_file = Path(env.get("AWS_CONFIG_FILE") or home / ".aws" / "config")
    creds = configparser.ConfigParser(interpolation=None)
    conf = configparser.ConfigParser(interpolation=None)
    creds.read(cred_file)
    conf.read(conf_file)
    section = creds[profile] if creds.has_section(profile) else {}
    conf_name = profile if profile == "default" else f"profile {profile}"
    conf_section = conf[conf_name] if conf.has_section(conf_name) else {}

    def get(key: str) -> str:
        return str(section.get(key, "") or conf_section.get(key, "") or "")

    if not (get("aws_access_key_id") and get("aws_secret_access_key")):
        return Credentials("none (unsigned requests)", region=get("region"))
    return Credentials(
        f"{source} profile '{profile}'",
        get("aws_access_key_id"),
        get("aws_secret_access_key"),
        get("aws_session_token"),
        get("region"),
    )


def credentials_for(scheme: str, url: str, env: Mapping[str, str]) -> Credentials:
    """The credentials Triton would use for the repository ``url`` (as given)."""
    file = env.get("TRITON_CLOUD_CREDENTIAL_PATH", "")
    if file:
        return _from_file(scheme, url, file)
    if scheme == "s3":
        key_id, secret = env.get("AWS_ACCESS_KEY_ID", ""), env.get("AWS_SECRET_ACCESS_KEY", "")
        region = env.get("AWS_DEFAULT_REGION", "")
        if key_id and secret:
            return Credentials(
                "environment (AWS_ACCESS_KEY_ID)",
                key_id,
                secret,
                env.get("AWS_SESSION_TOKEN", ""),
                region,
            )
        found = _aws_profile(env.get("AWS_PROFILE") or "default", "AWS config files", env)
        if not found.region and region:
            found = Credentials(
                found.source,
                found.key_id,
                found.secret_key,
                found.session_token,
                region,
            )
        return found
    if scheme == "gs":
        path = env.get("GOOGLE_APPLICATION_CREDENTIALS", "")
        if path:
            return Credentials("environment (GOOGLE_APPLICATION_CREDENTIALS)", gcs_key_file=path)
        return Credentials("none (anonymous)")
    account, key = env.get("AZURE_STORAGE_ACCOUNT", ""), env.get("AZURE_STORAGE_KEY", "")
    if account or key:
        return Credentials("environment (AZURE_STORAGE_ACCOUNT)", account=account, account_key=key)
    return Credentials("none (anonymous)")
