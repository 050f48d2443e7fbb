"""Fake model instances and small helpers for driving the real schedulers in-process.

Rules of this file:
- A fake instance has exactly what the schedulers call on an instance (``name``,
  ``execute``, ``stop``; ``start`` for the backend contract) and records every batch it was
  given: the request ids, in order, and the batch's size in items.
- Each ``execute`` waits on its own gate (an ``asyncio.Event``) while the instance is held,
  so a test decides when a batch finishes; ``release()`` opens the oldest closed gate,
  ``open()`` opens every gate now and later.
- Like a real backend, ``execute`` concatenates the batch's ``IN`` tensors along the batch
  dimension, computes ``OUT = IN * 10 + k`` (k the instance's index) on the whole batch and
  splits ``OUT`` back per request: each caller must get its own rows.
- ``compute_ms``: each ``execute`` also lasts at least that long by the monotonic clock (a
  model's compute time, for the latency-target batcher to measure; never less: the loop's
  timers may fire early, so it checks the clock).
- Tests wait on state (``until``), never on time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np
import uvloop
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from sluice.backends.base import ExecuteResult
from sluice.core.stats import ModelStats
from sluice.errors import ServerError
from sluice.scheduling.scheduler import Scheduler
from sluice.types import InferRequest, InferResponse

__all__ = [
    "FakeInstance",
    "Tracker",
    "KEY",
    "answer",
    "answers",
    "MODEL",
    "config",
    "request",
    "run",
    "settle",
    "stats",
    "until",
]

MODEL = "m"


class Tracker:
    """Counts executions running at once across several fake instances."""

    def __init__(self) -> None:
        self.running = 0
        self.most = 0


class FakeInstance:
    def __init__(
        self,
        index: int = 0,
        *,
        held: bool = True,
        tracker: Tracker | None = None,
        fail: Callable[[list[InferRequest]], BaseException | None] | None = None,
        compute_ms: float = 0.0,
    ) -> None:
        self.name = f"{MODEL}_0_{index}"
        self.index = index
        self.batches: list[list[str]] = []  # request ids of each batch, in execution order
        self.sizes: list[int] = []  # items in each batch (sum of batch dims)
        self.seen: list[list[InferRequest]] = []  # the requests themselves
        self.finished = 0
        self.stopped = False
        self._held = held
        self._gates: list[asyncio.Event] = []
        self._tracker = tracker
        self._fail = fail
        self._compute_ns = int(compute_ms * 1_000_000)

    @property
    def waiting(self) -> int:
        """Batches inside ``execute`` whose gate is still closed."""
        return sum(1 for g in self._gates if not g.is_set())

    def release(self) -> None:
        for g in self._gates:
            if not g.is_set():
                g.set()
                return
        raise AssertionError(f"{self.name}: no batch is waiting to be released")

    def open(self) -> None:
        self._held = False
        for g in self._gates:
            g.set()

    async def start(self) -> None:
        return None

    async def execute(self, requests: list[InferRequest]) -> ExecuteResult:
        self.batches.append([r.id for r in requests])
        self.seen.append(list(requests))
        sizes = [len(r.inputs["IN"]) if "IN" in r.inputs else 1 for r in requests]
        self.sizes.append(sum(sizes))
        gate = asyncio.Event()
        self._gates.append(gate)
        if not self._held:
            gate.set()
        t = self._tracker
        if t is not None:
            t.running += 1
            t.most = max(t.most, t.running)
        try:
            await gate.wait()
            if self._compute_ns:
                end = time.monotonic_ns() + self._compute_ns
                while (left := end - time.monotonic_ns()) > 0:
                    await asyncio.sleep(left / 1e9)
        finally:
            if t is not None:
                t.running -= 1
        self.finished += 1
        if self._fail is not None:
            exc = self._fail(requests)
            if exc is not None:
                raise exc
        results: list[InferResponse | ServerError] = []
        if all("IN" in r.inputs for r in requests):
            whole = np.concatenate([r.inputs["IN"] for r in requests]) * 10 + self.index
            parts = np.split(whole, np.cumsum(sizes)[:-1])
        else:
            parts = [np.zeros((1,), np.int32) for _ in requests]
        for r, out in zip(requests, parts, strict=True):
            results.append(InferResponse(r.model_name, "1", r.id, {"OUT": out}, {"OUT": "INT32"}))
        return ExecuteResult(results)

    async def stop(self, grace: float | None = None) -> None:
        self.stopped = True


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run one test's coroutine on a fresh event loop (uvloop, as the server does)."""
    uvloop.run(main())


def config(text: str) -> mc.ModelConfig:
    """A model config from pbtxt, named ``MODEL`` unless it names itself."""
    cfg = text_format.Parse(text, mc.ModelConfig())
    cfg.name = cfg.name or MODEL
    return cfg


def batcher(text: str, *instances: Any, st: ModelStats | None = None) -> Scheduler:
    """The real dynamic-batching scheduler of model ``MODEL`` version 1 over ``instances``,
    configured by the pbtxt ``text``."""
    return Scheduler(MODEL, "1", config(text), list(instances), st if st is not None else stats())


def stats() -> ModelStats:
    return ModelStats(MODEL, "1")


def request(rid: str, *values: int, **parameters: Any) -> InferRequest:
    """A request ``rid`` whose ``IN`` holds one row per value (its batch size)."""
    data = np.array([[v] for v in values] or [[0]], dtype=np.int32)
    return InferRequest(
        model_name=MODEL,
        id=rid,
        inputs={"IN": data},
        input_datatypes={"IN": "INT32"},
        parameters=dict(parameters),
    )


KEY = (("IN", (1,)),)  # the non-batch shape key every request here shares


async def until(cond: Callable[[], object], what: str, limit: float = 10.0) -> None:
    """Wait (polling the loop) until ``cond()`` holds; fail naming ``what`` after ``limit``
    seconds, a bound against a hang, not a timing assertion."""
    loop = asyncio.get_running_loop()
    end = loop.time() + limit
    while not cond():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.001)


async def answers(*futures: Any, errors: bool = False, limit: float = 10.0) -> list[Any]:
    """The results of ``futures`` (with ``errors``: their exceptions in their place); fail
    after ``limit`` seconds, a bound against a hang, not a timing assertion."""
    try:
        return await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=errors), limit)
    except TimeoutError:
        raise AssertionError(f"no answer within {limit} s: the requests are stuck") from None


async def answer(future: Any, limit: float = 10.0) -> Any:
    """The one result of ``future``, bounded as ``answers``."""
    (result,) = await answers(future, limit=limit)
    return result


async def settle(rounds: int = 20) -> None:
    """Let every callback already scheduled run (loop iterations, not time)."""
    for _ in range(rounds):
        await asyncio.sleep(0)
