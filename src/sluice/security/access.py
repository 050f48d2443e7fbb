"""Who may call what: Triton's API groups, its restricted APIs, and sluice's keys with roles.

Rules of this file:
- One classification of every endpoint into Triton's API groups (``health``, ``metadata``,
  ``inference``, ``shared-memory``, ``model-config``, ``model-repository``, ``statistics``,
  ``trace``, ``logging``), used by both front-ends: HTTP's is the route table's
  (``protocol.http_routes``, read by ``http_group``: no path parsing here), gRPC's is
  ``GRPC_GROUPS`` (method name).
- ``Guard`` is built only when something is configured; a front-end holding ``None`` pays one
  ``is not None`` test per request and nothing else.
- The order of checks: Triton's restriction of the group (as Triton answers it: HTTP 403
  ``This API is restricted, expecting header '<key>'``, gRPC UNAVAILABLE ``This protocol is
  restricted, expecting header 'triton-grpc-protocol-<key>'``), then the bearer key (health
  stays open to probes): no valid key -> 401 / UNAUTHENTICATED, a key whose role does not
  cover the group -> 403 / PERMISSION_DENIED.

Usage::

    guard = Guard.build(http_restrictions, grpc_restrictions, keys)  # None: nothing to check
    name = guard.check_http(group, headers)  # raises AccessDenied; the key's name or ""
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypeVar

from ..config import Restriction, ServerConfig
from ..errors import ServerError, Status
from ..protocol.http_routes import (
    GROUPS,
    HEALTH,
    INFERENCE,
    LOGGING,
    METADATA,
    MODEL_CONFIG,
    MODEL_REPOSITORY,
    ROUTES,
    SHARED_MEMORY,
    STATISTICS,
    TRACE,
)
from .audit import AuditLog, grpc_action, outcome
from .keys import KeyFileError, KeyRing

_R = TypeVar("_R")

__all__ = [
    "GROUPS",
    "GRPC_GROUPS",
    "GRPC_RESTRICTED_PREFIX",
    "AccessDenied",
    "CALLER",
    "client_address",
    "build_policy",
    "Policy",
    "Restriction",
    "Guard",
    "http_group",
    "parse_restrictions",
]

# Triton checks a gRPC restriction's header under this prefix (measured on 2.51)
GRPC_RESTRICTED_PREFIX = "triton-grpc-protocol-"

GRPC_GROUPS: dict[str, str] = {
    "ServerLive": HEALTH,
    "ServerReady": HEALTH,
    "ModelReady": HEALTH,
    "ServerMetadata": METADATA,
    "ModelMetadata": METADATA,
    "ModelInfer": INFERENCE,
    "ModelStreamInfer": INFERENCE,
    "ModelConfig": MODEL_CONFIG,
    "ModelStatistics": STATISTICS,
    "RepositoryIndex": MODEL_REPOSITORY,
    "RepositoryModelLoad": MODEL_REPOSITORY,
    "RepositoryModelUnload": MODEL_REPOSITORY,
    "SystemSharedMemoryStatus": SHARED_MEMORY,
    "SystemSharedMemoryRegister": SHARED_MEMORY,
    "SystemSharedMemoryUnregister": SHARED_MEMORY,
    "CudaSharedMemoryStatus": SHARED_MEMORY,
    "CudaSharedMemoryRegister": SHARED_MEMORY,
    "CudaSharedMemoryUnregister": SHARED_MEMORY,
    "TraceSetting": TRACE,
    "LogSettings": LOGGING,
    "ModelTraffic": MODEL_REPOSITORY,  # sluice.Operations
}


def http_group(parts: Sequence[bytes]) -> str | None:
    """The API group of an HTTP path split on ``/`` (``["", "v2", ...]``), from the route
    table; None for a path that is no endpoint (it answers 404 whoever asks) or an open one."""
    return ROUTES.group(list(parts))


class AccessDenied(ServerError):
    """A refused call; ``http_status`` and ``status`` (-> gRPC code) say how."""

    def __init__(self, message: str, status: Status, http_status: int) -> None:
        super().__init__(message, status)
        self.http_status = http_status


def parse_restrictions(items: Sequence[str], flag: str, what: str) -> tuple[Restriction, ...]:
    """``--http-restricted-api`` (what="api") / ``--grpc-restricted-protocol``
    (what="protocol") values; ValueError with tritonserver's text."""
    out: list[Restriction] = []
    seen: set[str] = set()
    for item in items:
        apis, colon, setting = item.partition(":")
        key, eq, value = setting.partition("=")
        if not colon or not eq or not apis or not key:
            raise ValueError(
                f"{flag} option format is '<config name>:<setting>=<value>'. Got {item}"
            )
        groups = tuple(a.strip() for a in apis.split(","))
        for g in groups:
            if g not in GROUPS:
                raise ValueError(f"unknown restricted {what} '{g}'")
            if g in seen:
                raise ValueError(
                    f"restricted {what} '{g}' can not be specified in multiple config groups"
                )
            seen.add(g)
        out.append(Restriction(groups, key, value))
    return tuple(out)


def _same(given: str | None, expected: str) -> bool:
    """A restriction's value, compared in constant time."""
    if given is None:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected.encode())


def _table(restrictions: Sequence[Restriction], prefix: str) -> dict[str, tuple[str, str, str]]:
    """group -> (header name to look up (lower case), expected value, name in the message)"""
    out = {}
    for r in restrictions:
        shown = prefix + r.key
        for g in r.groups:
            out[g] = (shown.lower(), r.value, shown)
    return out


