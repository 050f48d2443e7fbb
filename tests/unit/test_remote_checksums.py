"""The checksums each store reports, read from its headers, and a download checked against
them: MD5 where reported, else CRC32C; nothing computed where nothing is reported."""

from __future__ import annotations

import base64
import hashlib

import pytest

from sluice.repository.remote.checksums import (
    Digest,
    Reported,
    from_content_md5,
    from_goog_hash,
    from_s3_etag,
    same_etag,
)

DATA = b"123456789"
MD5 = hashlib.md5(DATA).digest()
CRC32C = bytes.fromhex("e3069283")  # the CRC32C check value of "123456789" (RFC 3720)


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def test_s3_etag_is_an_md5_only_for_a_plain_upload() -> None:
    assert from_s3_etag(f'"{MD5.hex()}"') == Reported(md5=MD5, source="the ETag")
    assert from_s3_etag(f'"{MD5.hex()}-3"') == Reported()  # multipart: no digest of the bytes
    assert from_s3_etag(None) == Reported()


def test_goog_hash_in_one_header_or_two() -> None:
    one = from_goog_hash([f"crc32c={b64(CRC32C)},md5={b64(MD5)}"])
    two = from_goog_hash([f"crc32c={b64(CRC32C)}", f"md5={b64(MD5)}"])
    assert one == two == Reported(md5=MD5, crc32c=CRC32C, source="X-Goog-Hash")
    # a composite object: a CRC32C only
    assert from_goog_hash([f"crc32c={b64(CRC32C)}"]) == Reported(
        crc32c=CRC32C, source="X-Goog-Hash"
    )
    assert from_goog_hash([]) == Reported()
    assert from_goog_hash(["md5=not base64!"]) == Reported()


def test_content_md5() -> None:
    assert from_content_md5(b64(MD5)) == Reported(md5=MD5, source="Content-MD5")
    assert from_content_md5(None) == from_content_md5("") == Reported()
    assert from_content_md5(b64(b"short")) == Reported()


def test_etags_compare_without_quotes() -> None:
    assert same_etag('"0x8D1"', "0x8D1") and same_etag('W/"a"', "a")
    assert not same_etag('"a"', '"b"')
    assert same_etag(None, "a")  # nothing to compare


def test_md5_is_preferred_and_a_mismatch_says_both_digests() -> None:
    d = Digest(Reported(md5=MD5, crc32c=b"\0\0\0\0", source="X-Goog-Hash"))
    d.update(DATA[:4])
    d.update(DATA[4:])
    assert d.mismatch() is None  # the wrong CRC32C is not looked at
    bad = Digest(Reported(md5=MD5, source="Content-MD5"))
    bad.update(b"123456780")
    assert bad.mismatch() == (
        f"checksum mismatch: the content's MD5 is {hashlib.md5(b'123456780').hexdigest()}, "
        f"the store reports {MD5.hex()} (Content-MD5)"
    )


def test_crc32c_when_it_is_the_only_checksum() -> None:
    pytest.importorskip("google_crc32c")
    d = Digest(Reported(crc32c=CRC32C, source="X-Goog-Hash"))
    d.update(DATA)
    assert d.mismatch() is None
    bad = Digest(Reported(crc32c=CRC32C, source="X-Goog-Hash"))
    bad.update(b"12345678")
    message = bad.mismatch()
    assert message is not None and message.startswith("checksum mismatch: the content's CRC32C")
    assert message.endswith(f"the store reports {CRC32C.hex()} (X-Goog-Hash)")


def test_nothing_reported_nothing_checked() -> None:
    d = Digest(Reported())
    d.update(DATA)
    assert d.mismatch() is None
