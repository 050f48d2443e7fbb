"""On-demand loading in-process: the real manager, request path and ``OnDemand`` over a fake
backend whose instances declare 1 GiB each (``sluice_memory_estimate``), so a budget of
3.5 GiB fits three. Requests are held inside ``execute`` (the fakes' gates) or inside their
model's ``start``; tests wait on state, never on time."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from sluice.backends.base import ModelInstance, ModelSpec, register_backend
from sluice.config import ControlMode, ServerConfig
from sluice.core.registry import Registry
from sluice.core.serving import Serving
from sluice.errors import NotFound, Unavailable
from sluice.repository.manager import ModelManager
from sluice.repository.on_demand import OnDemand

from .fakes import FakeInstance, answer, answers, request, run, settle, until

BACKEND = "middle_on_demand"
GIB = 1 << 30


class SlowStart(FakeInstance):
    """A fake instance whose ``start`` waits for ``gate`` when it has one."""

    def __init__(self, index: int, held: bool, gate: asyncio.Event | None) -> None:
        super().__init__(index, held=held)
        self.gate = gate

    async def start(self) -> None:
        if self.gate is not None:
            await self.gate.wait()


class FakeBackend:
    name = BACKEND
    created: dict[str, list[SlowStart]] = {}
    held: set[str] = set()  # models whose executions wait for ``release``
    start_gates: dict[str, asyncio.Event] = {}  # models whose start waits

    def default_model_filename(self) -> str:
        return ""

    def auto_complete(self, spec: ModelSpec) -> mc.ModelConfig:
        return spec.config

    def create_instances(self, spec: ModelSpec) -> list[ModelInstance]:
        inst = SlowStart(1, spec.name in self.held, self.start_gates.get(spec.name))
        self.created.setdefault(spec.name, []).append(inst)
        return [inst]


register_backend([BACKEND], FakeBackend)


def make_repo(tmp_path: Path, *names: str) -> Path:
    repo = tmp_path / "repo"
    for name in names:
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(
            f"""
name: "{name}"
backend: "{BACKEND}"
max_batch_size: 4
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
parameters {{ key: "sluice_memory_estimate" value {{ string_value: "1G" }} }}
"""
        )
    return repo


def build(repo: Path, limit: int, pins: tuple[str, ...] = ()) -> tuple[ModelManager, OnDemand]:
    registry = Registry()
    serving = Serving(registry, None)
    manager = ModelManager(
        ServerConfig(model_repositories=(repo,), control_mode=ControlMode.EXPLICIT),
        registry,
        serving,
    )
    on_demand = OnDemand(manager, limit=limit, pins=pins)
    serving.on_demand = on_demand
    return manager, on_demand


def infer(manager: ModelManager, model: str, rid: str, value: int) -> asyncio.Future:  # type: ignore[type-arg]
    req = request(rid, value)
    req.model_name = model
    return asyncio.ensure_future(manager.serving.infer(req))


def state(manager: ModelManager, model: str) -> tuple[str, str]:
    rec = manager.registry.get(model)
    assert rec is not None and len(rec.states) == 1, rec
    return next(iter(rec.states.values()))


@pytest.fixture(autouse=True)
def _fresh_backend() -> None:
    FakeBackend.created.clear()
    FakeBackend.held.clear()
    FakeBackend.start_gates.clear()


def test_busy_and_pinned_models_stay_the_idle_one_goes(tmp_path: Path) -> None:
    repo = make_repo(tmp_path, "p", "a", "b", "c")
    FakeBackend.held.add("a")

    async def main() -> None:
        manager, od = build(repo, limit=3584 << 20, pins=("p",))
        try:
            assert (await answer(infer(manager, "p", "p1", 1))).outputs["OUT"].tolist() == [[11]]
            busy = infer(manager, "a", "a1", 2)  # loads 'a', then waits inside execute
            await until(lambda: FakeBackend.created.get("a", [None])[0] is not None, "a made")
            a_inst = FakeBackend.created["a"][0]
            await until(lambda: a_inst.waiting == 1, "a's request executing")
            await answer(infer(manager, "b", "b1", 3))
            assert od.held() == 3 * GIB
            # 'c' needs room: 'p' is pinned, 'a' busy, so 'b' goes even though 'p' is older
            await answer(infer(manager, "c", "c1", 4))
            assert [od.counters_of(m).evictions for m in "pabc"] == [0, 0, 1, 0]
            st, reason = state(manager, "b")
            assert st == "UNAVAILABLE" and reason.startswith("evicted: ")
            assert reason.endswith("to make room for 'c'")
            assert od.evicted_reason("b") == reason
            assert FakeBackend.created["b"][0].stopped and not a_inst.stopped
            assert state(manager, "p") == ("READY", "pinned (never evicted)")
            assert od.held() == 3 * GIB
            a_inst.release()
            assert (await answer(busy)).outputs["OUT"].tolist() == [[21]]
        finally:
            await od.close(timeout=10)
            assert await manager.shutdown(timeout=10)

    run(main)


def test_one_load_for_many_waiters_and_close_lets_it_finish(tmp_path: Path) -> None:
    repo = make_repo(tmp_path, "a", "b")

    async def main() -> None:
        gate = asyncio.Event()
        FakeBackend.start_gates["a"] = gate
        manager, od = build(repo, limit=8 * GIB)
        try:
            waiters = [infer(manager, "a", f"r{i}", i) for i in range(5)]
            await until(lambda: od.waiting().get("a") == 5, "five requests waiting for 'a'")
            queued = infer(manager, "b", "b1", 1)  # its load waits for the one under way
            await until(lambda: od.waiting().get("b") == 1, "a request waiting for 'b'")
            closing = asyncio.ensure_future(od.close(timeout=30))
            await settle()
            assert not closing.done()
            gate.set()  # the load under way ends: its requests are served
            out = await answers(*waiters)
            assert [r.outputs["OUT"].tolist() for r in out] == [[[i * 10 + 1]] for i in range(5)]
            assert len(FakeBackend.created["a"]) == 1 and od.counters_of("a").loads == 1
            assert od.counters_of("a").wait.total == 5
            [refused] = await answers(queued, errors=True)
            assert isinstance(refused, Unavailable), refused
            assert refused.message == "Server is shutting down: model load refused"
            await answer(closing)
            # closed: a model that serves nothing answers the lookup's own error
            [late] = await answers(infer(manager, "b", "b2", 1), errors=True)
            assert isinstance(late, NotFound), late
            assert "b" not in FakeBackend.created
        finally:
            assert await manager.shutdown(timeout=10)

    run(main)
