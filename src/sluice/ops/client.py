"""A thin client of the repository/statistics API for the operator's commands, over
``tritonclient.http`` (Triton's own client library), so the same commands drive sluice and a real
``tritonserver``.

Rules of this file:
- Every failure becomes one of two exceptions, which the commands map to exit codes:
  ``ServerSaid`` (the server answered with an error: its own text, exit 1) and
  ``CannotConnect`` (nothing answered at the URL: exit 3). Nothing else escapes.
- Standard endpoints go through tritonclient's public methods. sluice's own endpoints
  (per-version load/unload, traffic split) have no method there; they use the same client's
  ``_get``/``_post`` (one connection, the same plugins and headers) and the error rule below.
- An error answer's text is the ``error`` field of its JSON body, as Triton writes it.

Usage::

    api = OpsClient.connect("localhost:8000")
    rows = api.index()
    api.load("add_sub", config={"max_batch_size": 4})
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import quote

from ..perf.credentials import api_key_option

__all__ = [
    "add_server_flags",
    "api_key_option",
    "OpsError",
    "ServerSaid",
    "CannotConnect",
    "UsageError",
    "OpsClient",
    "parse_url",
]

DEFAULT_URL = "localhost:8000"
T = TypeVar("T")


class OpsError(Exception):
    """A failure of an operator command; ``exit_code`` is what the command returns."""

    exit_code = 1


class ServerSaid(OpsError):
    """The server refused (its error text is the message)."""

    exit_code = 1

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class CannotConnect(OpsError):
    exit_code = 3


class UsageError(OpsError):
    exit_code = 2


def add_server_flags(p: argparse.ArgumentParser, key: str = "") -> None:
    """``-u/--url`` and ``--api-key``, as every operator command spells them; ``key`` says
    which key the command needs (e.g. "an admin key, ")."""
    p.add_argument(
        "-u",
        "--url",
        default=None,
        metavar="HOST:PORT",
        help="the server's HTTP endpoint (default localhost:8000)",
    )
    p.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help=f"{key}sent as 'Authorization: Bearer KEY' (default $SLUICE_API_KEY)",
    )


def parse_url(url: str | None) -> str:
    """``HOST:PORT`` (an ``http://`` prefix and a trailing slash are dropped)."""
    text = (url or DEFAULT_URL).strip()
    if text.startswith("https://"):
        raise UsageError(f"-u: https is not supported, got '{url}'")
    if text.startswith("http://"):
        text = text[len("http://") :]
    text = text.rstrip("/")
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"-u expects HOST:PORT, got '{url}'")
    return text


def _seg(text: str) -> str:
    return quote(text, safe="")


class OpsClient:
    def __init__(self, url: str, timeout: float = 120.0, api_key: str | None = None) -> None:
        import tritonclient.http as httpclient  # imported on use: it pulls in gevent

        self.url = parse_url(url)
        # sent with every request when the server checks keys (--api-keys-file)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        # connection_timeout bounds the connect; network_timeout each answer (a load can take
        # a while: model initialisation happens before the server answers).
        self.http = httpclient.InferenceServerClient(
            self.url, connection_timeout=10.0, network_timeout=timeout
        )

    @classmethod
    def connect(
        cls, url: str | None, timeout: float = 120.0, api_key: str | None = None
    ) -> OpsClient:
        return cls(parse_url(url), timeout, api_key)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> OpsClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ plumbing
    def _call(self, fn: Callable[[], T]) -> T:
        from tritonclient.utils import InferenceServerException

        try:
            return fn()
        except InferenceServerException as exc:
            status = exc.status()
            raise ServerSaid(
                exc.message() or str(exc), int(status) if str(status).isdigit() else None
            ) from None
        except OSError as exc:  # refused, unreachable, DNS, timeout
            raise CannotConnect(f"cannot connect to {self.url}: {exc}") from None

    def _checked(self, response: Any, path: str) -> Any:
        """The JSON body of a 2xx answer (None when empty); ServerSaid otherwise."""
        body = response.read()
        status = int(response.status_code)
        doc: Any = None
        if body:
            try:
                doc = json.loads(body)
            except ValueError:
                doc = None
        if status >= 400:
            if isinstance(doc, dict) and "error" in doc:
                text = str(doc["error"])
            else:
                text = body.decode(errors="replace").strip() if body else f"HTTP {status}"
            if status == 404 and text in ("Not Found", f"HTTP {status}", ""):
                # Triton's answer to a route it does not have (sluice names the model instead)
                text = (
                    f"Not Found: the server at {self.url} has no /{path} (sluice's own API: "
                    "Triton has no per-version load/unload or traffic split)"
                )
            raise ServerSaid(text, status)
        return doc

    def _get(self, path: str) -> Any:
        return self._call(lambda: self._checked(self.http._get(path, self.headers, None), path))

    def _post(self, path: str, body: Mapping[str, Any] | None = None) -> Any:
        payload = json.dumps(body) if body is not None else ""
        return self._call(
            lambda: self._checked(self.http._post(path, payload, self.headers, None), path)
        )

    # ------------------------------------------------------------------ standard endpoints
    def index(self) -> list[dict[str, Any]]:
        return list(self._call(lambda: self.http.get_model_repository_index(self.headers)))

    def load(self, model: str, config: Mapping[str, Any] | str | None = None) -> None:
        text = config if isinstance(config, str) or config is None else json.dumps(config)
        self._call(lambda: self.http.load_model(model, self.headers, config=text))

    def unload(self, model: str, unload_dependents: bool = False) -> None:
        self._call(
            lambda: self.http.unload_model(model, self.headers, unload_dependents=unload_dependents)
        )

    def config(self, model: str, version: str = "") -> dict[str, Any]:
        return dict(self._call(lambda: self.http.get_model_config(model, version, self.headers)))

    def stats(self, model: str = "", version: str = "") -> dict[str, Any]:
        return dict(
            self._call(lambda: self.http.get_inference_statistics(model, version, self.headers))
        )

    def is_ready(self, model: str, version: str = "") -> bool:
        return bool(self._call(lambda: self.http.is_model_ready(model, version, self.headers)))

    # ------------------------------------------------------------------ sluice's endpoints
    def load_version(
        self, model: str, version: str, config: Mapping[str, Any] | str | None = None
    ) -> None:
        body = None
        if config is not None:
            text = config if isinstance(config, str) else json.dumps(config)
            body = {"parameters": {"config": text}}
        self._post(f"v2/repository/models/{_seg(model)}/versions/{_seg(version)}/load", body)

    def unload_version(self, model: str, version: str) -> None:
        self._post(f"v2/repository/models/{_seg(model)}/versions/{_seg(version)}/unload")

    def traffic(self, model: str) -> dict[str, Any]:
        doc = self._get(f"v2/repository/models/{_seg(model)}/traffic")
        return doc if isinstance(doc, dict) else {}

    def set_traffic(self, model: str, weights: Mapping[str, int]) -> dict[str, Any]:
        doc = self._post(f"v2/repository/models/{_seg(model)}/traffic", {"weights": dict(weights)})
        return doc if isinstance(doc, dict) and "weights" in doc else self.traffic(model)
