"""Object-store clients (obstore: one library for S3, GCS and Azure) and their errors.

Rules of this file:
- obstore is imported here only, when a remote repository is first used: a server without
  the ``storage`` extra serves local repositories, and names the extra when given a URL.
- Every failure becomes ``RepositoryError`` (HTTP 400, as Triton's load errors) whose message
  names the URL and says in a few words what failed: the store's error code and message, a
  refused connection, a timeout. Secrets are scrubbed from every message.
- A download is checked against the listed size, and against the checksum the store reports
  where it reports one (``checksums.py``): S3's listing carries it (an ETag that is an MD5);
  for GCS and Azure, whose checksums obstore does not expose, one HEAD request per downloaded
  object reads them (``X-Goog-Hash``, ``Content-MD5``), to a URL obstore signs with the
  store's credentials (unsigned for an anonymous store, as obstore's own requests are then).
  That answer's ETag and the download's must both be the listed one: a checksum or content
  of another version of the object is never taken for the listed one.
- Emulators: ``CLOUD_STORAGE_EMULATOR_ENDPOINT`` (the GCS emulator variable of google-cloud-cpp,
  the client inside Triton) or ``STORAGE_EMULATOR_HOST`` (the Python client's); for Azure,
  sluice's own ``AZURE_STORAGE_ENDPOINT`` (Triton always uses the account's public endpoint).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

from ...errors import InvalidArgument
from .checksums import (
    Digest,
    Reported,
    from_content_md5,
    from_goog_hash,
    from_s3_etag,
    normal_etag,
    same_etag,
)
from .credentials import Credentials, secrets_of
from .url import StoreUrl

__all__ = ["ObjectInfo", "RepositoryError", "Store", "describe_error", "open_store"]


log = logging.getLogger("sluice.repository")

# a download is written out in pieces of about this size
_CHUNK = 4 << 20
# how long a URL signed for reading an object's checksum is valid
_SIGNED_FOR = datetime.timedelta(minutes=15)


class RepositoryError(InvalidArgument):
    """A remote model repository could not be read (listing, download, verification)."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    etag: str | None
    version: str | None
    modified: str


def describe_error(exc: BaseException, secrets: list[str]) -> str:
    """A short account of a store failure: the store's error code and message where it
    sent them, else the first line of the client's message; secrets replaced by '***'. A
    failure to get an access token (GCS) names the token endpoint, not the store."""
    text = str(exc)
    token = re.search(r"Error performing token request: Error performing \w+ (\S+)", text)
    code = re.search(r"<Code>([^<]*)</Code>", text)
    msg = re.search(r"<Message>([^<]*)</Message>", text)
    peer = "the token endpoint" if token is not None else "the store"
    if code is not None:
        out = code.group(1) + (f": {msg.group(1)}" if msg is not None else "")
    elif re.search(r"connection refused|Connection refused|tcp connect error", text):
        out = f"connection refused (is {peer}'s address right, and is it up?)"
    elif "InvalidCertificate(" in text:
        why = re.search(r"InvalidCertificate\(\s*(\w+)", text)
        out = (
            f"{peer}'s TLS certificate is not trusted ({why.group(1) if why else 'invalid'}): "
            "name its CA in SSL_CERT_FILE"
        )
    elif "dns error" in text:
        out = f"cannot resolve {peer}'s host name"
    elif "error sending request" in text:
        out = f"cannot reach {peer} (error sending request)"
    elif "timed out" in text or "operation timed out" in text or "deadline" in text:
        out = f"{peer} did not answer in time"
    else:
        m = re.search(r"Server returned non-2xx status code: ([^:\n]*)", text)
        if m is not None:
            out = f"{peer} answered {m.group(1)}"
        else:
            out = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
            out = re.sub(r"^Generic [\w ]+ error: ", "", out)[:300]
    if token is not None:
        out = f"cannot get an access token from {token.group(1)}: {out}"
    for s in secrets:
        out = out.replace(s, "***")
    return out


