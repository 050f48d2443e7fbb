"""Object-store clients (obstore: one library for S3, GCS and Azure) and their errors.

Rules of this file:
- obstore is imported here only, when a remote repository is first used: a server without
  the ``storage`` extra serves local repositories, and names the extra when given a URL.
- Every failure becomes ``RepositoryError`` (HTTP 400, as Triton's load errors) whose message
  names the URL and says in a few words what failed: the store's error code and message, a
  refused connection, a timeout. Secrets are scrubbed from every message.
- Emulators: ``CLOUD_STORAGE_EMULATOR_ENDPOINT`` (the GCS emulator variable of google-cloud-cpp,
  the client inside Triton) or ``STORAGE_EMULATOR_HOST`` (the Python client's); for Azure,
  sluice's own ``AZURE_STORAGE_ENDPOINT`` (Triton always uses the account's public endpoint).
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

from ...errors import InvalidArgument
from .credentials import Credentials, secrets_of
from .url import StoreUrl

__all__ = ["ObjectInfo", "RepositoryError", "Store", "describe_error", "open_store"]


# a download is written out in pieces of about this size
_CHUNK = 4 << 20


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
    sent them, else the first line of the client's message; secrets replaced by '***'."""
    text = str(exc)
    code = re.search(r"<Code>([^<]*)</Code>", text)
    msg = re.search(r"<Message>([^<]*)</Message>", text)
    if code is not None:
        out = code.group(1) + (f": {msg.group(1)}" if msg is not None else "")
    elif re.search(r"connection refused|Connection refused|tcp connect error", text):
        out = "connection refused (is the store's endpoint right and up?)"
    elif "dns error" in text:
        out = "cannot resolve the store's host name"
    elif "error sending request" in text:
        out = "cannot reach the store (error sending request)"
    elif "timed out" in text or "operation timed out" in text or "deadline" in text:
        out = "the store did not answer in time"
    else:
        m = re.search(r"Server returned non-2xx status code: ([^:\n]*)", text)
        if m is not None:
            out = f"the store answered {m.group(1)}"
        else:
            out = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
            out = out[:300]
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


class Store:
    """One repository's client: list its objects, fetch one (verified)."""

    def __init__(self, url: StoreUrl, creds: Credentials, timeout_s: float, client: Any) -> None:
        self.url = url
        self.creds = creds
        self.timeout_s = timeout_s
        self._client = client
        self._obstore = _import_obstore()
        self.secrets = secrets_of(creds)

    def error(self, what: str, exc: BaseException, key: str = "") -> RepositoryError:
        where = self.url.object_url(key) if key else self.url.url
        return RepositoryError(
            f"model repository {where}: {what}: {describe_error(exc, self.secrets)}"
        )

    async def list_once(self) -> list[ObjectInfo]:
        """Every object under the repository's prefix ("directory" markers left out)."""
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

    async def fetch(self, obj: ObjectInfo, out: BinaryIO) -> None:
        """Write the bytes of ``obj`` to ``out`` as they arrive, then check them against the
        listed size (and, for an S3 ETag that is an MD5, the content's MD5). Any wait for
        the store (the answer, each chunk) is bounded by the timeout: a slow but moving
        download of a large file is not cut, a stalled one is."""
        loop = asyncio.get_running_loop()
        digest = hashlib.md5(usedforsecurity=False)
        size = 0
        try:
            result = await asyncio.wait_for(
                self._obstore.get_async(self._client, obj.key), self.timeout_s
            )
            chunks = result.stream(min_chunk_size=_CHUNK).__aiter__()
            while True:
                try:
                    chunk = await asyncio.wait_for(chunks.__anext__(), self.timeout_s)
                except StopAsyncIteration:
                    break
                data = bytes(chunk)
                size += len(data)
                digest.update(data)
                await loop.run_in_executor(None, out.write, data)
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
        etag = (obj.etag or "").strip('"')
        if self.url.scheme == "s3" and re.fullmatch(r"[0-9a-f]{32}", etag):
            got = digest.hexdigest()
            if got != etag:
                raise RepositoryError(
                    f"model repository {where}: content MD5 {got} does not match the ETag "
                    f"{etag} (the object changed during the download?)"
                )


def open_store(
    url: StoreUrl, creds: Credentials, env: Mapping[str, str], timeout_s: float
) -> Store:
    """A client for ``url`` with ``creds``; nothing is sent until the first list."""
    obstore = _import_obstore()
    from obstore.store import AzureStore, GCSStore, S3Store

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
    del obstore
    client: Any
    if url.scheme == "s3":
        kw: dict[str, Any] = {"virtual_hosted_style_request": False}
        if url.endpoint:
            kw["endpoint"] = url.endpoint
            client_options["allow_http"] = url.endpoint.startswith("http://")
        kw["region"] = creds.region or "us-east-1"
        if creds.key_id and creds.secret_key:
            kw["access_key_id"] = creds.key_id
            kw["secret_access_key"] = creds.secret_key
            if creds.session_token:
                kw["session_token"] = creds.session_token
        else:
            kw["skip_signature"] = True
        client = S3Store(url.bucket, client_options=client_options, retry_config=retry, **kw)
    elif url.scheme == "gs":
        gkw: dict[str, Any] = {}
        emulator = env.get("CLOUD_STORAGE_EMULATOR_ENDPOINT", "") or env.get(
            "STORAGE_EMULATOR_HOST", ""
        )
        if emulator and "://" not in emulator:
            emulator = f"http://{emulator}"
        if emulator:
            client_options["allow_http"] = emulator.startswith("http://")
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
        client = GCSStore(url.bucket, client_options=client_options, retry_config=retry, **gkw)
    else:
        akw: dict[str, Any] = {"account_name": creds.account or url.account}
        endpoint = env.get("AZURE_STORAGE_ENDPOINT", "")
        if endpoint:
            akw["endpoint"] = endpoint
            client_options["allow_http"] = endpoint.startswith("http://")
        if creds.account_key:
            akw["account_key"] = creds.account_key
        else:
            akw["skip_signature"] = True
        client = AzureStore(url.bucket, client_options=client_options, retry_config=retry, **akw)
    return Store(url, creds, timeout_s, client)