class Guard:
    """The checks of one server (restrictions per protocol, and the key ring)."""

    def __init__(
        self,
        http: Sequence[Restriction] = (),
        grpc: Sequence[Restriction] = (),
        keys: KeyRing | None = None,
    ) -> None:
        self._http = _table(http, "")
        self._grpc = _table(grpc, GRPC_RESTRICTED_PREFIX)
        self.keys = keys
        # the header names a gRPC edge must hand over (lower case)
        names = {h for h, _, _ in self._grpc.values()}
        if keys is not None:
            names.add("authorization")
        self.grpc_headers: tuple[str, ...] = tuple(sorted(names))

    @classmethod
    def build(
        cls,
        http: Sequence[Restriction],
        grpc: Sequence[Restriction],
        keys: KeyRing | None,
    ) -> Guard | None:
        if not http and not grpc and keys is None:
            return None
        return cls(http, grpc, keys)

    def check_http(self, group: str | None, header: Callable[[str], str | None]) -> str:
        """Raise AccessDenied unless the call may go on; returns the key's name ("" when no
        keys are configured or the group needs none). ``header(name)`` gives a request
        header by lower-case name."""
        if group is None:
            return ""
        rule = self._http.get(group)
        if rule is not None and not _same(header(rule[0]), rule[1]):
            raise AccessDenied(
                f"This API is restricted, expecting header '{rule[2]}'",
                Status.PERMISSION_DENIED,
                403,
            )
        return self._key(group, header)

    def check_grpc(self, method: str, metadata: Mapping[str, str]) -> str:
        group = GRPC_GROUPS.get(method)
        if group is None:
            return ""
        rule = self._grpc.get(group)
        if rule is not None and not _same(metadata.get(rule[0]), rule[1]):
            raise AccessDenied(
                f"This protocol is restricted, expecting header '{rule[2]}'",
                Status.UNAVAILABLE,
                503,
            )
        return self._key(group, metadata.get)

    def _key(self, group: str, header: Callable[[str], str | None]) -> str:
        keys = self.keys
        if keys is None or group == HEALTH:
            return ""
        auth = header("authorization")
        token = ""
        if auth:
            scheme, _, rest = auth.strip().partition(" ")
            if scheme.lower() == "bearer":
                token = rest.strip()
        if not token:
            raise AccessDenied(
                "missing API key: send 'Authorization: Bearer <key>'", Status.UNAUTHENTICATED, 401
            )
        key = keys.find(token)
        if key is None:
            raise AccessDenied("invalid API key", Status.UNAUTHENTICATED, 401)
        if group not in key.groups:
            raise AccessDenied(
                f"the key '{key.name}' (role {key.role}) may not use the {group} API",
                Status.PERMISSION_DENIED,
                403,
            )
        return key.name


# (key name, client address) of the call being served, set by a gRPC edge for its handler's
# task when a Policy is configured (the audit log reads it)
CALLER: ContextVar[tuple[str, str]] = ContextVar("sluice_caller", default=("", ""))


def build_policy(config: ServerConfig) -> Policy | None:
    """The Policy of ``config`` (None when nothing is configured); ServerError when the
    keys file or the audit log cannot be used."""
    keys = None
    if config.api_keys_file:
        try:
            keys = KeyRing.load(Path(config.api_keys_file))
        except KeyFileError as exc:
            raise ServerError(str(exc)) from None
    audit = None
    if config.audit_log:
        try:
            audit = AuditLog(Path(config.audit_log))
        except OSError as exc:
            raise ServerError(f"--audit-log {config.audit_log}: {exc.strerror or exc}") from None
    guard = Guard.build(config.http_restricted, config.grpc_restricted, keys)
    return Policy.build(guard, audit)


def client_address(peer: str) -> str:
    """gRPC's peer (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``) as ``host:port``."""
    kind, sep, rest = peer.partition(":")
    return rest if sep and kind in ("ipv4", "ipv6", "unix") else peer


class Policy:
    """What a front-end checks and records: ``guard`` (None: no checks) and ``audit`` (None:
    no audit log). Front-ends hold a Policy only when one of them is set."""

    __slots__ = ("guard", "audit")

    def __init__(self, guard: Guard | None, audit: AuditLog | None) -> None:
        self.guard = guard
        self.audit = audit

    @classmethod
    def build(cls, guard: Guard | None, audit: AuditLog | None) -> Policy | None:
        return None if guard is None and audit is None else cls(guard, audit)

    def record_denied(self, name: str, request: Any, client: str, exc: AccessDenied) -> None:
        """A refused gRPC control action in the audit log (outcome ``denied: ...``)."""
        if self.audit is None:
            return
        try:
            action = grpc_action(name, request)
        except Exception:  # a request that does not parse: nothing to name
            action = None
        if action is not None:
            self.audit.write(
                key="",
                client=client,
                protocol="grpc",
                action=action[0],
                outcome=f"denied: {exc}",
                **action[1],
            )

    def audited(
        self, name: str, handler: Callable[[Any], Awaitable[_R]]
    ) -> Callable[[Any], Awaitable[_R]]:
        """``handler`` (a gRPC method) writing an audit line for each control action."""
        audit = self.audit
        if audit is None:
            return handler

        async def method(request: Any) -> _R:
            action = grpc_action(name, request)
            if action is None:
                return await handler(request)
            key, client = CALLER.get()
            try:
                out = await handler(request)
            except Exception as exc:
                audit.write(
                    key=key,
                    client=client,
                    protocol="grpc",
                    action=action[0],
                    outcome=outcome(exc),
                    **action[1],
                )
                raise
            audit.write(key=key, client=client, protocol="grpc", action=action[0], **action[1])
            return out

        return method
