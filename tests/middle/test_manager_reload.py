"""The model manager reloading a model while requests are in flight, in-process: a fake
backend (registered under its own name) hands out fake instances; requests go through the
one request path (``Serving.infer``: routing, validation, the scheduler).

The manager is driven only through its public calls (``load``, ``serving``, ``shutdown``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from sluice.backends.base import ModelInstance, ModelSpec, register_backend
from sluice.config import ControlMode, ServerConfig
from sluice.core.registry import Registry
from sluice.core.serving import Serving
from sluice.repository.manager import ModelManager

from .fakes import MODEL, FakeInstance, answer, answers, request, run, until

BACKEND = "middle_fake"
CONFIG = f"""
name: "{MODEL}"
backend: "{BACKEND}"
max_batch_size: 4
dynamic_batching {{ max_queue_delay_microseconds: 3600000000 }}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
"""


class FakeBackend:
    """Each load's instance is one FakeInstance whose index is its load's number (1, 2, ...):
    a response's ``OUT % 10`` says which load answered it. The first load's instance is held."""

    name = BACKEND
    created: list[FakeInstance] = []

    def default_model_filename(self) -> str:
        return ""

    def auto_complete(self, spec: ModelSpec) -> mc.ModelConfig:
        return spec.config

    def create_instances(self, spec: ModelSpec) -> list[ModelInstance]:
        n = len(self.created) + 1
        inst = FakeInstance(n, held=n == 1)
        self.created.append(inst)
        return [inst]


register_backend([BACKEND], FakeBackend)


def test_a_reload_under_load_finishes_old_requests_on_the_old_instance(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / MODEL / "1").mkdir(parents=True)
    cfg_path = repo / MODEL / "config.pbtxt"
    cfg_path.write_text(CONFIG)
    FakeBackend.created.clear()
    created = FakeBackend.created

    async def main() -> None:
        registry = Registry()
        serving = Serving(registry, None)
        manager = ModelManager(
            ServerConfig(model_repositories=(repo,), control_mode=ControlMode.EXPLICIT),
            registry,
            serving,
        )
        try:
            await manager.load(MODEL)
            # four requests fill a batch on the first load's (held) instance
            old = [asyncio.ensure_future(serving.infer(request(f"old{i}", i))) for i in range(4)]
            await until(lambda: len(created) == 1 and created[0].waiting == 1, "batch 1 runs")
            # the files change: the reload starts a new instance and swaps it in, then waits
            # for the old one to drain
            cfg_path.write_text(CONFIG + 'parameters { key: "load" value { string_value: "2" } }\n')
            reload = asyncio.ensure_future(manager.load(MODEL))
            await until(
                lambda: serving.get(MODEL).spec.config.parameters["load"].string_value == "2",
                "the new version serves",
            )
            assert not reload.done()
            new = [asyncio.ensure_future(serving.infer(request(f"new{i}", i))) for i in range(4)]
            new_answers = await answers(*new)
            assert [r.outputs["OUT"].tolist() for r in new_answers] == [
                [[i * 10 + 2]] for i in range(4)
            ]
            assert created[1].batches == [["new0", "new1", "new2", "new3"]]
            assert (created[0].stopped, reload.done()) == (False, False)
            # the old batch ends on the old instance; then the reload retires it
            created[0].release()
            old_answers = await answers(*old)
            assert [r.outputs["OUT"].tolist() for r in old_answers] == [
                [[i * 10 + 1]] for i in range(4)
            ]
            await answer(reload)
            assert created[0].batches == [["old0", "old1", "old2", "old3"]]
            assert [i.stopped for i in created] == [True, False]
        finally:
            assert await manager.shutdown(timeout=10)
        assert [i.stopped for i in created] == [True, True]

    run(main)
