"""The middle test layer: ``Serving`` and a real scheduler driven in-process, with no manager
and no server. A version is built from a config and a fake instance (an object with the
methods the scheduler calls), published in a ``Registry``, and served by ``Serving.infer``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from sluice.backends.base import ExecuteResult, ModelSpec
from sluice.core.registry import Registry
from sluice.core.serving import Serving
from sluice.core.stats import ModelStats
from sluice.errors import InvalidArgument, NotFound
from sluice.protocol import grpc_codec
from sluice.protocol.infer_layout import GrpcLayouts
from sluice.scheduling.scheduler import Scheduler
from sluice.scheduling.serving_version import build as build_version
from sluice.types import InferRequest, InferResponse

LAYOUTS = GrpcLayouts()  # what a gRPC front-end keeps

CONFIG = """
name: "doubler" backend: "python" max_batch_size: 4
input [ { name: "IN" data_type: TYPE_FP32 dims: [ DIMS ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ DIMS ] } ]
"""


class FakeInstance:
    """What the scheduler calls on an instance: ``execute`` (and ``stop`` at the end)."""

    name = "doubler_0"

    def __init__(self) -> None:
        self.batches: list[list[str]] = []  # request ids of each execute() call
        self.stopped = False

    async def start(self) -> None:
        pass

    async def execute(self, requests: list[InferRequest]) -> ExecuteResult:
        self.batches.append([r.id for r in requests])
        return ExecuteResult(
            [InferResponse(r.model_name, "", r.id, {"OUT": r.inputs["IN"] * 2}) for r in requests]
        )

    async def stop(self, grace: float | None = None) -> None:
        self.stopped = True


def _spec(version: int, dims: int = 2) -> ModelSpec:
    config = text_format.Parse(CONFIG.replace("DIMS", str(dims)), mc.ModelConfig())
    here = Path("/nonexistent/doubler")
    return ModelSpec("doubler", version, here, here / str(version), config, here.parent)


def _request(rid: str, data: np.ndarray, version: str = "") -> InferRequest:
    return InferRequest("doubler", version, rid, {"IN": data}, {"IN": "FP32"})


def test_serving_infers_through_a_scheduler_over_a_fake_instance() -> None:
    async def scenario() -> None:
        registry = Registry()
        serving = Serving(registry)
        inst = FakeInstance()
        stats = ModelStats("doubler", "3")
        sv = build_version(_spec(3), [inst], stats, generation=7)
        assert type(sv.scheduler) is Scheduler
        assert (sv.version_str, sv.max_batch_size, sv.generation) == ("3", 4, 7)
        assert sv.required_inputs == frozenset({"IN"})
        registry.publish("doubler", {3: sv})

        data = np.array([[1.5, -2.0]], np.float32)
        response = await serving.infer(_request("r1", data))
        assert (response.model_name, response.model_version, response.id) == (
            "doubler",
            "3",
            "r1",
        )
        np.testing.assert_array_equal(response.outputs["OUT"], np.array([[3.0, -4.0]]))
        assert response.output_datatypes == {"OUT": "FP32"}
        assert inst.batches == [["r1"]]
        assert (stats.success.count, stats.execution_count, stats.inference_count) == (1, 1, 1)
        assert registry.serving_stats("doubler") == [stats]

        # a client mistake is refused by validation, before the instance sees it
        with pytest.raises(InvalidArgument, match=r"\[request id: r2\].*'IN'"):
            await serving.infer(_request("r2", np.zeros((1, 3), np.float32)))
        assert inst.batches == [["r1"]]

        # retired: new requests no longer find it, naming the model
        assert registry.retire("doubler", 3) is sv
        with pytest.raises(NotFound, match="'doubler'"):
            await serving.infer(_request("r3", data))
        await sv.scheduler.drain()
        await sv.scheduler.stop()
        assert inst.stopped

    asyncio.run(scenario())


def test_a_layouts_validation_is_not_reused_for_another_version() -> None:
    """Requests decoded from one learned gRPC layout share their validation answer, but only
    for the version it was given for: after a swap to a version whose config differs, the
    same layout is checked again (and refused, naming the input), never served from the
    old answer."""

    async def scenario() -> None:
        registry = Registry()
        serving = Serving(registry)
        inst = FakeInstance()
        v1 = build_version(_spec(1, dims=2), [inst], ModelStats("doubler", "1"))
        registry.publish("doubler", {1: v1})
        data = np.array([[1.0, 2.0]], np.float32)
        payload = grpc_codec.encode_infer_request("doubler", {"IN": data}).SerializeToString()
        grpc_codec.read_model_infer(payload, LAYOUTS)  # the first one teaches the layout
        for _ in range(2):
            req = grpc_codec.read_model_infer(payload, LAYOUTS)
            assert req.signature is not None  # decoded from the learned layout
            response = await serving.infer(req)
            np.testing.assert_array_equal(response.outputs["OUT"], data * 2)
        assert len(inst.batches) == 2

        other = FakeInstance()
        v2 = build_version(_spec(2, dims=3), [other], ModelStats("doubler", "2"))
        registry.publish("doubler", {2: v2})  # the swap: version 1 no longer serves
        req = grpc_codec.read_model_infer(payload, LAYOUTS)
        assert req.signature is not None
        with pytest.raises(InvalidArgument, match=r"unexpected shape for input 'IN'.*\[-1,3\]"):
            await serving.infer(req)
        assert other.batches == []
        for sv in (v1, v2):
            await sv.scheduler.stop()

    asyncio.run(scenario())
