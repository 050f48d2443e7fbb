"""The audit log (``--audit-log=PATH``): one JSON line per control action.

Control actions: model load/unload (whole model or one version), traffic split changes,
shared-memory register/unregister, log and trace setting updates. Each line::

    {"time": "2026-12-01T12:00:00.123Z", "key": "ops", "client": "127.0.0.1:50312",
     "protocol": "http", "action": "load", "model": "m", "version": "", "outcome": "ok"}

``key`` is the API key's name (never the key; "" without keys), ``outcome`` is ``ok`` or
``error: <message>``. Lines are appended and flushed one by one (the file can be tailed or
rotated by moving it: it is reopened when it disappears).

Usage::

    audit = AuditLog(Path("audit.jsonl"))
    audit.write(key="ops", client="127.0.0.1:5000", protocol="grpc", action="unload",
                model="m", version="", outcome="ok")
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from ..protocol.http_routes import ROUTES

__all__ = ["AuditLog", "grpc_action", "http_action", "outcome"]


def outcome(exc: BaseException | None) -> str:
    return "ok" if exc is None else f"error: {exc}"


def _now() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


class AuditLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._file: TextIO | None = None
        self._ino = 0
        self._open()  # a path that cannot be written stops the start (OSError)

    def _open(self) -> TextIO:
        f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (kept open)
        self._file = f
        self._ino = os.fstat(f.fileno()).st_ino
        return f

    def write(
        self,
        *,
        key: str,
        client: str,
        protocol: str,
        action: str,
        model: str = "",
        version: str = "",
        outcome: str = "ok",
        **extra: Any,
    ) -> None:
        line = json.dumps(
            {
                "time": _now(),
                "key": key,
                "client": client,
                "protocol": protocol,
                "action": action,
                "model": model,
                "version": version,
                **extra,
                "outcome": outcome,
            },
            ensure_ascii=False,
        )
        with self._lock:
            f = self._file
            try:
                moved = os.stat(self.path).st_ino != self._ino
            except OSError:
                moved = True
            if f is None or moved:
                if f is not None:
                    f.close()
                f = self._open()
            f.write(line + "\n")
            f.flush()

    def write_result(self, error: BaseException | None, **fields: Any) -> None:
        """``write`` with the outcome of ``error`` ("ok" when None)."""
        self.write(outcome=outcome(error), **fields)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def http_action(method: str, parts: list[bytes]) -> tuple[str, dict[str, Any]] | None:
    """The control action of an HTTP request (path split on ``/``) as ``(action, fields)``,
    or None when the request changes nothing: the route table's (``protocol.http_routes``)."""
    return ROUTES.action(method, parts)


def grpc_action(method: str, request: Any) -> tuple[str, dict[str, str]] | None:
    """The control action of a gRPC call (method name, parsed request), or None."""
    if method in ("RepositoryModelLoad", "RepositoryModelUnload"):
        action = "load" if method == "RepositoryModelLoad" else "unload"
        return action, {"model": request.model_name}
    if method.endswith("SharedMemoryRegister") or method.endswith("SharedMemoryUnregister"):
        kind = "cuda" if method.startswith("Cuda") else "system"
        action = "shm-unregister" if method.endswith("Unregister") else "shm-register"
        return action, {"kind": kind, "region": request.name}
    if method == "LogSettings" and request.settings:
        return "log-settings", {}
    if method == "TraceSetting" and request.settings:
        return "trace-settings", {"model": request.model_name}
    if method == "ModelTraffic":
        try:
            doc = json.loads(request) if request else {}
        except (ValueError, UnicodeDecodeError):
            doc = {}
        if isinstance(doc, dict) and "weights" in doc:
            return "traffic", {"model": str(doc.get("model", ""))}
    return None
