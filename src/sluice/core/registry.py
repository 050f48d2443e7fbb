"""The registry: what serves now (one record per model: its serving versions, their states
for the index, its traffic split), the state names of the index, and how a serving version
is built from a config and started instances.

Rules of this file:
- The registry is written only through its write methods (``publish``, ``retire``,
  ``set_state``, ``set_states``, ``drop_state``, ``set_required``, ``set_traffic``,
  ``record``, ``forget``), called by the manager's load / unload / poll procedures
  (``repository/manager.py``, ``repository/versions.py``). Everyone else (the request path, the service, metrics, the
  dashboard, the control file) only reads, through the read methods.
- A serving set is replaced in one assignment (``publish``): a request finds either the old
  set or the new one, never a mix.
- A record holds what serves and what the index and readiness show; the bookkeeping of
  loads (lock, directory signature, overrides, dependents) is the manager's own
  (``repository/load_book.py``), not here.
- A ``ServingVersion`` needs no manager: ``scheduling.serving_version.build`` makes one from
  a config, started instances and statistics, and ``core.serving.Serving`` serves it (unit
  tests drive it with fake instances). The registry knows a scheduler only by what it is
  asked (``VersionScheduler``).

Usage::

    registry = Registry()
    serving = Serving(registry)
    registry.publish("m", {1: build(spec, instances, ModelStats("m", "1"))})
    response = await serving.infer(request)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from ..backends.base import ModelSpec
from ..errors import ServerError
from ..protocol.datatypes import config_to_kserve, kserve_to_numpy
from ..types import InferRequest, InferResponse
from .stats import ModelStats
from .traffic import TrafficSplit

__all__ = [
    "READY",
    "UNAVAILABLE",
    "LOADING",
    "UNLOADING",
    "TensorInfo",
    "ServingVersion",
    "VersionScheduler",
    "ModelRecord",
    "Registry",
]

READY = "READY"
UNAVAILABLE = "UNAVAILABLE"
LOADING = "LOADING"
UNLOADING = "UNLOADING"


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    datatype: str  # KServe spelling
    dtype: np.dtype | None
    dims: tuple[int, ...]
    optional: bool = False


def tensor_infos(tensors: list[mc.ModelInput] | list[mc.ModelOutput]) -> dict[str, TensorInfo]:
    out: dict[str, TensorInfo] = {}
    for t in tensors:
        if t.name in out:  # declared twice: the first declaration counts (config warns)
            continue
        dt = config_to_kserve(mc.DataType.Name(t.data_type))
        out[t.name] = TensorInfo(
            t.name,
            dt,
            kserve_to_numpy(dt),
            tuple(int(d) for d in t.dims),
            bool(getattr(t, "optional", False)),
        )
    return out


class VersionScheduler(Protocol):
    """What the request path and the manager ask of a version's scheduler (the dynamic or
    sequence batcher, ``scheduling/``): queue a validated request, drain, stop."""

    def submit(
        self,
        request: InferRequest,
        batch_size: int,
        shape_key: tuple[Any, ...],
        priority: int = 0,
        timeout_us: int = 0,
    ) -> asyncio.Future[InferResponse]: ...

    def run_now(
        self, request: InferRequest, batch_size: int
    ) -> Coroutine[Any, Any, InferResponse] | None:
        """The request's execution in the caller's task, where it may start at once without
        a queue; None: ``submit`` it."""

    async def drain(self) -> None: ...

    def fail_queued(self, error: ServerError) -> None: ...

    async def stop(self, grace: float | None = None) -> None: ...

    def close(self) -> None:
        """Give up what the scheduler holds of the server's (its rate limiter places)
        without stopping the instances: for a version that never served."""


@dataclass(slots=True)
class ServingVersion:
    """A loaded version: its config, scheduler and statistics. Immutable once serving."""

    spec: ModelSpec
    scheduler: VersionScheduler
    stats: ModelStats
    inputs: dict[str, TensorInfo]
    outputs: dict[str, TensorInfo]
    required_inputs: frozenset[str]
    max_batch_size: int
    version_str: str
    decoupled: bool = False  # model_transaction_policy { decoupled: true }
    cached: bool = False  # response_cache { enable: true } and a server cache
    # unique per load of this version (the manager counts): the response cache keys on it,
    # so files changed under the same version number never answer from the old load's entries
    generation: int = 0
    # bytes its instances hold as admission saw them (declared or measured estimate per
    # instance x instances; 0 for an ensemble): what on-demand loading counts in its budget
    memory: int = 0
    # when it was built (wall clock, seconds): the OpenAI model list's "created"
    loaded_at: float = field(default_factory=time.time)

    @property
    def config(self) -> mc.ModelConfig:
        return self.spec.config


@dataclass(slots=True)
class ModelRecord:
    name: str
    serving: dict[int, ServingVersion] = field(default_factory=dict)
    # version (or -1 = the model as a whole) -> (state, reason), for the index
    states: dict[int, tuple[str, str]] = field(default_factory=dict)
    latest: ServingVersion | None = None  # highest serving version
    required: bool = False  # counts for strict readiness
    # kept across reloads so statistics stay cumulative, as in Triton
    stats: dict[int, ModelStats] = field(default_factory=dict)
    # weighted split of requests that name no version (``traffic.py``); None: the latest
    split: TrafficSplit[ServingVersion] | None = None

    def set_serving(self, serving: dict[int, ServingVersion]) -> None:
        self.serving = serving
        self.latest = serving[max(serving)] if serving else None
        if self.split is not None:
            self.split = self.split.rebind(serving)

    @property
    def ready(self) -> bool:
        return bool(self.serving)

    @property
    def present(self) -> bool:
        """Serving, or on its way in or out: listed in the index even without a directory."""
        return bool(self.serving) or any(
            state in (LOADING, UNLOADING) for state, _ in self.states.values()
        )


class Registry:
    """The models and versions serving now, by name; see the rules at the top of the file."""

    def __init__(self) -> None:
        self._records: dict[str, ModelRecord] = {}

    # ------------------------------------------------------------------ reads
    @property
    def by_name(self) -> Mapping[str, ModelRecord]:
        """The records by name, read-only (the mapping itself, not a copy: the request path
        looks names up here at the cost of a dict lookup)."""
        return self._records

    def get(self, name: str) -> ModelRecord | None:
        return self._records.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._records

    def records(self) -> list[ModelRecord]:
        """Every record, in the order the names were first seen (a copy: safe to iterate
        while loads change the registry)."""
        return list(self._records.values())

    def versions(self, name: str) -> list[int]:
        """The serving versions of ``name``, ascending (none if it is not serving)."""
        rec = self._records.get(name)
        return sorted(rec.serving) if rec is not None else []

    def serving_version(self, name: str, version: int) -> ServingVersion | None:
        rec = self._records.get(name)
        return rec.serving.get(version) if rec is not None else None

    def all_serving(self) -> list[ServingVersion]:
        return [sv for rec in self.records() for sv in rec.serving.values()]

    def serving_stats(self, name: str | None = None) -> list[ModelStats]:
        """The statistics of the serving versions (of ``name``, or of every model), by model
        then ascending version; cumulative across reloads, as in Triton."""
        recs = self.records() if name is None else [r for r in [self.get(name)] if r is not None]
        return [st for rec in recs for v, st in sorted(rec.stats.items()) if v in rec.serving]

    # ----------------------------------------------------------------- writes
    def record(self, name: str) -> ModelRecord:
        """The record of ``name``, made if there is none yet."""
        rec = self._records.get(name)
        if rec is None:
            rec = self._records[name] = ModelRecord(name)
        return rec

    def forget(self, name: str) -> None:
        self._records.pop(name, None)

    def publish(self, name: str, serving: dict[int, ServingVersion]) -> None:
        """Make ``serving`` the serving set of ``name`` in one assignment (``{}``: none); the
        statistics of its versions are kept by version (a later load of the same version
        passes them on: they stay cumulative, as in Triton)."""
        rec = self.record(name)
        for v, sv in serving.items():
            rec.stats[v] = sv.stats
        rec.set_serving(serving)

    def retire(self, name: str, version: int) -> ServingVersion | None:
        """Take ``version`` out of the serving set (new requests no longer find it); returns
        it for the caller to drain and stop."""
        rec = self._records.get(name)
        if rec is None or version not in rec.serving:
            return None
        sv = rec.serving[version]
        rec.set_serving({v: s for v, s in rec.serving.items() if v != version})
        return sv

    def set_state(self, name: str, version: int, state: str, reason: str = "") -> None:
        """The index entry of ``version`` (-1: the model as a whole)."""
        self.record(name).states[version] = (state, reason)

    def set_states(self, name: str, states: dict[int, tuple[str, str]]) -> None:
        """Replace every index entry of ``name``."""
        self.record(name).states = dict(states)

    def drop_state(self, name: str, version: int) -> None:
        rec = self._records.get(name)
        if rec is not None:
            rec.states.pop(version, None)

    def set_required(self, name: str, required: bool) -> None:
        """Whether ``name`` counts for the server's readiness (--strict-readiness)."""
        self.record(name).required = required

    def set_traffic(self, name: str, split: TrafficSplit[ServingVersion] | None) -> None:
        """The weighted split of requests that name no version (None: the latest)."""
        self.record(name).split = split
