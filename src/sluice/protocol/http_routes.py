"""The HTTP API's URL space: one table of routes, read by the router (``frontends/http_api``),
access control (``access.http_group``) and the audit log (``audit.http_action``).

Rules of this file:
- One entry per endpoint: its methods, path pattern, handler (the name of an ``HttpFrontend``
  method, ``_<handler>``), Triton API group (restricted APIs, API keys) and audit action. An
  endpoint is added by one entry and its handler; nothing else parses paths.
- The OpenAI-compatible API (``/v1``, ``openai=True``: errors in OpenAI's shape) is governed
  by the groups of the same calls on ``/v2``: completions, chat completions and embeddings
  are ``inference``, the model list is ``metadata``; a key of role ``inference`` may use it
  all, and ``--http-restricted-api=inference:...`` restricts it with the KServe inference.
- Patterns are literal segments, ``{name}`` (one segment, percent-decoded: ``a%2Fb`` is the
  name ``a/b``, never two segments) and a last ``{name...}`` that takes the rest of the path
  (zero or more segments). A route with no methods accepts any.
- The path is ``raw_path`` split once on ``/``; one trailing slash is tolerated. Matching costs
  one dict lookup on (segment count, last segment), then a tuple comparison of the literal
  segments of each candidate (one candidate on the infer paths); no regular expressions.
- The first route whose path and method match serves; when routes match the path but none the
  method, ``MethodNotAllowed`` names their methods (405 with Allow); no route: None (404).
- A path's API group is that of the first route matching it, whatever the method (a refused
  method is refused after the access check, as before). Audit actions are those of POST
  routes: an action's fields are its fixed fields, then the route's parameters.

Usage::

    found = ROUTES.match("POST", b"/v2/models/m/versions/2/infer".split(b"/"))
    route, args = found  # route.handler == "infer", args == ["m", "2"]
    ROUTES.group(parts)  # "inference"
    ROUTES.action("POST", b"/v2/repository/models/m/load".split(b"/"))  # ("load", {"model": "m"})
"""

from __future__ import annotations

import copy
from collections.abc import Container, Iterable, Sequence
from operator import itemgetter
from typing import Any
from urllib.parse import unquote

__all__ = [
    "ACTIONS",
    "GROUPS",
    "ROUTES",
    "MethodNotAllowed",
    "Route",
    "Router",
    "segment",
]

# Triton's API groups (--http-restricted-api, --grpc-restricted-protocol)
HEALTH = "health"
METADATA = "metadata"
INFERENCE = "inference"
SHARED_MEMORY = "shared-memory"
MODEL_CONFIG = "model-config"
MODEL_REPOSITORY = "model-repository"
STATISTICS = "statistics"
TRACE = "trace"
LOGGING = "logging"
GROUPS = (
    HEALTH,
    METADATA,
    INFERENCE,
    SHARED_MEMORY,
    MODEL_CONFIG,
    MODEL_REPOSITORY,
    STATISTICS,
    TRACE,
    LOGGING,
)

# the audit log's control actions (gRPC names the same ones: audit.grpc_action)
ACTIONS = (
    "load",
    "unload",
    "traffic",
    "shm-register",
    "shm-unregister",
    "log-settings",
    "trace-settings",
)


def segment(raw: bytes) -> str:
    """One path segment, percent-decoded (undecodable bytes kept as surrogates)."""
    s = raw.decode("utf-8", "surrogateescape")
    return unquote(s) if "%" in s else s


_FOUND_KEPT = 4096  # paths whose route is kept (match_path); past it, it starts over


class MethodNotAllowed(Exception):
    """The path is an endpoint, the method is not one of its: ``allowed`` for the Allow header."""

    def __init__(self, allowed: str) -> None:
        super().__init__(allowed)
        self.allowed = allowed


class _AnyMethod:
    """What a route with no methods accepts: all of them."""

    def __contains__(self, method: object) -> bool:
        return True


_ANY = _AnyMethod()