def _import_obstore() -> Any:
    try:
        import obstore
        import obstore.store
    except ImportError:
        raise InvalidArgument(
            "model repositories in object storage (s3://, gs://, as://) need the 'storage' "
            "extra: pip install 'sluice[storage]'"
        ) from None
    return obstore


@dataclass(frozen=True, slots=True)
class ChecksumSource:
    """Where a GCS or Azure object's checksum is read: a HEAD of the object's URL, signed by
    obstore (``sign``: the method to sign for) or, for an anonymous store, ``base`` + the
    quoted key."""

    base: str
    sign: str = ""  # "HEAD" (GCS), "GET" (Azure: a read SAS serves HEAD too), "" = unsigned


class _WriteFailed(Exception):
    """Writing a download out failed (args[0]: the OSError)."""


def _head(url: str, timeout_s: float) -> tuple[int, Any]:
    """One HEAD request: (status, headers); runs in a thread."""
    req = urllib.request.Request(url, method="HEAD")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, resp.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers


class Store:
    """One repository's client: list its objects, fetch one (verified)."""

    def __init__(
        self,
        url: StoreUrl,
        creds: Credentials,
        timeout_s: float,
        client: Any,
        checksums: ChecksumSource | None = None,
        broken: RepositoryError | None = None,
    ) -> None:
        self.url = url
        self.creds = creds
        self.timeout_s = timeout_s
        self._client = client
        self._checksums = checksums
        self._obstore = _import_obstore()
        self.secrets = secrets_of(creds)
        # the client could not be made (an unreadable key file): every listing fails so,
        # as an unreachable store's does, and the server decides as for any other failure
        self._broken = broken

    def error(self, what: str, exc: BaseException, key: str = "") -> RepositoryError:
        where = self.url.object_url(key) if key else self.url.url
        return RepositoryError(
            f"model repository {where}: {what}: {describe_error(exc, self.secrets)}"
        )

    async def list_once(self) -> list[ObjectInfo]:
        """Every object under the repository's prefix ("directory" markers left out)."""
        if self._broken is not None:
            raise self._broken
        out: list[ObjectInfo] = []
        try:
            async for batch in self._obstore.list(self._client, prefix=self.url.prefix or None):
                for meta in batch:
                    key = str(meta["path"])
                    if key.endswith("/"):
                        continue
                    modified = meta.get("last_modified")
                    out.append(
                        ObjectInfo(
                            key,
                            int(meta["size"]),
                            meta.get("e_tag"),
                            meta.get("version"),
                            modified.isoformat() if modified is not None else "",
                        )
                    )
        except Exception as exc:
            raise self.error("cannot list objects", exc) from None
        return out

    def stalled(self, what: str, key: str = "") -> RepositoryError:
        where = self.url.object_url(key) if key else self.url.url
        return RepositoryError(
            f"model repository {where}: {what}: the store did not answer within "
            f"--repository-timeout-secs={self.timeout_s:g}"
        )

    async def list(self) -> list[ObjectInfo]:
        """``list_once`` within the timeout."""
        try:
            return await asyncio.wait_for(self.list_once(), self.timeout_s)
        except TimeoutError:
            raise self.stalled("cannot list objects") from None

    async def reported(self, obj: ObjectInfo) -> Reported:
        """The checksum the store reports for ``obj`` (see the rules above); RepositoryError
        if the object is gone or changed since it was listed. A store that will not answer
        the HEAD (other than 404) leaves the object to be checked by its size, with a
        warning."""
        if self.url.scheme == "s3" or self._checksums is None:
            return from_s3_etag(obj.etag) if self.url.scheme == "s3" else Reported()
        src = self._checksums
        where = self.url.object_url(obj.key)
        try:
            if src.sign:
                target = await asyncio.wait_for(
                    self._obstore.sign_async(self._client, src.sign, obj.key, _SIGNED_FOR),
                    self.timeout_s,
                )
            else:
                target = src.base + urllib.parse.quote(obj.key, safe="/")
            loop = asyncio.get_running_loop()
            status, headers = await asyncio.wait_for(
                loop.run_in_executor(None, _head, target, self.timeout_s), self.timeout_s
            )
        except TimeoutError:
            raise self.stalled("cannot read its checksum", obj.key) from None
        except Exception as exc:
            log.warning(
                "model repository %s: cannot read its checksum (%s): checked by its size only",
                where,
                describe_error(exc, self.secrets),
            )
            return Reported()
        if status == 404:
            raise RepositoryError(
                f"model repository {where}: object disappeared while downloading: the store "
                "answered 404 Not Found"
            )
        if status >= 300:
            log.warning(
                "model repository %s: cannot read its checksum (the store answered %d): "
                "checked by its size only",
                where,
                status,
            )
            return Reported()
        if not same_etag(headers.get("ETag"), obj.etag):
            raise self.changed(obj, headers.get("ETag"))
        if self.url.scheme == "gs":
            return from_goog_hash(headers.get_all("X-Goog-Hash") or [])
        return from_content_md5(headers.get("Content-MD5"))

    def changed(self, obj: ObjectInfo, etag: str | None) -> RepositoryError:
        return RepositoryError(
            f"model repository {self.url.object_url(obj.key)}: the object changed after it "
            f"was listed (ETag {normal_etag(etag)}, listed {normal_etag(obj.etag)}); the next "
            "refresh reads it again"
        )

    async def fetch(self, obj: ObjectInfo, out: BinaryIO) -> None:
        """Write the bytes of ``obj`` to ``out`` as they arrive, then check them against the
        listed size and the checksum the store reports (``reported``); the download's ETag
        must be the listed one. Any wait for the store (the answer, each chunk) is bounded by
        the timeout: a slow but moving download of a large file is not cut, a stalled one
        is."""
        want = await self.reported(obj)
        digest = Digest(want)
        loop = asyncio.get_running_loop()
        size = 0

        def take(data: bytes) -> None:
            digest.update(data)
            try:
                out.write(data)
            except OSError as exc:  # the cache's file system, not the store: the caller names it
                raise _WriteFailed(exc) from None

        try:
            result = await asyncio.wait_for(
                self._obstore.get_async(self._client, obj.key), self.timeout_s
            )
            got_etag = result.meta.get("e_tag")
            if not same_etag(got_etag, obj.etag):
                raise self.changed(obj, got_etag)
            chunks = result.stream(min_chunk_size=_CHUNK).__aiter__()
            while True:
                try:
                    chunk = await asyncio.wait_for(chunks.__anext__(), self.timeout_s)
                except StopAsyncIteration:
                    break
                data = bytes(chunk)
                size += len(data)
                await loop.run_in_executor(None, take, data)
        except RepositoryError:
            raise
        except _WriteFailed as exc:
            raise exc.args[0] from None
        except TimeoutError:
            raise self.stalled("download stalled", obj.key) from None
        except FileNotFoundError as exc:
            raise self.error("object disappeared while downloading", exc, obj.key) from None
        except Exception as exc:
            raise self.error("download failed", exc, obj.key) from None
        where = self.url.object_url(obj.key)
        if size != obj.size:
            raise RepositoryError(
                f"model repository {where}: downloaded {size} bytes, the listing said "
                f"{obj.size} (the object changed during the download?)"
            )
        wrong = digest.mismatch()
        if wrong is not None:
            raise RepositoryError(f"model repository {where}: {wrong}")


