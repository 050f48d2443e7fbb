"""KServe v2 / Triton HTTP front-end: a bare ASGI callable (no framework, no middleware).

Rules of this file:
- Translate only: decode, call ``InferenceService``, encode. No behaviour lives here.
- Routes are the table of ``protocol.http_routes`` (method, path, handler, API group, audit
  action): the path (``raw_path``, so ``%2F`` in a model name stays in the name) is matched
  there once; route ``R`` is served by the method ``_<R.handler>(scope, receive, *args)``.
- Every handler returns ``(status, body, headers)``; ``__call__`` sends it. Errors are mapped
  once, in ``__call__``, by ``frontends.errors.http_error``; error bodies are
  ``{"error": "<message>"}`` with Content-Type application/json, except on the routes of the
  OpenAI-compatible API (``Route.openai``, served by ``frontends/openai_api``): there they
  are OpenAI's ``{"error": {"message", "type", "param", "code"}}``.

Usage::

    frontend = HttpFrontend(service)
    server, task, port = await start_http_server(frontend, "127.0.0.1", 8000)
    ...
    server.should_exit = True
    await task
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import gzip
import json
import socket
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, MutableMapping
from functools import partial
from typing import Any, TypeVar

import uvicorn

from ..errors import InvalidArgument, NotFound, ServerError, Status
from ..protocol import json_body
from ..protocol.config_json import config_to_json_dict
from ..protocol.generate_codec import (
    decode_generate_request,
    encode_generate_response,
    sse_event,
)
from ..protocol.http_codec import encode_infer_response, read_infer_request
from ..protocol.http_routes import ROUTES, MethodNotAllowed, Route, Router
from ..protocol.infer_layout import HttpLayouts
from ..protocol.openai_codec import error_body as openai_error_body
from ..security.access import CALLER, AccessDenied, Policy
from ..service import InferenceService
from ..types import InferResponse
from .dashboard_page import dashboard_data, dashboard_file
from .errors import http_error, http_error_headers
from .http_limits import (
    DEFAULT_MAX_INPUT_SIZE,
    DISCONNECTED,
    ON_DISCONNECT,
    TASK,
    BodyTooLarge,
    limit_body,
)
from .http_protocol import HttpProtocol
from .openai_api import OpenAIEdge, Reply

__all__ = ["HttpFrontend", "make_http_server", "start_http_server"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]
Result = tuple[int, bytes, Headers]

_CT_JSON: Headers = [(b"content-type", b"application/json")]
_OK_EMPTY: Result = (200, b"", [])
_NOT_READY: Result = (400, b"", [])  # server not live/ready: a bare 400, as Triton
_json_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode

_SSE_HEADERS: Headers = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]


class _Stream(Exception):
    """Not an error: the answer is a stream of server-sent events (``generate_stream``);
    raised with the events so that ``__call__`` sends them as they come."""

    def __init__(self, events: AsyncIterator[bytes]) -> None:
        self.events = events


class _Disconnected(Exception):
    """The client went away before its request body arrived; nothing to answer."""


_T = TypeVar("_T")


async def _unless_gone(scope: Scope, answer: Awaitable[_T]) -> _T:
    """``answer`` awaited, unless the client closes its connection first: then the wait is
    cancelled (a queued request leaves its queue, a stream's model sees ``is_cancelled()``)
    and _Disconnected raised. The protocol reports the loss (``http_limits``)."""
    task = scope.get(TASK) or asyncio.current_task()
    assert task is not None
    scope[ON_DISCONNECT] = task.cancel
    try:
        return await answer
    except asyncio.CancelledError:
        if not scope.get(DISCONNECTED):
            raise  # shutdown, not the client
        task.uncancel()
        raise _Disconnected from None
    finally:
        scope[ON_DISCONNECT] = None


async def _events(
    first: InferResponse | None, rest: AsyncIterator[InferResponse]
) -> AsyncIterator[bytes]:
    """``generate_stream``'s events: one per response with data (a decoupled model's empty
    final response sends none); an error mid-stream is an event ``{"error": ...}``."""
    try:
        item = first
        while item is not None:
            if item.error is not None:
                yield sse_event({"error": str(item.error)})
            elif item.outputs or not item.final:
                yield sse_event(encode_generate_response(item))
            item = await anext(rest, None)
    except ServerError as exc:
        yield sse_event({"error": str(exc)})
    finally:
        await rest.aclose()  # type: ignore[attr-defined]


def _json(obj: Any, status: int = 200) -> Result:
    return status, _json_dumps(obj).encode(), _CT_JSON


def _pairs(pairs: list[tuple[str, Any]]) -> Result:
    """A JSON object from (key, value) pairs, keys in order and repeated as given (Triton's
    trace setting repeats ``resource``)."""
    body = ",".join(f"{_json_dumps(k)}:{_json_dumps(v)}" for k, v in pairs)
    return 200, f"{{{body}}}".encode(), _CT_JSON


def _error(status: int, message: str) -> Result:
    return status, _json_dumps({"error": message}).encode(), _CT_JSON


def _failure(route: Route | None, status: int, message: str, exc: object = None) -> Result:
    """An error answer in the shape of the route's API: Triton's, or OpenAI's on ``/v1``
    (``param`` and ``code`` from the error where it names them)."""
    if route is None or not route.openai:
        return _error(status, message)
    param = getattr(exc, "param", None)
    code = getattr(exc, "code", None)
    return status, openai_error_body(status, message, param, code), _CT_JSON


_MODEL_NOT_READY = _error(400, "Model version not ready")
_OPENAI_TRACE = "sluice.openai_trace"  # scope key: the trace an OpenAI call sampled


def _index_rows(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """Triton omits empty fields: ``{"name": "m"}`` for a model never loaded, no "reason" for
    a READY one."""
    return [{k: v for k, v in row.items() if v or k == "name"} for row in rows]


async def _read_body(receive: Receive) -> bytes:
    msg = await receive()
    if msg["type"] == "http.disconnect":
        raise _Disconnected
    body: bytes = msg.get("body", b"")
    if not msg.get("more_body", False):
        return body
    chunks = [body]
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise _Disconnected
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body", False):
            return b"".join(chunks)


class _UnsupportedEncoding(Exception):
    """A Content-Encoding other than gzip, deflate, identity: 415 (Triton answers 501)."""


def _decompress(body: bytes, encoding: bytes, limit: int = 0) -> bytes:
    """The body decoded; no more than ``limit`` bytes once inflated (0 = no limit)."""
    enc = encoding.strip().lower()
    if enc in (b"", b"identity"):
        return body
    if enc not in (b"gzip", b"deflate"):
        raise _UnsupportedEncoding(
            f"unsupported Content-Encoding {encoding.decode('latin-1')!r}: this server "
            "accepts gzip, deflate and identity"
        )
    # gzip: a gzip header (wbits 16+15); deflate: the zlib format, as Triton reads it
    inflater = zlib.decompressobj(31 if enc == b"gzip" else 15)
    try:
        out = inflater.decompress(body, limit + 1) if limit else inflater.decompress(body)
        if limit and len(out) > limit:
            raise BodyTooLarge(None, limit)
        if not inflater.eof:
            raise zlib.error("the compressed data ends early")
    except zlib.error as exc:
        raise InvalidArgument(
            f"failed to decompress the {enc.decode()} request body: {exc}"
        ) from None
    return out


@functools.lru_cache(maxsize=64)  # (a client sends the same header on every request)
def _accepted_encoding(accept: bytes) -> bytes | None:
    """The compression Triton would apply for this Accept-Encoding (gzip or deflate)."""
    for part in accept.lower().split(b","):
        token, _, q = part.strip().partition(b";")
        if token in (b"gzip", b"deflate") and q.strip() not in (b"q=0", b"q=0.0"):
            return token
    return None


def _json_body(body: bytes, what: str) -> dict[str, Any]:
    """Optional JSON-object body of a control request ({} when empty)."""
    if not body.strip():
        return {}
    doc = json_body.loads(body, f"{what} request")
    if type(doc) is not dict:
        raise InvalidArgument(f"the {what} request JSON must be an object")
    return doc


def _params(doc: dict[str, Any], what: str) -> dict[str, Any]:
    params = doc.get("parameters")
    if params is None:
        return {}
    if type(params) is not dict:
        raise InvalidArgument(f"the {what} request field 'parameters' must be a JSON object")
    return params


# --------------------------------------------------------------------------- the application
class HttpFrontend:
    """ASGI application serving the KServe v2 / Triton HTTP API over ``service``."""

    __slots__ = (
        "service",
        "tracer",
        "policy",
        "max_input_size",
        "routes",
        "layouts",
        "openai",
        "_handlers",
    )

    def __init__(
        self,
        service: InferenceService,
        policy: Policy | None = None,
        *,
        max_input_size: int = DEFAULT_MAX_INPUT_SIZE,
        routes: Router = ROUTES,
        openai: OpenAIEdge | None = None,
    ) -> None:
        self.service = service
        # the OpenAI-compatible API (/v1); None: its routes answer 404
        self.openai = openai
        # --http-max-input-size: the most bytes a request body may hold (0 = no limit)
        self.max_input_size = max_input_size
        self.tracer = service.tracer  # the trace extension: one test per request when off
        # restricted APIs, API keys, audit log (access.Policy): one test per request when none
        self.policy = policy
        # the URL space (protocol.http_routes); route i is served by _handlers[i]
        self.routes = routes
        # the binary-data request layouts this front-end has learned (a repeat skips JSON)
        self.layouts = HttpLayouts()
        self._handlers: tuple[Callable[..., Awaitable[Result]], ...] = tuple(
            getattr(self, f"_{r.handler}") for r in routes.routes
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1003})
            return
        if self.policy is not None and "sluice.key" not in scope:
            await self._policed(self.policy, scope, receive, send)
            return
        trace = None
        route: Route | None = None
        raw: bytes = scope.get("raw_path") or scope["path"].encode()
        try:
            if self.max_input_size:
                receive = limit_body(scope, receive, self.max_input_size)
            found = self.routes.match_path(scope["method"], raw)
            if found is None:
                status, body, headers = _error(404, f"no route for {scope['path']}")
            else:
                route, args = found
                handler = self._handlers[route.index]
                if route.traced and self.tracer.on:  # args[0]: the model
                    trace = self.tracer.sample(args[0])
                    if trace is not None:
                        trace.stamp("HTTP_RECV_START")
                    status, body, headers = await handler(scope, receive, *args, trace=trace)
                else:
                    status, body, headers = await handler(scope, receive, *args)
                    if route.openai:  # the model is in the body: the handler sampled it
                        trace = scope.pop(_OPENAI_TRACE, None)
        except _Disconnected:
            if trace is not None:
                trace.finish()
            return
        except _Stream as stream:
            with contextlib.suppress(_Disconnected):
                await self._send_events(scope, send, stream.events)
            return
        except MethodNotAllowed as exc:
            route = self.routes.route_of(raw.split(b"/"))
            status, body, headers = _failure(
                route, 405, f"method {scope['method']} is not allowed on {scope['path']}"
            )
            headers = [*headers, (b"allow", exc.allowed.encode())]
        except BodyTooLarge as exc:  # the rest of the body is not read: close after answering
            route = route or self.routes.route_of(raw.split(b"/"))
            status, body, headers = _failure(route, 413, str(exc))
            headers = [*headers, (b"connection", b"close")]
        except _UnsupportedEncoding as exc:
            status, body, headers = _failure(route, 415, str(exc))
        except Exception as exc:  # mapped once, here
            code, message = http_error(exc, f"{scope['method']} {scope['path']}")
            status, body, headers = _failure(route, code, message, exc)
            headers = [*headers, *http_error_headers(exc)]
        if trace is not None:
            await self._send_traced(send, status, body, headers, trace)
            return
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [*headers, (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def _policed(self, policy: Policy, scope: Scope, receive: Receive, send: Send) -> None:
        """The request checked by ``policy.guard`` (answered here when refused), then served
        as usual; a control action is written to the audit log with its outcome."""
        raw: bytes = scope.get("raw_path") or scope["path"].encode()
        parts = raw.split(b"/")
        client = scope.get("client")
        address = f"{client[0]}:{client[1]}" if client else ""
        key = ""
        if policy.guard is not None:
            raw_headers = scope["headers"]

            def header(name: str) -> str | None:
                want = name.encode("latin-1")
                for k, v in raw_headers:
                    if k == want:
                        return str(v.decode("latin-1"))
                return None

            try:
                key = policy.guard.check_http(self.routes.group(parts), header)
            except AccessDenied as exc:
                action = self.routes.action(scope["method"], parts) if policy.audit else None
                if policy.audit is not None and action is not None:
                    policy.audit.write(
                        key="",
                        client=address,
                        protocol="http",
                        action=action[0],
                        outcome=f"denied: {exc}",
                        **action[1],
                    )
                route = self.routes.route_of(parts)
                status, body, extra = _failure(route, exc.http_status, exc.message, exc)
                if exc.http_status == 401:
                    extra = [*extra, (b"www-authenticate", b"Bearer")]
                await send(
                    {
                        "type": "http.response.start",
                        "status": status,
                        "headers": [*extra, (b"content-length", str(len(body)).encode())],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        scope["sluice.key"] = key
        audit = policy.audit
        if audit is not None:  # what the request causes (a load on demand) names its caller
            CALLER.set((key, address))
        action = self.routes.action(scope["method"], parts) if audit is not None else None
        if audit is None or action is None:
            await self(scope, receive, send)
            return
        answer: dict[str, Any] = {"status": 500, "body": b""}

        async def recording_send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                answer["status"] = message["status"]
            elif message["type"] == "http.response.body" and answer["status"] >= 400:
                answer["body"] += message.get("body", b"")
            await send(message)

        try:
            await self(scope, receive, recording_send)
        finally:
            code = answer["status"]
            result = "ok"
            if code >= 400:
                try:
                    text = json.loads(answer["body"])["error"]
                except (ValueError, KeyError, TypeError):
                    text = f"HTTP {code}"
                result = f"error: {text}"
            audit.write(
                key=key,
                client=address,
                protocol="http",
                action=action[0],
                outcome=result,
                **action[1],
            )

    @staticmethod
    async def _send_traced(
        send: Send, status: int, body: bytes, headers: Headers, trace: Any
    ) -> None:
        """The answer to a sampled request, between HTTP_SEND_START and HTTP_SEND_END."""
        trace.stamp("HTTP_SEND_START")
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [*headers, (b"content-length", str(len(body)).encode())],
                }
            )
            await send({"type": "http.response.body", "body": body})
            trace.stamp("HTTP_SEND_END")
        finally:
            trace.finish()

    @staticmethod
    async def _send_events(scope: Scope, send: Send, events: AsyncIterator[bytes]) -> None:
        """The events as they come; a client that leaves ends the stream (and its request)."""

        async def pump() -> None:
            async with contextlib.aclosing(events):  # type: ignore[type-var]
                async for event in events:
                    if scope.get(DISCONNECTED):  # it left before the hook was set: stop
                        break
                    await send({"type": "http.response.body", "body": event, "more_body": True})

        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        await _unless_gone(scope, pump())
        await send({"type": "http.response.body", "body": b""})

    async def _generate(
        self, scope: Scope, receive: Receive, name: str, version: str = "", stream: bool = False
    ) -> Result:
        body = await _read_body(receive)
        meta = await self.service.model_metadata(name, version)
        request = decode_generate_request(body, name, version, meta["inputs"])
        if not stream:
            response = await _unless_gone(scope, self.service.infer(request, single=True))
            return _json(encode_generate_response(response))
        responses = self.service.infer_stream(request)
        try:  # errors before the first response are a plain error answer, as Triton
            first = await _unless_gone(scope, anext(responses))
        except StopAsyncIteration:
            first = None
        except BaseException:
            await responses.aclose()  # type: ignore[attr-defined]
            raise
        raise _Stream(_events(first, responses))

    # ------------------------------------------------------------------ handlers (routes)
    async def _server_metadata(self, scope: Scope, receive: Receive) -> Result:
        return _json(self.service.server_metadata())

    async def _live(self, scope: Scope, receive: Receive) -> Result:
        return _OK_EMPTY if self.service.live() else _NOT_READY

    async def _ready(self, scope: Scope, receive: Receive) -> Result:
        return _OK_EMPTY if await self.service.ready_checked() else _NOT_READY

    async def _all_statistics(self, scope: Scope, receive: Receive) -> Result:
        return _json(self.service.model_statistics())

    async def _model_metadata(
        self, scope: Scope, receive: Receive, name: str, version: str = ""
    ) -> Result:
        return _json(await self.service.model_metadata(name, version))

    async def _model_ready(
        self, scope: Scope, receive: Receive, name: str, version: str = ""
    ) -> Result:
        if await self.service.model_ready_checked(name, version):
            return _OK_EMPTY
        why = self.service.not_ready_reason(name)  # on-demand loading: evicted, and why
        return _error(400, f"Model version not ready: {why}") if why else _MODEL_NOT_READY

    async def _model_config(
        self, scope: Scope, receive: Receive, name: str, version: str = ""
    ) -> Result:
        return _json(config_to_json_dict(await self.service.model_config(name, version)))

    async def _model_statistics(
        self, scope: Scope, receive: Receive, name: str, version: str = ""
    ) -> Result:
        return _json(self.service.model_statistics(name, version))

    async def _generate_stream(
        self, scope: Scope, receive: Receive, name: str, version: str = ""
    ) -> Result:
        return await self._generate(scope, receive, name, version, True)

    async def _trace_setting(self, scope: Scope, receive: Receive, model: str = "") -> Result:
        # /v2/trace/setting, /v2/models/<m>/trace/setting (the trace extension)
        if scope["method"] == "GET":
            return _pairs(self.service.trace_settings(model))
        doc = _json_body(await _read_body(receive), "trace setting")
        return _pairs(self.service.update_trace_settings(model, doc))

    async def _logging(self, scope: Scope, receive: Receive) -> Result:
        if scope["method"] == "GET":
            return _json(self.service.log_settings())
        doc = _json_body(await _read_body(receive), "logging")
        return _json(self.service.update_log_settings(doc))

    async def _repository_index(self, scope: Scope, receive: Receive) -> Result:
        doc = _json_body(await _read_body(receive), "repository index")
        ready = doc.get("ready", False)
        if type(ready) is not bool:
            raise InvalidArgument("the repository index request field 'ready' must be a boolean")
        await self.service.refresh_repositories()
        return _json(_index_rows(self.service.repository_index(ready_only=ready)))

    async def _load(
        self, scope: Scope, receive: Receive, name: str, version: str | None = None
    ) -> Result:
        doc = _json_body(await _read_body(receive), "load")
        params = _load_params(_params(doc, "load"))
        if version is not None:
            await self.service.load_model_version(name, version, params)
        else:
            await self.service.load_model(name, params)
        return _OK_EMPTY

    async def _unload(
        self, scope: Scope, receive: Receive, name: str, version: str | None = None
    ) -> Result:
        doc = _json_body(await _read_body(receive), "unload")
        params = _params(doc, "unload")
        if version is None:
            await self.service.unload_model(name, params or None)
        else:
            await self.service.unload_model(name, {**params, "version": version})
        return _OK_EMPTY

    async def _traffic(self, scope: Scope, receive: Receive, name: str) -> Result:
        if scope["method"] == "GET":
            return _json(self.service.model_traffic(name))
        doc = _json_body(await _read_body(receive), "traffic")
        return _json(await self.service.set_model_traffic(name, doc))

    async def _shm_status(self, scope: Scope, receive: Receive, region: str = "") -> Result:
        return _json(self.service.shm_status(region))

    async def _shm_register(self, scope: Scope, receive: Receive, region: str) -> Result:
        if not region:  # /v2/systemsharedmemory/region//register names no region
            return _error(404, f"no route for {scope['path']}")
        doc = _json_body(await _read_body(receive), "shared memory register")
        self.service.shm_register(
            region, doc.get("key", ""), doc.get("offset", 0), doc.get("byte_size", -1)
        )
        return _OK_EMPTY

    async def _shm_unregister(self, scope: Scope, receive: Receive, region: str = "") -> Result:
        await _read_body(receive)
        self.service.shm_unregister(region)
        return _OK_EMPTY

    async def _cuda_status(self, scope: Scope, receive: Receive, region: str = "") -> Result:
        return _json([])  # no regions (as a Triton without GPUs answers)

    async def _cuda_unregister(self, scope: Scope, receive: Receive, region: str = "") -> Result:
        await _read_body(receive)
        return _OK_EMPTY  # nothing to unregister: OK, as Triton without GPUs answers

    async def _cuda_register(self, scope: Scope, receive: Receive, region: str = "") -> Result:
        return _error(
            501,
            "CUDA shared memory is not supported without a GPU: this server has none (use "
            "system shared memory)",
        )

    async def _cuda_other(self, scope: Scope, receive: Receive, rest: str) -> Result:
        leaf = rest.rpartition("/")[2]
        if leaf == "status" and scope["method"] == "GET":
            return await self._cuda_status(scope, receive)
        if leaf == "unregister" and scope["method"] == "POST":
            return await self._cuda_unregister(scope, receive)
        return await self._cuda_register(scope, receive)

    async def _dashboard(self, scope: Scope, receive: Receive, file: str = "") -> Result:
        return dashboard_file(file)

    async def _dashboard_data(self, scope: Scope, receive: Receive) -> Result:
        return dashboard_data(self.service)

    # ------------------------------------------------------------------ /v1 (openai_api)
    def _openai_edge(self, scope: Scope) -> OpenAIEdge:
        if self.openai is None:
            raise NotFound(f"no route for {scope['path']}: the OpenAI-compatible API is off")
        return self.openai

    async def _openai_call(self, scope: Scope, receive: Receive, call: str) -> Result:
        edge = self._openai_edge(scope)
        received = time.monotonic_ns()
        body = await _read_body(receive)
        reply: Reply = await getattr(edge, call)(body, partial(_unless_gone, scope), received)
        if reply.events is not None:
            raise _Stream(reply.events)
        if reply.trace is not None:
            scope[_OPENAI_TRACE] = reply.trace
        return _json(reply.doc)

    async def _openai_models(self, scope: Scope, receive: Receive) -> Result:
        return _json(self._openai_edge(scope).models())

    async def _openai_model(self, scope: Scope, receive: Receive, name: str) -> Result:
        return _json(self._openai_edge(scope).model(name))

    async def _openai_completions(self, scope: Scope, receive: Receive) -> Result:
        return await self._openai_call(scope, receive, "completions")

    async def _openai_chat(self, scope: Scope, receive: Receive) -> Result:
        return await self._openai_call(scope, receive, "chat_completions")

    async def _openai_embeddings(self, scope: Scope, receive: Receive) -> Result:
        return await self._openai_call(scope, receive, "embeddings")

    async def _openai_unknown(self, scope: Scope, receive: Receive, rest: str) -> Result:
        """Any other /v1 path and method: 405 on a path of the API, else 404."""
        raw: bytes = scope.get("raw_path") or scope["path"].encode()
        route = self.routes.route_of(raw.split(b"/"))
        if route is not None and route.handler != "openai_unknown":
            raise MethodNotAllowed(", ".join(route.methods))
        raise NotFound(f"no route for {scope['path']}")

    async def _infer(
        self, scope: Scope, receive: Receive, model: str, version: str = "", trace: Any = None
    ) -> Result:
        body = await _read_body(receive)
        received_ns = time.monotonic_ns()
        if trace is not None:
            trace.stamp("HTTP_RECV_END")
        header_length: int | None = None
        accept: bytes | None = None
        for key, value in scope["headers"]:
            if key == b"inference-header-content-length":
                try:
                    header_length = int(value)
                except ValueError:
                    raise InvalidArgument(
                        f"Inference-Header-Content-Length must be an integer, got {value!r}"
                    ) from None
            elif key == b"content-encoding":
                body = _decompress(body, value, self.max_input_size)
            elif key == b"accept-encoding":
                accept = value
        request = read_infer_request(body, model, version, header_length, self.layouts)
        request.arrival_ns = received_ns
        request.may_run_now = True  # cancelled only when its client has gone
        if trace is not None:
            request.trace = trace
        response = await _unless_gone(scope, self.service.infer(request, protocol="HTTP end point"))
        if trace is not None:
            trace.stamp("INFER_RESPONSE_COMPLETE")
        out, headers = encode_infer_response(response, request)
        if accept is not None:
            enc = _accepted_encoding(accept)
            if enc is not None:
                out = gzip.compress(out, 6) if enc == b"gzip" else zlib.compress(out)
                headers.append((b"content-encoding", enc))
        return 200, out, headers


def _load_params(params: dict[str, Any]) -> dict[str, Any] | None:
    """HTTP load parameters -> service form: "file:..." values base64-decoded to bytes;
    "config" kept as a JSON string (an object is accepted and re-serialised)."""
    if not params:
        return None
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key.startswith("file:"):
            if type(value) is not str:
                raise InvalidArgument(f"load parameter '{key}' must be a base64 string")
            try:
                out[key] = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise InvalidArgument(
                    f"load parameter '{key}' is not valid base64: {exc}"
                ) from None
        elif key == "config":
            if type(value) is dict:
                value = json.dumps(value)
            elif type(value) is not str:
                raise InvalidArgument("load parameter 'config' must be a JSON string")
            out[key] = value
        else:
            out[key] = value
    return out


# --------------------------------------------------------------------------- server helpers
class _Server(uvicorn.Server):
    """uvicorn.Server that leaves signal handling to its owner (sluice's server.py)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def make_http_server(
    app: HttpFrontend | InferenceService,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    install_signal_handlers: bool = False,
    **config: Any,
) -> uvicorn.Server:
    """A uvicorn.Server for ``app`` tuned for the hot path (uvloop, sluice's HTTP/1.1
    connection on httptools (``http_protocol``), no access log, no lifespan, no proxy-headers
    middleware, no Server/Date headers). ``config`` overrides
    any uvicorn.Config keyword. Run it with ``await server.serve()`` (or ``serve(sockets=...)``);
    stop it with ``server.should_exit = True``."""
    if isinstance(app, InferenceService):
        app = HttpFrontend(app)
    options: dict[str, Any] = {
        "host": host,
        "port": port,
        "loop": "uvloop",
        "http": HttpProtocol,
        "access_log": False,
        "lifespan": "off",
        "proxy_headers": False,
        "server_header": False,
        "date_header": False,
        "log_level": "warning",
        "timeout_keep_alive": 75,
        "backlog": 4096,
    }
    options.update(config)
    cfg = uvicorn.Config(app, **options)
    return (uvicorn.Server if install_signal_handlers else _Server)(cfg)


async def start_http_server(
    app: HttpFrontend | InferenceService,
    host: str = "127.0.0.1",
    port: int = 0,
    **config: Any,
) -> tuple[uvicorn.Server, asyncio.Task[None], int]:
    """Bind ``host:port`` (0 = any free port), start serving in a task on the running loop and
    wait until it accepts connections. Returns ``(server, task, bound_port)``. Stop with
    ``server.should_exit = True; await task``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ServerError(f"cannot bind HTTP to {host}:{port}: {exc}", Status.UNAVAILABLE) from exc
    sock.set_inheritable(True)
    bound = sock.getsockname()[1]
    server = make_http_server(app, host, bound, **config)
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            sock.close()
            task.result()  # re-raise the startup error
            raise ServerError(f"HTTP server on {host}:{bound} exited during startup")
        await asyncio.sleep(0.005)
    return server, task, bound
