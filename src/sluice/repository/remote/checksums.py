"""The checksum a store reports for an object, and a download checked against it.

Rules of this file:
- What each store reports, and so what is checked (besides the listed size, always):
  S3: the ETag when it is 32 hex digits, the MD5 of the content (a single PUT; a multipart
  upload's ETag ends in ``-N`` and is no digest of the content). GCS: the ``X-Goog-Hash``
  header of the object (its ``md5Hash`` and ``crc32c``): the MD5, else the CRC32C (a composite
  object has no MD5). Azure: ``Content-MD5`` (set by an upload in one request, or by the
  uploader; a blob uploaded in blocks without it has none).
- MD5 is preferred; a CRC32C is computed only when it is the only checksum reported, with
  ``google-crc32c`` (in the ``storage`` extra). Without that library such an object is
  checked by its size alone and the log says so, once.
- Only what will be checked is computed: a download with nothing to check hashes nothing.
- ETags are compared without their quotes and weak prefix (a listing and a response may
  quote the same tag differently).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Digest",
    "Reported",
    "from_content_md5",
    "from_goog_hash",
    "from_s3_etag",
    "normal_etag",
    "same_etag",
]

log = logging.getLogger("sluice.repository")

_crc32c_missing_told = False


@dataclass(frozen=True, slots=True)
class Reported:
    """The checksums a store reports for one object; ``source`` names where they came from
    (for messages)."""

    md5: bytes | None = None
    crc32c: bytes | None = None  # 4 bytes, big-endian (as GCS encodes it)
    source: str = ""


def _b64(value: str, size: int) -> bytes | None:
    try:
        raw = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) == size else None


def from_s3_etag(etag: str | None) -> Reported:
    """An S3 ETag that is a plain MD5 (32 hex digits), else nothing to check."""
    tag = normal_etag(etag)
    if re.fullmatch(r"[0-9a-fA-F]{32}", tag):
        return Reported(md5=bytes.fromhex(tag), source="the ETag")
    return Reported()


def from_goog_hash(values: Iterable[str]) -> Reported:
    """GCS's ``X-Goog-Hash`` header(s): ``crc32c=<b64>,md5=<b64>``, in one header or two."""
    md5 = crc = None
    for value in values:
        for part in value.split(","):
            name, _, v = part.strip().partition("=")
            if name.lower() == "md5":
                md5 = _b64(v, 16)
            elif name.lower() == "crc32c":
                crc = _b64(v, 4)
    if md5 is None and crc is None:
        return Reported()
    return Reported(md5=md5, crc32c=crc, source="X-Goog-Hash")


def from_content_md5(value: str | None) -> Reported:
    """Azure's ``Content-MD5`` (base64), when the blob has one."""
    md5 = _b64(value, 16) if value else None
    return Reported(md5=md5, source="Content-MD5") if md5 is not None else Reported()


def normal_etag(etag: str | None) -> str:
    tag = (etag or "").strip()
    tag = tag.removeprefix("W/")
    return tag.strip('"')


def same_etag(a: str | None, b: str | None) -> bool:
    """True unless both tags are given and differ (quotes and weak prefix ignored)."""
    if not a or not b:
        return True
    return normal_etag(a) == normal_etag(b)


def _crc32c() -> Any:
    global _crc32c_missing_told
    try:
        import google_crc32c
    except ImportError:
        if not _crc32c_missing_told:
            _crc32c_missing_told = True
            log.warning(
                "google-crc32c is not installed: objects whose store reports only a CRC32C "
                "(GCS composite objects) are checked by their size alone; pip install "
                "'sluice[storage]'"
            )
        return None
    return google_crc32c.Checksum()


class Digest:
    """The running checksum of a download, for what ``want`` reports (see the rules)."""

    def __init__(self, want: Reported) -> None:
        self.want = want
        self._md5: Any = None
        self._crc: Any = None
        if want.md5 is not None:
            self._md5 = hashlib.md5(usedforsecurity=False)
        elif want.crc32c is not None:
            self._crc = _crc32c()

    def update(self, data: bytes) -> None:
        if self._md5 is not None:
            self._md5.update(data)
        elif self._crc is not None:
            self._crc.update(data)

    def mismatch(self) -> str | None:
        """None if the content matches what the store reports (or nothing is checked); else
        what differs, in a few words."""
        want = self.want
        if self._md5 is not None and want.md5 is not None:
            got = self._md5.digest()
            if got != want.md5:
                return (
                    f"checksum mismatch: the content's MD5 is {got.hex()}, the store reports "
                    f"{want.md5.hex()} ({want.source})"
                )
        elif self._crc is not None and want.crc32c is not None:
            got = bytes(self._crc.digest())
            if got != want.crc32c:
                return (
                    f"checksum mismatch: the content's CRC32C is {got.hex()}, the store reports "
                    f"{want.crc32c.hex()} ({want.source})"
                )
        return None
