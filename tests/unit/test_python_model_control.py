"""The model loading API's server side (``backends/python/model_control.py``): Triton's
version texts, and the calls that would wait for themselves refused before they are made,
against a service that records what it was asked."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sluice.backends.python.messages import ModelControlCall
from sluice.backends.python.model_control import ModelController, parse_version
from sluice.errors import InvalidArgument


def test_parse_version_as_triton():
    assert parse_version("") == ""
    assert parse_version("3") == "3"
    with pytest.raises(InvalidArgument) as exc:
        parse_version("abc")
    assert str(exc.value) == (
        "failed to get model version from specified version string 'abc' (details: stol), "
        "version should be an integral value > 0"
    )
    with pytest.raises(InvalidArgument) as exc:
        parse_version("-1")
    assert str(exc.value) == (
        "failed to get model version from specified version string '-1', version should be "
        "an integral value > 0"
    )


class Service:
    """Loads wait until ``release`` is set, so a call can be seen while it is in flight."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str, Any]] = []
        self.release = asyncio.Event()

    def _check_control(self) -> None:
        pass

    def model_ready(self, name: str, version: str = "") -> bool:
        return name == "ready"

    async def model_ready_checked(self, name: str, version: str = "") -> bool:
        return self.model_ready(name, version)  # no model of its own to ask

    async def load_model(self, name: str, params: Any = None) -> None:
        self.asked.append(("load", name, params))
        await self.release.wait()

    async def unload_model(self, name: str, params: Any = None) -> None:
        self.asked.append(("unload", name, params))


def call(op: str, model: str, **kw: Any) -> ModelControlCall:
    return ModelControlCall(1, op, model, **kw)


def test_waits_refused_before_they_deadlock():
    async def main() -> None:
        svc = Service()
        ctl = ModelController(svc)
        assert await ctl.call("a", False, ("a",), call("ready", "ready")) == ("", True)
        assert await ctl.call("a", False, ("a",), call("load", "a")) == (
            "model 'a' cannot load itself: the load would wait for the call that asks for it",
            False,
        )
        # a's initialize loads b (in flight); b's initialize then asks for a: a cycle
        first = asyncio.ensure_future(
            ctl.call("a", True, ("a",), call("load", "b", config="{}", files=(("file:x", b"1"),)))
        )
        await asyncio.sleep(0)
        err, _ = await ctl.call("b", True, ("b",), call("load", "a"))
        assert err == (
            "model load cycle refused: the load of 'a' waits for the load of 'b' already "
            "(b -> a -> b); the load would wait for itself"
        )
        svc.release.set()
        assert await first == ("", False)
        # from execute: unloading a model whose request waits (BLS) on this one
        err, _ = await ctl.call("c", False, ("x", "c"), call("unload", "x"))
        assert err.startswith("model 'c' cannot unload 'x': a request of 'x' waits for this one")
        assert await ctl.call("c", False, ("c",), call("unload", "x", unload_dependents=True)) == (
            "",
            False,
        )
        assert svc.asked == [
            ("load", "b", {"config": "{}", "file:x": b"1"}),
            ("unload", "x", {"unload_dependents": True}),
        ]
        assert ctl._waits == {}  # nothing waits once the loads are done

    asyncio.run(main())
