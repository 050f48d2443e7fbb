"""One HTTP route table (``sluice.protocol.http_routes``): the router, access control and the
audit log all read it, so an endpoint is added by one entry (and its handler).

The extra endpoint is served by the real ``HttpFrontend`` on uvicorn, on 127.0.0.1 port 0, with
a restriction and an audit log; it is reached over a socket.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Iterator
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import pytest
import uvloop

from sluice.frontends.http_api import HttpFrontend, start_http_server
from sluice.protocol.http_routes import ACTIONS, GROUPS, ROUTES, MethodNotAllowed, Route, Router
from sluice.security.access import Guard, Policy, Restriction, http_group
from sluice.security.audit import AuditLog, http_action
from tests.e2e.helpers import wait_until
from tests.unit.test_frontends_fake_service import ToyService

SRC = Path(__file__).resolve().parents[2] / "src" / "sluice"
WARM = Route(
    "POST",
    "/v2/models/{model}/versions/{version}/warm",
    "warm",
    "model-repository",
    "load",
)


class WarmingFrontend(HttpFrontend):
    """The front-end with one more handler: the extra entry's."""

    __slots__ = ()

    async def _warm(self, scope: Any, receive: Any, model: str, version: str) -> Any:
        body = json.dumps({"warmed": model, "version": version}).encode()
        return 200, body, [(b"content-type", b"application/json")]


@pytest.fixture
def warm_server(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    audit = tmp_path / "audit.jsonl"
    guard = Guard(http=[Restriction(("model-repository",), "admin-key", "secret")])
    policy = Policy(guard, AuditLog(audit))
    frontend = WarmingFrontend(ToyService(), policy, routes=Router([*ROUTES.routes, WARM]))
    loop = uvloop.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def run(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(30)

    server, task, port = run(start_http_server(frontend, "127.0.0.1", 0))
    try:
        yield port, audit
    finally:

        async def stop() -> None:
            server.should_exit = True
            await task

        run(stop())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _request(
    port: int, method: str, path: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], Any]:
    conn = HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=b"" if method == "POST" else None, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), json.loads(resp.read() or b"null")
    finally:
        conn.close()


def test_an_endpoint_is_added_by_one_route_entry(warm_server: tuple[int, Path]) -> None:
    port, audit = warm_server
    path = "/v2/models/a%2Fb/versions/3/warm"
    # access control classifies it (its group is restricted) and the refusal is audited
    code, _, body = _request(port, "POST", path)
    assert (code, body) == (403, {"error": "This API is restricted, expecting header 'admin-key'"})
    # the router serves it, its parameters percent-decoded
    code, _, body = _request(port, "POST", path, {"admin-key": "secret"})
    assert (code, body) == (200, {"warmed": "a/b", "version": "3"})
    # another method: 405 naming the entry's methods (the message shows the decoded path)
    code, headers, body = _request(port, "GET", path, {"admin-key": "secret"})
    assert (code, body) == (
        405,
        {"error": "method GET is not allowed on /v2/models/a/b/versions/3/warm"},
    )
    assert headers["allow"] == "POST"
    # a line is written once the answer is sent: wait for both
    wait_until(lambda: len(audit.read_text().splitlines()) >= 2, what="two audit lines")
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    assert sorted((x["action"], x["model"], x["version"], x["outcome"]) for x in lines) == [
        ("load", "a/b", "3", "denied: This API is restricted, expecting header 'admin-key'"),
        ("load", "a/b", "3", "ok"),
    ]
    # the server's own table is untouched
    assert ROUTES.match("POST", b"/v2/models/m/versions/3/warm".split(b"/")) is None


def _example(route: Route) -> str:
    """A concrete path of the route: each parameter's value is its name."""
    return re.sub(r"\{(\w+)(\.\.\.)?\}", lambda m: m.group(1), route.pattern)


@pytest.mark.parametrize("route", ROUTES.routes, ids=repr)
def test_every_route_is_served_classified_and_audited_from_its_entry(route: Route) -> None:
    assert hasattr(HttpFrontend, f"_{route.handler}"), route
    assert route.group in GROUPS or (
        route.group is None and route.pattern.startswith(("/dash", "/v1/{rest"))
    )
    parts = _example(route).encode().split(b"/")
    for method in route.methods or ("GET", "POST", "PUT"):
        found = ROUTES.match(method, list(parts))
        assert found is not None and found[0].pattern == route.pattern, (method, found)
    assert http_group(list(parts)) == route.group
    if route.action is None:
        assert http_action("POST", list(parts)) is None
    else:
        assert route.action in ACTIONS and "POST" in route.methods
        fields = {**route.fields, **{p: p for p in route.params}}
        assert http_action("POST", list(parts)) == (route.action, fields)
        assert http_action("GET", list(parts)) is None


def test_a_route_naming_no_known_group_or_action_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown API group 'admin'"):
        Router([Route("GET", "/v2/x", "x", "admin")])
    with pytest.raises(ValueError, match="unknown audit action 'wipe'"):
        Router([Route("POST", "/v2/x", "x", "logging", "wipe")])
    with pytest.raises(ValueError, match="an audit action is a POST's"):
        Router([Route("GET", "/v2/x", "x", "logging", "log-settings")])


@pytest.mark.parametrize(
    "module",
    [
        "security/access.py",
        "security/audit.py",
        "frontends/http_api.py",
        "frontends/dashboard_page.py",
    ],
)
def test_no_path_parsing_outside_the_table(module: str) -> None:
    source = (SRC / module).read_text()
    for needle in ('b"v2"', 'b"models"', "unquote", 'split(b"/")', "parts[", 'b"dashboard"'):
        if needle == 'split(b"/")' and module == "frontends/http_api.py":
            continue  # the router's input: the path split once, handed to the table
        assert needle not in source, (module, needle)


def test_a_path_matched_once_is_kept_with_the_same_answer() -> None:
    """``match_path`` answers as ``match`` does (its route and decoded arguments; None for a
    path no route has; MethodNotAllowed for another method), and a repeat of a found path is
    the kept answer."""
    router = Router(ROUTES.routes)
    raw = b"/v2/models/my%20model/versions/3/infer"
    expected = router.match("POST", raw.split(b"/"))
    assert expected is not None
    found = router.match_path("POST", raw)
    assert found is not None
    assert (found[0], tuple(found[1])) == (expected[0], tuple(expected[1]))
    assert tuple(found[1]) == ("my model", "3") and found[0].handler == "infer"
    assert router.match_path("POST", raw) is found  # kept
    assert router.match_path("POST", b"/v2/nowhere") is None
    assert router.match_path("POST", b"/v2/nowhere") is None  # (nothing kept)
    with pytest.raises(MethodNotAllowed) as refused:
        router.match_path("DELETE", b"/v2/health/ready")
    assert "GET" in refused.value.allowed