class Route:
    """One endpoint. ``fields``: the audit line's fixed fields (before the parameters);
    ``traced``: the trace extension samples it (the handler takes ``trace=``); ``openai``: a
    route of the OpenAI-compatible API."""

    __slots__ = (
        "methods",
        "pattern",
        "handler",
        "group",
        "action",
        "fields",
        "traced",
        "openai",
        "index",
        "size",
        "last",
        "rest",
        "params",
        "_idx",
        "_get",
        "_lits",
        "_accepts",
        "_nargs",
        "_i0",
        "_i1",
    )

    def __init__(
        self,
        methods: str,
        pattern: str,
        handler: str,
        group: str | None,
        action: str | None = None,
        fields: Iterable[tuple[str, str]] = (),
        *,
        traced: bool = False,
        openai: bool = False,
    ) -> None:
        self.methods = tuple(methods.split())
        self.pattern = pattern
        self.handler = handler
        self.group = group
        self.action = action
        self.fields = dict(fields)
        self.traced = traced
        self.openai = openai  # the OpenAI-compatible API: its errors in OpenAI's shape
        self.index = -1  # position in its Router (which holds a copy)
        segs = pattern.split("/")
        self.rest = segs[-1].startswith("{") and segs[-1].endswith("...}")
        if self.rest:
            segs = segs[:-1]
        self.size = len(segs)  # segments before a rest parameter: all of them otherwise
        params: list[str] = []
        idx: list[int] = []
        lit_idx: list[int] = []
        lits: list[bytes] = []
        for i, s in enumerate(segs):
            if s.startswith("{") and s.endswith("}"):
                params.append(s[1:-1])
                idx.append(i)
            else:
                lit_idx.append(i)
                lits.append(s.encode())
        if self.rest:
            params.append(pattern.rsplit("{", 1)[1][:-4])
        self.params = tuple(params)
        self.last = None if self.rest or (idx and idx[-1] == self.size - 1) else lits[-1]
        self._idx = tuple(idx)
        self._get = itemgetter(*lit_idx) if len(lit_idx) > 1 else lambda p: (p[lit_idx[0]],)
        self._lits = tuple(lits)
        self._accepts: Container[str] = self.methods or _ANY
        self._nargs = -1 if self.rest else len(idx)  # -1: args() decodes
        self._i0, self._i1 = (*idx, 0, 0)[:2]

    def __repr__(self) -> str:
        return f"Route({' '.join(self.methods) or '*'} {self.pattern} -> {self.handler})"

    def args(self, parts: Sequence[bytes]) -> list[str]:
        """The parameters' values, in pattern order (a rest parameter: the decoded tail)."""
        out = [segment(parts[i]) for i in self._idx]
        if self.rest:
            out.append("/".join(segment(p) for p in parts[self.size :]))
        return out


_Keyed = tuple[Route, Any, tuple[bytes, ...], Container[str], int, int, int]


def _keyed(r: Route) -> _Keyed:
    """``r`` unpacked for ``Router.match``, without its last literal (the lookup's key)."""
    get, lits = r._get, r._lits
    if r.last is not None and len(lits) > 2:
        idx = [i for i in range(r.size) if i not in r._idx][:-1]
        get, lits = itemgetter(*idx), lits[:-1]
    return r, get, lits, r._accepts, r._nargs, r._i0, r._i1