def open_store(
    url: StoreUrl, creds: Credentials, env: Mapping[str, str], timeout_s: float
) -> Store:
    """A client for ``url`` with ``creds``; nothing is sent until the first list. A client
    that cannot be made (a key file that cannot be read) gives a Store whose every listing
    fails, naming the URL, where the credentials came from and what was wrong (as an
    unreachable store's listing fails: at the start, in a load, in a poll)."""
    _import_obstore()
    # connecting is bounded by the timeout; a request as a whole by a generous multiple of it
    # (a large model downloads for longer than any one wait: Store bounds each wait)
    client_options: Any = {
        "timeout": f"{max(3600, int(timeout_s))}s",
        "connect_timeout": f"{max(1, int(timeout_s))}s",
    }
    retry: Any = {
        "max_retries": 2,
        "retry_timeout": datetime.timedelta(seconds=max(1.0, timeout_s)),
    }
    make = {"s3": _s3_client, "gs": _gcs_client}.get(url.scheme, _azure_client)
    try:
        client, checksums = make(url, creds, env, client_options, retry)
    except Exception as exc:
        broken = RepositoryError(
            f"model repository {url.url}: cannot set up its client (credentials from "
            f"{creds.source}): {describe_error(exc, secrets_of(creds))}"
        )
        return Store(url, creds, timeout_s, None, broken=broken)
    return Store(url, creds, timeout_s, client, checksums)


