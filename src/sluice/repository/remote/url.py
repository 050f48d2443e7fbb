"""Triton's model-repository URL forms for object stores, parsed into one ``StoreUrl``.

Rules of this file (the forms are Triton's, read from its core ``src/filesystem/``):
- ``s3://bucket/path`` (AWS), ``s3://host:port/bucket/path`` (an S3-compatible endpoint over
  plain HTTP), ``s3://http://host:port/bucket/path`` and ``s3://https://host:port/bucket/path``.
  Repeated slashes collapse, leading and trailing ones are dropped, as Triton cleans the path.
- ``gs://bucket/path``; ``as://account/container/path`` (``account`` may be written
  ``account.blob.core.windows.net``).
- Anything that is not one of these is refused with a message naming the URL and the forms.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...errors import InvalidArgument

__all__ = ["SCHEMES", "StoreUrl", "is_remote", "parse_url"]

SCHEMES = ("s3", "gs", "as")

# Triton's S3 endpoint form: host:port, then a bucket of lower-case letters, digits, '.', '-'
_S3_ENDPOINT = re.compile(
    r"(?P<proto>http://|https://|)(?P<host>[0-9a-zA-Z\-.]+):(?P<port>[0-9]+)/"
    r"(?P<bucket>[0-9a-z.\-]+)(?P<path>(/[0-9a-zA-Z.\-_]+)*)"
)
_AS_FORM = re.compile(r"(?P<account>[^/]+)/(?P<container>[^/?]+)(?:/(?P<path>[^?]*))?")
_FORMS = (
    "s3://bucket/path, s3://host:port/bucket/path, s3://https://host:port/bucket/path, "
    "gs://bucket/path, as://account/container/path"
)


@dataclass(frozen=True, slots=True)
class StoreUrl:
    """One repository in an object store. ``prefix`` is the key prefix of the repository
    ("" or ending in "/"); ``endpoint`` is "" for the provider's own service."""

    scheme: str  # "s3" | "gs" | "as"
    bucket: str  # S3/GCS bucket, Azure container
    prefix: str
    endpoint: str = ""  # "http://host:port" or "https://host:port" (S3 only)
    account: str = ""  # Azure storage account

    @property
    def url(self) -> str:
        """The URL as written in messages: the cleaned form the user gave."""
        if self.scheme == "as":
            head = f"as://{self.account}/{self.bucket}"
        elif self.endpoint:
            proto, _, hostport = self.endpoint.partition("://")
            shown = hostport if proto == "http" else self.endpoint
            head = f"s3://{shown}/{self.bucket}"
        else:
            head = f"{self.scheme}://{self.bucket}"
        return head + ("/" + self.prefix.rstrip("/") if self.prefix else "")

    def object_url(self, key: str) -> str:
        """The URL of one object under this repository, for messages."""
        rel = key[len(self.prefix) :] if key.startswith(self.prefix) else key
        return f"{self.url}/{rel}"


def is_remote(path: str) -> bool:
    """True for a repository path that names an object store (``s3://``, ``gs://``, ``as://``)."""
    return path.split("://", 1)[0] in SCHEMES and "://" in path


def _clean(rest: str, url: str) -> str:
    """Triton's cleaning: drop leading/trailing slashes and collapse repeated ones."""
    cleaned = re.sub(r"/{2,}", "/", rest.strip("/"))
    if not cleaned:
        raise InvalidArgument(f"invalid model repository URL '{url}': no bucket name")
    return cleaned


def _prefix(path: str) -> str:
    path = path.strip("/")
    return path + "/" if path else ""


def parse_url(url: str) -> StoreUrl:
    """``url`` (one of Triton's forms) as a StoreUrl; InvalidArgument naming it otherwise."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in SCHEMES:
        raise InvalidArgument(f"invalid model repository URL '{url}': expected one of {_FORMS}")
    if scheme == "s3":
        proto = ""
        for p in ("https://", "http://"):
            if rest.startswith(p):
                proto, rest = p, rest[len(p) :]
        cleaned = _clean(rest, url)
        m = _S3_ENDPOINT.fullmatch(proto + cleaned)
        if m is not None:
            endpoint = ("https://" if m["proto"] == "https://" else "http://") + (
                f"{m['host']}:{m['port']}"
            )
            return StoreUrl("s3", m["bucket"], _prefix(m["path"]), endpoint=endpoint)
        if proto or re.match(r"[^/]*:\d+(/|$)", cleaned):
            raise InvalidArgument(
                f"invalid model repository URL '{url}': an S3 endpoint is written "
                "s3://[http://|https://]host:port/bucket/path (bucket: lower-case letters, "
                "digits, '.', '-'; path: letters, digits, '.', '-', '_')"
            )
        bucket, _, path = cleaned.partition("/")
        return StoreUrl("s3", bucket, _prefix(path))
    if scheme == "gs":
        cleaned = _clean(rest, url)
        bucket, _, path = cleaned.partition("/")
        return StoreUrl("gs", bucket, _prefix(path))
    m = _AS_FORM.fullmatch(rest.split("?", 1)[0])
    if m is None:
        raise InvalidArgument(
            f"invalid model repository URL '{url}': Azure storage is written "
            "as://account/container/path"
        )
    account = m["account"].removesuffix(".blob.core.windows.net")
    return StoreUrl("as", m["container"], _prefix(m["path"] or ""), account=account)