class Router:
    """Routes in order, indexed for matching (see the rules of this file)."""

    def __init__(self, routes: Sequence[Route]) -> None:
        self.routes = tuple(copy.copy(r) for r in routes)  # each numbered in this table
        for i, r in enumerate(self.routes):
            if r.group is not None and r.group not in GROUPS:
                raise ValueError(f"{r!r}: unknown API group {r.group!r}")
            if r.action is not None and r.action not in ACTIONS:
                raise ValueError(f"{r!r}: unknown audit action {r.action!r}")
            if r.action is not None and "POST" not in r.methods:
                raise ValueError(f"{r!r}: an audit action is a POST's")
            r.index = i
        self._rests = tuple(r for r in self.routes if r.rest)
        sizes = {r.size for r in self.routes}
        # (segment count, last segment) -> candidates; segment count -> candidates whatever
        # the last segment (a last parameter, a rest): both in table order
        self._by_last: dict[tuple[int, bytes], tuple[Route, ...]] = {}
        self._by_size: dict[int, tuple[Route, ...]] = {}
        for n in sizes:
            self._by_size[n] = self._candidates(n, None)
            for last in {r.last for r in self.routes if r.size == n and r.last is not None}:
                self._by_last[n, last] = self._candidates(n, last)
        # the same for match() (the hot path): last segment -> segment count -> candidates,
        # unpacked, a literal last segment left out of their checks (the key checked it)
        self._keyed: dict[bytes, dict[int, tuple[_Keyed, ...]]] = {}
        self._found: dict[tuple[str, bytes], tuple[Route, Sequence[str]]] = {}  # match_path's
        for (n, last), rs in self._by_last.items():
            self._keyed.setdefault(last, {})[n] = tuple(_keyed(r) for r in rs)

    def _candidates(self, n: int, last: bytes | None) -> tuple[Route, ...]:
        return tuple(
            r
            for r in self.routes
            if (r.rest and r.size <= n) or (r.size == n and (r.last is None or r.last == last))
        )

    def candidates(self, parts: list[bytes]) -> tuple[list[bytes], tuple[Route, ...]]:
        """The path without its trailing slash, and the routes it may match."""
        n = len(parts)
        if n > 2 and not parts[-1]:  # tolerate one trailing slash
            parts = parts[:-1]
            n -= 1
        return parts, self._by_last.get((n, parts[-1])) or self._fallback(n)

    def match_path(self, method: str, raw: bytes) -> tuple[Route, Sequence[str]] | None:
        """``match`` of the raw path ``raw``, kept once found (a client asks the same few
        paths again and again; a path that matches nothing, or not this method, is not
        kept)."""
        key = (method, raw)
        found = self._found.get(key)
        if found is None:
            found = self.match(method, raw.split(b"/"))
            if found is not None:
                found = (found[0], tuple(found[1]))
                if len(self._found) >= _FOUND_KEPT:
                    self._found.clear()
                self._found[key] = found
        return found

    def match(self, method: str, parts: list[bytes]) -> tuple[Route, Sequence[str]] | None:
        """The route serving ``method`` on the path (split on ``/``) and its arguments; None
        when no route has this path; MethodNotAllowed when routes have it, not the method.

        On every request: written for speed (``candidates`` inlined, one or two parameters
        decoded without a loop)."""
        n = len(parts)
        last = parts[-1]
        if not last and n > 2:  # tolerate one trailing slash
            parts = parts[:-1]
            n -= 1
            last = parts[-1]
        by_size = self._keyed.get(last)
        found = (by_size and by_size.get(n)) or self._keyed_fallback(n)
        allowed = None
        for r, get, lits, accepts, k, i0, i1 in found:
            if get(parts) == lits:  # candidates have the path's length (or a rest)
                if method in accepts:
                    if k == 1:
                        return r, (segment(parts[i0]),)
                    if k == 2:
                        return r, (segment(parts[i0]), segment(parts[i1]))
                    return r, r.args(parts)
                allowed = [*(allowed or ()), *(m for m in r.methods if m not in (allowed or ()))]
        if allowed:
            raise MethodNotAllowed(", ".join(allowed))
        return None

    def _fallback(self, n: int) -> tuple[Route, ...]:
        found = self._by_size.get(n)
        return found if found is not None else tuple(r for r in self._rests if r.size <= n)

    def _keyed_fallback(self, n: int) -> tuple[_Keyed, ...]:
        return tuple(_keyed(r) for r in self._fallback(n))

    def route_of(self, parts: list[bytes]) -> Route | None:
        """The first route with this path, whatever the method."""
        parts, found = self.candidates(parts)
        for r in found:
            if r._get(parts) == r._lits:
                return r
        return None

    def group(self, parts: list[bytes]) -> str | None:
        """The API group of the path; None when it is no endpoint (or an open one)."""
        r = self.route_of(parts)
        return None if r is None else r.group

    def action(self, method: str, parts: list[bytes]) -> tuple[str, dict[str, Any]] | None:
        """The audit action of the request, ``(action, fields)``; None when it changes
        nothing."""
        if method != "POST":
            return None
        try:
            found = self.match(method, parts)
        except MethodNotAllowed:
            return None
        if found is None:
            return None
        route, args = found
        action = route.action
        if action is None:
            return None
        return action, {**route.fields, **dict(zip(route.params, args, strict=True))}


_SYSTEM = (("kind", "system"), ("region", ""))
_CUDA = (("kind", "cuda"), ("region", ""))