def _s3_client(
    url: StoreUrl, creds: Credentials, env: Mapping[str, str], options: Any, retry: Any
) -> tuple[Any, ChecksumSource | None]:
    from obstore.store import S3Store

    kw: dict[str, Any] = {"virtual_hosted_style_request": False}
    if url.endpoint:
        kw["endpoint"] = url.endpoint
        options["allow_http"] = url.endpoint.startswith("http://")
    kw["region"] = creds.region or "us-east-1"
    if creds.key_id and creds.secret_key:
        kw["access_key_id"] = creds.key_id
        kw["secret_access_key"] = creds.secret_key
        if creds.session_token:
            kw["session_token"] = creds.session_token
    else:
        kw["skip_signature"] = True
    return S3Store(url.bucket, client_options=options, retry_config=retry, **kw), None


def _gcs_client(
    url: StoreUrl, creds: Credentials, env: Mapping[str, str], options: Any, retry: Any
) -> tuple[Any, ChecksumSource | None]:
    from obstore.store import GCSStore

    gkw: dict[str, Any] = {}
    emulator = env.get("CLOUD_STORAGE_EMULATOR_ENDPOINT", "") or env.get(
        "STORAGE_EMULATOR_HOST", ""
    )
    if emulator and "://" not in emulator:
        emulator = f"http://{emulator}"
    if emulator:
        options["allow_http"] = emulator.startswith("http://")
    if creds.gcs_key_file:
        gkw["application_credentials"] = creds.gcs_key_file
        if emulator:
            gkw["base_url"] = emulator
    else:
        # anonymous: a key that turns OAuth off (obstore's skip_signature still asks the
        # metadata server for a token), pointed at the service or the emulator
        gkw["service_account_key"] = json.dumps(
            {
                "gcs_base_url": emulator or "https://storage.googleapis.com",
                "disable_oauth": True,
                "client_email": "",
                "private_key": "",
                "private_key_id": "",
            }
        )
    client = GCSStore(url.bucket, client_options=options, retry_config=retry, **gkw)
    # the XML API's HEAD answers X-Goog-Hash; a key file signs its URL
    base = emulator or "https://storage.googleapis.com"
    return client, ChecksumSource(f"{base}/{url.bucket}/", "HEAD" if creds.gcs_key_file else "")


def _azure_client(
    url: StoreUrl, creds: Credentials, env: Mapping[str, str], options: Any, retry: Any
) -> tuple[Any, ChecksumSource | None]:
    from obstore.store import AzureStore

    akw: dict[str, Any] = {"account_name": creds.account or url.account}
    endpoint = env.get("AZURE_STORAGE_ENDPOINT", "")
    if endpoint:
        akw["endpoint"] = endpoint
        options["allow_http"] = endpoint.startswith("http://")
    if creds.account_key:
        akw["account_key"] = creds.account_key
    else:
        akw["skip_signature"] = True
    client = AzureStore(url.bucket, client_options=options, retry_config=retry, **akw)
    account_url = endpoint or f"https://{akw['account_name']}.blob.core.windows.net"
    return client, ChecksumSource(
        f"{account_url.rstrip('/')}/{url.bucket}/", "GET" if creds.account_key else ""
    )