ROUTES = Router(
    [
        # the hot path first: one candidate per lookup
        Route("POST", "/v2/models/{model}/infer", "infer", INFERENCE, traced=True),
        Route(
            "POST", "/v2/models/{model}/versions/{version}/infer", "infer", INFERENCE, traced=True
        ),
        Route("GET", "/v2", "server_metadata", METADATA),
        Route("GET", "/v2/health/live", "live", HEALTH),
        Route("GET", "/v2/health/ready", "ready", HEALTH),
        Route("GET POST", "/v2/models/stats", "all_statistics", STATISTICS),
        Route("GET", "/v2/models/{model}", "model_metadata", METADATA),
        Route("GET", "/v2/models/{model}/versions/{version}", "model_metadata", METADATA),
        Route("GET", "/v2/models/{model}/ready", "model_ready", HEALTH),
        Route("GET", "/v2/models/{model}/versions/{version}/ready", "model_ready", HEALTH),
        Route("GET", "/v2/models/{model}/config", "model_config", MODEL_CONFIG),
        Route("GET", "/v2/models/{model}/versions/{version}/config", "model_config", MODEL_CONFIG),
        Route("GET POST", "/v2/models/{model}/stats", "model_statistics", STATISTICS),
        Route(
            "GET POST",
            "/v2/models/{model}/versions/{version}/stats",
            "model_statistics",
            STATISTICS,
        ),
        Route("POST", "/v2/models/{model}/generate", "generate", INFERENCE),
        Route("POST", "/v2/models/{model}/versions/{version}/generate", "generate", INFERENCE),
        Route("POST", "/v2/models/{model}/generate_stream", "generate_stream", INFERENCE),
        Route(
            "POST",
            "/v2/models/{model}/versions/{version}/generate_stream",
            "generate_stream",
            INFERENCE,
        ),
        Route("GET POST", "/v2/trace/setting", "trace_setting", TRACE, "trace-settings"),
        Route(
            "GET POST",
            "/v2/models/{model}/trace/setting",
            "trace_setting",
            TRACE,
            "trace-settings",
        ),
        Route("GET POST", "/v2/logging", "logging", LOGGING, "log-settings"),
        Route("GET POST", "/v2/repository/index", "repository_index", MODEL_REPOSITORY),
        Route("POST", "/v2/repository/models/{model}/load", "load", MODEL_REPOSITORY, "load"),
        Route("POST", "/v2/repository/models/{model}/unload", "unload", MODEL_REPOSITORY, "unload"),
        Route(
            "POST",
            "/v2/repository/models/{model}/versions/{version}/load",
            "load",
            MODEL_REPOSITORY,
            "load",
        ),
        Route(
            "POST",
            "/v2/repository/models/{model}/versions/{version}/unload",
            "unload",
            MODEL_REPOSITORY,
            "unload",
        ),
        Route(
            "GET POST",
            "/v2/repository/models/{model}/traffic",
            "traffic",
            MODEL_REPOSITORY,
            "traffic",
        ),
        Route("GET", "/v2/systemsharedmemory/status", "shm_status", SHARED_MEMORY),
        Route("GET", "/v2/systemsharedmemory/region/{region}/status", "shm_status", SHARED_MEMORY),
        Route(
            "POST",
            "/v2/systemsharedmemory/region/{region}/register",
            "shm_register",
            SHARED_MEMORY,
            "shm-register",
            _SYSTEM,
        ),
        Route(
            "POST",
            "/v2/systemsharedmemory/unregister",
            "shm_unregister",
            SHARED_MEMORY,
            "shm-unregister",
            _SYSTEM,
        ),
        Route(
            "POST",
            "/v2/systemsharedmemory/region/{region}/unregister",
            "shm_unregister",
            SHARED_MEMORY,
            "shm-unregister",
            _SYSTEM,
        ),
        # CUDA shared memory: no GPU here, answered as a Triton without GPUs answers
        Route("GET", "/v2/cudasharedmemory/status", "cuda_status", SHARED_MEMORY),
        Route("GET", "/v2/cudasharedmemory/region/{region}/status", "cuda_status", SHARED_MEMORY),
        Route(
            "POST",
            "/v2/cudasharedmemory/region/{region}/register",
            "cuda_register",
            SHARED_MEMORY,
            "shm-register",
            _CUDA,
        ),
        Route(
            "POST",
            "/v2/cudasharedmemory/unregister",
            "cuda_unregister",
            SHARED_MEMORY,
            "shm-unregister",
            _CUDA,
        ),
        Route(
            "POST",
            "/v2/cudasharedmemory/region/{region}/unregister",
            "cuda_unregister",
            SHARED_MEMORY,
            "shm-unregister",
            _CUDA,
        ),
        # any other method or path under it: 501 (status and unregister answered as above)
        Route("", "/v2/cudasharedmemory/{rest...}", "cuda_other", SHARED_MEMORY),
        # the OpenAI-compatible API (frontends/openai_api.py); any other /v1 path: a 404 in
        # OpenAI's shape
        Route("GET", "/v1/models", "openai_models", METADATA, openai=True),
        Route("GET", "/v1/models/{model...}", "openai_model", METADATA, openai=True),
        Route("POST", "/v1/completions", "openai_completions", INFERENCE, openai=True),
        Route("POST", "/v1/chat/completions", "openai_chat", INFERENCE, openai=True),
        Route("POST", "/v1/embeddings", "openai_embeddings", INFERENCE, openai=True),
        Route("", "/v1/{rest...}", "openai_unknown", None, openai=True),
        # the operator's page (open) and its data (statistics): frontends/dashboard_page.py
        Route("GET", "/dashboard", "dashboard", None),
        Route("GET", "/dashboard/data", "dashboard_data", STATISTICS),
        Route("GET", "/dashboard/{file}", "dashboard", None),
    ]
)
